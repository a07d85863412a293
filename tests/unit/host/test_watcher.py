"""The watcher on temporary directories: events reach the loop; watches follow the set.
What matters in a quiet directory, the config file's events and removed directories, one
row per situation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

import pytest

from ate_devplugin.host.watcher import FsEvent, Watcher, Watches, matters, nearest_existing, removed_dirs, touches
from tests.unit.fakes import until


def dirs(*paths: Path) -> Watches:
    return Watches(dirs=frozenset(str(p) for p in paths))


def inotify_instances() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += "inotify" in os.readlink(f"/proc/self/fd/{fd}")
    return n


async def test_events_reach_the_loop_and_watches_follow_directories(tmp_path: Path) -> None:
    before = inotify_instances()
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    watcher.watch(dirs(a, b))  # b does not exist yet: skipped
    (a / "x").write_text("1")
    await until(lambda: any(e.path == str(a / "x") and e.kind == "created" for e in seen), "created in a")
    (a / "x").rename(a / "y")
    await until(lambda: any(e.kind == "moved" and e.paths() == (str(a / "x"), str(a / "y")) for e in seen), "moved")
    # b made: watched once asked again; a no longer asked for: not watched.
    b.mkdir()
    watcher.watch(dirs(b))
    seen.clear()
    (a / "z").write_text("1")
    (b / "z").write_text("1")
    await until(lambda: any(e.path == str(b / "z") for e in seen), "created in b")
    assert not any(e.path.startswith(str(a)) for e in seen)
    # b removed and made again: forget() drops the old watch, watch() arms a new one.
    shutil.rmtree(b)
    watcher.forget(str(b))
    b.mkdir()
    watcher.watch(dirs(b))
    seen.clear()
    (b / "again").write_text("1")
    await until(lambda: any(e.path == str(b / "again") for e in seen), "created in the new b")
    watcher.stop()
    await until(lambda: inotify_instances() == before, "every inotify instance closed")


def test_nearest_existing(tmp_path: Path) -> None:
    assert nearest_existing(str(tmp_path / "no/such/dir")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing("/no-such-top-level-dir") == "/"


async def test_what_cannot_matter_is_never_put(tmp_path: Path) -> None:
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    watcher.watch(Watches(quiet_dirs=frozenset({str(tmp_path)}), files=frozenset({str(tmp_path / "wanted")})))
    (tmp_path / "noise").write_text("1")
    (tmp_path / "wanted").write_text("1")
    (tmp_path / "b.sock").write_text("1")
    # Events of one directory arrive in order: once b.sock's is in, the others' would have been.
    await until(lambda: any(e.path == str(tmp_path / "b.sock") for e in seen), "created b.sock")
    assert any(e.path == str(tmp_path / "wanted") for e in seen)
    assert not any(e.path.endswith("noise") for e in seen)
    watcher.stop()


def test_a_quiet_directory_watched_in_full_is_not_quiet(tmp_path: Path) -> None:
    quiet = Watches(quiet_dirs=frozenset({str(tmp_path)}))
    assert quiet.quiet == {str(tmp_path)}
    assert (quiet | dirs(tmp_path)).quiet == set()
    # Not there yet: watched through its nearest ancestor, and quiet once it exists.
    assert (Watches(quiet_dirs=frozenset({str(tmp_path / "later")})) | dirs(tmp_path)).quiet == {
        str(tmp_path / "later")
    }


D = "/var/lib/kubelet/device-plugins"


CONFIG_DIR = "/etc/ate"


def fs(kind: str, path: str, dest: str = "", is_dir: bool = False) -> FsEvent:
    return FsEvent(kind=kind, path=path, dest_path=dest, is_directory=is_dir)


CONFIG_ROWS: list[tuple[str, list[FsEvent], bool]] = [
    ("config edited in place", [fs("closed", "/etc/ate/config.yaml")], True),
    ("ConfigMap ..data swap", [fs("moved", "/etc/ate/..data_tmp", "/etc/ate/..data")], True),
    ("renamed into the directory", [fs("moved", "/tmp/x", "/etc/ate/config.yaml")], True),
    ("another directory", [fs("closed", "/etc/other/config.yaml")], False),
    ("a device node", [fs("created", "/dev/kvm")], False),
]


@pytest.mark.parametrize(("why", "batch", "changed"), CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_config_events(why: str, batch: list[FsEvent], changed: bool) -> None:
    assert touches(batch, CONFIG_DIR) is changed, why


def test_removed_directories_are_named() -> None:
    batch = [
        fs("deleted", "/dev/net", is_dir=True),
        fs("moved", "/dev/old", "/dev/new", is_dir=True),
        fs("deleted", "/dev/kvm"),
        fs("created", "/dev/made", is_dir=True),
    ]
    assert removed_dirs(batch) == ["/dev/net", "/dev/old"]


@pytest.mark.parametrize(
    ("event", "quiet_dir", "kept"),
    [
        # The kubelet's checkpoint rewrite: a temporary file written, then renamed over.
        (fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), D, False),
        (fs("closed", f"{D}/.kubelet_internal_checkpoint.tmp"), D, False),
        (fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", f"{D}/kubelet_internal_checkpoint"), D, False),
        (fs("created", f"{D}/kubelet.sock"), D, True),
        (fs("deleted", f"{D}/kvm.sock"), D, True),
        (fs("moved", f"{D}/x.tmp", f"{D}/kvm.sock"), D, True),
        (fs("moved", f"{D}/checkpoint", "/elsewhere/checkpoint"), D, True),
        (fs("created", f"{D}/sub", is_dir=True), D, True),
        (fs("deleted", D, is_dir=True), D, True),
        # Not quiet (nothing given, or another directory): everything is kept.
        (fs("created", f"{D}/kubelet_internal_checkpoint"), None, True),
        (fs("created", "/dev/kvm"), D, True),
    ],
)
def test_only_sockets_and_directories_matter_in_the_quiet_directory(
    event: FsEvent, quiet_dir: str | None, kept: bool
) -> None:
    assert matters(event, {quiet_dir} if quiet_dir else set()) is kept


def test_the_checkpoint_matters_while_pods_are_read() -> None:
    checkpoint = f"{D}/kubelet_internal_checkpoint"
    renamed = fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", checkpoint)
    assert matters(renamed, {D}, also={checkpoint})
    assert matters(fs("closed", checkpoint), {D}, also={checkpoint})
    assert not matters(fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), {D}, also={checkpoint})
