"""Device discovery on an in-memory filesystem (no root needed), and once on real nodes."""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import EscapesRootError, discover, resolve_in_root, watch_dirs
from tests.harness.devices import DeviceNumber, can_mknod, mknod_char
from tests.harness.require import require

ROOT = "/host/dev"


@dataclass(frozen=True)
class Node:
    st_mode: int
    st_rdev: int = 0
    target: str = ""  # of a symlink


DIR = Node(stat.S_IFDIR | 0o755)


class MemoryFS:
    """A tree of directories, character devices, files and symlinks, resolved as the
    kernel resolves paths (symlinks in every component, 40 hops at most)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {"/": DIR}

    def _add(self, path: str, node: Node) -> None:
        self.mkdir(posixpath.dirname(path))
        self.nodes[path] = node

    def mkdir(self, path: str) -> None:
        if path not in self.nodes:
            self._add(path, DIR)

    def chardev(self, path: str, minor: int = 232) -> None:
        self._add(path, Node(stat.S_IFCHR | 0o600, os.makedev(10, minor)))

    def file(self, path: str) -> None:
        self._add(path, Node(stat.S_IFREG | 0o644))

    def symlink(self, path: str, target: str) -> None:
        self._add(path, Node(stat.S_IFLNK | 0o777, target=target))

    def _resolve(self, path: str, follow_last: bool) -> tuple[str, Node]:
        parts = [p for p in path.split("/") if p]
        current, node, hops = "/", DIR, 0
        while parts:
            part = parts.pop(0)
            if not stat.S_ISDIR(node.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if part in (".", ".."):
                current = current if part == "." else posixpath.dirname(current)
                node = self.nodes[current]
                continue
            candidate = posixpath.join(current, part)
            if candidate not in self.nodes:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            node = self.nodes[candidate]
            if stat.S_ISLNK(node.st_mode) and (parts or follow_last):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                parts = [p for p in node.target.split("/") if p] + parts
                current = "/" if node.target.startswith("/") else current
                node = self.nodes[current]
                continue
            current = candidate
        return current, node

    def lstat(self, path: str) -> Node:
        return self._resolve(path, follow_last=False)[1]

    def stat(self, path: str) -> Node:
        return self._resolve(path, follow_last=True)[1]

    def readlink(self, path: str) -> str:
        node = self.lstat(path)
        if not stat.S_ISLNK(node.st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return node.target

    def listdir(self, path: str) -> list[str]:
        real, node = self._resolve(path, follow_last=True)
        if not stat.S_ISDIR(node.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return [posixpath.basename(p) for p in self.nodes if p != "/" and posixpath.dirname(p) == real]


@pytest.fixture
def fs() -> MemoryFS:
    tree = MemoryFS()
    tree.mkdir(ROOT)
    return tree


def res(*devices: str) -> ResourceConfig:
    return ResourceConfig(name="ate.dev/x", devices=devices, units=2)


def at(path: str) -> str:
    return posixpath.join(ROOT, path)


def test_finds_char_device(fs: MemoryFS) -> None:
    fs.chardev(at("kvm"))
    found = discover(res("/dev/kvm"), ROOT, fs)
    assert found.complete
    assert [(n.host_path, n.major, n.minor) for n in found.nodes] == [("/dev/kvm", 10, 232)]


def test_all_paths_must_exist_for_complete(fs: MemoryFS) -> None:
    fs.chardev(at("vhost-net"), 238)
    found = discover(res("/dev/vhost-net", "/dev/net/tun"), ROOT, fs)
    assert not found.complete
    assert [n.host_path for n in found.nodes] == ["/dev/vhost-net"]


@pytest.mark.parametrize("make", ["file", "mkdir"])
def test_only_a_character_device_counts(fs: MemoryFS, make: str) -> None:
    getattr(fs, make)(at("kvm"))
    found = discover(res("/dev/kvm"), ROOT, fs)
    assert found.nodes == ()
    assert not found.complete


def test_a_file_where_a_directory_should_be_is_absence(fs: MemoryFS) -> None:
    fs.file(at("net"))
    assert resolve_in_root(ROOT, "/dev/net/tun", fs) is None
    assert not discover(res("/dev/net/tun"), ROOT, fs).complete


def test_glob_matches_nodes_in_named_directory(fs: MemoryFS) -> None:
    fs.chardev(at("dri/renderD128"), 1)
    fs.chardev(at("dri/renderD129"), 2)
    fs.chardev(at("dri/.renderD130"), 3)  # hidden: never matched
    fs.file(at("dri/card0"))
    found = discover(res("/dev/dri/renderD*"), ROOT, fs)
    assert [n.host_path for n in found.nodes] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert found.complete


def test_glob_under_a_missing_or_escaping_directory_matches_nothing(fs: MemoryFS) -> None:
    fs.symlink(at("out"), "/etc")
    assert not discover(res("/dev/vfio/*", "/dev/out/*"), ROOT, fs).nodes
    assert not discover(res("/dev/vfio/*"), ROOT, fs).complete


def test_glob_in_a_middle_part(fs: MemoryFS) -> None:
    fs.chardev(at("a/x/node"), 1)
    fs.chardev(at("b/x/node"), 2)
    fs.file(at("c"))  # listed by the glob, but not a directory
    found = discover(res("/dev/*/x/node"), ROOT, fs)
    assert [n.host_path for n in found.nodes] == ["/dev/a/x/node", "/dev/b/x/node"]


def test_symlink_inside_root_is_followed_as_host_path(fs: MemoryFS) -> None:
    fs.chardev(at("real/kvm"))
    fs.symlink(at("kvm"), "/dev/real/kvm")  # absolute: a host path
    fs.symlink(at("kvm2"), "real/kvm")  # relative
    fs.symlink(at("kvm3"), "./real/../real/kvm")
    assert resolve_in_root(ROOT, "/dev/kvm", fs) == at("real/kvm")
    found = discover(res("/dev/kvm", "/dev/kvm2", "/dev/kvm3"), ROOT, fs)
    assert found.complete
    # The runtime is told the configured path; the node behind it is the same.
    assert {n.host_path for n in found.nodes} == {"/dev/kvm", "/dev/kvm2", "/dev/kvm3"}


def test_symlinked_directory_is_followed(fs: MemoryFS) -> None:
    fs.chardev(at("vfio/real/0"))
    fs.symlink(at("vfio/link"), "real")
    assert resolve_in_root(ROOT, "/dev/vfio/link/0", fs) == at("vfio/real/0")
    assert discover(res("/dev/vfio/link/0"), ROOT, fs).complete


@pytest.mark.parametrize("target", ["/etc/passwd", "../../etc/passwd", "../outside", "/dev/../etc"])
def test_symlink_escaping_the_root_is_ignored(fs: MemoryFS, target: str) -> None:
    fs.file("/host/outside")
    fs.file("/etc/passwd")
    fs.symlink(at("kvm"), target)
    with pytest.raises(EscapesRootError):
        resolve_in_root(ROOT, "/dev/kvm", fs)
    assert discover(res("/dev/kvm"), ROOT, fs).nodes == ()


def test_symlink_loop_is_ignored(fs: MemoryFS) -> None:
    fs.symlink(at("a"), "b")
    fs.symlink(at("b"), "a")
    with pytest.raises(EscapesRootError):
        resolve_in_root(ROOT, "/dev/a", fs)
    assert discover(res("/dev/a"), ROOT, fs).nodes == ()


def test_a_dangling_symlink_is_absence(fs: MemoryFS) -> None:
    fs.symlink(at("kvm"), "/dev/gone")
    assert resolve_in_root(ROOT, "/dev/kvm", fs) is None
    assert not discover(res("/dev/kvm"), ROOT, fs).complete


def test_watch_dirs_cover_every_existing_directory_down_each_path(fs: MemoryFS) -> None:
    fs.mkdir(at("net"))
    fs.mkdir(at("a/b"))
    fs.mkdir(at("linked-target"))
    fs.symlink(at("linked"), "linked-target")  # a symlinked directory is not descended
    resource = res("/dev/kvm", "/dev/net/tun", "/dev/vfio/*", "/dev/a/b/c/node", "/dev/a/*/x", "/dev/linked/n")
    assert watch_dirs(resource, ROOT, fs) == {ROOT, at("net"), at("a"), at("a/b")}


def test_the_real_filesystem_is_the_default(tmp_path: Path) -> None:
    """Once through ``os`` with real nodes (mknod needs root: skipped elsewhere, required in CI)."""
    require(can_mknod(), "mknod of a character device needs root")
    mknod_char(tmp_path / "kvm", DeviceNumber(10, 232))
    mknod_char(tmp_path / "dri/renderD128", DeviceNumber(226, 128))
    (tmp_path / "link").symlink_to("/dev/dri/renderD128")
    found = discover(res("/dev/kvm", "/dev/dri/render*", "/dev/link"), str(tmp_path))
    assert found.complete
    assert [(n.host_path, n.major, n.minor) for n in found.nodes] == [
        ("/dev/dri/renderD128", 226, 128),
        ("/dev/kvm", 10, 232),
        ("/dev/link", 226, 128),
    ]
    assert watch_dirs(res("/dev/dri/renderD128"), str(tmp_path)) == {str(tmp_path), str(tmp_path / "dri")}
