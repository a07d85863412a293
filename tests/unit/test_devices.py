import os
import stat
from pathlib import Path

import pytest

from ate_devplugin.config import ResourceConfig
from ate_devplugin.devices import EscapesRootError, discover, resolve_in_root, watch_dirs


def chardev(path: Path, minor: int = 232) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(10, minor))


def res(*devices: str) -> ResourceConfig:
    return ResourceConfig(name="ate.dev/x", devices=devices, units=2)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")


@needs_root
def test_finds_char_device(tmp_path: Path) -> None:
    chardev(tmp_path / "kvm")
    found = discover(res("/dev/kvm"), str(tmp_path))
    assert found.complete
    assert [(n.host_path, n.major, n.minor) for n in found.nodes] == [("/dev/kvm", 10, 232)]


@needs_root
def test_all_paths_must_exist_for_complete(tmp_path: Path) -> None:
    chardev(tmp_path / "vhost-net", 238)
    found = discover(res("/dev/vhost-net", "/dev/net/tun"), str(tmp_path))
    assert not found.complete
    assert [n.host_path for n in found.nodes] == ["/dev/vhost-net"]


def test_regular_file_is_not_a_device(tmp_path: Path) -> None:
    (tmp_path / "kvm").write_text("")
    assert not discover(res("/dev/kvm"), str(tmp_path)).complete


@needs_root
def test_glob_matches_nodes_in_named_directory(tmp_path: Path) -> None:
    chardev(tmp_path / "dri/renderD128", 1)
    chardev(tmp_path / "dri/renderD129", 2)
    (tmp_path / "dri/card0").write_text("")
    found = discover(res("/dev/dri/renderD*"), str(tmp_path))
    assert [n.host_path for n in found.nodes] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]


@needs_root
def test_symlink_inside_root_is_followed_as_host_path(tmp_path: Path) -> None:
    chardev(tmp_path / "real/kvm")
    (tmp_path / "kvm").symlink_to("/dev/real/kvm")  # absolute: a host path
    (tmp_path / "kvm2").symlink_to("real/kvm")  # relative
    assert resolve_in_root(str(tmp_path), "/dev/kvm") == str(tmp_path / "real/kvm")
    found = discover(res("/dev/kvm", "/dev/kvm2"), str(tmp_path))
    assert found.complete
    # The runtime is told the configured path; the node behind it is the same.
    assert {n.host_path for n in found.nodes} == {"/dev/kvm", "/dev/kvm2"}


@pytest.mark.parametrize("target", ["/etc/passwd", "../../etc/passwd", "../outside"])
def test_symlink_escaping_the_root_is_ignored(tmp_path: Path, target: str) -> None:
    root = tmp_path / "dev"
    root.mkdir()
    (tmp_path / "outside").write_text("")
    (root / "kvm").symlink_to(target)
    with pytest.raises(EscapesRootError):
        resolve_in_root(str(root), "/dev/kvm")
    assert discover(res("/dev/kvm"), str(root)).nodes == ()


def test_symlink_loop_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert discover(res("/dev/a"), str(tmp_path)).nodes == ()


def test_watch_dirs_cover_every_existing_directory_down_each_path(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "a/b").mkdir(parents=True)
    resource = res("/dev/kvm", "/dev/net/tun", "/dev/vfio/*", "/dev/a/b/c/node", "/dev/a/*/x")
    assert watch_dirs(resource, str(tmp_path)) == {str(tmp_path / p) for p in ("", "net", "a", "a/b")} | {str(tmp_path)}
