"""When the daemon probes a KVM resource, and what it does with the verdict.

The prober is a recording fake where the test is about the schedule; the real one (its
child process) where it is about a verdict the kernel gives (a missing node) or a probe
that hangs. The device itself is probed in tests/kubelet/test_kvm_health.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.components import Notice
from ate_devplugin.config import ResourceConfig
from ate_devplugin.cpu.restore import CODES, RestoreProfile, TscRule
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.runner import ProbeRunner
from ate_devplugin.kvmhealth.health import REASONS, KvmHealth
from ate_devplugin.kvmhealth.link import ProberLink
from ate_devplugin.kvmhealth.probes import LocalProbes, NoProbes, Probes
from ate_devplugin.kvmstate import KvmChanged, KvmStates
from ate_devplugin.observability.metrics import KvmMetrics
from ate_devplugin.settings import KvmHealthSettings
from ate_devplugin.tasks import Guard
from ate_devplugin.view import build
from tests.unit.cpu.samples import PVM_REGISTERS

KVM = ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",))
TUN = ResourceConfig(name="ate.dev/tun", devices=("/dev/net/tun",))
NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc")


class FakeProber:
    """Answers each probe with ``answer(path)`` after ``delay`` s; records the paths."""

    def __init__(self, answer: Callable[[str], Reason] = lambda path: Reason.PASSED, delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.paths: list[str] = []
        self.closed = False

    async def probe(self, device: str, timeout: float) -> ProbeResult:
        self.paths.append(device)
        await asyncio.sleep(self.delay)
        reason = self.answer(device)
        return ProbeResult(device=device, reason=reason, detail=str(reason), duration_s=0.001, rdev="10:232")

    async def close(self) -> None:
        self.closed = True


class Harness:
    """The component as the daemon builds it (runtime.kvm_health), its notices heard as the
    other components hear them: ``told`` lists each resource's verdict as it changed."""

    def __init__(
        self,
        tmp_path: Path,
        runner: FakeProber | ProbeRunner,
        period: float = 0.0,
        timeout: float = 5.0,
        mode: str = "local",
        prober: tuple[int, int] | None = None,
    ) -> None:
        """``prober``: the identity the socket accepts (default: this process's own)."""
        self.root = str(tmp_path / "dev")
        (tmp_path / "dev").mkdir()
        self.socket = str(tmp_path / "run/prober.sock")
        settings = KvmHealthSettings(
            device_root=self.root,
            kvm_probe=mode,
            kvm_probe_period=period,
            kvm_probe_timeout=timeout,
            kvm_probe_socket=self.socket,
            kvm_prober_uid=0,
            kvm_prober_gid=0,
            nfd_features_dir="",
            nfd_label_ttl=900,
        )
        self.registry = CollectorRegistry()
        metrics = KvmMetrics(self.registry)
        identity = prober or (os.geteuid(), os.getegid())
        self.link = (
            ProberLink(self.socket, settings.prober_grace_s, identity, metrics, 0.3) if mode == "socket" else None
        )
        probes: Probes = self.link or (NoProbes() if mode == "off" else LocalProbes(self.root, runner))
        self.health = KvmHealth(settings, metrics, probes, NODE, rng=lambda: 0.5)
        self.states: KvmStates = {}
        self.told: list[tuple[str, Reason | None]] = []
        self.health.tell_to(self.heard)
        self.died: list[str] = []

    def heard(self, notice: Notice) -> None:
        """A resource's state told anew (a new verdict, or none) or gone; not one just added."""
        assert isinstance(notice, KvmChanged)
        for name in sorted({*self.states, *notice.states}):
            before, after = self.states.get(name), notice.states.get(name)
            if after is None or (before is not None and after is not before):
                self.told.append((name, after.verdict.reason if after and after.verdict else None))
        self.states = notice.states

    def verdict(self) -> ProbeResult | None:
        """The KVM resource's verdict, as last told."""
        state = self.states.get(KVM.name)
        return state.verdict if state else None

    async def start(self, *resources: ResourceConfig) -> None:
        await self.health.start(resources, Guard(lambda name, error: self.died.append(name)))

    def discover(self, major: int = 10, minor: int = 232) -> None:
        """What the daemon found of the KVM resource (``major`` 0: no node)."""
        nodes = (DeviceNode("/dev/kvm", major, minor),) if major else ()
        self.health.on_view(build((KVM,), {KVM.name: Discovery(nodes=nodes, complete=bool(nodes))}, {}))

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {"resource_name": KVM.name, **labels})


@pytest.fixture
async def stopped() -> AsyncIterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        assert await h.health.stop(2.0) == []


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)
    assert check(), what


async def test_a_node_that_is_not_kvms_fails_at_once_unopened(tmp_path: Path, stopped: list[Harness]) -> None:
    prober = FakeProber()
    h = Harness(tmp_path, prober)
    stopped.append(h)
    await h.start(KVM)
    h.discover(1, 3)
    # Told within the discovery's own call: no probe, no await.
    assert h.told == [(KVM.name, Reason.NOT_KVM)]
    verdict = h.verdict()
    assert verdict is not None
    assert verdict.message == "/dev/kvm: character device 1:3 is not KVM's 10:232: not opened"
    assert h.health.readiness() == (True, f"KVM probe failed: not-a-kvm-device: {verdict.message} (ate.dev/kvm)")
    await asyncio.sleep(0.05)
    assert prober.paths == []
    assert h.sample("ate_devplugin_kvm_probes_total", reason="not-a-kvm-device") == 1
    assert h.sample("ate_devplugin_kvm_probe_state", state="failed") == 1


async def test_a_kvm_node_is_probed_under_the_device_root_on_each_change(
    tmp_path: Path, stopped: list[Harness]
) -> None:
    prober = FakeProber()
    h = Harness(tmp_path, prober)
    (tmp_path / "dev/kvm").touch()
    stopped.append(h)
    await h.start(KVM, TUN)  # the tun resource is judged by existence: never probed
    assert h.health.readiness() == (True, "")
    found = {
        KVM.name: Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True),
        TUN.name: Discovery(nodes=(DeviceNode("/dev/net/tun", 10, 200),), complete=True),
    }
    h.health.on_view(build((KVM, TUN), found, {}))
    assert h.health.readiness() == (True, "KVM probe: no verdict yet (ate.dev/kvm)")
    await until(lambda: len(h.told) == 1, "a verdict")
    assert prober.paths == [f"{h.root}/kvm"]
    verdict = h.verdict()
    assert verdict is not None
    assert (verdict.device, verdict.message) == ("/dev/kvm", "/dev/kvm: passed")  # the host's path
    h.discover()  # the same node: nothing to probe
    await asyncio.sleep(0.05)
    assert len(prober.paths) == 1
    h.discover(0)  # gone: no verdict holds
    h.discover()  # back: probed afresh
    await until(lambda: len(prober.paths) == 2, "probed again")
    await until(lambda: len(h.told) == 3, "told")
    assert h.told == [(KVM.name, Reason.PASSED), (KVM.name, None), (KVM.name, Reason.PASSED)]
    assert h.sample("ate_devplugin_kvm_probe_state", state="passed") == 1
    assert (
        h.registry.get_sample_value("ate_devplugin_kvm_probe_state", {"resource_name": TUN.name, "state": "passed"})
        is None
    )


async def test_a_verdict_on_a_node_swapped_while_probed_is_dropped(tmp_path: Path, stopped: list[Harness]) -> None:
    prober = FakeProber(delay=0.1)
    h = Harness(tmp_path, prober)
    stopped.append(h)
    await h.start(KVM)
    h.discover()
    await until(lambda: len(prober.paths) == 1, "probing")
    h.discover(1, 3)  # swapped mid-probe: failed at once ...
    h.discover()  # ... and back, again mid-probe
    await until(lambda: len(prober.paths) == 2, "the new node probed")
    await until(lambda: len(h.told) == 2, "told")
    # The first probe's pass (about the first node) was never told.
    assert h.told == [(KVM.name, Reason.NOT_KVM), (KVM.name, Reason.PASSED)]


async def test_a_verdict_from_while_the_node_was_gone_is_dropped_once_it_is_back(
    tmp_path: Path, stopped: list[Harness]
) -> None:
    """CI's trace test: a periodic probe ran while the node was removed, and its 'missing'
    came after the same node was back, flipping the resource Unhealthy for a moment."""
    gone = asyncio.Event()
    prober = FakeProber(answer=lambda path: Reason.MISSING if gone.is_set() else Reason.PASSED, delay=0.1)
    h = Harness(tmp_path, prober)
    stopped.append(h)
    await h.start(KVM)
    h.discover()
    await until(lambda: len(prober.paths) == 1, "probing")
    h.discover(0)  # removed mid-probe, the probe finds it missing ...
    gone.set()
    h.discover()  # ... and the same node back before that verdict arrives
    await until(lambda: len(prober.paths) == 2, "the node probed again")
    gone.clear()
    await until(lambda: len(h.told) == 2, "told")
    await asyncio.sleep(0.15)
    assert h.told == [(KVM.name, None), (KVM.name, Reason.PASSED)]


async def test_the_reason_gauge_names_the_current_verdicts_reason(tmp_path: Path, stopped: list[Harness]) -> None:
    """What AteDevpluginKvmProbeFailing names: the reason of the verdict that holds now, which
    the counter cannot tell once a failure decided at an event (not-a-kvm-device) stops counting."""
    h = Harness(tmp_path, FakeProber())
    stopped.append(h)
    await h.start(KVM)

    def said() -> dict[str, float | None]:
        values = {r: h.sample("ate_devplugin_kvm_probe_reason", reason=r) for r in REASONS}
        assert set(values.values()) <= {0.0, 1.0}, values  # every reason's series exists from the start
        return {r: v for r, v in values.items() if v}

    assert said() == {}
    h.discover(1, 3)
    assert said() == {"not-a-kvm-device": 1.0}
    h.discover()  # the real node: probed, passes
    await until(lambda: said() == {"passed": 1.0}, "the pass replaces the failure")
    h.discover(0)  # gone: no verdict, no reason
    assert said() == {}
    assert h.sample("ate_devplugin_kvm_probe_state", state="unverified") == 1
    await h.health.on_resources(())
    assert h.sample("ate_devplugin_kvm_probe_reason", reason="passed") is None


async def test_probes_repeat_every_period_and_a_failure_is_logged_once(
    tmp_path: Path, stopped: list[Harness], caplog: pytest.LogCaptureFixture
) -> None:
    answers = iter([Reason.PASSED, Reason.RUN, Reason.RUN, Reason.RUN, Reason.PASSED])
    prober = FakeProber(lambda path: next(answers, Reason.PASSED))
    h = Harness(tmp_path, prober, period=0.02)
    stopped.append(h)
    caplog.set_level(logging.INFO, "ate_devplugin.kvmhealth.health")
    await h.start(KVM)
    h.discover()
    await until(lambda: len(prober.paths) >= 6, "periodic probes")
    reasons = [r for _, r in h.told[:5]]
    assert reasons == [Reason.PASSED, Reason.RUN, Reason.RUN, Reason.RUN, Reason.PASSED]
    said = [r.getMessage() for r in caplog.records]
    assert said[:3] == ["KVM probe passed: /dev/kvm: passed", "KVM probe failed: /dev/kvm: run-failed",
                        "KVM probe passed: /dev/kvm: passed"]  # fmt: skip
    assert h.sample("ate_devplugin_kvm_probes_total", reason="run-failed") == 3


async def test_the_real_worker_says_a_missing_node_is_missing(tmp_path: Path, stopped: list[Harness]) -> None:
    h = Harness(tmp_path, ProbeRunner())
    stopped.append(h)
    await h.start(KVM)
    h.discover()  # discovery says 10:232, but no node is there when the worker opens it
    await until(lambda: len(h.told) == 1, "a verdict", timeout=10)
    verdict = h.verdict()
    assert verdict is not None
    assert verdict.reason is Reason.MISSING
    assert verdict.message == "/dev/kvm: no such device node"


async def test_a_hung_probe_is_a_timed_out_verdict_and_does_not_hold_the_stop(tmp_path: Path) -> None:
    hangs = ProbeRunner([sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(600)"])
    h = Harness(tmp_path, hangs, timeout=0.3)
    await h.start(KVM)
    h.discover()
    await until(lambda: len(h.told) == 1, "a verdict")
    assert h.told == [(KVM.name, Reason.TIMED_OUT)]
    h.discover(0)
    h.discover()  # probing again, hung
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    # A stop held by the hung probe would take its whole deadline: 60 s, far over this bound.
    assert await h.health.stop(60.0) == []
    assert loop.time() - started < 30
    assert h.died == []


async def test_a_reloaded_resource_list_adds_and_removes_probes(tmp_path: Path, stopped: list[Harness]) -> None:
    h = Harness(tmp_path, FakeProber())
    stopped.append(h)
    await h.start(TUN)
    await h.health.on_resources((KVM, TUN))
    h.discover()
    await until(lambda: len(h.told) == 1, "probed")
    await h.health.on_resources((TUN,))
    assert h.told[-1] == (KVM.name, None)
    assert h.sample("ate_devplugin_kvm_probe_state", state="passed") is None


async def test_a_probe_that_cannot_judge_the_device_leaves_it_to_existence_and_says_so(
    tmp_path: Path, stopped: list[Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """no-permission (the prober may not open it) and prober-failed (its process died) are
    not verdicts on the device: no verdict holds, the state is cannot-probe with the reason,
    /readyz and the log say it once; the next probe that passes ends it."""
    answers = iter([Reason.NO_PERMISSION, Reason.NO_PERMISSION, Reason.PROBER_FAILED, Reason.PASSED])
    prober = FakeProber(lambda path: next(answers, Reason.PASSED))
    h = Harness(tmp_path, prober, period=0.02)
    stopped.append(h)
    caplog.set_level(logging.INFO, "ate_devplugin.kvmhealth.health")
    await h.start(KVM)
    h.discover()
    await until(lambda: h.told[:1] == [(KVM.name, None)], "told, with no verdict")
    assert h.sample("ate_devplugin_kvm_probe_state", state="cannot-probe") == 1
    assert h.sample("ate_devplugin_kvm_probe_reason", reason="no-permission") == 1
    assert h.health.readiness() == (
        True,
        "KVM probe could not judge the device: no-permission: /dev/kvm: no-permission (ate.dev/kvm)",
    )
    await until(lambda: h.sample("ate_devplugin_kvm_probe_state", state="passed") == 1, "the pass", 5)
    assert [r for _, r in h.told[:3]] == [None, None, None]  # every one of them: no verdict
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "KVM probe could not judge the device: /dev/kvm: no-permission",
        "KVM probe could not judge the device: /dev/kvm: prober-failed",
        "KVM probe passed: /dev/kvm: passed",
    ]
    assert h.health.readiness() == (True, "")


async def test_with_the_probe_off_a_node_that_is_not_kvms_still_fails(tmp_path: Path, stopped: list[Harness]) -> None:
    prober = FakeProber()
    h = Harness(tmp_path, prober, period=0.02, mode="off")
    stopped.append(h)
    await h.start(KVM)
    h.discover()
    await asyncio.sleep(0.1)
    assert (h.told, prober.paths, h.health.readiness()) == ([], [], (True, ""))  # existence alone
    h.discover(1, 3)
    assert h.told == [(KVM.name, Reason.NOT_KVM)]
    h.discover()  # KVM's node back: nothing will probe it, the other node's verdict goes
    assert h.told == [(KVM.name, Reason.NOT_KVM), (KVM.name, None)]
    assert prober.paths == []


# --- restore profiles (docs/restore-placement.md) -------------------------------------


def kvm_with(**profiles: RestoreProfile) -> ResourceConfig:
    return ResourceConfig(name=KVM.name, devices=KVM.devices, restore_profiles=tuple(profiles.values()))


class RecordingCpu(FakeProber):
    """A passing probe learns this machine's CPU (its PVM KVM's registers, recorded)."""

    async def probe(self, device: str, timeout: float) -> ProbeResult:
        result = await super().probe(device, timeout)
        facts = DeviceFacts(12, {"tsc_control": 0}, "d", (), cpuid_registers=PVM_REGISTERS, tsc_khz=2_599_998)
        return replace(result, device_facts=facts)


async def test_each_restore_profile_is_answered_from_the_cpu_a_passing_probe_learned(
    tmp_path: Path, stopped: list[Harness], caplog: pytest.LogCaptureFixture
) -> None:
    here = RestoreProfile("here", frozenset({"la57", "cx16", "invtsc"}), tsc=TscRule(2_599_998))
    more = RestoreProfile("more", frozenset({"cx16", "3dnow"}))
    fast = RestoreProfile("fast", tsc=TscRule(2_859_997))
    prober = RecordingCpu()
    h = Harness(tmp_path, prober)
    stopped.append(h)
    caplog.set_level(logging.INFO, "ate_devplugin.kvmhealth.health")
    await h.start(kvm_with(here=here, more=more, fast=fast))

    def answers() -> dict[str, str]:
        return {a.profile: a.code for a in h.states[KVM.name].restore}

    def gauge(profile: str) -> dict[str, float]:
        values = {c: h.sample("ate_devplugin_kvm_restore_answer", profile=profile, answer=c) for c in CODES}
        return {c: v for c, v in values.items() if v}

    assert answers() == {"fast": "unknown", "here": "unknown", "more": "unknown"}  # no probe passed yet
    assert h.states[KVM.name].attributes()["restore_here"] is False
    h.discover()
    await until(lambda: h.verdict() is not None, "passed")
    assert answers() == {"fast": "tsc", "here": "restorable", "more": "missing-features"}
    attributes = h.states[KVM.name].attributes()
    assert (attributes["restore_here"], attributes["restore_more"], attributes["restore_fast"]) == (True, False, False)
    assert (gauge("here"), gauge("more"), gauge("fast")) == ({"restorable": 1}, {"missing-features": 1}, {"tsc": 1})
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("restore profile")]
    assert "restore profile more: not restorable: 1 feature missing: 3dnow" in said
    assert any(line.startswith("restore profile fast: not restorable: TSC 2859997 kHz") for line in said)

    # A reload that changes a profile alone: answered again at once, nothing probed again.
    probes = len(prober.paths)
    await h.health.on_resources((kvm_with(here=here, more=RestoreProfile("more", frozenset({"cx16"}))),))
    assert answers() == {"here": "restorable", "more": "restorable"}
    assert (h.verdict() is not None, len(prober.paths)) == (True, probes)
    assert gauge("fast") == {}  # the profile gone, its series too
