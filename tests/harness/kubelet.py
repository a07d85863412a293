"""The kubelet's real device manager as a test peer, in a private mount namespace.

Three pieces, all driven from pytest:

* :class:`Namespace`: a private mount namespace with a tmpfs over ``/var/lib`` and an
  empty ``/var/lib/kubelet/device-plugins``. The kubelet socket path is hard-wired
  upstream, so everything kubelet-side runs in here and the host's ``/var/lib`` is never
  touched. :meth:`Namespace.spawn` starts any process inside (our daemon, the Go stub);
  :meth:`Namespace.path` maps a path inside to one the test process can open.
* :class:`KubeletBench`: our Go program ``tests/kubelet_bench`` (built by
  ``tools/build-kubelet-bench.sh``) that embeds ``k8s.io/kubernetes/pkg/kubelet/cm/
  devicemanager`` of a pinned release and answers JSON lines. A kubelet restart is
  :meth:`KubeletBench.restart`: by default the process is killed and a new one started
  in the same namespace (the checkpoint file carries allocations over), which is what a
  real restart looks like to a plugin.
* :class:`GoStubPlugin`: the kubelet's own Go stub device plugin (``plugin/v1beta1.Stub``)
  as a peer, from the same binary.
* :class:`KubeletDra`: the kubelet's DRA side (``kubelet-bench dra``, 1.35+: its DRA
  manager and plugin manager, and optionally its PodResources API) against an API server.

Typical use::

    with Namespace() as ns, KubeletBench(ns, "1.37") as kubelet:
        kubelet.start()
        with GoStubPlugin(ns, "1.37", "example.com/foo", devices=3):
            kubelet.wait("example.com/foo", allocatable=3)
            alloc = kubelet.allocate("pod-1", "main", {"example.com/foo": 1})

Needs root (``unshare -m``, ``mount``, ``nsenter`` from util-linux).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypedDict, Unpack

from tests.harness.process import stop_process

__all__ = [
    "CHECKPOINT_FILE",
    "KNOWN_VERSIONS",
    "KUBELET_SOCKET",
    "PLUGIN_DIR",
    "POD_RESOURCES_SOCKET",
    "BenchError",
    "Capacity",
    "ContainerAllocation",
    "DeviceSpec",
    "GoStubPlugin",
    "KubeletBench",
    "KubeletDra",
    "Mount",
    "Namespace",
    "PendingWait",
    "PodSpec",
    "WaitResult",
    "WaitTimeoutError",
    "bench_binary",
    "bench_dir",
    "built_versions",
    "missing_prerequisites",
]

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = f"{PLUGIN_DIR}/kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
#: Where the bench serves the kubelet's PodResources API when asked: where our daemon
#: looks by default (beside the plugin directory).
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: Kubernetes releases the bench is pinned to (tests/kubelet_bench/go1NN.mod): the oldest
#: supported (chart/Chart.yaml kubeVersion), the one the e2e cluster runs, and the newest.
KNOWN_VERSIONS: tuple[str, ...] = ("1.29", "1.35", "1.37")

_REPO_ROOT = Path(__file__).resolve().parents[2]

#: A pod the bench treats as active: a UID, or {"uid": ..., "containers": {name: {res: n}},
#: "init_containers": {...}, "name": ..., "namespace": ...}.
PodSpec = str | Mapping[str, Any]


def bench_dir() -> Path:
    """Where the bench binaries are: ``$KUBELET_BENCH_DIR`` or ``build/kubelet-bench``."""
    env = os.environ.get("KUBELET_BENCH_DIR")
    return Path(env) if env else _REPO_ROOT / "build" / "kubelet-bench"


def bench_binary(version: str) -> Path:
    """Path of the bench binary for ``version`` (e.g. ``"1.37"``); it may not exist."""
    return bench_dir() / f"kubelet-bench-{version}"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def built_versions() -> list[str]:
    """Releases whose bench binary is built, oldest first."""
    return sorted(
        (v for v in KNOWN_VERSIONS if os.access(bench_binary(v), os.X_OK)),
        key=_version_key,
    )


def missing_prerequisites() -> str | None:
    """Why the bench cannot run here (None when it can): needs root, unshare, nsenter."""
    if os.geteuid() != 0:
        return "the kubelet bench needs root (private mount namespace, tmpfs mount)"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) not found"
    return None


class BenchError(RuntimeError):
    """The bench (or the stub) answered an error, or died."""

    def __init__(self, message: str, response: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.response: dict[str, Any] = dict(response or {})


class WaitTimeoutError(BenchError, TimeoutError):
    """A :meth:`KubeletBench.wait` condition did not hold in time."""


class WaitFor(TypedDict, total=False):
    """What :meth:`KubeletBench.wait` waits for (at least one of the first three), how
    long, and how often the bench polls."""

    capacity: int | None
    allocatable: int | None
    present: bool | None
    timeout: float  # default 10 s
    interval: float  # default 1 ms


# ---------------------------------------------------------------------------
# JSON lines over a child's stdin/stdout


class _JsonLineChannel:
    """Reads a child's stdout line by line on a thread; writes requests to its stdin."""

    _EOF = object()

    def __init__(self, proc: subprocess.Popen[bytes], name: str) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc = proc
        self._stdin: IO[bytes] = proc.stdin
        self._lines: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), name=f"{name}-stdout", daemon=True)
        self._thread.start()

    def _pump(self, stdout: IO[bytes]) -> None:
        try:
            for raw in stdout:
                line = raw.strip()
                if line:
                    self._lines.put(line)
        finally:
            self._lines.put(self._EOF)

    def send(self, msg: Mapping[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        try:
            self._stdin.write(data)
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise BenchError(f"cannot write to child (exited with {self._proc.poll()})") from exc

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer within {timeout:.1f}s") from None
        if item is self._EOF:
            self._lines.put(self._EOF)  # stays at EOF for later readers
            try:
                rc = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
            raise BenchError(f"child closed its stdout (exit code {rc})")
        assert isinstance(item, bytes)
        value = json.loads(item)
        if not isinstance(value, dict):
            raise BenchError(f"unexpected line from child: {item!r}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------------------
# The mount namespace


class Namespace:
    """A private mount namespace with a tmpfs on ``/var/lib`` (and the plugin dir made).

    Held open by a ``sleep infinity`` process; every process started with :meth:`spawn`
    joins it through ``nsenter``. Closing kills those processes and the holder, after
    which the kernel drops the namespace and its tmpfs.

    ``/var/lib`` inside is empty apart from ``mkdirs`` (default: the device plugin dir):
    a program run inside that needs something under the host's ``/var/lib`` will not
    find it.
    """

    def __init__(self, mkdirs: Sequence[str] = (PLUGIN_DIR,), tmpfs: str = "/var/lib") -> None:
        self._mkdirs = tuple(mkdirs)
        self._tmpfs = tmpfs
        self._holder: subprocess.Popen[bytes] | None = None
        self._children: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()

    # -- lifecycle --

    def open(self) -> Self:
        if self._holder is not None:
            return self
        why = missing_prerequisites()
        if why:
            raise RuntimeError(why)
        for d in self._mkdirs:
            if not (d == self._tmpfs or d.startswith(self._tmpfs.rstrip("/") + "/")):
                raise ValueError(f"{d} is not under the namespace's tmpfs {self._tmpfs}")
        quoted = " ".join(_sh_quote(d) for d in self._mkdirs)
        script = (
            f"mount -t tmpfs -o mode=0755 ate-kubelet-ns {_sh_quote(self._tmpfs)} "
            f"&& mkdir -p {quoted} && echo ready && exec sleep infinity"
        )
        # unshare without --fork execs sh (then sleep) in place: the holder's PID is the
        # namespace's anchor.
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert holder.stdout is not None
        assert holder.stderr is not None
        line = holder.stdout.readline()
        if line.strip() != b"ready":
            holder.kill()
            _, err = holder.communicate(timeout=10)
            raise RuntimeError(f"cannot set up the mount namespace: {err.decode(errors='replace').strip()}")
        holder.stdout.close()
        holder.stderr.close()
        self._holder = holder
        return self

    def close(self) -> None:
        with self._lock:
            children, self._children = self._children, []
        for proc in reversed(children):
            stop_process(proc, timeout=5)
        if self._holder is not None:
            stop_process(self._holder, signal.SIGKILL)
            self._holder = None

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- use --

    @property
    def pid(self) -> int:
        if self._holder is None:
            raise RuntimeError("namespace is not open")
        return self._holder.pid

    def nsenter_argv(
        self, argv: Sequence[str | os.PathLike[str]], cwd: str | os.PathLike[str] | None = None
    ) -> list[str]:
        """The argv that runs ``argv`` inside the namespace (nsenter execs it in place)."""
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", f"--wd={wd}", "--", *(os.fspath(a) for a in argv)]

    def spawn(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        cwd: str | os.PathLike[str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace; the Popen's PID is the program's own PID.

        Keyword arguments go to :class:`subprocess.Popen` (``cwd`` is applied inside the
        namespace). The process is stopped (SIGTERM, then SIGKILL) when the namespace
        closes, unless it has exited before.
        """
        proc: subprocess.Popen[Any] = subprocess.Popen(self.nsenter_argv(argv, cwd), **popen_kwargs)
        with self._lock:
            self._children = [p for p in self._children if p.poll() is None]
            self._children.append(proc)
        return proc

    def run(
        self, argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """:func:`subprocess.run` inside the namespace."""
        return subprocess.run(self.nsenter_argv(argv, cwd), **kwargs)

    def path(self, p: str | os.PathLike[str]) -> Path:
        """Host-visible path of the absolute namespace path ``p`` (via /proc/<pid>/root)."""
        s = os.fspath(p)
        if not s.startswith("/"):
            raise ValueError(f"namespace paths are absolute: {s!r}")
        return Path(f"/proc/{self.pid}/root") / s.lstrip("/")

    @property
    def plugin_dir(self) -> Path:
        """Host-visible ``/var/lib/kubelet/device-plugins`` of the namespace."""
        return self.path(PLUGIN_DIR)

    def sockets(self) -> list[str]:
        """Names of the unix sockets in the plugin dir, sorted."""
        import stat as _stat

        out = []
        for entry in self.plugin_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if _stat.S_ISSOCK(entry.lstat().st_mode):
                    out.append(entry.name)
        return sorted(out)


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Capacity:
    """What GetCapacity reports: per resource counts, plus resources dropped since the
    previous :meth:`KubeletBench.capacity` call (upstream reports a removal only once)."""

    capacity: dict[str, int]
    allocatable: dict[str, int]
    removed: list[str]

    def of(self, resource: str) -> tuple[int, int]:
        """(capacity, allocatable) of ``resource``, zeros when absent."""
        return self.capacity.get(resource, 0), self.allocatable.get(resource, 0)


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerAllocation:
    """What the container runtime would be given (GetDeviceRunContainerOptions) plus the
    device IDs the manager assigned (GetDevices)."""

    device_ids: dict[str, list[str]]
    devices: list[DeviceSpec]
    mounts: list[Mount]
    envs: dict[str, str]
    annotations: dict[str, str]
    cdi_devices: list[str]
    allocate_s: float | None = None

    @classmethod
    def from_response(cls, r: Mapping[str, Any]) -> ContainerAllocation:
        return cls(
            device_ids={k: list(v) for k, v in r.get("device_ids", {}).items()},
            devices=[DeviceSpec(**d) for d in r.get("devices", [])],
            mounts=[Mount(**m) for m in r.get("mounts", [])],
            envs=dict(r.get("envs", {})),
            annotations=dict(r.get("annotations", {})),
            cdi_devices=list(r.get("cdi_devices", [])),
            allocate_s=r.get("allocate_s"),
        )


@dataclass(frozen=True)
class WaitResult:
    """A satisfied wait: seconds from the bench receiving the request until the condition
    held, and CLOCK_MONOTONIC at that moment (comparable with ``time.monotonic_ns()``)."""

    elapsed_s: float
    done_monotonic_ns: int
    capacity: int
    allocatable: int
    present: bool


class PendingWait:
    """A wait sent with :meth:`KubeletBench.begin_wait`; call :meth:`result` to collect it.

    No other request may be sent on the bench until the result is collected.
    """

    def __init__(self, bench: KubeletBench, resource: str, timeout: float) -> None:
        self._bench = bench
        self._resource = resource
        self._timeout = timeout
        self._sent_ns = time.monotonic_ns()
        self._result: WaitResult | None = None

    @property
    def sent_monotonic_ns(self) -> int:
        return self._sent_ns

    def result(self) -> WaitResult:
        if self._result is None:
            self._result = self._bench._finish_wait(self._resource, self._timeout)
        return self._result


# ---------------------------------------------------------------------------
# The bench


class KubeletBench:
    """One bench process (the kubelet's device manager) inside ``ns``.

    ``version`` is a release from :func:`built_versions` (default: the newest built).
    stderr (klog, at ``-v=verbosity``) goes to :attr:`log_path`; :meth:`log_text` reads it.
    With ``pod_resources`` (1.35+) it also serves the kubelet's PodResources API at
    :data:`POD_RESOURCES_SOCKET`, over its active pods and the units allocated to them.
    """

    def __init__(
        self,
        ns: Namespace,
        version: str | None = None,
        *,
        verbosity: int = 2,
        log_dir: str | os.PathLike[str] | None = None,
        request_timeout: float = 30.0,
        pod_resources: bool = False,
    ) -> None:
        if version is None:
            built = built_versions()
            if not built:
                raise FileNotFoundError(f"no kubelet bench built in {bench_dir()}; run tools/build-kubelet-bench.sh")
            version = built[-1]
        self.ns = ns
        self.version = version
        self.binary = bench_binary(version)
        if not os.access(self.binary, os.X_OK):
            raise FileNotFoundError(f"{self.binary} missing; run tools/build-kubelet-bench.sh {version}")
        self.verbosity = verbosity
        self.request_timeout = request_timeout
        self.pod_resources = pod_resources
        self._log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="kubelet-bench-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self._log_dir / f"kubelet-bench-{version}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._chan: _JsonLineChannel | None = None
        self._ids = itertools.count(1)
        self._pending: PendingWait | None = None
        self._last_pods: list[dict[str, Any]] = []
        self._incarnation = 0
        self.info: dict[str, Any] = {}

    # -- process --

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def alive(self) -> bool:
        return self.pid is not None

    def launch(self) -> Self:
        """Start the bench process (not the manager: see :meth:`start`)."""
        if self.alive:
            return self
        self._incarnation += 1
        with self.log_path.open("ab") as log:
            log.write(f"=== kubelet-bench {self.version} process #{self._incarnation} ===\n".encode())
            log.flush()
            argv: list[str | os.PathLike[str]] = [self.binary, "bench", f"-v={self.verbosity}"]
            if self.pod_resources:
                argv.append(f"--pod-resources-socket={POD_RESOURCES_SOCKET}")
            proc: subprocess.Popen[bytes] = self.ns.spawn(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self._proc = proc
        self._chan = _JsonLineChannel(proc, "kubelet-bench")
        self._pending = None
        self.info = self.request("version")
        return self

    def kill(self) -> None:
        """SIGKILL the bench process (a kubelet crash: kubelet.sock stays behind).

        The active pods are remembered for the next :meth:`start`/:meth:`restart`.
        """
        if self._proc is None:
            return
        if self.alive and self._pending is None:
            with contextlib.suppress(BenchError, TimeoutError):
                self._last_pods = self.pods()
        stop_process(self._proc, signal.SIGKILL)
        if self._chan is not None:
            self._chan.close()
        self._proc, self._chan, self._pending = None, None, None

    def close(self) -> None:
        """Stop the manager and end the process (SIGTERM, then SIGKILL)."""
        if self._proc is None:
            return
        if self.alive and self._pending is None:
            with contextlib.suppress(BenchError, TimeoutError):
                self.request("exit", timeout=10)
        stop_process(self._proc, signal.SIGTERM)
        if self._chan is not None:
            self._chan.close()
        self._proc, self._chan, self._pending = None, None, None

    def __enter__(self) -> Self:
        return self.launch()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- protocol --

    def request(self, cmd: str, *, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and return its answer; raise :class:`BenchError` on ``ok: false``."""
        self._send(cmd, fields)
        return self._receive(cmd, timeout if timeout is not None else self.request_timeout)

    def _send(self, cmd: str, fields: Mapping[str, Any]) -> int:
        if self._pending is not None:
            raise RuntimeError("a begin_wait() result is still pending; call result() first")
        if self._chan is None or not self.alive:
            raise BenchError("bench process is not running (launch() or start() it)")
        rid = next(self._ids)
        msg = {"cmd": cmd, "id": rid, **{k: v for k, v in fields.items() if v is not None}}
        self._chan.send(msg)
        return rid

    def _receive(self, cmd: str, timeout: float) -> dict[str, Any]:
        assert self._chan is not None
        try:
            resp = self._chan.receive(timeout)
        except TimeoutError as exc:
            raise BenchError(f"bench: no answer to {cmd!r} within {timeout:.1f}s\n{_tail(self.log_path)}") from exc
        except BenchError as exc:
            raise BenchError(f"bench died during {cmd!r}: {exc}\n{_tail(self.log_path)}") from exc
        if not resp.get("ok"):
            raise BenchError(f"bench {cmd}: {resp.get('error', resp)}", resp)
        return resp

    # -- manager --

    def start(
        self,
        active_pods: Iterable[PodSpec] | None = None,
        *,
        sources_ready: bool = True,
        running_containers: Iterable[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """NewManagerImpl + Start (launching the process if needed).

        Start wipes every unix socket in the plugin dir (keeping the checkpoint) and
        listens on kubelet.sock. ``active_pods`` is what the manager's active-pods
        function returns (pods not listed lose their devices at the next allocation);
        ``sources_ready=False`` plus ``running_containers`` ((pod_uid, container) pairs)
        reproduce the kubelet's state right after a restart. Returns e.g.
        ``{"checkpoint_found": True, ...}``.
        """
        self.launch()
        pods = list(active_pods) if active_pods is not None else []
        rc = [{"pod_uid": p, "container": c} for p, c in running_containers]
        return self.request("start", active_pods=pods, sources_ready=sources_ready, running_containers=rc)

    def stop(self) -> bool:
        """Manager Stop (disconnects every plugin); the process keeps running."""
        return bool(self.request("stop").get("was_running"))

    def restart(
        self,
        *,
        in_process: bool = False,
        active_pods: Iterable[PodSpec] | None = None,
        sources_ready: bool = True,
        running_containers: Iterable[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """A kubelet restart.

        Default: SIGKILL the process and start a new one in the same namespace (the
        faithful one: the new manager knows only the checkpoint). ``in_process=True``:
        Stop, then a fresh manager in the same process. ``active_pods`` defaults to the
        pods active before the restart.
        """
        if active_pods is None:
            active_pods = self.pods() if self.alive and self._pending is None else self._last_pods
        pods = list(active_pods)
        if in_process:
            self.stop()
        else:
            self.kill()
        return self.start(pods, sources_ready=sources_ready, running_containers=running_containers)

    def capacity(self) -> Capacity:
        r = self.request("capacity")
        return Capacity(
            capacity={k: int(v) for k, v in r["capacity"].items()},
            allocatable={k: int(v) for k, v in r["allocatable"].items()},
            removed=list(r["removed"]),
        )

    def allocate(
        self,
        pod_uid: str,
        container: str,
        resources: Mapping[str, int],
        *,
        init: bool = False,
        pod_name: str | None = None,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> ContainerAllocation:
        """Admit a container: Allocate, then GetDeviceRunContainerOptions and GetDevices.

        The pod becomes active (and stays active if admission fails but it was active
        already). Raises :class:`BenchError` with the manager's message on failure.
        """
        r = self.request(
            "allocate",
            pod_uid=pod_uid,
            container=container,
            resources=dict(resources),
            init=init or None,
            pod_name=pod_name,
            namespace=namespace,
            timeout_s=timeout,
            timeout=(timeout or self.request_timeout) + 10,
        )
        return ContainerAllocation.from_response(r)

    def options(self, pod_uid: str, container: str) -> ContainerAllocation:
        """GetDeviceRunContainerOptions again for an active pod's container (a container
        (re)start: PreStartContainer runs here, and a missing record is re-allocated)."""
        return ContainerAllocation.from_response(self.request("options", pod_uid=pod_uid, container=container))

    def devices(self, pod_uid: str, container: str) -> dict[str, list[str]]:
        """GetDevices: device IDs per resource assigned to the container."""
        r = self.request("devices", pod_uid=pod_uid, container=container)
        return {k: list(v) for k, v in r["device_ids"].items()}

    def allocatable_devices(self) -> dict[str, list[str]]:
        """GetAllocatableDevices: healthy device IDs per resource."""
        r = self.request("allocatable_devices")
        return {k: list(v) for k, v in r["device_ids"].items()}

    def pods(self) -> list[dict[str, Any]]:
        """The active pods, as pod specs accepted by :meth:`start`."""
        return list(self.request("pods")["pods"])

    def set_active_pods(self, pods: Iterable[PodSpec]) -> None:
        """Replace the active pods and free the devices of the others."""
        self.request("set_active_pods", pods=list(pods))

    def remove_pod(self, pod_uid: str) -> bool:
        """The pod terminated: drop it and free its devices. True if it was active."""
        return bool(self.request("remove_pod", pod_uid=pod_uid).get("was_active"))

    def metrics(self) -> dict[str, Any]:
        """The kubelet's own metrics: ``{"registrations": {res: n}, "alloc_duration":
        {res: {"count": n, "sum": s}}}`` (kubelet_device_plugin_registration_total and
        kubelet_device_plugin_alloc_duration_seconds; process-wide, survive in-process
        restarts, reset on process restarts)."""
        r = self.request("metrics")
        return {"registrations": dict(r["registrations"]), "alloc_duration": dict(r["alloc_duration"])}

    # -- waiting --

    def wait(self, resource: str, **conditions: Unpack[WaitFor]) -> WaitResult:
        """Poll GetCapacity inside the bench (every ``interval`` s) until ``resource`` has
        the given capacity / allocatable / presence. Raises :class:`WaitTimeoutError`."""
        return self.begin_wait(resource, **conditions).result()

    def begin_wait(self, resource: str, **conditions: Unpack[WaitFor]) -> PendingWait:
        """Send a wait and return at once, so the test can trigger the event afterwards
        (e.g. restart a plugin) and then collect the timing with ``.result()``."""
        wanted = {k: conditions.get(k) for k in ("capacity", "allocatable", "present")}
        if all(v is None for v in wanted.values()):
            raise ValueError("wait for at least one of capacity, allocatable, present")
        timeout = conditions.get("timeout", 10.0)
        interval = conditions.get("interval", 0.001)
        self._send("wait", {"resource": resource, **wanted, "timeout_s": timeout, "interval_s": interval})
        pending = PendingWait(self, resource, timeout)
        self._pending = pending
        return pending

    def _finish_wait(self, resource: str, timeout: float) -> WaitResult:
        self._pending = None
        try:
            r = self._receive("wait", timeout + 10)
        except BenchError as exc:
            if exc.response.get("error", "").startswith("timeout"):
                raise WaitTimeoutError(f"{resource}: {exc.response['error']}", exc.response) from None
            raise
        return WaitResult(
            elapsed_s=float(r["elapsed_s"]),
            done_monotonic_ns=int(r["done_monotonic_ns"]),
            capacity=int(r["capacity"]),
            allocatable=int(r["allocatable"]),
            present=bool(r["present"]),
        )

    # -- files --

    def checkpoint(self) -> dict[str, Any] | None:
        """The manager's checkpoint file (JSON), or None if there is none."""
        p = self.ns.path(f"{PLUGIN_DIR}/{CHECKPOINT_FILE}")
        try:
            data: dict[str, Any] = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        return data


# ---------------------------------------------------------------------------
# The kubelet's Go stub device plugin


_READY_TIMEOUT = 20.0


class KubeletDra:
    """``kubelet-bench dra``: the kubelet's DRA manager for one node, against a real API
    server, on the host (it writes only under ``root``: the plugin registry it watches, its
    checkpoint and, with ``pod_resources``, the PodResources socket it serves).
    JSON lines as tests/kubelet_bench/README.md says ("DRA")."""

    def __init__(self, version: str, kubeconfig: Path, node: str, root: Path, *, pod_resources: bool = False) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.registry_dir = root / "plugins_registry"
        self.pod_resources_socket = root / "pod-resources" / "kubelet.sock"
        self.log_path = root / f"kubelet-bench-dra-{version}.log"
        self.argv = [
            str(bench_binary(version)), "dra", f"--kubeconfig={kubeconfig}", f"--node={node}",
            f"--registry-dir={self.registry_dir}", f"--state-dir={root / 'state'}", "-v=2",
            *([f"--pod-resources-socket={self.pod_resources_socket}"] if pod_resources else []),
        ]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None
        self._chan: _JsonLineChannel | None = None

    def __enter__(self) -> Self:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._chan = _JsonLineChannel(self._proc, "kubelet-bench-dra")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(BenchError, TimeoutError):
                self.request("exit", timeout=10)
        stop_process(self._proc, signal.SIGTERM)
        if self._chan is not None:
            self._chan.close()
        self._proc = self._chan = None

    def request(self, cmd: str, *, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        """One request and its answer; raises BenchError on ``ok: false``."""
        if self._chan is None:
            raise BenchError("kubelet-bench dra is not running")
        self._chan.send({"cmd": cmd, **fields})
        try:
            answer = self._chan.receive(timeout)
        except (TimeoutError, BenchError) as exc:
            raise BenchError(f"kubelet-bench dra {cmd}: {exc}\n{_tail(self.log_path)}") from exc
        if not answer.get("ok"):
            raise BenchError(f"kubelet-bench dra {cmd}: {answer.get('error', answer)}", answer)
        return answer


class GoStubPlugin:
    """The kubelet's own stub device plugin (``NewDevicePluginStub``) inside ``ns``.

    Advertises ``devices`` healthy devices ``<id_prefix>0..N-1``. With ``watch`` (the
    default) it runs the stub's own kubelet-restart watch: on a new kubelet.sock it
    restarts its gRPC server and registers again. Its Allocate answers envs
    ``STUB_RESOURCE`` / ``STUB_DEVICE_IDS`` and an annotation; with ``device_node`` also one
    device spec per ID (``/dev/stub/<id>`` -> the node). ``preferred`` makes it advertise
    GetPreferredAllocation and prefer the highest IDs.
    """

    def __init__(
        self,
        ns: Namespace,
        version: str,
        resource: str,
        *,
        devices: int = 2,
        socket: str | None = None,
        id_prefix: str = "dev-",
        preferred: bool = False,
        pre_start: bool = False,
        register: bool = True,
        watch: bool = True,
        device_node: str | None = None,
        verbosity: int = 2,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.ns = ns
        self.version = version
        self.resource = resource
        self.device_count = devices
        self.id_prefix = id_prefix
        self.socket = socket or f"{PLUGIN_DIR}/stub-{re.sub(r'[/.]', '-', resource)}.sock"
        self._argv: list[str] = [
            os.fspath(bench_binary(version)),
            "stub-plugin",
            f"--resource={resource}",
            f"--socket={self.socket}",
            f"--devices={devices}",
            f"--id-prefix={id_prefix}",
            f"-v={verbosity}",
            "--control",
        ]
        if preferred:
            self._argv.append("--preferred")
        if pre_start:
            self._argv.append("--pre-start")
        if not register:
            self._argv.append("--no-register")
        if not watch:
            self._argv.append("--no-watch")
        if device_node:
            self._argv.append(f"--device-node={device_node}")
        log_base = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="kubelet-stub-"))
        log_base.mkdir(parents=True, exist_ok=True)
        self.log_path = log_base / f"stub-{re.sub(r'[/.]', '-', resource)}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._chan: _JsonLineChannel | None = None
        self._ids = itertools.count(1)
        self.ready: dict[str, Any] = {}

    @property
    def device_ids(self) -> list[str]:
        return [f"{self.id_prefix}{i}" for i in range(self.device_count)]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> Self:
        """Start serving and (unless ``register=False``) register; returns once registered."""
        if self.pid is not None:
            return self
        with self.log_path.open("ab") as log:
            proc: subprocess.Popen[bytes] = self.ns.spawn(
                self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        self._proc = proc
        self._chan = _JsonLineChannel(proc, "go-stub")
        try:
            self.ready = self._chan.receive(_READY_TIMEOUT)
        except (BenchError, TimeoutError) as exc:
            self.kill()
            raise BenchError(f"Go stub plugin did not come up: {exc}\n{_tail(self.log_path)}") from exc
        return self

    def request(self, cmd: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        if self._chan is None or self.pid is None:
            raise BenchError(f"Go stub plugin is not running (exit code {self.returncode})\n{_tail(self.log_path)}")
        rid = next(self._ids)
        self._chan.send({"cmd": cmd, "id": rid, **fields})
        resp = self._chan.receive(timeout)
        if not resp.get("ok"):
            raise BenchError(f"stub {cmd}: {resp.get('error', resp)}", resp)
        return resp

    def set_health(self, unhealthy: Iterable[str] = ()) -> None:
        """Send a ListAndWatch update: all devices, those listed Unhealthy."""
        self.request("set_health", unhealthy=list(unhealthy))

    def register(self) -> None:
        """Call Register on kubelet.sock once more."""
        self.request("register")

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful stop (the stub closes its streams and removes its socket)."""
        if self._proc is None:
            return None
        if self.pid is not None:
            with contextlib.suppress(BenchError, TimeoutError):
                assert self._chan is not None
                self._chan.send({"cmd": "stop"})
        rc = stop_process(self._proc, signal.SIGTERM, timeout)
        if self._chan is not None:
            self._chan.close()
        self._proc, self._chan = None, None
        return rc

    def kill(self) -> None:
        """SIGKILL (plugin crash: the socket file stays behind)."""
        if self._proc is None:
            return
        stop_process(self._proc, signal.SIGKILL)
        if self._chan is not None:
            self._chan.close()
        self._proc, self._chan = None, None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
