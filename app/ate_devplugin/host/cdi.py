"""CDI (Container Device Interface) specs: how a CDI-aware runtime (containerd 2) learns
what a resource's device name stands for.

One spec file per resource, ``<cdi_dir>/<vendor>-<class>.json`` (``/var/run/cdi/ate.dev-kvm.json``):
kind = the resource name, one device named after the part after the slash (so the fully
qualified name is ``ate.dev/kvm=kvm``) carrying every present device node of the resource,
its mounts and its env. The runtime resolves the name the kubelet passes it (from Allocate's
``cdi_devices``, or from a DRA driver) against these files at container creation.

Files are replaced atomically (a temp file in the same directory, then rename): the
runtime never reads half a spec. The runtime reads only ``.json`` and ``.yaml`` files, so
the temp file (``.tmp``) is never taken for a spec.

The specs are state the daemon keeps: the directory is watched, and a spec removed, changed
by someone else, or lost with its directory (``/var/run/cdi`` is a tmpfs) is written again
at once. Nothing is written or removed through a symlink (the directory is opened with
``O_NOFOLLOW`` and every file relative to it), and a file is ours only if it holds what we
wrote or a spec of our kind: another vendor's file of the same name is left alone, with a
warning. A write that fails (a read-only or full directory) is counted, makes the daemon
unready saying why, and is retried with capped backoff: no file event says that a
directory became writable again (a remount, or space freed elsewhere on its filesystem).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.tasks import Backoff

if TYPE_CHECKING:
    from ate_devplugin.config import ResourceConfig
    from ate_devplugin.host.devices import DeviceNode, Discovery
    from ate_devplugin.observability.metrics import Metrics
    from ate_devplugin.tasks import Guard

log = logging.getLogger(__name__)

# Each spec says the lowest version its fields need: the runtime refuses a spec whose
# version is lower than that, and one newer than its own CDI library knows. Mount
# ``type`` came in 0.4.0, '.' in the class in 0.6.0; device nodes with uid, gid and
# fileMode were there from 0.3.0, the earliest version CDI libraries still load.
_BASE_VERSION = "0.3.0"
_MOUNT_TYPE_VERSION = "0.4.0"
_DOT_IN_CLASS_VERSION = "0.6.0"
SPEC_MODE = 0o644
# Our specs are a few KiB; a larger file of our name is read no further than this.
MAX_SPEC_BYTES = 1024 * 1024
# Retrying a write that failed: one syscall or two each time, so a short cap costs nothing.
RETRY_INITIAL_S = 0.1
RETRY_CAP_S = 5.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def device_name(resource_name: str) -> str:
    """The CDI device of a resource: the part of its name after the slash."""
    return resource_name.rsplit("/", 1)[1]


def device_id(resource_name: str) -> str:
    """The fully qualified CDI device name, e.g. ``ate.dev/kvm=kvm``."""
    return f"{resource_name}={device_name(resource_name)}"


def spec_file_name(resource_name: str) -> str:
    """``<vendor>-<class>.json``. Two resources whose file names collide also collide in
    their socket names, which the config refuses."""
    return resource_name.replace("/", "-") + ".json"


def spec(resource: ResourceConfig, nodes: Sequence[DeviceNode]) -> dict[str, Any]:
    """The spec document of a resource with these device nodes present."""
    device_nodes = []
    for node in nodes:
        entry: dict[str, Any] = {
            "path": node.host_path,
            "type": "c",  # discovery keeps character devices only
            "major": node.major,
            "minor": node.minor,
            "permissions": resource.permissions,
        }
        # Unset: the runtime takes the host node's mode, and CDI makes the node the
        # container user's (when that user is not root).
        if resource.cdi_file_mode is not None:
            entry["fileMode"] = resource.cdi_file_mode
        if resource.cdi_uid is not None:
            entry["uid"] = resource.cdi_uid
        if resource.cdi_gid is not None:
            entry["gid"] = resource.cdi_gid
        device_nodes.append(entry)
    edits: dict[str, Any] = {"deviceNodes": device_nodes}
    if resource.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in resource.mounts
        ]
    if resource.env:
        edits["env"] = [f"{k}={v}" for k, v in resource.env.items()]
    name = device_name(resource.name)
    version = _BASE_VERSION
    if resource.mounts:
        version = _MOUNT_TYPE_VERSION
    if "." in name:
        version = _DOT_IN_CLASS_VERSION
    return {
        "cdiVersion": version,
        "kind": resource.name,
        "devices": [{"name": name, "containerEdits": edits}],
    }


@dataclass(frozen=True)
class _OnDisk:
    """A spec file as written: its content and the identity of the file that holds it."""

    content: bytes
    identity: tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _NotOursError(Exception):
    """The name holds something this daemon did not write: it is never replaced or removed."""


class Viewed(Protocol):
    """What the specs read of a resource's view (view.ResourceView; named here, as the host
    room imports nothing of the rooms above it)."""

    @property
    def config(self) -> ResourceConfig: ...

    @property
    def found(self) -> Discovery: ...


class CdiSpecs:
    """Keeps the spec files of resources in one CDI directory.

    As a component, it keeps a spec for every resource that answers Allocate with CDI
    names (for every resource when ``every_resource``: a DRA driver answers with CDI names
    only), following the devices found and the directory's events, and removes them all
    when stopped: no runtime may resolve a name nobody serves.

    :meth:`cdi_ready` tells whether a resource's spec is on disk as written, so that no
    answer names a CDI device the runtime cannot resolve. Failures are logged (each once
    while it lasts) and counted (``ate_devplugin_cdi_spec_updates_total``), never raised.
    """

    name = "CDI specs"

    def __init__(self, cdi_dir: str, metrics: Metrics | None = None, every_resource: bool = False) -> None:
        self.cdi_dir = cdi_dir
        self.metrics = metrics
        self.every_resource = every_resource
        self._written: dict[str, _OnDisk] = {}  # resource name -> what this writer put on disk
        self._wanted: dict[str, bytes] = {}  # resource name -> the content its spec must have
        self._problems: dict[str, str] = {}  # resource name -> why its spec is not in place
        self._said = SaidOnce()  # per resource
        self._resources: tuple[ResourceConfig, ...] = ()
        self._stale = True  # the directory may have changed since it was last looked at
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_CAP_S)
        self._retry: asyncio.TimerHandle | None = None

    # --- the component --------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        self._resources = resources

    async def stop(self, deadline_s: float) -> list[str]:
        if self._retry is not None:
            self._retry.cancel()
        self._wanted.clear()
        self.remove_all()
        return []

    def readiness(self) -> tuple[bool, str]:
        if self._problems:
            name = min(self._problems)
            return False, f"CDI spec of {name} not in place: {self._problems[name]}"
        return True, ""

    def watches(self) -> Watches:
        # Watched while it may hold a spec of ours (asked before the first discovery, so by
        # config): a missing directory is watched through its nearest existing ancestor.
        needed = self._written or any(self.every_resource or r.uses_cdi for r in self._resources)
        return Watches(dirs=frozenset({self.cdi_dir})) if needed else Watches()

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        d = self.cdi_dir
        for e in batch:
            for p in e.paths():
                if p == d or p.startswith(d + "/") or d.startswith(p + "/"):
                    self._stale = True  # checked at the view that follows every batch
                    return

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self._resources = resources  # written at the view that follows

    def on_view(self, view: Mapping[str, Viewed]) -> None:
        wanted = {}
        for v in view.values():
            r, nodes = v.config, v.found.nodes
            # With no node present there is nothing to name (a CDI device needs edits): no file.
            if (self.every_resource or r.uses_cdi) and nodes:
                wanted[r.name] = _encode(spec(r, nodes))
        if wanted != self._wanted or self._stale:
            self._wanted = wanted
            self.sync()

    # --- what the answers may name --------------------------------------------------

    def cdi_ready(self, resource_name: str) -> bool:
        """Whether the resource's spec is on disk as this writer wrote it (one lstat)."""
        written = self._written.get(resource_name)
        if written is None or resource_name in self._problems:
            return False
        try:
            return _identity(os.lstat(self.path(resource_name))) == written.identity
        except OSError:
            return False

    def cdi_problem(self, resource_name: str) -> str:
        """Why the resource's spec is not in place ("" when it is)."""
        if self.cdi_ready(resource_name):
            return ""
        return self._problems.get(resource_name) or f"{self.path(resource_name)} is not the spec written"

    # --- keeping the files ------------------------------------------------------------

    def path(self, resource_name: str) -> str:
        return os.path.join(self.cdi_dir, spec_file_name(resource_name))

    def sync(self) -> bool:
        """Every wanted spec in place, every other one of ours removed; False while one is not.
        A failure is retried with backoff (no event may come to tell it would work now)."""
        self._stale = False
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        # Every one tried, whatever the others did.
        results = [self._put(name, content) for name, content in sorted(self._wanted.items())]
        results += [self._take_away(name) for name in sorted(self._written.keys() - self._wanted.keys())]
        if self._problems:
            with contextlib.suppress(RuntimeError):  # no running loop (a direct call): no retry
                loop = asyncio.get_running_loop()
                self._retry = loop.call_later(self._backoff.next(), self._retry_now)
        else:
            self._backoff.reset()
        return all(results)

    def _retry_now(self) -> None:
        self._retry = None
        self.sync()

    def remove(self, resource_name: str) -> bool:
        """Removes the resource's spec file, if this writer put one there. False on failure."""
        self._wanted.pop(resource_name, None)
        self._problems.pop(resource_name, None)
        self._said.over(resource_name)
        return self._take_away(resource_name)

    def remove_all(self) -> bool:
        results = [self.remove(name) for name in sorted(self._written)]
        return all(results)

    def _put(self, name: str, content: bytes) -> bool:
        path = self.path(name)
        try:
            with self._directory(create=True) as dfd:
                found = _read_ours(dfd, name, content)
                if found is not None and found[0] == content:
                    self._written[name] = _OnDisk(content, found[1])
                    self._resolved(name)
                    return True
                if found is not None and name in self._written:
                    log.warning("CDI spec %s changed by someone else: written again", path, extra={"resource": name})
                self._written[name] = _OnDisk(content, _replace(dfd, spec_file_name(name), content))
        except _NotOursError as exc:
            return self._failed(name, "write", f"{path} holds {exc}, not ours: left alone", logging.WARNING)
        except OSError as exc:
            return self._failed(name, "write", f"cannot write {path}: {exc.strerror or exc}")
        self._resolved(name)
        self._count(name, "write", "success")
        log.info("CDI spec written", extra={"resource": name, "path": path})
        return True

    def _take_away(self, name: str) -> bool:
        if name not in self._written:
            return True
        path = self.path(name)
        try:
            with self._directory(create=False) as dfd:
                if _read_ours(dfd, name, self._written[name].content) is not None:
                    os.unlink(spec_file_name(name), dir_fd=dfd)
        except FileNotFoundError:
            pass
        except _NotOursError as exc:
            self._count(name, "remove", "failure")
            log.warning("CDI spec %s not removed: it holds %s, not ours", path, exc, extra={"resource": name})
            return False
        except OSError as exc:
            self._count(name, "remove", "failure")
            log.error("cannot remove the CDI spec %s: %s", path, exc.strerror or exc, extra={"resource": name})
            return False
        del self._written[name]
        self._count(name, "remove", "success")
        log.info("CDI spec removed", extra={"resource": name, "path": path})
        if self.metrics is not None and name not in {r.name for r in self._resources}:
            self.metrics.remove_cdi_series(name)  # left the config: its series go with its spec
        return True

    @contextlib.contextmanager
    def _directory(self, create: bool) -> Iterator[int]:
        """The CDI directory, opened without following a symlink (made first if ``create``)."""
        try:
            dfd = os.open(self.cdi_dir, _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(os.path.dirname(self.cdi_dir), mode=0o755, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.cdi_dir, 0o755)
            dfd = os.open(self.cdi_dir, _DIR_FLAGS)
        except OSError as exc:
            if os.path.islink(self.cdi_dir):
                raise _NotOursError("a symlink in place of the directory") from exc
            raise
        try:
            yield dfd
        finally:
            os.close(dfd)

    def _resolved(self, name: str) -> None:
        self._problems.pop(name, None)
        if self._said.over(name):
            log.info("CDI spec in place again", extra={"resource": name, "path": self.path(name)})

    def _failed(self, name: str, action: str, why: str, level: int = logging.ERROR) -> bool:
        self._count(name, action, "failure")
        if self._said.new(why, name):  # the same failure again and again is logged once
            log.log(level, "CDI spec not in place: %s", why, extra={"resource": name})
        self._problems[name] = why
        return False

    def _count(self, resource_name: str, action: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.cdi_spec_updates.labels(resource_name, action, result).inc()


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=2).encode() + b"\n"


def _read_ours(dfd: int, name: str, ours: bytes) -> tuple[bytes, tuple[int, int, int, int]] | None:
    """The content and identity of the resource's spec file if it is ours (what we wrote,
    or a spec of the resource's kind: left by an earlier run, or changed by someone else);
    None when there is none. Raises _NotOursError for anything else, saying what it is."""
    try:
        fd = os.open(spec_file_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        st = os.stat(spec_file_name(name), dir_fd=dfd, follow_symlinks=False)
        raise _NotOursError("a symlink" if stat.S_ISLNK(st.st_mode) else "something unreadable") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotOursError("something other than a file")
        content = f.read(MAX_SPEC_BYTES + 1)
    if content == ours:
        return content, _identity(st)
    try:
        kind = json.loads(content).get("kind")
    except (ValueError, AttributeError):
        kind = None
    if kind != name:
        raise _NotOursError(f"a spec of kind {str(kind)[:80]!r}" if kind is not None else "no CDI spec of ours")
    return content, _identity(st)


def _replace(dfd: int, file_name: str, content: bytes) -> tuple[int, int, int, int]:
    """Writes ``content`` to a temp file in the directory and renames it over ``file_name``;
    the identity of the file written."""
    tmp = f".ate-devplugin-{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, SPEC_MODE, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, SPEC_MODE)  # whatever the umask
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            identity = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        os.rename(tmp, file_name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    return identity
