"""Socket mode (``--kvm-probe socket``): the KVM health component and the real prober
(kvm/prober.py) over a real unix socket; only the probe itself is faked (its worker is
tested in tests/unit/kvm/test_runner.py, the real device in tests/kvm)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.prober import serve
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.wire import Hello
from ate_devplugin.kvmhealth.link import ProberLink
from ate_devplugin.observability.metrics import KvmMetrics
from tests.unit.kvmhealth.test_monitor import KVM, FakeProber, Harness, until


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    # period 0.1 s: the prober's grace is 3 periods, 0.3 s
    h = Harness(tmp_path, FakeProber(), period=0.1, timeout=1.0, mode="socket")
    await h.start(KVM)
    yield h
    assert await h.health.stop(2.0) == []


async def test_unverified_until_the_prober_reports_then_its_verdicts_count(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # as the prober's pod logs: every line is made
    h = harness
    h.discover()
    assert h.health.readiness() == (True, "KVM probe: waiting for the prober (ate.dev/kvm)")
    assert h.sample("ate_devplugin_kvm_probe_state", state="unverified") == 1
    answers = {"reason": Reason.PASSED}
    fake = FakeProber(lambda path: answers["reason"])
    prober = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "ns/prober", fake))
    try:
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "passed once the prober reports")
        assert fake.paths[0] == "/dev/kvm"  # the path in the prober's container
        assert h.health.readiness() == (True, "")
        assert h.sample("ate_devplugin_kvm_probe_state", state="passed") == 1
        answers["reason"] = Reason.RUN
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.RUN)], "the next period's failure")
        assert h.health.readiness()[1].startswith("KVM probe failed: run-failed: /dev/kvm: ")
        assert h.link is not None
        assert h.link.hello == Hello("ns/prober", {KVM.name: "/dev/kvm"}, ids=True)
        assert not prober.done()
        assert "probed ate.dev/kvm (/dev/kvm): run-failed: /dev/kvm: run-failed" in caplog.text
    finally:
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober


async def test_a_prober_gone_past_its_grace_takes_its_verdict_with_it(harness: Harness) -> None:
    h = harness
    h.discover()
    prober = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "", FakeProber(lambda p: Reason.RUN)))
    await until(lambda: h.told[-1:] == [(KVM.name, Reason.RUN)], "failed")
    prober.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await prober
    # Within the grace the last verdict holds; then none (existence alone), state prober-gone.
    assert h.verdict() is not None
    await until(lambda: h.verdict() is None, "dropped after the grace", 2.0)
    assert h.told[-1] == (KVM.name, None)
    assert h.sample("ate_devplugin_kvm_probe_state", state="prober-gone") == 1
    assert h.health.readiness()[1].startswith("KVM probe: no prober for ")
    # A new prober: verdicts again.
    again = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "", FakeProber()))
    try:
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "passed with the new prober")
        assert h.sample("ate_devplugin_kvm_probe_state", state="passed") == 1
    finally:
        again.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await again


async def test_prober_gone_lasts_through_a_node_change_until_a_prober_comes(harness: Harness) -> None:
    """What AteDevpluginKvmProberGone reads: no prober ever came, the node goes and comes back
    meanwhile (it is unverified only once a prober is there to verify it)."""
    h = harness

    def state() -> list[str]:
        states = ("unverified", "passed", "failed", "prober-gone")
        return [s for s in states if h.sample("ate_devplugin_kvm_probe_state", state=s) == 1]

    h.discover()
    assert state() == ["unverified"]
    await until(lambda: state() == ["prober-gone"], "prober-gone after the grace, no prober ever", 2.0)
    h.discover(0)
    assert state() == ["prober-gone"]
    h.discover()
    assert state() == ["prober-gone"]
    prober = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "", FakeProber(lambda p: Reason.RUN)))
    try:
        await until(lambda: state() == ["failed"], "the new prober's verdict")
        assert h.sample("ate_devplugin_kvm_probe_reason", reason="run-failed") == 1
        h.discover(0)  # gone while the prober is there: unverified, not prober-gone
        assert state() == ["unverified"]
        assert h.sample("ate_devplugin_kvm_probe_reason", reason="run-failed") == 0
    finally:
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober


async def test_a_node_that_is_not_kvms_fails_without_the_prober(harness: Harness) -> None:
    harness.discover(1, 3)
    assert harness.told == [(KVM.name, Reason.NOT_KVM)]


async def test_kvms_node_back_drops_the_not_kvm_verdict_with_no_prober_to_replace_it(harness: Harness) -> None:
    """Without the prober nothing would replace that verdict: its units would stay Unhealthy, and
    the prober's pod, which requests one of them, could not be admitted to come back."""
    h = harness
    h.discover()
    await until(lambda: h.sample("ate_devplugin_kvm_probe_state", state="prober-gone") == 1, "prober-gone", 2.0)
    h.discover(1, 3)
    assert h.sample("ate_devplugin_kvm_probe_state", state="failed") == 1
    h.discover()
    assert h.told == [(KVM.name, None), (KVM.name, Reason.NOT_KVM), (KVM.name, None)]
    assert h.sample("ate_devplugin_kvm_probe_state", state="prober-gone") == 1
    assert h.sample("ate_devplugin_kvm_probe_reason", reason="not-a-kvm-device") == 0


class StaleProber(FakeProber):
    """Reports on a node of other numbers than the host's: its container's node is stale."""

    async def probe(self, device: str, timeout: float) -> ProbeResult:
        return replace(await super().probe(device, timeout), rdev="10:233")


async def test_a_report_on_another_node_restarts_the_prober(harness: Harness) -> None:
    harness.discover()
    prober = asyncio.create_task(serve(harness.socket, {KVM.name: "/dev/kvm"}, "", StaleProber()))
    assert await asyncio.wait_for(prober, 3.0) == 0  # told restart: it exits 0
    assert harness.told == []  # and its report did not count


async def test_the_prober_waits_for_the_daemon_with_backoff(tmp_path: Path) -> None:
    socket = str(tmp_path / "run/prober.sock")
    fake = FakeProber()
    prober = asyncio.create_task(serve(socket, {KVM.name: "/dev/kvm"}, "", fake, backoff_max_s=0.2))
    await asyncio.sleep(0.3)  # no daemon yet: it retries
    assert not prober.done()
    (tmp_path / "run").mkdir()

    async def daemon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        assert hello["hello"]["devices"] == {KVM.name: "/dev/kvm"}
        writer.write(b'{"v":1,"probe":{"resource":"ate.dev/kvm","timeout_s":1}}\n')
        report = json.loads(await reader.readline())
        assert report["report"]["result"]["reason"] == "passed"
        writer.write(b'{"v":1,"restart":true}\n')
        await writer.drain()

    server = await asyncio.start_unix_server(daemon, socket)
    try:
        assert await asyncio.wait_for(prober, 3.0) == 0
        assert fake.closed
    finally:
        server.close()


async def test_a_stopping_daemon_leaves_the_next_ones_socket(tmp_path: Path) -> None:
    """A rollout with overlap (1.37+): the new daemon serves the path before the old stops."""
    path = str(tmp_path / "run/prober.sock")
    me = (os.geteuid(), os.getegid())
    old, new = (
        ProberLink(path, 60.0, me, KvmMetrics(CollectorRegistry())),
        ProberLink(path, 60.0, me, KvmMetrics(CollectorRegistry())),
    )
    await old.start(lambda change: None)
    await new.start(lambda change: None)
    await old.close()
    assert Path(path).is_socket()
    await new.close()
    assert not Path(path).exists()


def refused(h: Harness, reason: str) -> float:
    return h.registry.get_sample_value("ate_devplugin_kvm_prober_refused_total", {"reason": reason}) or 0.0


async def test_a_peer_that_is_not_the_prober_is_refused_before_it_speaks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the prober's uid and gid (SO_PEERCRED) are heard: anyone else's hello and report
    change nothing; each refusal is counted, the peer logged once while it lasts."""
    me = (os.geteuid(), os.getegid())
    h = Harness(tmp_path, FakeProber(), period=0.1, timeout=1.0, mode="socket", prober=(me[0], me[1] + 1))
    await h.start(KVM)
    h.discover()
    caplog.set_level(logging.WARNING, "ate_devplugin.kvmhealth.link")
    liar = asyncio.create_task(
        serve(h.socket, {KVM.name: "/dev/kvm"}, "", FakeProber(lambda p: Reason.RUN), backoff_max_s=0.2)
    )
    try:
        await until(lambda: refused(h, "identity") >= 3, "refused again and again (with backoff)", 10)
        assert [reason for _, reason in h.told if reason is not None] == []  # its report never counted
        assert h.link is not None
        assert h.link.hello is None
        said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert said == [
            f"refused a connection to the KVM prober's socket: uid {me[0]} gid {me[1]} (pid {os.getpid()}) "
            f"is not the prober (uid {me[0]} gid {me[1] + 1})"
        ]
    finally:
        liar.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await liar
        assert await h.health.stop(2.0) == []


async def test_a_connection_that_says_no_hello_is_closed(harness: Harness) -> None:
    reader, writer = await asyncio.open_unix_connection(harness.socket)
    try:
        async with asyncio.timeout(3):
            assert await reader.read() == b""  # closed by the daemon after its 0.3 s
        assert refused(harness, "no-hello") == 1
    finally:
        writer.close()


async def test_the_socket_is_the_daemons_alone_when_the_prober_is_of_its_uid(harness: Harness) -> None:
    directory, socket_file = os.stat(os.path.dirname(harness.socket)), os.stat(harness.socket)
    assert (stat.S_IMODE(directory.st_mode), stat.S_IMODE(socket_file.st_mode)) == (0o700, 0o600)


@pytest.mark.skipif(os.geteuid() != 0, reason="another gid needs root")
async def test_a_refused_peer_does_not_displace_the_connected_prober(harness: Harness) -> None:
    h = harness
    h.discover()
    prober = asyncio.create_task(serve(h.socket, {KVM.name: "/dev/kvm"}, "ns/prober", FakeProber()))
    try:
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "the prober's verdict")
        # root of another group: it reaches the socket (the directory is root's), says hello
        # and reports a failure; the daemon refuses it at connect.
        hello = b'{"v":1,"hello":{"pod":"x/y","devices":{"ate.dev/kvm":"/dev/kvm"}}}\n'
        script = (
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
            f"try:\n    s.sendall({hello!r})\n    print(repr(s.recv(100)))\n"
            "except ConnectionError as e:\n    print(type(e).__name__)\n"
        )
        foreign = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", script, h.socket], group=65534, capture_output=True, text=True
        )
        assert foreign.stdout.strip() in ("b''", "ConnectionResetError", "BrokenPipeError"), foreign  # closed
        assert refused(h, "identity") == 1
        assert h.link is not None
        assert h.link.hello == Hello("ns/prober", {KVM.name: "/dev/kvm"}, ids=True)  # still the one heard
        await asyncio.sleep(0.25)  # a period later: the prober is asked, and answers
        assert h.told[-1] == (KVM.name, Reason.PASSED)
    finally:
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober
