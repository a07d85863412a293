"""Private namespaces a test cluster runs in, so that it never touches the host.

:class:`Sandbox` starts an init process with ``unshare`` in a new mount, network and PID
namespace. Before it says it is ready, the init mounts a tmpfs over ``/var/lib``, ``/run``
and ``/var/log`` (where the kubelet and containerd hard-code ``/var/lib/kubelet``,
``/run/containerd`` and ``/var/log/containers``) and brings up ``lo``; the mounts are
private, so nothing reaches the host's mount table. Every cluster process is started
inside with ``nsenter``; the bridges, the pod IPs and the API server's addresses exist
only in the sandbox's network namespace and its nodes'.

Ending the init ends every process in the PID namespace (the kernel kills them all,
containers included); the mount and network namespaces then go away with their last
process, and so do their mounts, pod network namespaces, veths and the bridge. The init
gets SIGKILL when ``unshare`` dies, and ``unshare`` when the test process dies, so even a
killed test run leaves no process behind.

HTTP to addresses inside (pod IPs, Prometheus) goes through :meth:`Sandbox.http_get`,
which runs on a thread that joined the sandbox's network namespace: the test process
itself never sends a packet from the host's network namespace to a pod.

Each node of a cluster (:meth:`Sandbox.node`) has a mount and a network namespace of its
own inside the sandbox, as a kind node is a container: its init mounts its own tmpfs over
the same directories (each kubelet hard-codes ``/var/lib/kubelet/device-plugins``), and
its processes are in the sandbox's PID namespace, so they end with it like everything else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

#: Host directories the sandbox hides behind its own tmpfs.
PRIVATE_DIRS = ("/var/lib", "/run", "/var/log")
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1

# PID 1 of the sandbox: private mounts, loopback up, then reap orphans until told to stop.
_INIT = """
import os, signal, subprocess, sys, time
for d in sys.argv[1:]:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "ate-e2e", d], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("ready", flush=True)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.5)
"""


# PID 1 of a node's mount and network namespaces (in the sandbox's PID namespace, whose
# init reaps): the same private mounts and loopback, then it only holds the namespaces.
_NODE_INIT = """
import os, signal, subprocess, sys
for d in sys.argv[1:]:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "ate-e2e", d], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("ready", flush=True)
while True:
    signal.pause()
"""


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (host PIDs), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class SandboxError(RuntimeError):
    """The sandbox, or a command in it, failed."""


class Process:
    """A long-running process inside the sandbox (``nsenter`` in front of it)."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """Host PID of the process itself (nsenter's child), once it is running."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = children(self.popen.pid)
            if kids:
                return kids[0]
            if self.popen.poll() is not None:
                raise SandboxError(f"{self.name} exited with {self.popen.returncode}: {self.log_tail()}")
            time.sleep(0.05)
        raise SandboxError(f"{self.name}: no process under nsenter {self.popen.pid}")

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the process, wait for it (SIGKILL after ``timeout``); its exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(SandboxError, ProcessLookupError):
                os.kill(self.pid, sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(SandboxError, ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        return self.popen.returncode

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Namespaces:
    """A set of namespaces that commands and processes are started in with ``nsenter``."""

    def __init__(self, log_dir: Path, processes: list[Process]) -> None:
        self.log_dir = log_dir
        self.init_pid = 0
        #: Every long-running process started inside, in start order (shared by a
        #: sandbox and its nodes, so that closing the sandbox stops them all).
        self.processes = processes

    def _enter(self) -> list[str]:
        if not self.init_pid:
            raise SandboxError("namespaces not started")
        return ["nsenter", "-t", str(self.init_pid), "-m", "-n", "-p", "--"]

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        """Start a long-running process inside; its output goes to ``<log_dir>/<name>.log``."""
        log_path = self.log_dir / f"{name}.log"
        log: IO[bytes]
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                [*self._enter(), *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, preexec_fn=die_with_parent,
                start_new_session=True,  # a Ctrl-C reaches pytest, which stops things in order
            )  # fmt: skip
        proc = Process(name, popen, log_path)
        self.processes.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        timeout: float = 120,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside and wait for it; raises SandboxError on failure when ``check``."""
        out = subprocess.run(
            [*self._enter(), *argv], input=stdin, capture_output=True, text=True, timeout=timeout,
            env=dict(env) if env is not None else None, check=False,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise SandboxError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr.strip()}\n{out.stdout[-2000:]}")
        return out


class Sandbox(Namespaces):
    """Mount, network and PID namespaces of their own; use as a context manager."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, [])
        self._unshare: subprocess.Popen[bytes] | None = None
        self._http: ThreadPoolExecutor | None = None

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._unshare = subprocess.Popen(
            ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--propagation", "private",
             "--kill-child=SIGKILL", sys.executable, "-c", _INIT, *PRIVATE_DIRS],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,  # only prctl: safe in the forked child
        )  # fmt: skip
        assert self._unshare.stdout is not None
        line = self._unshare.stdout.readline()
        if line.strip() != b"ready":
            err = self._unshare.stderr.read().decode() if self._unshare.stderr else ""
            self.close()
            raise SandboxError(f"sandbox init failed: {line!r} {err}")
        (self.init_pid,) = children(self._unshare.pid)
        self._http = ThreadPoolExecutor(max_workers=1, initializer=self._join_netns)

    def node(self, name: str) -> NodeNamespaces:
        """Mount and network namespaces of their own for one node, inside the sandbox."""
        node = NodeNamespaces(name, self)
        node.start()
        return node

    def _join_netns(self) -> None:
        # setns(CLONE_NEWNET) moves only the calling thread: this worker, not the test.
        fd = os.open(f"/proc/{self.init_pid}/ns/net", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the sandbox's network namespace")
        finally:
            os.close(fd)

    def in_netns(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn(*args)`` on the thread that lives in the sandbox's network namespace."""
        if self._http is None:
            raise SandboxError("sandbox not started")
        return self._http.submit(fn, *args).result()

    def http_get(self, url: str, timeout: float = 10) -> tuple[int, str]:
        """GET ``url`` from inside the sandbox's network namespace: (status, body)."""

        def get() -> tuple[int, str]:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            try:
                with opener.open(url, timeout=timeout) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode(errors="replace")

        return self.in_netns(get)

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), then the init: nothing survives it."""
        for proc in reversed(self.processes):
            proc.stop(timeout=15)
        if self._http is not None:
            self._http.shutdown(wait=True)
            self._http = None
        if self._unshare is not None:
            if self.init_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.init_pid, signal.SIGKILL)
            try:
                self._unshare.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
                self._unshare.wait(timeout=10)
            for stream in (self._unshare.stdout, self._unshare.stderr):
                if stream is not None:
                    stream.close()
            self._unshare = None


class NodeNamespaces(Namespaces):
    """One node's mount and network namespaces, nested in a :class:`Sandbox`: its own
    tmpfs over :data:`PRIVATE_DIRS`, its own loopback; the sandbox's PID namespace."""

    def __init__(self, name: str, sandbox: Sandbox) -> None:
        super().__init__(sandbox.log_dir, sandbox.processes)
        self.name = name
        self.sandbox = sandbox
        self.init: Process | None = None

    def start(self) -> None:
        log_path = self.log_dir / f"{self.name}-init.log"
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                [*self.sandbox._enter(), "unshare", "--mount", "--net", "--propagation", "private",
                 sys.executable, "-c", _NODE_INIT, *PRIVATE_DIRS],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, preexec_fn=die_with_parent,
                start_new_session=True,
            )  # fmt: skip
        self.init = init = Process(f"{self.name}-init", popen, log_path)
        self.processes.append(init)
        assert popen.stdout is not None
        line = popen.stdout.readline()
        popen.stdout.close()
        if line.strip() != b"ready":
            raise SandboxError(f"{self.name}: namespace init failed: {line!r} {init.log_tail()}")
        self.init_pid = init.pid

    def close(self) -> None:
        """End the namespaces before the sandbox does (their processes stopped first): they
        go with their init, and so do their mounts and the veth end in them."""
        if self.init is not None:
            self.init.stop()
            self.processes.remove(self.init)
            self.init = None
