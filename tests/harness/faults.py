"""Fault injection for the reliability tests: hostile peers, process footprints, soak counts.

* :func:`soak`: how many times a fault is repeated. CI runs short counts; ``ATE_SOAK_SCALE``
  asks for more (``full`` = the counts the issue names, a number = that fraction of them).
* :class:`Footprint`: open files, threads and resident memory of a process (from /proc).
* :class:`SilentPeer`: a unix socket server that accepts and reads but never answers (a
  kubelet whose Register hangs), or that closes every connection at once.
* :class:`ConfigMapDir`: a directory updated the way the kubelet updates a mounted
  ConfigMap: timestamped data directories, ``..data`` swapped by a rename.
* :func:`set_read_only`: make a directory inside a mount namespace read-only (a read-only
  bind mount over itself), and writable again.
* :class:`PodResourcesPeer`: the kubelet's PodResources List answering any bytes it is
  given (an answer too large, too long or undecodable).
* :func:`swap_in`: put a prepared file, directory or symlink in place of another in one step.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from tests.harness.daemon import DevicePluginDaemon
from tests.harness.kubelet import Namespace

SpawnDaemon = Callable[..., DevicePluginDaemon]

__all__ = [
    "ConfigMapDir",
    "Footprint",
    "PodResourcesPeer",
    "SilentPeer",
    "SpawnDaemon",
    "remove_tree",
    "set_read_only",
    "soak",
    "soak_scale",
]


def soak_scale() -> str:
    return os.environ.get("ATE_SOAK_SCALE", "").strip().lower()


def soak(ci: int, full: int) -> int:
    """The repeat count of a fault: ``ci`` by default, ``full`` with ATE_SOAK_SCALE=full,
    ``round(full * x)`` (at least 1) with ATE_SOAK_SCALE=x."""
    scale = soak_scale()
    if scale in ("", "ci"):
        return ci
    if scale == "full":
        return full
    return max(1, round(full * float(scale)))


def soak_seconds(ci: float, full: float) -> float:
    scale = soak_scale()
    if scale in ("", "ci"):
        return ci
    if scale == "full":
        return full
    return max(ci, full * float(scale))


@dataclass(frozen=True)
class Footprint:
    """What a process holds: open file descriptors, threads, resident memory."""

    fds: int
    threads: int
    rss_kib: int
    peak_rss_kib: int = 0  # the high-water mark since start or since reset_peak

    @classmethod
    def of(cls, pid: int) -> Footprint:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return cls(
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            threads=len(os.listdir(f"/proc/{pid}/task")),
            rss_kib=int(status["VmRSS"].split()[0]),
            peak_rss_kib=int(status["VmHWM"].split()[0]),
        )

    @staticmethod
    def reset_peak(pid: int) -> None:
        """Starts the high-water mark (VmHWM) afresh from the resident size now."""
        Path(f"/proc/{pid}/clear_refs").write_text("5")

    def fd_targets(self, pid: int) -> list[str]:
        out = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return sorted(out)


class SilentPeer:
    """A unix socket server at ``path`` (a host-visible path) that never answers.

    ``mode="hang"``: accepts every connection and reads whatever is sent, forever, and
    never writes a byte: a gRPC client's call on it ends only at its deadline.
    ``mode="close"``: accepts and closes at once (a peer that refuses every call).
    ``accepted`` counts the connections it took.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "hang") -> None:
        if mode not in ("hang", "close"):
            raise ValueError(mode)
        self.path = os.fspath(path)
        self.mode = mode
        self.accepted = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-peer", daemon=True)

    def start(self) -> Self:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._sock.bind(self.path)
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                if self.mode == "close":
                    conn.close()
                    continue
                self._conns.append(conn)
            threading.Thread(target=self._drain, args=(conn,), name="silent-peer-conn", daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class ConfigMapDir:
    """A ConfigMap volume as the kubelet lays it out and updates it.

    ``dir/..<timestamp>/<file>`` holds the data, ``dir/..data`` links to the current
    timestamped directory, and ``dir/<file>`` links to ``..data/<file>``. An update writes
    a new timestamped directory, points a new ``..data_tmp`` link at it, renames that over
    ``..data`` (the one atomic step), then removes the old directory.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def _new_data_dir(self, files: Mapping[str, str]) -> str:
        self._n += 1
        name = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + f"{os.getpid()}{self._n:04d}"
        data = self.dir / name
        data.mkdir()
        for fname, text in files.items():
            (data / fname).write_text(text)
        return name

    def write(self, files: Mapping[str, str]) -> None:
        """First write or update; the visible file names are the keys of ``files``."""
        new = self._new_data_dir(files)
        current = self.dir / "..data"
        old = os.readlink(current) if current.is_symlink() else None
        tmp = self.dir / "..data_tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(new)
        os.rename(tmp, current)
        for fname in files:
            link = self.dir / fname
            if not link.is_symlink():
                link.symlink_to(f"..data/{fname}")
        if old is not None:
            for p in sorted((self.dir / old).iterdir()):
                p.unlink()
            (self.dir / old).rmdir()

    def path(self, fname: str) -> Path:
        return self.dir / fname


def set_read_only(ns: Namespace, path: str, read_only: bool) -> None:
    """Make ``path`` (a directory inside ``ns``) read-only or writable again for every
    process of the namespace, root included: a bind mount of the directory over itself,
    remounted ``ro`` / ``rw``. (chmod would not stop root.)"""
    mounted = ns.run(["mountpoint", "-q", path]).returncode == 0
    if not mounted:
        _ns_run(ns, ["mount", "--bind", path, path])
    _ns_run(ns, ["mount", "-o", f"remount,bind,{'ro' if read_only else 'rw'}", path])


def _ns_run(ns: Namespace, argv: list[str]) -> None:
    result = ns.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


def is_read_only(ns: Namespace, path: str) -> bool:
    probe = f"{path}/.ate-rw-probe"
    result = ns.run(["sh", "-c", f"touch {probe} && rm -f {probe}"], capture_output=True, timeout=30)
    return result.returncode != 0


def log_matches(lines: list[dict[str, object]], words: str, level: str | None = None) -> list[dict[str, object]]:
    """The JSON log lines whose message contains ``words`` (and of ``level``, if given)."""
    return [
        line for line in lines if words in str(line.get("msg", "")) and (level is None or line.get("level") == level)
    ]


def min_backoff_attempts(seconds: float, initial: float = 0.02, cap: float = 30.0) -> int:
    """The most attempts a capped exponential backoff with jitter in [d/2, d] (the
    daemon's :class:`ate_devplugin.tasks.Backoff`) can make in ``seconds``: the
    count when every delay is drawn at its shortest."""
    attempts, elapsed, d = 1, 0.0, initial
    while True:
        elapsed += d / 2
        if elapsed > seconds:
            return attempts
        attempts += 1
        d = min(cap, d * 2)


class PodResourcesPeer:
    """The kubelet's PodResources API at ``path`` (a host-visible path): List answers
    ``answer``, whatever bytes it holds; ``calls`` counts the Lists."""

    def __init__(self, path: str | os.PathLike[str], answer: bytes = b"") -> None:
        self.path = os.fspath(path)
        self.answer = answer
        self.calls = 0
        self._server = grpc.server(ThreadPoolExecutor(2), options=[("grpc.max_send_message_length", 64 << 20)])
        list_method = grpc.unary_unary_rpc_method_handler(self._list)  # no (de)serializers: bytes
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": list_method})
        self._server.add_generic_rpc_handlers([handler])

    def _list(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        return self.answer

    def start(self) -> Self:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._server.add_insecure_port(f"unix:{self.path}")
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def remove_tree(path: Path) -> None:
    """rmtree, again when a daemon wrote into the tree between rmtree's listing and its rmdir
    (the CDI writer restores its directory within milliseconds)."""
    for _ in range(100):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} written again faster than it could be removed, 100 times")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def swap_in(path: Path, prepared: Path) -> None:
    """Put ``prepared`` where ``path`` is in one renameat2(RENAME_EXCHANGE), then remove what
    was there: removing first and creating after would race a daemon that restores ``path``
    as soon as it goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(prepared), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))
    if prepared.is_symlink() or not prepared.is_dir():
        prepared.unlink()
    else:
        remove_tree(prepared)
