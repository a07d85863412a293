"""The watcher on temporary directories and sockets: events reach the loop; watches follow
the set; the kernel is asked only for what can matter. What matters, the config file's
events, removed directories and the decoding of inotify's records, one row per situation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchdog.observers.inotify_c import InotifyConstants

from ate_devplugin.host import watcher as watcher_module
from ate_devplugin.host.watcher import (
    AWAITING,
    EVERYTHING,
    FILES,
    SOCKET,
    SOCKETS,
    FsEvent,
    Plan,
    Watcher,
    Watches,
    decode,
    matters,
    nearest_existing,
    plan,
    removed_dirs,
    touches,
)
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
    threads = threading.active_count()
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    assert threading.active_count() == threads  # read on the loop: no thread of its own
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


@contextlib.contextmanager
def bound(path: Path) -> Iterator[socket.socket]:
    """A listening unix socket at ``path``, as the kubelet's or ours is."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen()
    try:
        yield s
    finally:
        s.close()


async def test_sockets_are_watched_themselves_and_their_neighbours_never_wake_the_loop(tmp_path: Path) -> None:
    kubelet, ours, checkpoint = tmp_path / "kubelet.sock", tmp_path / "ours.sock", tmp_path / "checkpoint"
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    wanted = Watches(sockets=frozenset({str(kubelet), str(ours)}))
    with bound(kubelet), bound(ours):
        watcher.watch(wanted)
        # First watched: reported as made (they may have been made before their watch).
        assert {e.path for e in seen if e.kind == "created"} == {str(kubelet), str(ours)}
        seen.clear()
        # The kubelet's checkpoint rewrite, a file closed after writing, a mode changed: nothing
        # (test_the_kernel_is_asked... shows the kernel is not even asked for the first two).
        (tmp_path / ".tmp").write_text("1")
        (tmp_path / ".tmp").rename(checkpoint)
        (tmp_path / "noise").write_text("1")
        os.chmod(kubelet, 0o600)
        # Our socket unlinked: reported, after everything above would have been.
        ours.unlink()
        await until(lambda: fs("deleted", str(ours)) in seen, "ours deleted")
        assert seen == [fs("deleted", str(ours))]
    # The kubelet's socket gone (it unlinks it when it stops), then awaited: its making is
    # reported, and only that.
    kubelet.unlink()
    await until(lambda: fs("deleted", str(kubelet)) in seen, "kubelet.sock deleted")
    watcher.watch(Watches(sockets=frozenset({str(kubelet)})))
    seen.clear()
    (tmp_path / ".tmp2").write_text("1")
    with bound(kubelet):
        await until(lambda: fs("created", str(kubelet)) in seen, "kubelet.sock made")
        # Watched itself from now on; its making, awaited, is not reported twice.
        watcher.watch(Watches(sockets=frozenset({str(kubelet)})))
        assert seen == [fs("created", str(kubelet))]
        seen.clear()
        # Something renamed over it.
        (tmp_path / "impostor").write_text("1")
        (tmp_path / "impostor").rename(kubelet)
        await until(lambda: fs("deleted", str(kubelet)) in seen, "renamed over")
    # Bound anew between two watch() calls, unseen: the next watch() reports it made.
    kubelet.unlink()
    seen.clear()
    with bound(kubelet):
        watcher.watch(Watches(sockets=frozenset({str(kubelet)})))
        assert fs("created", str(kubelet)) in seen
    watcher.stop()


def test_nearest_existing(tmp_path: Path) -> None:
    assert nearest_existing(str(tmp_path / "no/such/dir")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing("/no-such-top-level-dir") == "/"


def test_the_kernel_is_asked_per_path_for_what_can_matter_there(tmp_path: Path) -> None:
    full, named, later = tmp_path / "full", tmp_path / "named", tmp_path / "later"
    full.mkdir()
    named.mkdir()
    absent, checkpoint = str(named / "kubelet.sock"), str(named / "checkpoint")
    with bound(named / "ours.sock"):
        present = str(named / "ours.sock")
        # A socket that exists is watched itself; its directory only for its own removal.
        p = plan(Watches(dirs=frozenset({str(full)}), sockets=frozenset({present})))
        assert p.masks == {str(full): EVERYTHING, str(named): SOCKETS, present: SOCKET}
        assert p.named_dirs == {str(named)}
        # One awaited: its directory is asked for what is made there.
        p = plan(Watches(sockets=frozenset({present, absent})))
        assert p.masks == {str(named): SOCKETS | AWAITING, present: SOCKET}
        assert p.awaited == {absent}
        # A file whose every rewrite matters: made, renamed over, closed after writing.
        assert plan(Watches(files=frozenset({checkpoint}), sockets=frozenset({present}))).masks == {
            str(named): FILES,
            present: SOCKET,
        }
        # Also watched in full: everything in it matters.
        p = plan(Watches(dirs=frozenset({str(named)}), sockets=frozenset({present})))
        assert p.masks == {str(named): EVERYTHING, present: SOCKET}
        assert p.named_dirs == set()
    # Not there yet: its nearest ancestor is watched in full, for its making.
    p = plan(Watches(sockets=frozenset({str(later / "kubelet.sock")})))
    assert p.masks == {str(tmp_path): EVERYTHING}
    assert p.named_dirs == set()


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


D = "/var/lib/kubelet/device-plugins"
KUBELET = f"{D}/kubelet.sock"
CHECKPOINT = f"{D}/kubelet_internal_checkpoint"


@pytest.mark.parametrize(
    ("event", "kept"),
    [
        # The kubelet's checkpoint rewrite, as far as the kernel still reports it.
        (fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), False),
        (fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", CHECKPOINT), False),
        (fs("created", f"{D}/other.sock"), False),
        (fs("created", f"{D}/sub", is_dir=True), False),
        (fs("created", KUBELET), True),
        (fs("deleted", f"{D}/kvm.sock"), True),
        (fs("moved", f"{D}/x.tmp", f"{D}/kvm.sock"), True),
        (fs("moved", f"{D}/kvm.sock", "/elsewhere/kvm.sock"), True),
        (fs("moved", f"{D}/x", "/elsewhere/x"), True),  # the other side is watched in full
        (fs("deleted", D, is_dir=True), True),  # the directory itself
        (fs("created", "/dev/kvm"), True),
    ],
)
def test_only_the_named_entries_matter_in_their_directory(event: FsEvent, kept: bool) -> None:
    assert matters(event, {D}, {KUBELET, f"{D}/kvm.sock"}) is kept


def test_the_checkpoint_matters_while_pods_are_read() -> None:
    renamed = fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", CHECKPOINT)
    names = {KUBELET, CHECKPOINT}
    assert matters(renamed, {D}, names)
    assert matters(fs("closed", CHECKPOINT), {D}, names)
    assert not matters(fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), {D}, names)


def raw(wd: int, mask: int, name: bytes = b"", cookie: int = 0) -> bytes:
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("iIII", wd, mask, cookie, len(padded)) + padded


IN = InotifyConstants
WATCHED = {1: ("/a", True), 2: ("/b", True), 3: ("/a/k.sock", False)}

DECODE_ROWS: list[tuple[str, bytes, list[FsEvent | None]]] = [
    ("created", raw(1, IN.IN_CREATE, b"x"), [fs("created", "/a/x")]),
    ("a directory made", raw(1, IN.IN_CREATE | IN.IN_ISDIR, b"d"), [fs("created", "/a/d", is_dir=True)]),
    ("deleted", raw(2, IN.IN_DELETE, b"x.sock"), [fs("deleted", "/b/x.sock")]),
    ("closed after writing", raw(1, IN.IN_CLOSE_WRITE, b"c"), [fs("closed", "/a/c")]),
    (
        "renamed within a directory",
        raw(1, IN.IN_MOVED_FROM, b".tmp", 7) + raw(1, IN.IN_MOVED_TO, b"checkpoint", 7),
        [fs("moved", "/a/.tmp", "/a/checkpoint")],
    ),
    (
        "renamed from one watched directory to another",
        raw(1, IN.IN_MOVED_FROM, b"x", 8) + raw(2, IN.IN_MOVED_TO, b"y", 8),
        [fs("moved", "/a/x", "/b/y")],
    ),
    ("renamed in from elsewhere", raw(1, IN.IN_MOVED_TO, b"y", 9), [fs("created", "/a/y")]),
    ("renamed away", raw(1, IN.IN_MOVED_FROM, b"x", 9), [fs("deleted", "/a/x")]),
    (
        "the watched directory removed",
        raw(2, IN.IN_DELETE_SELF) + raw(2, IN.IN_IGNORED),
        [fs("deleted", "/b", is_dir=True)],
    ),
    ("the watched directory renamed", raw(2, IN.IN_MOVE_SELF), [fs("deleted", "/b", is_dir=True)]),
    ("a watched socket unlinked or renamed over", raw(3, IN.IN_ATTRIB), [fs("changed", "/a/k.sock")]),
    ("a watched socket renamed away", raw(3, IN.IN_MOVE_SELF), [fs("deleted", "/a/k.sock")]),
    ("a watch removed since", raw(4, IN.IN_CREATE, b"x"), []),
    ("the queue overflowed", raw(-1, IN.IN_Q_OVERFLOW) + raw(1, IN.IN_CREATE, b"x"), [None, fs("created", "/a/x")]),
]


@pytest.mark.parametrize(("why", "data", "events"), DECODE_ROWS, ids=[r[0] for r in DECODE_ROWS])
def test_decode(why: str, data: bytes, events: list[FsEvent | None]) -> None:
    assert list(decode(data, WATCHED)) == events, why


async def test_a_queue_overflow_reports_every_watched_directory_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    wanted = tmp_path / "wanted"
    watcher.watch(Watches(files=frozenset({str(wanted)})))
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    # More files made than the kernel queues, before the loop reads any: events are lost.
    for i in range(limit + 1):
        os.close(os.open(tmp_path / f"{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    wanted.write_text("1")
    with caplog.at_level(logging.WARNING):
        await until(lambda: any(e.path == str(tmp_path) and e.kind == "created" for e in seen), "the directory")
    assert "overflowed" in caplog.text
    # The named file is reported (its events were lost); what cannot matter still is not.
    assert fs("created", str(wanted)) in seen
    assert {e.path for e in seen} == {str(tmp_path), str(wanted)}
    watcher.stop()


async def test_a_directory_removed_while_its_watch_is_armed_leaves_its_parent_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI met: the plan names a directory, which goes before its watch is armed.
    The parent's watch must not have ended, the removal is reported, and the directory
    made again is seen."""
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    cdi = tmp_path / "cdi"
    watcher.watch(dirs(cdi))  # absent: watched through tmp_path
    cdi.mkdir()
    planned = watcher_module.plan

    def plan_then_remove(watches: Watches) -> Plan:
        made = planned(watches)
        if cdi.exists():
            cdi.rmdir()  # after the plan named it, before its watch
        return made

    monkeypatch.setattr(watcher_module, "plan", plan_then_remove)
    watcher.watch(dirs(cdi))
    assert fs("deleted", str(cdi), is_dir=True) in seen
    seen.clear()
    cdi.mkdir()
    await until(lambda: fs("created", str(cdi), is_dir=True) in seen, "the directory made again")
    watcher.stop()


async def test_a_directory_replaced_before_its_events_are_read_is_reported_made_anew(tmp_path: Path) -> None:
    """The race CI met: the CDI directory swapped for a symlink to another directory after
    one batch's events were read and before the next plan. The plan finds a new identity
    under the name and watches it; the old watch's events (its move) go unread with it, so
    the replacement itself must be reported."""
    seen: list[FsEvent] = []
    watcher = Watcher(asyncio.get_running_loop(), seen.append)
    watcher.start()
    cdi, elsewhere, link = tmp_path / "cdi", tmp_path / "elsewhere", tmp_path / "cdi.link"
    cdi.mkdir()
    elsewhere.mkdir()
    watcher.watch(dirs(cdi))
    link.symlink_to(elsewhere)
    os.rename(cdi, tmp_path / "old")  # no await: the loop reads none of this before the plan
    os.rename(link, cdi)
    watcher.watch(dirs(cdi))
    assert seen == [fs("created", str(cdi), is_dir=True)]
    await asyncio.sleep(0.05)  # the old watch's move and the tmp_path events stay unread
    assert seen == [fs("created", str(cdi), is_dir=True)]
    watcher.watch(dirs(cdi))  # the same identity: nothing new
    assert seen == [fs("created", str(cdi), is_dir=True)]
    watcher.stop()
