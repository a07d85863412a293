"""Device roots with real character device nodes, for scenario tests.

A "device root" stands in for the host's ``/dev`` (the daemon's ``--device-root``). The
nodes are made with ``os.mknod`` (needs root) and copy the major/minor numbers of real
host devices, so that code which checks ``stat.S_ISCHR`` and the device numbers sees the
same thing it sees on a node. Nothing is opened: creating a node does not touch the
device behind it.

    root = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm", "null": "/dev/null"})
    remove_device_node(root, "kvm")        # unplug
    add_device_node(root, "kvm", "/dev/kvm")   # plug back in

:func:`can_mknod` tells whether this process may make nodes at all (CAP_MKNOD: root).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DeviceNumber",
    "add_device_node",
    "can_mknod",
    "device_number",
    "make_device_root",
    "mknod_char",
    "remove_device_node",
]


@dataclass(frozen=True)
class DeviceNumber:
    """Major and minor number of a character device."""

    major: int
    minor: int

    @property
    def rdev(self) -> int:
        return os.makedev(self.major, self.minor)


# Fallbacks used when the host lacks the device (the numbers are the kernel's fixed ones).
WELL_KNOWN: Mapping[str, DeviceNumber] = {
    "/dev/null": DeviceNumber(1, 3),
    "/dev/zero": DeviceNumber(1, 5),
    "/dev/full": DeviceNumber(1, 7),
    "/dev/random": DeviceNumber(1, 8),
    "/dev/urandom": DeviceNumber(1, 9),
    "/dev/kvm": DeviceNumber(10, 232),
    "/dev/net/tun": DeviceNumber(10, 200),
    "/dev/vhost-net": DeviceNumber(10, 238),
    "/dev/vhost-vsock": DeviceNumber(10, 241),
}


def device_number(source: str | os.PathLike[str] | DeviceNumber) -> DeviceNumber:
    """The device number of ``source``: a host character device path or a DeviceNumber.

    A path that does not exist on this host falls back to :data:`WELL_KNOWN`.
    """
    if isinstance(source, DeviceNumber):
        return source
    path = os.fspath(source)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path in WELL_KNOWN:
            return WELL_KNOWN[path]
        raise
    if not stat.S_ISCHR(st.st_mode):
        raise ValueError(f"{path} is not a character device")
    return DeviceNumber(os.major(st.st_rdev), os.minor(st.st_rdev))


def mknod_char(path: str | os.PathLike[str], number: DeviceNumber, mode: int = 0o666) -> Path:
    """Create a character device node at ``path`` (parents too), replacing what is there."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() or p.is_symlink():
        p.unlink()
    os.mknod(p, stat.S_IFCHR | mode, number.rdev)
    os.chmod(p, mode)  # mknod applies the umask
    return p


def can_mknod() -> bool:
    """Whether this process may create character device nodes (CAP_MKNOD: root, in CI too)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mknod_char(os.path.join(tmp, "probe"), WELL_KNOWN["/dev/null"])
        except PermissionError:
            return False
    return True


def add_device_node(
    root: str | os.PathLike[str],
    name: str,
    source: str | os.PathLike[str] | DeviceNumber,
    mode: int = 0o666,
) -> Path:
    """Create ``root/name`` (``name`` may contain ``/``, e.g. ``net/tun``) like ``source``."""
    return mknod_char(Path(root) / name, device_number(source), mode)


def remove_device_node(root: str | os.PathLike[str], name: str) -> None:
    """Remove ``root/name`` if present (simulates a device going away)."""
    (Path(root) / name).unlink(missing_ok=True)


def make_device_root(
    root: str | os.PathLike[str],
    nodes: Mapping[str, str | os.PathLike[str] | DeviceNumber],
    mode: int = 0o666,
) -> Path:
    """Create directory ``root`` holding one character device node per entry of ``nodes``.

    ``nodes`` maps the name under the root (``"kvm"``, ``"net/tun"``) to the host device
    whose numbers it copies (``"/dev/kvm"``) or to a :class:`DeviceNumber`.
    """
    r = Path(root)
    r.mkdir(parents=True, exist_ok=True)
    for name, source in nodes.items():
        add_device_node(r, name, source, mode)
    return r
