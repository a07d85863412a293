"""Fault cases of the prober's socket (issue 43): peers with the prober's identity that send
what a prober never does, two probers at once, and the socket's directory. The daemon's end
is the real ProberLink in the real KVM health component over a real unix socket; a hostile
peer is a raw client speaking kvm/wire.py's lines (or not).

Before: a report with a CPUID register of -1 or 2**40 killed the component (OverflowError
in cpu/features.py, through the restore answers), a TSC of Infinity raised in the
connection callback, a late answer was taken for the current request, a newer hello was
"no hello within 5s", and two probers displaced each other thousands of times in 15 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ate_devplugin.config import ResourceConfig
from ate_devplugin.cpu.restore import RestoreProfile
from ate_devplugin.host.sockdir import SocketDirError
from ate_devplugin.kvm import wire
from ate_devplugin.kvm.facts import DeviceFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.prober import serve
from ate_devplugin.kvm.reasons import Reason
from tests.unit.kvmhealth.test_link import refused
from tests.unit.kvmhealth.test_monitor import KVM, FakeProber, Harness, until

# A restore profile: a report's device facts reach cpu/ through its answers.
RESTORED = ResourceConfig(name=KVM.name, devices=KVM.devices, restore_profiles=(RestoreProfile("any"),))
FACTS = DeviceFacts(12, {"tsc_control": 0}, "ab" * 16, ("sse",), {}, 2_599_998)
PASSED = ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.001, "10:232", device_facts=FACTS)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, FakeProber(), period=0.1, timeout=0.3, mode="socket")
    await h.start(RESTORED)
    h.discover()
    yield h
    assert await h.health.stop(2.0) == []
    assert h.died == []


class Peer:
    """A raw client with the prober's identity: what it says is up to the test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: str, hello: bytes | None = None) -> Peer:
        reader, writer = await asyncio.open_unix_connection(path, limit=wire.MAX_LINE)
        peer = cls(reader, writer)
        if hello is None:
            hello = wire.encode(wire.Hello("ns/raw", {KVM.name: "/dev/kvm"}, ids=True))
        await peer.send(hello)
        return peer

    async def send(self, line: bytes) -> None:
        self.writer.write(line if line.endswith(b"\n") else line + b"\n")
        await self.writer.drain()

    async def request(self) -> wire.ProbeRequest:
        async with asyncio.timeout(5):
            message = wire.decode(await self.reader.readline())
        assert isinstance(message, wire.ProbeRequest)
        return message

    async def report(
        self, request: wire.ProbeRequest, result: ProbeResult = PASSED, answers: int | None = None
    ) -> None:
        """``answers``: another request id than ``request``'s."""
        number = request.request if answers is None else answers
        await self.send(wire.encode(wire.Report(request.resource, result, number)))

    def close(self) -> None:
        self.writer.close()


def bad_report(request: wire.ProbeRequest, **facts: Any) -> bytes:
    """PASSED's report on ``request`` with fields of its device facts replaced, as raw JSON
    (Infinity included: the peer is not bound by our encoder)."""
    result = PASSED.to_json()
    result["device_facts"] = {**result["device_facts"], **facts}
    line = {"v": 1, "report": {"resource": request.resource, "id": request.request, "result": result}}
    return json.dumps(line).encode()


def unchanged(h: Harness) -> bool:
    """Every verdict told was a pass (each period's pass is told anew: a new state object)."""
    return set(h.told) == {(KVM.name, Reason.PASSED)}


def logged(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# --- every field checked before it is believed ------------------------------------------

ATTACKS: dict[str, dict[str, Any]] = {
    "register -1": {"cpuid_registers": {"0x0.0.ebx": -1}},
    "register 2**40": {"cpuid_registers": {"0x0.0.ebx": 2**40}},
    "tsc Infinity": {"tsc_khz": float("inf")},
    "tsc NaN": {"tsc_khz": float("nan")},
    "tsc -1": {"tsc_khz": -1},
    "features unbounded": {"cpu_features": ["sse"] * 5000},
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_bad_report_is_refused_and_the_last_good_verdict_keeps_its_meaning(
    harness: Harness, caplog: pytest.LogCaptureFixture, attack: str
) -> None:
    h = harness
    caplog.set_level(logging.WARNING, "ate_devplugin.kvmhealth.link")
    peer = await Peer.connect(h.socket)
    try:
        await peer.report(await peer.request())
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the good report counted")
        good = h.verdict()
        for _ in range(3):  # again and again: counted each time, logged once
            await peer.send(bad_report(await peer.request(), **ATTACKS[attack]))
            await asyncio.sleep(0.05)
        assert refused(h, "bad-message") == 3
        assert h.verdict() is good  # the last good verdict holds: the bad ones were no verdict
        assert h.told == [(KVM.name, Reason.PASSED)]
        assert len(logged(caplog, "refused the KVM prober")) == 1
        assert h.died == []
        await peer.report(await peer.request())  # the connection, and the component, live on
        await until(lambda: h.sample("ate_devplugin_kvm_probe_state", state="passed") == 1, "still passed")
    finally:
        peer.close()


async def test_a_late_answer_is_not_taken_for_the_current_request(harness: Harness) -> None:
    """The first request times out (its report is late); the late report, a failure, comes
    while the next request is in flight: it is refused, and the next request's own answers."""
    h = harness
    peer = await Peer.connect(h.socket)
    try:
        first = await peer.request()  # not answered within 0.3 s + slack
        second = await peer.request()
        assert second.request != first.request
        assert (h.told[-1:], h.verdict()) == ([(KVM.name, Reason.TIMED_OUT)], h.verdict())
        failed = ProbeResult("/dev/kvm", Reason.RUN, "late", 0.001, "10:232")
        await peer.report(first, failed)
        await until(lambda: refused(h, "late") == 1, "the late answer refused")
        await peer.report(second)
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the current answer counted")
        assert (KVM.name, Reason.RUN) not in h.told
    finally:
        peer.close()


async def test_a_report_of_another_resource_or_none_asked_is_late(harness: Harness) -> None:
    h = harness
    peer = await Peer.connect(h.socket)
    try:
        request = await peer.request()
        await peer.send(wire.encode(wire.Report("ate.dev/other", PASSED, request.request)))
        assert request.request is not None
        await peer.report(request, answers=request.request + 1000)
        await until(lambda: refused(h, "late") == 2, "both refused")
        await peer.report(request)
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the right one counted")
        await peer.report(request)  # the same answer again: its request is over
        await until(lambda: refused(h, "late") == 3, "an answer twice")
    finally:
        peer.close()


@pytest.mark.parametrize(
    ("case", "line", "reason"),
    [
        ("newer version", b'{"v":2,"hello":{"pod":"ns/next","devices":{}}}', "version"),
        ("not JSON", b"hello?", "bad-message"),
        ("bad hello", b'{"v":1,"hello":{"pod":"","devices":{"r":"relative"}}}', "bad-message"),
        ("a report first", b'{"v":1,"restart":true}', "no-hello"),
    ],
)
async def test_a_bad_first_line_is_refused_with_its_reason(
    harness: Harness, caplog: pytest.LogCaptureFixture, case: str, line: bytes, reason: str
) -> None:
    caplog.set_level(logging.WARNING, "ate_devplugin.kvmhealth.link")
    peer = await Peer.connect(harness.socket, line)
    try:
        async with asyncio.timeout(3):
            assert await peer.reader.read() == b""  # closed at once, not after the hello's 0.3 s
        assert refused(harness, reason) == 1
        if reason == "version":
            assert logged(caplog, "speaks protocol version 2; this daemon speaks 1")
    finally:
        peer.close()


async def test_a_line_past_the_limit_is_refused_and_the_prober_heard_again(harness: Harness) -> None:
    h = harness
    peer = await Peer.connect(h.socket)
    try:
        await peer.request()
        await peer.send(b"x" * (wire.MAX_LINE + 10))
        await until(lambda: refused(h, "bad-message") == 1, "refused")
        async with asyncio.timeout(3):
            await peer.reader.read()  # the connection is closed
    finally:
        peer.close()
    again = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "", FakeProber()))
    try:
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "a prober heard again")
    finally:
        again.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await again


# --- one prober at a time ------------------------------------------------------------------


async def test_two_probers_one_is_heard_the_other_waits_no_storm(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Two real probers with the prober's identity on one socket (a rolled pod with overlap, a
    second release's prober): the first is heard, the second told to wait; over 2 s neither
    reconnects, every request is answered (passed throughout) and the health never moves."""
    h = harness
    caplog.set_level(logging.INFO)
    first_fake, second_fake = FakeProber(), FakeProber()
    first = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "ns/first", first_fake))
    await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the first prober heard")
    second = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "ns/second", second_fake))
    try:
        await until(lambda: h.link is not None and h.link.connections == 2, "the second connected")
        asked = len(first_fake.paths)
        await asyncio.sleep(2.0)  # ~20 periods
        assert h.link is not None
        assert h.link.connections == 2  # nobody reconnected
        assert h.link.hello is not None
        assert h.link.hello.pod == "ns/first"
        assert len(first_fake.paths) > asked  # the first keeps answering
        assert second_fake.paths == []  # the second waits, unasked
        assert unchanged(h)  # health unchanged throughout
        assert h.sample("ate_devplugin_kvm_probe_reason", reason="timed-out") == 0
        assert len(logged(caplog, "waits its turn")) == 1
        assert logged(caplog, "waiting for the daemon to hear this prober")
        # The first goes (its pod deleted): the second is heard at once, nothing in between.
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await until(lambda: second_fake.paths != [], "the second asked")
        assert h.link.hello is not None
        assert h.link.hello.pod == "ns/second"
        await asyncio.sleep(0.3)
        assert unchanged(h)
        assert h.link.connections == 2
    finally:
        for task in (first, second):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_probers_past_the_line_are_refused_busy_and_back_off(harness: Harness) -> None:
    h = harness
    probers = [
        asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, f"ns/p{i}", FakeProber(), backoff_max_s=1.0))
        for i in range(7)  # one heard, 4 waiting, 2 more
    ]
    try:
        await until(lambda: refused(h, "busy") >= 2, "two refused")
        await asyncio.sleep(1.0)
        # A refused prober retries with backoff (0.5 s, 1 s, ...), not at once: a few tries each.
        assert refused(h, "busy") <= 2 * 4
        assert unchanged(h)
    finally:
        for task in probers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_stuck_prober_hands_over_to_the_one_waiting(harness: Harness) -> None:
    h = harness
    stuck = await Peer.connect(h.socket)  # says hello, then never answers
    waiting = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "ns/next", FakeProber()))
    try:
        await until(lambda: h.link is not None and h.link.connections == 2, "both connected")
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the waiting one heard", 10)
        assert h.told == [(KVM.name, Reason.TIMED_OUT), (KVM.name, Reason.PASSED)]
    finally:
        stuck.close()
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting


# --- the socket's directory ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "file"])
async def test_a_socket_directory_not_the_daemons_stops_the_start(tmp_path: Path, kind: str) -> None:
    (tmp_path / "elsewhere").mkdir()
    if kind == "symlink":
        (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    else:
        (tmp_path / "run").write_text("")
    h = Harness(tmp_path, FakeProber(), period=0.1, timeout=1.0, mode="socket")
    with pytest.raises(
        SocketDirError, match=f"^{tmp_path}/run is a {'symlink' if kind == 'symlink' else 'regular file'}"
    ):
        await h.start(KVM)
    assert list((tmp_path / "elsewhere").iterdir()) == []  # no socket made where it pointed
    with contextlib.suppress(Exception):
        await h.health.stop(1.0)


async def test_a_socket_directory_of_a_loose_mode_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run").chmod(0o777)
    h = Harness(tmp_path, FakeProber(), period=0.1, timeout=1.0, mode="socket")
    await h.start(KVM)
    try:
        assert os.stat(tmp_path / "run").st_mode & 0o777 == 0o700
    finally:
        assert await h.health.stop(2.0) == []
