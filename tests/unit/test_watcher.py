"""The watcher on temporary directories: events reach the loop; watches follow the set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from ate_devplugin.host.watcher import FsEvent, Watcher, nearest_existing
from tests.unit.fakes import until


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
    watcher.watch({str(a), str(b)})  # b does not exist yet: skipped
    (a / "x").write_text("1")
    await until(lambda: any(e.path == str(a / "x") and e.kind == "created" for e in seen), "created in a")
    (a / "x").rename(a / "y")
    await until(lambda: any(e.kind == "moved" and e.paths() == (str(a / "x"), str(a / "y")) for e in seen), "moved")
    # b made: watched once asked again; a no longer asked for: not watched.
    b.mkdir()
    watcher.watch({str(b)})
    seen.clear()
    (a / "z").write_text("1")
    (b / "z").write_text("1")
    await until(lambda: any(e.path == str(b / "z") for e in seen), "created in b")
    assert not any(e.path.startswith(str(a)) for e in seen)
    # b removed and made again: forget() drops the old watch, watch() arms a new one.
    shutil.rmtree(b)
    watcher.forget(str(b))
    b.mkdir()
    watcher.watch({str(b)})
    seen.clear()
    (b / "again").write_text("1")
    await until(lambda: any(e.path == str(b / "again") for e in seen), "created in the new b")
    watcher.stop()
    await until(lambda: inotify_instances() == before, "every inotify instance closed")


def test_nearest_existing(tmp_path: Path) -> None:
    assert nearest_existing(str(tmp_path / "no/such/dir")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing("/no-such-top-level-dir") == "/"


async def test_events_keep_drops_are_never_put(tmp_path: Path) -> None:
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append, keep=lambda e: not e.path.endswith(".skip"))
    watcher.start()
    watcher.watch({str(tmp_path)})
    (tmp_path / "a.skip").write_text("1")
    (tmp_path / "b").write_text("1")
    # Events of one directory arrive in order: once b's is in, a's would have been.
    await until(lambda: any(e.path == str(tmp_path / "b") for e in seen), "created b")
    assert not any(e.path.endswith(".skip") for e in seen)
    watcher.stop()
