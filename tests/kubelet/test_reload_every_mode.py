"""A live config reload through the real daemon, in every mode (issue 42).

A reload that added a resource ended the daemon in mode ``dra`` and ``both`` (a KeyError in
dra/plugin.py, exit 1); tests/unit/test_daemon.py covers the supervisor in process, this
the process the DaemonSet runs. One daemon per mode, never restarted, is given three
config changes, each read live: ``ate.dev/tun`` added (the file rewritten by a rename, as
config tools write), renamed ``ate.dev/tap`` on the same node (a symlink into another
directory renamed over the file, as the kubelet swaps a ConfigMap) and removed (that
symlink's target rewritten where the daemon watches nothing, then SIGHUP: only the signal
can have read it). After each: the same process runs and logged the reload and no error;
the kubelet's real device manager (the bench) serves exactly the configured resources
(device-plugin modes); the ResourceSlices in a real kube-apiserver hold devices of exactly
the configured resources, the kubelet's real DRA side having registered the driver (DRA
modes); /readyz is ready and /metrics has series of no other resource.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import apiserver
from tests.harness.apiserver import ApiServer
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import add_device_node
from tests.harness.faults import SpawnDaemon
from tests.harness.kubelet import KubeletBench, KubeletDra, Namespace
from tests.harness.require import missing, require_kubelet_bench
from tests.harness.wait import wait_until

pytestmark = pytest.mark.kubelet

# One release for the bench and the API server: the newest (consumable capacity on, so a
# resource publishes its shareable device besides its slots).
RELEASE = "1.37"
KVM, TUN, TAP = "ate.dev/kvm", "ate.dev/tun", "ate.dev/tap"
EVER = (KVM, TUN, TAP)
UNITS = 4096  # the config's default
SLOTS = 2
KVM_ONLY = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"
KVM_AND_TUN = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tun, devices: [/dev/net/tun]}]\n"
KVM_AND_TAP = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tap, devices: [/dev/net/tun]}]\n"
# Generous: each bounds only a hang (a reload is read within a second here).
SERVED_S = 60.0


@pytest.fixture
def kubelet_version() -> str:
    """The bench of one release (not every pinned one): this is about the daemon's reload."""
    require_kubelet_bench(RELEASE)
    return RELEASE


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """One API server for the module: each mode publishes for a Node of its own."""
    why = apiserver.missing(RELEASE)
    if why:
        missing(why)
    with ApiServer(tmp_path_factory.mktemp(f"apiserver-{RELEASE}"), RELEASE) as server:
        yield server


def replace(path: Path, text: str) -> None:
    """Writes ``path`` whole at once, as config tools do (a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def slice_resources(api: ApiServer, node: str) -> dict[str, int]:
    """Devices per resource (their ``resource`` attribute) in this node's slices of our driver."""
    found: dict[str, int] = {}
    for s in api.slices():
        if s["spec"].get("nodeName") != node or s["spec"]["driver"] != "ate.dev":
            continue
        for device in s["spec"].get("devices") or []:  # the API server drops an empty list
            name = device["attributes"]["resource"]["string"]
            found[name] = found.get(name, 0) + 1
    return found


def metrics_by_resource(d: DevicePluginDaemon) -> dict[str, dict[str, float]]:
    """The /metrics samples of each resource: {resource: {"name{other labels}": value}}."""
    found: dict[str, dict[str, float]] = {}
    for (name, labels), value in d.metrics().items():
        others = dict(labels)
        if resource := others.pop("resource_name", None):
            found.setdefault(resource, {})[f"{name}{others or ''}"] = value
    return found


def troubles(d: DevicePluginDaemon) -> list[str]:
    """Log lines that say something went wrong: an error, a task that died, a traceback."""
    bad = [
        f"{line.get('level')}: {line.get('msg')}"
        for line in d.log_lines()
        if line.get("level") in ("error", "critical") or "exc" in line or str(line.get("msg", "")).endswith(" died")
    ]
    return bad + (["a traceback in the log"] if "Traceback" in d.log_text() else [])


def reloads(d: DevicePluginDaemon) -> list[list[str]]:
    """The resource lists of the "config reloaded" log lines, in order."""
    return [list(line["resources"]) for line in d.log_lines() if line.get("msg") == "config reloaded"]


@pytest.mark.parametrize("mode", ["device-plugin", "dra", "both"])
def test_a_live_reload_adds_renames_and_removes_a_resource(
    mode: str,
    request: pytest.FixtureRequest,
    kubelet_ns: Namespace,
    device_root: Path,
    spawn_daemon: SpawnDaemon,
    tmp_path: Path,
) -> None:
    dp, dra = mode != "dra", mode != "device-plugin"
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    etc, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    etc.mkdir()
    elsewhere.mkdir()
    config = etc / "config.yaml"
    config.write_text(KVM_ONLY)
    kubelet: KubeletBench | None = request.getfixturevalue("kubelet") if dp else None
    api: ApiServer | None = request.getfixturevalue("api") if dra else None
    node = f"reload-{mode}"
    args = ["--mode", mode, "--config", str(config)]
    env: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        kubelet_dra: KubeletDra | None = None
        if api is not None:
            api.create_node(node)
            # The kubelet's own DRA side registers the driver (the daemon is ready only then).
            kubelet_dra = stack.enter_context(
                KubeletDra(RELEASE, api.kubeconfig(apiserver.ADMIN), node, tmp_path / "kubelet-dra")
            )
            args += ["--node-name", node, "--dra-slots", str(SLOTS), "--registry-dir", str(kubelet_dra.registry_dir),
                     "--dra-dir", str(tmp_path / "plugins" / "ate.dev")]  # fmt: skip
            env["KUBECONFIG"] = str(api.kubeconfig())
        d = spawn_daemon(device_root, ns=kubelet_ns, env=env, args=args)
        assert d.proc is not None
        pid = d.proc.pid
        if kubelet_dra is not None:
            kubelet_dra.request("wait_registered", driver="ate.dev", timeout_s=SERVED_S, timeout=SERVED_S + 30)

        def served(names: tuple[str, ...], step: str) -> None:
            """Every surface serves exactly ``names``; the process is the one started."""
            gone = [n for n in EVER if n not in names]
            if kubelet is not None:
                for name in names:
                    kubelet.wait(name, capacity=UNITS, allocatable=UNITS, timeout=SERVED_S)
                for name in gone:
                    # The device manager keeps a resource's capacity for its 5 minute grace
                    # period after the plugin left; nothing is allocatable at once.
                    if kubelet.capacity().of(name) != (0, 0):
                        kubelet.wait(name, allocatable=0, timeout=SERVED_S)
                sockets = {f"ate-{n.replace('.', '-').replace('/', '-')}.sock" for n in names}
                wait_until(lambda: set(kubelet_ns.sockets()) == {*sockets, "kubelet.sock"}, SERVED_S, "our sockets")
            if api is not None:
                # Per resource its shareable device and its slots, and no other resource.
                wanted = dict.fromkeys(names, SLOTS + 1)
                wait_until(
                    lambda: slice_resources(api, node) == wanted,
                    SERVED_S,
                    lambda: f"{step}: slices hold {slice_resources(api, node)}, not {wanted}",
                )
                wait_until(lambda: d.metric("ate_devplugin_dra_slices_in_sync") == 1, SERVED_S, "slices in sync")
            wait_until(
                lambda: set(metrics_by_resource(d)) == set(names),
                SERVED_S,
                lambda: (
                    f"{step}: /metrics has series of other resources than {names}: "
                    + str({r: m for r, m in metrics_by_resource(d).items() if r not in names})
                ),
            )
            wait_until(d.ready, SERVED_S, lambda: f"{step}: /readyz says {d.get('/readyz')[1].decode()!r}")
            assert d.proc is not None
            assert (d.running(), d.proc.pid, d.starts) == (True, pid, 1), f"{step}: not the process started"
            assert troubles(d) == [], f"{step}: {troubles(d)}"

        served((KVM,), "at start")

        def reloaded(n: int, names: tuple[str, ...], step: str) -> None:
            wait_until(
                lambda: len(reloads(d)) == n,
                SERVED_S,
                lambda: f"{step}: {len(reloads(d))} reloads logged, not {n}; troubles: {troubles(d)}",
            )
            assert reloads(d)[-1] == list(names)
            assert d.metric("ate_devplugin_config_reloads_total", result="success") == n
            assert d.metric("ate_devplugin_config_reloads_total", result="failure") == 0
            served(names, step)

        # (1) Added, by a file event: the file rewritten by a rename.
        replace(config, KVM_AND_TUN)
        reloaded(1, (KVM, TUN), "tun added")

        # (2) Renamed on the same node, by a file event: a symlink to a file in a directory the
        # daemon does not watch, renamed over the config (how the kubelet swaps a ConfigMap).
        (elsewhere / "config.yaml").write_text(KVM_AND_TAP)
        link = etc / ".config.yaml.link"
        link.symlink_to(elsewhere / "config.yaml")
        os.replace(link, config)
        reloaded(2, (KVM, TAP), "tun renamed tap")

        # (3) Removed, by SIGHUP alone: the symlink's target rewritten where no watch sees it.
        replace(elsewhere / "config.yaml", KVM_ONLY)
        d.proc.send_signal(signal.SIGHUP)
        reloaded(3, (KVM,), "tap removed")

        # kvm's KVM state outlived the reloads (a reload used to render it against the old list).
        assert d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="passed") == 1
        assert d.stop() == 0
