"""What host/watcher.py takes from watchdog below its public API, against the installed
watchdog: ``watchdog.observers.inotify_c``'s ``inotify_init``, ``inotify_add_watch``,
``inotify_rm_watch``, ``WatchDescriptor`` and ``InotifyConstants``. The names are there, are
libc's calls with their C signatures and errno kept, behave as the watcher relies on, and the
constants are the kernel's. pyproject.toml bounds watchdog to the majors this passed on, so a
new major is taken only after it passes here, not found out on a node."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import tomllib
from _ctypes import FUNCFLAG_USE_ERRNO, CFuncPtr
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from watchdog.observers import inotify_c

from ate_devplugin.host import watcher

REPO = Path(__file__).resolve().parents[3]
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; the name follows

# include/uapi/linux/inotify.h: the kernel's ABI, the same on every architecture.
KERNEL_CONSTANTS = {
    "IN_ATTRIB": 0x00000004,
    "IN_CLOSE_WRITE": 0x00000008,
    "IN_MOVED_FROM": 0x00000040,
    "IN_MOVED_TO": 0x00000080,
    "IN_CREATE": 0x00000100,
    "IN_DELETE": 0x00000200,
    "IN_DELETE_SELF": 0x00000400,
    "IN_MOVE_SELF": 0x00000800,
    "IN_Q_OVERFLOW": 0x00004000,
    "IN_IGNORED": 0x00008000,
    "IN_DONT_FOLLOW": 0x02000000,
    "IN_ISDIR": 0x40000000,
}


def _address(func: CFuncPtr) -> int | None:
    return ctypes.cast(func, ctypes.c_void_p).value


def _watchdog_requirement() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (found,) = [r for r in map(Requirement, deps) if r.name == "watchdog"]
    return found


def test_watchdog_is_bounded_and_the_installed_one_is_in_the_range() -> None:
    requirement = _watchdog_requirement()
    assert any(spec.operator == "<" for spec in requirement.specifier), (
        f"{requirement}: a new watchdog major may move what host/watcher.py imports; bound it"
    )
    installed = version("watchdog")
    assert requirement.specifier.contains(installed), f"watchdog {installed} installed, pyproject says {requirement}"


def test_every_name_the_watcher_imports_is_there() -> None:
    for name in ("inotify_init", "inotify_add_watch", "inotify_rm_watch", "WatchDescriptor", "InotifyConstants"):
        assert hasattr(inotify_c, name), f"watchdog {version('watchdog')} has no inotify_c.{name}"
        assert getattr(watcher, name) is getattr(inotify_c, name)


@pytest.mark.parametrize(
    ("name", "argtypes"),
    [
        ("inotify_init", ()),
        ("inotify_add_watch", (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)),
        ("inotify_rm_watch", (ctypes.c_int, ctypes.c_uint32)),
    ],
)
def test_the_calls_are_libcs_with_their_c_signature_and_errno_kept(
    name: str, argtypes: tuple[type[ctypes._SimpleCData[int]], ...]
) -> None:
    """The watcher passes bytes and ints and reads failures with ``ctypes.get_errno()``, which
    only a function made with ``use_errno=True`` sets."""
    func = getattr(inotify_c, name)
    assert isinstance(func, CFuncPtr)
    assert _address(func) == _address(getattr(ctypes.CDLL(None), name))
    assert func.restype is ctypes.c_int
    assert tuple(func.argtypes) == argtypes
    assert func._flags_ & FUNCFLAG_USE_ERRNO


@pytest.mark.parametrize(("name", "value"), sorted(KERNEL_CONSTANTS.items()))
def test_the_constants_are_the_kernels(name: str, value: int) -> None:
    assert getattr(inotify_c.InotifyConstants, name) == value


def test_a_watch_descriptor_is_the_int_it_wraps() -> None:
    wd = inotify_c.WatchDescriptor(7)
    assert wd == 7
    assert isinstance(wd, int)


@pytest.fixture
def inotify_fd() -> Iterator[int]:
    fd = inotify_c.inotify_init()
    assert fd >= 0, os.strerror(ctypes.get_errno())
    yield fd
    os.close(fd)


def _read(fd: int) -> list[tuple[int, int, str]]:
    data = os.read(fd, 4096)
    events, pos = [], 0
    while pos < len(data):
        wd, mask, _, length = _EVENT.unpack_from(data, pos)
        name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0").decode()
        events.append((wd, mask, name))
        pos += _EVENT.size + length
    return events


def test_the_calls_behave_as_the_watcher_relies_on(inotify_fd: int, tmp_path: Path) -> None:
    assert "inotify" in os.readlink(f"/proc/self/fd/{inotify_fd}")
    consts = inotify_c.InotifyConstants
    wd = inotify_c.inotify_add_watch(inotify_fd, os.fsencode(tmp_path), consts.IN_CREATE)
    assert wd >= 0, os.strerror(ctypes.get_errno())
    # A new mask for a watched path keeps its descriptor (Watcher.watch relies on it).
    assert inotify_c.inotify_add_watch(inotify_fd, os.fsencode(tmp_path), consts.IN_CREATE | consts.IN_DELETE) == wd
    (tmp_path / "made").touch()
    (tmp_path / "made").unlink()
    assert _read(inotify_fd) == [(wd, consts.IN_CREATE, "made"), (wd, consts.IN_DELETE, "made")]

    # Failures return -1 and leave errno where ctypes.get_errno() reads it.
    ctypes.set_errno(0)
    assert inotify_c.inotify_add_watch(inotify_fd, os.fsencode(tmp_path / "absent"), consts.IN_CREATE) == -1
    assert ctypes.get_errno() == errno.ENOENT

    assert inotify_c.inotify_rm_watch(inotify_fd, inotify_c.WatchDescriptor(wd)) == 0
    assert _read(inotify_fd) == [(wd, consts.IN_IGNORED, "")]
    ctypes.set_errno(0)
    assert inotify_c.inotify_rm_watch(inotify_fd, inotify_c.WatchDescriptor(wd)) == -1
    assert ctypes.get_errno() == errno.EINVAL
