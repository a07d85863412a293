"""The watcher on temporary directories: events reach the loop; watches follow the set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from ate_devplugin.host.watcher import FsEvent, Watcher, Watches, nearest_existing
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
