"""Daemon settings: command-line flags over environment variables over defaults.

:class:`Settings` is the whole; each subsystem gets only its own frozen part from it
(``Settings.for_device_plugin()``, ``for_pod_resources()``, ``for_dra()``, ``for_daemon()``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ate_devplugin.config import (
    ALLOCATE_DEVICES,
    DEFAULT_UNITS,
    ConfigError,
    Problem,
    Problems,
    ResourceConfig,
    socket_name,
)

T = TypeVar("T")

ENV_PREFIX = "ATE_DEVPLUGIN_"
# The DRA driver name: one driver for every configured resource (see docs/dra.md).
DRA_DRIVER = "ate.dev"
MODES = ("device-plugin", "dra", "both")
MAX_DRA_SLOTS = 1024
# capacity: a shareable device per resource where the API server keeps it, plus the slots;
# slots: the slots only (docs/dra.md, "Sharing one /dev/kvm").
DRA_SHARING = ("capacity", "slots")
DEFAULTS = {
    "config": "",
    "device_root": "/dev",
    "plugin_dir": "/var/lib/kubelet/device-plugins",
    "metrics_address": "0.0.0.0:9477",
    "log_format": "auto",
    "log_level": "info",
    "cdi_dir": "/var/run/cdi",
    # A suffix of the device plugin sockets' names (the chart passes the pod's UID on
    # Kubernetes 1.37+, whose kubelet keeps one endpoint per socket): two plugin pods can
    # then serve a node at once while a rolling update overlaps them.
    "socket_suffix": "",
    # --- DRA (mode dra or both) ---
    "mode": "device-plugin",
    "node_name": "",  # falls back to NODE_NAME, which the chart sets from the downward API
    "registry_dir": "/var/lib/kubelet/plugins_registry",
    "dra_dir": "/var/lib/kubelet/plugins/" + DRA_DRIVER,
    "dra_slots": "32",
    "dra_sharing": "capacity",
    # Which pods hold units, from the kubelet's PodResources API: on or off (off: the
    # fallback Lists cost measurable idle CPU, see README); its socket
    # (empty: pod-resources/kubelet.sock next to the plugin directory); the fallback
    # interval in seconds (0: only on the kubelet's checkpoint writes and health changes).
    "pod_resources": "off",
    "pod_resources_socket": "",
    "pod_resources_interval": "60",
}
SOCKET_SUFFIX = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]{0,63})?")
LOG_FORMATS = ("auto", "json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")
KUBELET_SOCKET = "kubelet.sock"
POD_RESOURCES_DIR = "pod-resources"  # next to the device-plugins directory in the kubelet's root
# Written by the kubelet's device manager in the plugin directory.
CHECKPOINT = "kubelet_internal_checkpoint"
MAX_INTERVAL_S = 86400.0


@dataclass(frozen=True)
class Timing:
    """Every timing knob of the lifecycle, in seconds: one place, so tests can shrink them."""

    # Registered but the kubelet opened no stream (or dropped it) without restarting:
    # wait this long for a restart before registering again.
    stream_grace_s: float = 5.0
    # The kubelet dials us back within Register with a 10 s timeout; allow it that and a margin.
    register_timeout_s: float = 12.0
    backoff_initial_s: float = 0.02
    backoff_cap_s: float = 30.0
    # gRPC server stop: grace for open calls, then this margin before giving up on it.
    server_stop_grace_s: float = 1.0
    server_stop_margin_s: float = 0.5
    # Stopping one agent (its task, then its server) takes at most this long.
    agent_stop_s: float = 2.5
    # Reading and decoding a changed config file, in a worker thread.
    reload_timeout_s: float = 5.0
    # ... once its new content stayed the same this long (a torn write is not judged).
    reload_settle_s: float = 0.2
    # A batch of events not handled within this long is a stall: /healthz fails.
    event_deadline_s: float = 10.0
    # After a stop signal: agents, watcher and server are down within this long ...
    shutdown_deadline_s: float = 3.0
    # ... and spans flushed within this long (5 s in all, the chart grants 10 s).
    trace_flush_s: float = 1.5
    # PodResources: at most one List this often while events keep coming, each this long at most.
    pod_resources_debounce_s: float = 0.5
    pod_resources_timeout_s: float = 5.0


@dataclass(frozen=True)
class DevicePluginSettings:
    """The device plugin's part: the kubelet's socket directory and the agents' timing."""

    plugin_dir: str
    socket_suffix: str
    stream_grace_s: float
    register_timeout_s: float
    backoff_initial_s: float
    backoff_cap_s: float
    server_stop_grace_s: float
    server_stop_margin_s: float
    agent_stop_s: float

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    def socket_path(self, resource: ResourceConfig) -> str:
        return os.path.join(self.plugin_dir, socket_name(resource.name, self.socket_suffix))


@dataclass(frozen=True)
class PodResourcesSettings:
    """Which pods hold units: the kubelet's PodResources socket, how often to List without
    being asked, and the device manager's checkpoint whose rewrites ask (None: not watched)."""

    socket: str
    interval_s: float
    debounce_s: float
    timeout_s: float
    checkpoint: str | None


@dataclass(frozen=True)
class DraSettings:
    """The DRA driver's part: this node, the kubelet's plugin directories, how devices are shared."""

    node_name: str
    registry_dir: str
    dra_dir: str
    slots: int
    sharing: str = DEFAULTS["dra_sharing"]
    driver: str = DRA_DRIVER

    @property
    def socket(self) -> str:
        return os.path.join(self.dra_dir, "dra.sock")

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver}-reg.sock")


@dataclass(frozen=True)
class DaemonSettings:
    """The supervisor's part: where devices are found, and its deadlines."""

    device_root: str
    event_deadline_s: float
    shutdown_deadline_s: float


@dataclass(frozen=True)
class Settings:
    """Everything resolved; each subsystem is handed only its own part (``for_*``)."""

    config: Path | None
    device_root: str
    plugin_dir: str
    metrics_host: str
    metrics_port: int
    log_format: str
    log_level: str
    timing: Timing = field(default_factory=Timing)
    # Where the daemon writes the CDI specs of resources that answer Allocate with CDI names.
    cdi_dir: str = DEFAULTS["cdi_dir"]
    socket_suffix: str = ""
    # --- DRA (mode dra or both) ---
    mode: str = DEFAULTS["mode"]
    node_name: str = ""
    registry_dir: str = DEFAULTS["registry_dir"]
    dra_dir: str = DEFAULTS["dra_dir"]
    dra_slots: int = int(DEFAULTS["dra_slots"])
    dra_sharing: str = DEFAULTS["dra_sharing"]
    # --- which pods hold units (PodResources) ---
    pod_resources: bool = False
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pod_resources_interval_s: float = 60.0
    # Settings given that do nothing in this mode: warned about at start.
    idle: tuple[Problem, ...] = ()

    def warnings(self, resources: Sequence[ResourceConfig]) -> list[Problem]:
        """What was set but does nothing here: these settings, then the config's fields."""
        return [*self.idle, *idle_fields(resources, self.mode)]

    @property
    def device_plugin(self) -> bool:
        return self.mode != "dra"

    @property
    def dra(self) -> bool:
        return self.mode != "device-plugin"

    @property
    def dra_socket(self) -> str:
        return self.for_dra().socket

    @property
    def registration_socket(self) -> str:
        return self.for_dra().registration_socket

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    def for_device_plugin(self) -> DevicePluginSettings:
        t = self.timing
        return DevicePluginSettings(
            plugin_dir=self.plugin_dir,
            socket_suffix=self.socket_suffix,
            stream_grace_s=t.stream_grace_s,
            register_timeout_s=t.register_timeout_s,
            backoff_initial_s=t.backoff_initial_s,
            backoff_cap_s=t.backoff_cap_s,
            server_stop_grace_s=t.server_stop_grace_s,
            server_stop_margin_s=t.server_stop_margin_s,
            agent_stop_s=t.agent_stop_s,
        )

    def for_pod_resources(self) -> PodResourcesSettings:
        return PodResourcesSettings(
            socket=self.pod_resources_socket,
            interval_s=self.pod_resources_interval_s,
            debounce_s=self.timing.pod_resources_debounce_s,
            timeout_s=self.timing.pod_resources_timeout_s,
            # Rewritten when units are allocated, so pods are read again; only the device
            # plugin watches its directory.
            checkpoint=os.path.join(self.plugin_dir, CHECKPOINT) if self.device_plugin else None,
        )

    def for_dra(self) -> DraSettings:
        return DraSettings(self.node_name, self.registry_dir, self.dra_dir, self.dra_slots, self.dra_sharing)

    def for_daemon(self) -> DaemonSettings:
        t = self.timing
        return DaemonSettings(self.device_root, t.event_deadline_s, t.shutdown_deadline_s)


def flag_of(key: str) -> str:
    return "--" + key.replace("_", "-")


def variable_of(key: str) -> str:
    return ENV_PREFIX + key.upper()


def resolve(flags: Mapping[str, str | None], env: Mapping[str, str]) -> Settings:
    """Flags (None when not given) win over ATE_DEVPLUGIN_* variables, which win over defaults.

    Raises ConfigError with every bad value, each named as the user set it (``--mode``,
    ``ATE_DEVPLUGIN_MODE``); ``Settings.idle`` holds those given that do nothing here."""
    given: dict[str, str] = {}  # key -> the flag or variable that set it

    def pick(key: str) -> str:
        flag = flags.get(key)
        if flag is not None:
            given[key] = flag_of(key)
            return flag
        if variable_of(key) in env:
            given[key] = variable_of(key)
            return env[variable_of(key)]
        return DEFAULTS[key]

    def name(key: str) -> str:
        return given.get(key, flag_of(key))

    problems = Problems()

    def checked(key: str, check: Callable[[str, str], T], fallback: T) -> T:
        with problems.gathered():
            return check(pick(key), name(key))
        return fallback

    device_root = checked("device_root", _absolute_dir, "/")
    plugin_dir = checked("plugin_dir", _absolute_dir, "/")
    host, port = checked("metrics_address", _address, ("", 0))
    log_format = checked("log_format", _one_of(LOG_FORMATS), "")
    log_level = checked("log_level", _one_of(LOG_LEVELS), "")
    config = pick("config")
    suffix = checked("socket_suffix", _socket_suffix, "")
    mode = checked("mode", _one_of(MODES), "")
    node_name = pick("node_name") or env.get("NODE_NAME", "")
    if mode in ("dra", "both") and not node_name:
        problems.add(
            ConfigError(
                name("node_name"),
                f"is required in mode {mode}: set NODE_NAME (downward API), {variable_of('node_name')} or --node-name",
            )
        )
    slots = checked("dra_slots", _slots, 0)
    sharing = checked("dra_sharing", _one_of(DRA_SHARING), "")
    pod_resources = checked("pod_resources", _one_of(("on", "off")), "") == "on"
    pod_socket = checked("pod_resources_socket", _absolute_or_empty, "") or os.path.join(
        os.path.dirname(plugin_dir), POD_RESOURCES_DIR, KUBELET_SOCKET
    )
    interval = checked("pod_resources_interval", _seconds, 0.0)
    cdi_dir = checked("cdi_dir", _absolute_dir, "/")
    registry_dir = checked("registry_dir", _absolute_dir, "/")
    dra_dir = checked("dra_dir", _absolute_dir, "/")
    problems.raise_any()
    return Settings(
        config=Path(config).absolute() if config else None,
        device_root=device_root,
        plugin_dir=plugin_dir,
        metrics_host=host,
        metrics_port=port,
        log_format=log_format,
        log_level=log_level,
        cdi_dir=cdi_dir,
        socket_suffix=suffix,
        mode=mode,
        node_name=node_name,
        registry_dir=registry_dir,
        dra_dir=dra_dir,
        dra_slots=slots,
        dra_sharing=sharing,
        pod_resources=pod_resources,
        pod_resources_socket=os.path.normpath(pod_socket),
        pod_resources_interval_s=interval,
        idle=tuple(_idle_settings(mode, pod_resources, given)),
    )


def mode_of(flag: str | None, env: Mapping[str, str]) -> str:
    """The mode alone (check-config judges a file for it); raises ConfigError."""
    if flag is not None:
        return _one_of(MODES)(flag, flag_of("mode"))
    return _one_of(MODES)(env.get(variable_of("mode"), DEFAULTS["mode"]), variable_of("mode"))


# --- settings that do nothing: warnings, not errors ------------------------------------

_DRA_ONLY = ("node_name", "registry_dir", "dra_dir", "dra_slots")
_POD_RESOURCES_ONLY = ("pod_resources_socket", "pod_resources_interval")


def _idle_settings(mode: str, pod_resources: bool, given: Mapping[str, str]) -> Iterator[Problem]:
    if mode == "device-plugin":
        for key in (k for k in _DRA_ONLY if k in given):
            yield Problem(
                given[key], "does nothing in mode device-plugin: only the DRA driver (--mode dra or both) uses it"
            )
    if not pod_resources:
        switch = given.get("pod_resources", flag_of("pod_resources"))
        for key in (k for k in _POD_RESOURCES_ONLY if k in given):
            yield Problem(given[key], f"does nothing while {switch} is off")


def idle_fields(resources: Sequence[ResourceConfig], mode: str) -> Iterator[Problem]:
    """The config's fields that do nothing in this mode."""
    for i, r in enumerate(resources):
        where = f"resources[{i}]"
        if mode == "device-plugin" and not r.uses_cdi and (r.cdi_file_mode, r.cdi_uid, r.cdi_gid) != (None,) * 3:
            yield Problem(
                f"{where}.cdi",
                f"does nothing with allocate: {ALLOCATE_DEVICES} in mode device-plugin: no CDI spec is written",
                "set allocate: cdi or both to answer with the CDI device",
            )
        if mode == "dra":
            if r.preferred_allocation:
                yield Problem(
                    f"{where}.preferred_allocation",
                    "does nothing in mode dra: only the device plugin answers GetPreferredAllocation",
                )
            if r.uses_cdi:
                yield Problem(
                    f"{where}.allocate",
                    "does nothing in mode dra: it says how the device plugin answers Allocate "
                    "(the DRA driver always hands out the CDI device)",
                )
            if r.units != DEFAULT_UNITS:
                yield Problem(
                    f"{where}.units",
                    "does nothing in mode dra: the DRA driver publishes --dra-slots slots per resource",
                )


# --- one check per kind of value: the text given and the name it was given by ----------


def _one_of(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def check(value: str, name: str) -> str:
        if value.lower() not in choices:
            raise ConfigError(name, f"must be one of {', '.join(choices)} (got {value!r})")
        return value.lower()

    return check


def _absolute_dir(value: str, name: str) -> str:
    if not value.startswith("/"):
        raise ConfigError(name, f"must be an absolute path (got {value!r})")
    return os.path.normpath(value)


def _absolute_or_empty(value: str, name: str) -> str:
    return _absolute_dir(value, name) if value else ""


def _address(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(name, f"must be HOST:PORT with a port from 0 to 65535 (got {value!r})")
    return host.strip("[]") or "0.0.0.0", int(port)


def _socket_suffix(value: str, name: str) -> str:
    if not SOCKET_SUFFIX.fullmatch(value):
        raise ConfigError(name, f"must be up to 64 letters, digits and '-', not starting with '-' (got {value!r})")
    return value


def _slots(value: str, name: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_DRA_SLOTS:
        raise ConfigError(name, f"must be an integer from 1 to {MAX_DRA_SLOTS} (got {value!r})")
    return int(value)


def _seconds(value: str, name: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_INTERVAL_S:  # also refuses nan
        raise ConfigError(name, f"must be a number of seconds from 0 to {MAX_INTERVAL_S:.0f} (got {value!r})")
    return seconds
