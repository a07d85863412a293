"""Every option of ``ate-devplugin run``, one record each, grouped as ``--help`` shows them.

A record says everything about its option: its key (``dra_slots`` is ``--dra-slots`` and
``ATE_DEVPLUGIN_DRA_SLOTS``), how its text is checked into a value, its default, its help,
when it does something (the modes, an on/off switch), and which chart value sets it.
From this table come the argument parser (cli.py), the environment variables and defaults
(resolve.py), the warnings about options that do nothing in the mode (idle.py), the chart's
guard on ``daemon.extraArgs`` (tools/gen-chart-args.py) and the flag table of
docs/configuration.md (tools/gen-settings-doc.py). Each subsystem reads the values through
its own frozen part (parts.py), whose fields are named after the keys.

Adding an option: one record here, a field of that name in the part of the subsystem that
reads it, and a line in that part's builder (parts.PARTS).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ate_devplugin.settings import checks
from ate_devplugin.settings.checks import OneOf, OnOff

T = TypeVar("T")

ENV_PREFIX = "ATE_DEVPLUGIN_"
# The DRA driver name: one driver for every configured resource (see docs/dra.md).
DRA_DRIVER = "ate.dev"
MODES = ("device-plugin", "dra", "both")
LOG_FORMATS = ("auto", "json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")
# capacity: a shareable device per resource where the API server keeps it, plus the slots;
# slots: the slots only (docs/dra.md, "Sharing one /dev/kvm").
DRA_SHARING = ("capacity", "slots")
# The effect of the taint a KVM device that fails its probe carries (docs/kvm-health.md).
DRA_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
# local: the daemon opens the device itself; socket: a prober reports over a unix socket;
# off: existence only (docs/kvm-health.md).
KVM_PROBE_MODES = ("local", "socket", "off")
KUBELET_SOCKET = "kubelet.sock"
POD_RESOURCES_DIR = "pod-resources"  # next to the device-plugins directory in the kubelet's root


@dataclass(frozen=True)
class Applies:
    """When an option does something: in these modes (used by ``who``), and while the
    on/off option ``switch`` is on. Given where it does nothing, it is warned about."""

    modes: tuple[str, ...] = MODES
    who: str = ""
    switch: str = ""


ALWAYS = Applies()
DEVICE_PLUGIN_ONLY = Applies(("device-plugin", "both"), "the device plugin")
DRA_ONLY = Applies(("dra", "both"), "the DRA driver")
WITH_POD_RESOURCES = Applies(switch="pod_resources")


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option: ``--key-with-dashes``, ``ATE_DEVPLUGIN_KEY``, and the value ``check`` makes of its text."""

    key: str
    check: Callable[[str, str], T]
    default: str  # as text, checked as a given value is
    metavar: str
    help: str
    # What the default does, when its text alone does not say it (or it is empty).
    default_help: str = ""
    applies: Applies = ALWAYS
    # The value when the option is empty or not given, from the options before it in the table.
    derive: Callable[[Mapping[str, Any]], T] | None = None
    # A variable read when neither the flag nor ours is given (the chart's downward API).
    fallback_env: str = ""
    required: bool = False  # where it applies
    # How the chart sets it: the chart's guard refuses it in daemon.extraArgs with this
    # text. Empty: the chart does not set it, and extraArgs may.
    chart: str = ""
    # The default cell of docs/configuration.md's flag table, when it says more than the help (markdown).
    doc: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def shown_default(self) -> str:
        return self.default_help or self.default


@dataclass(frozen=True)
class Group:
    """Options shown together in ``--help``."""

    title: str
    options: tuple[Option[Any], ...]


def _braces(choices: tuple[str, ...]) -> str:
    return "{" + ",".join(choices) + "}"


def _pod_resources_socket(values: Mapping[str, Any]) -> str:
    return os.path.join(os.path.dirname(values["plugin_dir"]), POD_RESOURCES_DIR, KUBELET_SOCKET)


GROUPS = (
    Group(
        "the device plugin",
        (
            Option(
                "config",
                checks.file_or_none,
                "",
                "FILE",
                "the resource config file",
                "none: ate.dev/kvm -> /dev/kvm",
                chart="use deviceConfig",
                doc="none: `ate.dev/kvm` → `/dev/kvm`",
            ),
            Option(
                "device_root",
                checks.absolute_dir,
                "/dev",
                "DIR",
                "where the host's /dev is visible",
                chart="use hostPaths.dev",
                doc="`/dev` (`/host/dev` in the chart)",
            ),
            Option(
                "plugin_dir",
                checks.absolute_dir,
                "/var/lib/kubelet/device-plugins",
                "DIR",
                "the kubelet's device plugin directory: kubelet.sock and our sockets",
                chart="use hostPaths.devicePlugins",
            ),
            Option(
                "metrics_address",
                checks.address,
                "0.0.0.0:9477",
                "HOST:PORT",
                "where /metrics, /healthz and /readyz are served",
                chart="use metrics.bindAddress and metrics.port",
            ),
            Option(
                "log_format",
                OneOf(LOG_FORMATS),
                "auto",
                _braces(LOG_FORMATS),
                "log lines as JSON or text",
                "auto: JSON unless on a terminal",
                chart="use daemon.logFormat",
            ),
            Option(
                "log_level",
                OneOf(LOG_LEVELS),
                "info",
                _braces(LOG_LEVELS),
                "the least severe level logged",
                chart="use daemon.logLevel",
            ),
            Option(
                "cdi_dir",
                checks.absolute_dir,
                "/var/run/cdi",
                "DIR",
                "where the CDI specs are written (allocate: cdi or both, and DRA)",
                chart="use hostPaths.cdi",
            ),
            Option(
                "mode",
                OneOf(MODES),
                "device-plugin",
                _braces(MODES),
                "serve the device plugin, the DRA driver, or both",
                chart="use dra.mode (which adds the DRA driver's RBAC and mounts)",
            ),
            Option(
                "socket_suffix",
                checks.socket_suffix,
                "",
                "SUFFIX",
                "a suffix of the device plugin sockets' names, e.g. the pod's UID: two plugin pods can then "
                "serve one node at once (a rolling update, Kubernetes 1.37+)",
                "none",
                applies=DEVICE_PLUGIN_ONLY,
                chart="the chart names the sockets with the pod UID where the kubelet allows it (1.37+)",
                doc="none; the sockets are then `ate-ate-dev-kvm-<SUFFIX>.sock` (the chart passes the pod UID "
                "on Kubernetes 1.37+, [chart README](../chart/README.md#upgrading))",
            ),
        ),
    ),
    Group(
        "DRA (mode dra or both)",
        (
            Option(
                "node_name",
                checks.text,
                "",
                "NAME",
                "this node's name",
                "$NODE_NAME (the chart sets it); required with DRA",
                applies=DRA_ONLY,
                fallback_env="NODE_NAME",
                required=True,
                chart="it comes from the downward API (NODE_NAME)",
            ),
            Option(
                "registry_dir",
                checks.absolute_dir,
                "/var/lib/kubelet/plugins_registry",
                "DIR",
                "the kubelet's plugin registry",
                applies=DRA_ONLY,
                chart="use dra.registryDir",
            ),
            Option(
                "dra_dir",
                checks.absolute_dir,
                "/var/lib/kubelet/plugins/" + DRA_DRIVER,
                "DIR",
                "the DRA driver's socket directory",
                applies=DRA_ONLY,
                chart="use dra.pluginDir",
            ),
            Option(
                "dra_slots",
                checks.slots,
                "32",
                "N",
                f"single-claim devices per resource on a node, beside the shareable one, 1 to {checks.MAX_SLOTS}",
                applies=DRA_ONLY,
                chart="use dra.slots",
            ),
            Option(
                "dra_sharing",
                OneOf(DRA_SHARING),
                "capacity",
                _braces(DRA_SHARING),
                "capacity: one shareable device per resource where the API server keeps it, plus the slots; "
                "slots: the slots only",
                applies=DRA_ONLY,
                chart="use dra.sharing",
                doc="`capacity` ([dra.md](dra.md#sharing-one-devkvm-among-many-claims))",
            ),
            Option(
                "dra_taint_effect",
                OneOf(DRA_TAINT_EFFECTS),
                "NoSchedule",
                _braces(DRA_TAINT_EFFECTS),
                "the effect of the taint on the devices of a KVM resource that fails its probe: NoSchedule keeps "
                "new claims off them, NoExecute also evicts the pods of allocated claims that do not tolerate it",
                applies=DRA_ONLY,
                chart="use dra.taintEffect",
                doc="`NoSchedule` ([kvm-health.md](kvm-health.md#dra-device-taints))",
            ),
        ),
    ),
    Group(
        "KVM health (resources with health kvm: docs/kvm-health.md)",
        (
            Option(
                "kvm_probe",
                OneOf(KVM_PROBE_MODES),
                "local",
                _braces(KVM_PROBE_MODES),
                "local: the daemon probes the device itself (it must be able to open it); socket: a prober granted "
                "the device (ate-devplugin probe) probes it and reports over --kvm-probe-socket; off: existence only",
                chart="use kvmProbe.enabled (socket, with the chart's prober; off otherwise: its unprivileged daemon "
                "cannot open host devices)",
                doc="`local` ([kvm-health.md](kvm-health.md#where-the-probe-runs))",
            ),
            Option(
                "kvm_probe_period",
                checks.seconds,
                "60",
                "SECONDS",
                "seconds between functional probes of each KVM resource, jittered by a tenth; it is probed at start "
                "and on every change of its device node too; 0: only then",
                applies=Applies(switch="kvm_probe"),
                chart="use kvmProbe.periodSeconds",
                doc="`60` ([kvm-health.md](kvm-health.md))",
            ),
            Option(
                "kvm_probe_timeout",
                checks.positive_seconds,
                "5",
                "SECONDS",
                "a probe with no verdict by then is killed and the device Unhealthy (timed-out)",
                applies=Applies(switch="kvm_probe"),
                chart="use kvmProbe.timeoutSeconds",
            ),
            Option(
                "kvm_probe_socket",
                checks.absolute_dir,
                "/run/ate-devplugin/prober.sock",
                "PATH",
                "socket mode: the unix socket the prober connects to (made by the daemon)",
                applies=Applies(switch="kvm_probe"),
                chart="use kvmProbe.socketDir",
                doc="`/run/ate-devplugin/prober.sock` ([kvm-health.md](kvm-health.md#the-socket-protocol))",
            ),
            Option(
                "kvm_prober_uid",
                checks.user_id,
                "0",
                "UID",
                "socket mode: the user id the prober runs as; a connection from any other is refused "
                "(SO_PEERCRED), and the socket's directory is the daemon's own (0700) when it is the daemon's",
                applies=Applies(switch="kvm_probe"),
                chart="use kvmProbe.podSecurityContext.runAsUser",
            ),
            Option(
                "kvm_prober_gid",
                checks.user_id,
                "0",
                "GID",
                "socket mode: the group id the prober runs as; a connection from any other is refused",
                applies=Applies(switch="kvm_probe"),
                chart="use kvmProbe.podSecurityContext.runAsGroup",
            ),
            Option(
                "nfd_features_dir",
                checks.absolute_or_empty,
                "",
                "DIR",
                "node-feature-discovery's features.d: the KVM facts go there as node labels (ate.dev/cpuModel=...)",
                "none: no feature file",
                applies=Applies(switch="kvm_probe"),
                chart="use nfd.enabled and nfd.featuresDir",
                doc="none ([kvm-health.md](kvm-health.md#as-node-labels-device-plugin-mode))",
            ),
            Option(
                "nfd_label_ttl",
                checks.positive_seconds,
                "900",
                "SECONDS",
                "the feature file's labels expire this long after the daemon last renewed them (every third of "
                "it): once the daemon is gone (uninstalled), nfd-worker drops them; at least twice nfd-worker's "
                "own interval (60 s)",
                applies=Applies(switch="kvm_probe"),
                chart="use nfd.labelTtl",
            ),
        ),
    ),
    Group(
        "which pods hold units (PodResources)",
        (
            Option(
                "pod_resources",
                OnOff(),
                "on",
                "{on,off}",
                "export which pods hold units, read from the kubelet's PodResources API",
                chart="use podResources.enabled",
                doc="`on` ([observability.md](observability.md#which-pods-hold-the-device---pod-resources))",
            ),
            Option(
                "pod_resources_socket",
                checks.absolute_or_empty,
                "",
                "PATH",
                "the kubelet's PodResources socket",
                "pod-resources/kubelet.sock next to the plugin directory",
                applies=WITH_POD_RESOURCES,
                derive=_pod_resources_socket,
                chart="use podResources.hostPath",
                doc="`pod-resources/kubelet.sock` next to the plugin directory "
                "(`/var/lib/kubelet/pod-resources/kubelet.sock`)",
            ),
            Option(
                "pod_resources_interval",
                checks.seconds,
                "60",
                "SECONDS",
                "seconds between Lists when no event asked for one; 0: events only",
                applies=WITH_POD_RESOURCES,
                chart="use podResources.interval",
            ),
        ),
    ),
)

OPTIONS: dict[str, Option[Any]] = {o.key: o for g in GROUPS for o in g.options}
