"""The prober socket's directory (host/sockdir.py): made and kept the daemon's own, or refused
at start with one line naming what to remove. One test per state of the path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ate_devplugin.host.sockdir import SocketDirError, own_directory


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_absent_it_is_made_with_its_parents(tmp_path: Path) -> None:
    path = tmp_path / "run/ate-devplugin"
    old = os.umask(0o077)  # the umask takes bits away from mkdir's: the mode is set all the same
    try:
        own_directory(str(path), 0o711)
    finally:
        os.umask(old)
    assert path.is_dir()
    assert mode(path) == 0o711


def test_ours_with_its_mode_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "dir"
    path.mkdir(0o700)
    path.chmod(0o700)
    (path / "keep").write_text("x")
    assert own_directory(str(path), 0o700) is False
    assert (mode(path), (path / "keep").read_text()) == (0o700, "x")


def test_ours_with_a_wrong_mode_is_fixed(tmp_path: Path) -> None:
    path = tmp_path / "dir"
    path.mkdir()
    path.chmod(0o777)
    assert own_directory(str(path), 0o700) is True
    assert mode(path) == 0o700


def test_another_owner_is_refused_naming_what_to_remove(tmp_path: Path) -> None:
    path = tmp_path / "dir"
    path.mkdir()
    path.chmod(0o777)
    other = os.geteuid() + 1  # the daemon's uid as another: the directory is not its own
    with pytest.raises(SocketDirError) as caught:
        own_directory(str(path), 0o700, uid=other)
    assert str(caught.value) == (
        f"{path} is owned by uid {os.geteuid()}, not the daemon's uid {other}: remove it (rm -r {path}); "
        "the daemon makes the directory itself"
    )
    assert mode(path) == 0o777  # untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
def test_a_directory_chowned_to_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dir"
    path.mkdir()
    os.chown(path, 65534, 65534)
    with pytest.raises(SocketDirError, match="is owned by uid 65534, not the daemon's uid 0"):
        own_directory(str(path), 0o700)


@pytest.mark.parametrize("target", ["dir", "nowhere"])
def test_a_symlink_is_refused_and_what_it_points_to_untouched(tmp_path: Path, target: str) -> None:
    real = tmp_path / "dir"
    real.mkdir()
    real.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / target)
    with pytest.raises(SocketDirError) as caught:
        own_directory(str(link), 0o700)
    assert str(caught.value) == (
        f"{link} is a symlink, not a directory: remove it (rm {link}); the daemon makes the directory itself"
    )
    assert mode(real) == 0o755  # never chmod'ed through the link
    assert not (tmp_path / "nowhere").exists()  # nor made where it points


def test_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(SocketDirError, match=r"is a regular file, not a directory: remove it \(rm "):
        own_directory(str(path), 0o700)
