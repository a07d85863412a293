"""The plugins under test, each in its own private namespace with its own kubelet bench.

Every peer runs next to the same kubelet device manager (the same bench binary, one
process per peer) so that a figure compares plugins and nothing else:

* ``ours``: ate-devplugin, as the DaemonSet runs it (``python -m ate_devplugin run``).
* ``go-stub``: the kubelet's own Go stub device plugin (``plugin/v1beta1.Stub`` from
  ``k8s.io/kubernetes``), one process per resource, as upstream wrote it.
* ``go-stub-pref``: the same stub advertising GetPreferredAllocation, so that the
  kubelet makes the same two RPCs per admission it makes to ours.
* ``generic-device-plugin``: ``github.com/squat/generic-device-plugin`` (Go), the plugin
  people run for this job, from a binary built outside this repository (its path by
  ``--generic-device-plugin`` or ``ATE_BENCH_GENERIC_DEVICE_PLUGIN``); absent, its
  figures say so.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import DeviceNumber, add_device_node
from tests.harness.kubelet import PLUGIN_DIR, GoStubPlugin, KubeletBench, Namespace
from tests.harness.net import free_port, http_get
from tests.harness.process import stop_process
from tests.harness.wait import wait_until

UNITS = 4096
NULL = DeviceNumber(1, 3)  # every benchmark device node copies /dev/null's numbers
GDP_ENV = "ATE_BENCH_GENERIC_DEVICE_PLUGIN"
GDP = "generic-device-plugin"
SYNC_THREADS = 8  # the sync bare plugin's pool: one held by the ListAndWatch stream
BARE_PLUGIN = "bare-grpc-aio-plugin"
BARE_SYNC_PLUGIN = "bare-grpc-sync-plugin"


def gdp_binary() -> Path | None:
    """The generic-device-plugin binary the run was given, if any (never built here)."""
    value = os.environ.get(GDP_ENV, "")
    return Path(value) if value else None


def gdp_missing() -> str | None:
    """Why the generic-device-plugin peer cannot run (None: it can)."""
    path = gdp_binary()
    if path is None:
        return f"no binary given (--generic-device-plugin PATH or {GDP_ENV})"
    if not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    return None


def resource_names(prefix: str, count: int) -> list[str]:
    """``count`` resource names: ``<prefix>/kvm`` alone, or ``<prefix>/r0`` ... when several."""
    return [f"{prefix}/kvm"] if count == 1 else [f"{prefix}/r{i}" for i in range(count)]


class Plugin(ABC):
    """One peer's process(es) serving ``resources`` in ``ns``."""

    key: str
    label: str

    def __init__(self, ns: Namespace, resources: Sequence[str], units: int, work: Path) -> None:
        self.ns = ns
        self.resources = list(resources)
        self.units = units
        self.work = work

    @property
    def resource(self) -> str:
        return self.resources[0]

    @abstractmethod
    def spawn(self) -> None:
        """Start the process(es) and return at once (registration happens on its own)."""

    @abstractmethod
    def started(self) -> None:
        """Return once the process(es) started by :meth:`spawn` are up (not necessarily registered)."""

    @abstractmethod
    def stop(self) -> None:
        """Graceful stop (SIGTERM): streams end, sockets go."""

    @property
    @abstractmethod
    def pids(self) -> list[int]:
        """The processes whose cost is the peer's cost."""

    @property
    @abstractmethod
    def socket(self) -> str:
        """Namespace path of the first resource's plugin socket."""

    # Figures a peer cannot produce say why (None: it can).
    def cannot_remove_devices(self) -> str | None:
        return None

    def cannot_scrape_metrics(self) -> str | None:
        return None

    def metrics_port(self) -> int | None:
        return None

    def start(self) -> Self:
        self.spawn()
        self.started()
        return self


class OneProcessPlugin(Plugin):
    """A peer that is one process (``proc``, set by :meth:`spawn`)."""

    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []


class DeviceNodes:
    """One device node per resource under ``work/dev`` (numbers of /dev/null), which the
    bench removes and restores to play a device going away and coming back."""

    def make_nodes(self, resources: Sequence[str], work: Path) -> None:
        self.device_root = work / "dev"
        self.nodes = {r: f"bench/{r.rsplit('/', 1)[1]}" for r in resources}
        for node in self.nodes.values():
            add_device_node(self.device_root, node, NULL)
        self.first = resources[0]

    def node_path(self, resource: str | None = None) -> Path:
        return self.device_root / self.nodes[resource or self.first]

    def remove_node(self, resource: str | None = None) -> None:
        self.node_path(resource).unlink()

    def restore_node(self, resource: str | None = None) -> None:
        add_device_node(self.device_root, self.nodes[resource or self.first], NULL)


class OurDaemon(Plugin, DeviceNodes):
    key = "ours"
    label = "ate-devplugin (Python)"

    def __init__(
        self,
        ns: Namespace,
        resources: Sequence[str],
        units: int,
        work: Path,
        *,
        otlp_endpoint: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(ns, resources, units, work)
        self.make_nodes(self.resources, work)
        entries = []
        for r in self.resources:
            entries.append(f"  - name: {r}\n    devices: [/dev/{self.nodes[r]}]\n    units: {units}\n")
        self.daemon = DevicePluginDaemon(
            self.device_root,
            work / "daemon",
            ns=ns,
            config="resources:\n" + "".join(entries),
            args=["--log-level", "info", *args],
        )
        # Tracing only when asked: never inherit an endpoint from the caller's environment.
        for var in [v for v in self.daemon.env if v.startswith("OTEL_")]:
            del self.daemon.env[var]
        self.daemon.env.update(env or {})
        if otlp_endpoint:
            self.daemon.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
            self.daemon.env["OTEL_SERVICE_NAME"] = "ate-devplugin-bench"

    def spawn(self) -> None:
        self.daemon.port = free_port()
        self.daemon.spawn()

    def started(self) -> None:
        self.daemon.wait_healthy()

    def stop(self) -> None:
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop(signal.SIGTERM)

    @property
    def pids(self) -> list[int]:
        p = self.daemon.proc
        return [p.pid] if p is not None and p.poll() is None else []

    @property
    def socket(self) -> str:
        name = "ate-" + self.resource.replace("/", "-").replace(".", "-") + ".sock"
        return f"{PLUGIN_DIR}/{name}"

    def metrics_port(self) -> int | None:
        port: int = self.daemon.port
        return port


class GenericDevicePlugin(OneProcessPlugin, DeviceNodes):
    """squat/generic-device-plugin serving the same job as ours: each resource
    ``<domain>/<name>`` is one device node, shared ``units`` times (its ``count``),
    mounted at ``/dev/<name>``. It looks only at the namespace's kubelet directory and
    a clean environment (it reads settings from any environment variable of a flag's
    name, and from ``./config.yaml``: the working directory is the run's own)."""

    key = GDP
    label = "squat/generic-device-plugin (Go)"

    def __init__(self, ns: Namespace, resources: Sequence[str], units: int, work: Path) -> None:
        super().__init__(ns, resources, units, work)
        binary = gdp_binary()
        why = gdp_missing()
        if binary is None or why is not None:
            raise RuntimeError(f"generic-device-plugin: {why}")
        self.binary = binary
        self.make_nodes(self.resources, work)
        domains = {r.split("/", 1)[0] for r in self.resources}
        if len(domains) != 1:
            raise ValueError("generic-device-plugin serves one domain per process")
        self.argv: list[str] = [str(binary), "--domain", domains.pop(), "--plugin-directory", PLUGIN_DIR]
        for r in self.resources:
            name = r.rsplit("/", 1)[1]
            group = {"count": units, "paths": [{"path": str(self.node_path(r)), "mountPath": f"/dev/{name}"}]}
            self.argv += ["--device", json.dumps({"name": name, "groups": [group]})]
        self.port = 0
        self.log_path = work / "logs" / "generic-device-plugin.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def spawn(self) -> None:
        self.port = free_port()
        argv = [*self.argv, "--listen", f"127.0.0.1:{self.port}", "--log-level", "info"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        with self.log_path.open("ab") as log:
            self.proc = self.ns.spawn(argv, cwd=self.work, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)

    def started(self) -> None:
        """Until its /health answers (it serves that before its plugin sockets)."""

        def healthy() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"generic-device-plugin exited:\n{self.log_path.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                return http_get(f"http://127.0.0.1:{self.port}/health", timeout=5)[0] == 200
            return False

        wait_until(healthy, 30, "generic-device-plugin /health")

    @property
    def socket(self) -> str:
        """Its socket is ``gdp-<base64 of the resource>-<start time>.sock``."""
        prefix = "gdp-" + base64.b64encode(self.resource.encode()).decode()
        names = [n for n in self.ns.sockets() if n.startswith(prefix + "-")]
        if not names:
            raise RuntimeError(f"no socket {prefix}-*.sock in {PLUGIN_DIR}")
        return f"{PLUGIN_DIR}/{max(names)}"


class GoStub(Plugin):
    key = "go-stub"
    label = "kubelet Go stub"
    preferred = False

    def __init__(self, ns: Namespace, resources: Sequence[str], units: int, work: Path, *, version: str) -> None:
        super().__init__(ns, resources, units, work)
        self.stubs = [
            GoStubPlugin(ns, version, r, devices=units, preferred=self.preferred, verbosity=0, log_dir=work / "logs")
            for r in self.resources
        ]

    def spawn(self) -> None:
        # The stub reports "ready" only once registered; start() waits for that line.
        # Several resources are started one after another, each blocking until registered.
        for stub in self.stubs:
            stub.start()

    def started(self) -> None:
        return None

    def stop(self) -> None:
        for stub in self.stubs:
            stub.stop()

    @property
    def pids(self) -> list[int]:
        return [p for p in (s.pid for s in self.stubs) if p is not None]

    @property
    def socket(self) -> str:
        socket: str = self.stubs[0].socket
        return socket

    def cannot_remove_devices(self) -> str | None:
        return "no device files: the stub advertises a fixed list and only changes health when told"

    def cannot_scrape_metrics(self) -> str | None:
        return "no metrics endpoint"


class GoStubPreferred(GoStub):
    key = "go-stub-pref"
    label = "kubelet Go stub + GetPreferredAllocation"
    preferred = True


class BarePlugin(OneProcessPlugin):
    """``bench.bare_grpc plugin``: the least a Python device plugin on grpc.aio does
    (see there); the floor under each of our figures."""

    key = BARE_PLUGIN
    label = "bare grpc.aio device plugin (Python floor)"

    def __init__(self, ns: Namespace, resources: Sequence[str], units: int, work: Path) -> None:
        super().__init__(ns, resources, units, work)
        if len(self.resources) != 1:
            raise ValueError("the bare plugin serves one resource")

    def spawn(self) -> None:
        repo = Path(__file__).resolve().parents[1]
        path = os.pathsep.join([str(repo), str(repo / "app"), os.environ.get("PYTHONPATH", "")])
        argv = [sys.executable, "-m", "bench.bare_grpc", "plugin", self.socket, self.resource, str(self.units)]
        self.proc = self.ns.spawn(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path}
        )

    def started(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"bench.bare_grpc plugin did not start (exit {self.proc.poll()})")

    @property
    def socket(self) -> str:
        return f"{PLUGIN_DIR}/bare-plugin.sock"

    def cannot_remove_devices(self) -> str | None:
        return "sends its list once and never looks at devices"


class BareSyncPlugin(BarePlugin):
    """``bench.bare_grpc plugin-sync``: the bare plugin on gRPC's synchronous server with a
    thread pool, next to the aio one: what serving the calls another way would change."""

    key = BARE_SYNC_PLUGIN
    label = f"bare grpc sync-server device plugin ({SYNC_THREADS} threads)"

    def spawn(self) -> None:
        repo = Path(__file__).resolve().parents[1]
        path = os.pathsep.join([str(repo), str(repo / "app"), os.environ.get("PYTHONPATH", "")])
        argv = [sys.executable, "-m", "bench.bare_grpc", "plugin-sync", self.socket, self.resource]
        argv += [str(self.units), str(SYNC_THREADS)]
        self.proc = self.ns.spawn(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path}
        )


class BarePeer:
    """An idle baseline (``bench.bare_grpc``) inside ``ns``: the bare server alone, or
    with a client process holding a stream open (that client is not measured)."""

    def __init__(self, ns: Namespace, *, held_stream: bool = False) -> None:
        self.ns = ns
        self.held_stream = held_stream
        self.key = "bare-grpc-aio-stream" if held_stream else "bare-grpc-aio"
        self.label = PEER_LABELS[self.key]
        self.socket = f"{PLUGIN_DIR}/{self.key}.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: subprocess.Popen[bytes] | None = None

    def _spawn(self, mode: str) -> subprocess.Popen[bytes]:
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, "-m", "bench.bare_grpc", mode, self.socket]
        proc: subprocess.Popen[bytes] = self.ns.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"bench.bare_grpc {mode} did not start (exit {proc.poll()})")
        return proc

    def start(self) -> Self:
        self.proc = self._spawn("serve")
        if self.held_stream:
            self.client = self._spawn("hold")
        return self

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []

    def stop(self) -> None:
        for proc in (self.client, self.proc):
            if proc is not None:
                stop_process(proc)


class Env:
    """A fresh namespace, a kubelet bench (manager started) and one peer in it.

    ``pod_resources``: the kubelet bench serves its PodResources API too (1.35+);
    ``daemon_args``, ``daemon_env``: more arguments and variables for ours (a ``PYTHONPATH``
    runs another checkout's daemon)."""

    def __init__(
        self,
        peer: str,
        version: str,
        *,
        resources: int = 1,
        units: int = UNITS,
        otlp_endpoint: str | None = None,
        work_root: Path | None = None,
        pod_resources: bool = False,
        daemon_args: Sequence[str] = (),
        daemon_env: Mapping[str, str] | None = None,
    ) -> None:
        self.peer_key = peer
        self.version = version
        self.work = Path(tempfile.mkdtemp(prefix=f"bench-{peer}-", dir=work_root))
        self.ns = Namespace()
        self.kubelet: KubeletBench | None = None
        self.plugin: Plugin | None = None
        self._resources = resources
        self._units = units
        self._otlp = otlp_endpoint
        self._pod_resources = pod_resources
        self._daemon_args = tuple(daemon_args)
        self._daemon_env = dict(daemon_env or {})

    def open(self, *, start_plugin: bool = True) -> Self:
        self.ns.open()
        self.kubelet = KubeletBench(
            self.ns, self.version, verbosity=0, log_dir=self.work / "logs", pod_resources=self._pod_resources
        )
        self.kubelet.start()
        ours_domain = self.peer_key in ("ours", GDP, BARE_PLUGIN, BARE_SYNC_PLUGIN)
        names = resource_names("ate.dev" if ours_domain else "example.com", self._resources)
        self.plugin = make_plugin(
            self.peer_key,
            self.ns,
            names,
            self._units,
            self.work,
            self.version,
            self._otlp,
            self._daemon_args,
            self._daemon_env,
        )
        if start_plugin:
            self.plugin.start()
            self.wait_full()
        return self

    @property
    def k(self) -> KubeletBench:
        assert self.kubelet is not None
        return self.kubelet

    @property
    def p(self) -> Plugin:
        assert self.plugin is not None
        return self.plugin

    def wait_full(self, timeout: float = 120.0) -> None:
        for r in self.p.resources:
            self.k.wait(r, capacity=self.p.units, allocatable=self.p.units, timeout=timeout)

    def close(self) -> None:
        if self.plugin is not None:
            with contextlib.suppress(Exception):
                self.plugin.stop()
        if self.kubelet is not None:
            with contextlib.suppress(Exception):
                self.kubelet.close()
        self.ns.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def make_plugin(
    key: str,
    ns: Namespace,
    resources: Sequence[str],
    units: int,
    work: Path,
    version: str,
    otlp_endpoint: str | None = None,
    daemon_args: Sequence[str] = (),
    daemon_env: Mapping[str, str] | None = None,
) -> Plugin:
    if key == "ours":
        return OurDaemon(ns, resources, units, work, otlp_endpoint=otlp_endpoint, args=daemon_args, env=daemon_env)
    if key == "go-stub":
        return GoStub(ns, resources, units, work, version=version)
    if key == "go-stub-pref":
        return GoStubPreferred(ns, resources, units, work, version=version)
    if key == GDP:
        return GenericDevicePlugin(ns, resources, units, work)
    if key == BARE_PLUGIN:
        return BarePlugin(ns, resources, units, work)
    if key == BARE_SYNC_PLUGIN:
        return BareSyncPlugin(ns, resources, units, work)
    raise ValueError(f"unknown peer {key!r}")


PEER_LABELS: Mapping[str, str] = {
    OurDaemon.key: OurDaemon.label,
    GoStub.key: GoStub.label,
    GoStubPreferred.key: GoStubPreferred.label,
    GenericDevicePlugin.key: GenericDevicePlugin.label,
    BarePlugin.key: BarePlugin.label,
    BareSyncPlugin.key: BareSyncPlugin.label,
    "bare-grpc-aio": "bare grpc.aio server (no services)",
    "bare-grpc-aio-stream": "bare grpc.aio server, one stream held open",
    "ours-tracing": "ate-devplugin, tracing on (OTLP)",
    "ours-restarted": "ate-devplugin after 12 kubelet restarts",
    f"{GDP}-restarted": "generic-device-plugin after 12 kubelet restarts",
}


def describe(obj: Any) -> str:
    return getattr(obj, "label", type(obj).__name__)
