"""Sequences, not single steps (issue 42): the real in-process daemon driven through random
sequences of reloads, device changes, probe verdicts, probers, kubelet restarts and API
server failures, every surface checked against the one view after each step.

Each of the 9 combinations of mode (device-plugin, dra, both) and KVM probe (local, socket,
off) is a hypothesis RuleBasedStateMachine run as a plain test. One test case is one event
loop (``asyncio.Runner``) and one daemon built as tests/unit/test_daemon.py's ``Setup`` builds
it (runtime.build with fake kubelet ports, an injectable discovery and, in the DRA modes, the
in-memory API server); the rules are sync and drive the loop with ``runner.run``, so
hypothesis generates, shrinks and replays the sequence itself and a failure prints the
steps as code. After every step the invariant waits until the daemon has caught up with the
model (each surface agrees with it, or the hang bound of ``SETTLE_S`` passes), then checks
that what an operator reads agrees with the view: agents, slices, device health reports,
/readyz and the metric series. Only hangs are bounded by the clock; nothing is asserted
about how fast the daemon is.

Who probes: ``local`` is the real LocalProbes with a scripted runner (the FakeProber of
tests/unit/kvmhealth/test_monitor.py in place of the child process, set on the built
component's ``probes.runner``); ``socket`` is the real ProberLink with the real prober
(kvm/prober.serve) in-process, coming and going, its runner the same FakeProber; ``off`` is
NoProbes. The probe period is short (PERIOD_S) so that a new verdict is heard without a node
change; the invariant waits for it.

CI runs ``EXAMPLES`` sequences of at most ``STEPS`` steps per combination. A longer run is
one command::

    ATE_STATE_MACHINE_EXAMPLES=500 PYTHONPATH=app python -m pytest -p no:cacheprovider -q \
        tests/unit/test_state_machine.py

(``ATE_STATE_MACHINE_STEPS`` sets the steps per sequence, 15 unless given.) Hypothesis keeps
no example database here (``database=None``): nothing is written into the repository, and a
failure is kept as a named regression test at the end of this module instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from ate_devplugin.api.pluginregistration.v1 import api_pb2 as regpb
from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.inventory import HEALTHY
from ate_devplugin.deviceplugin.probers import SUFFIX
from ate_devplugin.dra.plugin import DraPlugin
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.host.watcher import FsEvent
from ate_devplugin.kvm.prober import serve
from ate_devplugin.kvm.reasons import CANNOT_PROBE, Reason
from ate_devplugin.kvmhealth.health import KvmHealth
from ate_devplugin.kvmhealth.probes import LocalProbes
from ate_devplugin.kvmstate import failure_text
from tests.unit.dra.fakes import FakeApi
from tests.unit.kvmhealth.test_monitor import FakeProber
from tests.unit.test_daemon import Setup

EXAMPLES = int(os.environ.get("ATE_STATE_MACHINE_EXAMPLES", "10"))
STEPS = int(os.environ.get("ATE_STATE_MACHINE_STEPS", "15"))
SETTLE_S = float(os.environ.get("ATE_STATE_MACHINE_SETTLE_S", "30"))  # a hang bound only: until the daemon agrees
PERIOD_S = 0.05  # the probe period (and a prober's grace of three of it)

MODES = ("device-plugin", "dra", "both")
PROBES = ("local", "socket", "off")

KVM_NODE = (10, 232)
# Each resource the sequences may configure: a family of names (a rename stays in it),
# and the device lists it may have.
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "kvm": (("ate.dev/kvm", "ate.dev/vm"), (("/dev/kvm",),)),
    "tun": (("ate.dev/tun", "ate.dev/tap"), (("/dev/net/tun",),)),
    "vhost": (("ate.dev/vhost", "ate.dev/vnet"), (("/dev/vhost-net",), ("/dev/vhost-net", "/dev/net/tun"))),
}
PATHS = ("/dev/kvm", "/dev/net/tun", "/dev/vhost-net")
PROFILE = "{snap_0412: {vendor: GenuineIntel, features: [avx2, cx16], tsc: {khz: 2599998}}}"
VERDICTS = (Reason.PASSED, Reason.RUN, Reason.TIMED_OUT, Reason.NO_PERMISSION)  # passed, failed, timed out, cannot


@dataclass
class Res:
    family: str
    name: str
    devices: tuple[str, ...]
    units: int = 2
    restore: bool = False

    def yaml(self) -> str:
        extra = f", restore_profiles: {PROFILE}" if self.restore else ""
        return f"{{name: {self.name}, devices: [{', '.join(self.devices)}], units: {self.units}{extra}}}"


def config_text(resources: list[Res]) -> str:
    return f"resources: [{', '.join(r.yaml() for r in resources)}]\n"


@dataclass
class Model:
    """What the daemon should have: the running config, the host's nodes, the probe's answer."""

    resources: list[Res] = field(default_factory=lambda: [Res("kvm", "ate.dev/kvm", ("/dev/kvm",))])
    nodes: dict[str, tuple[int, int] | None] = field(
        default_factory=lambda: {"/dev/kvm": KVM_NODE, "/dev/net/tun": (10, 200), "/dev/vhost-net": (10, 238)}
    )
    answer: Reason = Reason.PASSED
    prober: bool = False  # socket mode: a prober is connected

    def names(self) -> list[str]:
        return [r.name for r in self.resources]

    def discovery(self, config: ResourceConfig) -> Discovery:
        found = [DeviceNode(d, *n) for d in config.devices if (n := self.nodes.get(d)) is not None]
        return Discovery(nodes=tuple(sorted(found)), complete=len(found) == len(config.devices))

    def verdict(self, config: ResourceConfig, probe: str) -> Reason | None:
        """The verdict that holds of a probed resource once the daemon has caught up."""
        node = self.nodes.get(config.probed_device)
        if node is None:
            return None
        if node != KVM_NODE:
            return Reason.NOT_KVM
        if probe == "off" or (probe == "socket" and not self.prober) or self.answer in CANNOT_PROBE:
            return None
        return self.answer


def dra_name(resource: str) -> str:
    return resource.replace(".", "-").replace("/", "-")


class DaemonMachine(RuleBasedStateMachine):
    mode = "device-plugin"
    probe = "off"

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.tmp = Path(tempfile.mkdtemp(prefix="sm-"))
        self.runner = asyncio.Runner()
        self.reloads = {"success": 0.0, "failure": 0.0}
        self.invalid = 0
        self.kubelet_id = 1
        self.prober_task: asyncio.Task[int] | None = None
        self.fake = FakeProber(lambda path: self.model.answer)
        self.runner.run(self._start())

    # --- the daemon --------------------------------------------------------------------

    async def _start(self) -> None:
        dra = self.mode != "device-plugin"
        flags = {"mode": self.mode, "kvm_probe": self.probe, "kvm_probe_period": str(PERIOD_S)}
        if dra:
            flags |= {"registry_dir": str(self.tmp / "registry"), "dra_dir": str(self.tmp / "dra")}
        if self.probe == "socket":
            flags |= {
                "kvm_probe_socket": str(self.tmp / "run/prober.sock"),
                "kvm_prober_uid": str(os.geteuid()),
                "kvm_prober_gid": str(os.getegid()),
            }
        self.api = FakeApi() if dra else None
        self.s = Setup(self.tmp, config_text(self.model.resources), flags=flags, kube=self.api, reload_settle_s=0.02)
        self._discover_from_model()
        (health,) = [c for c in self.s.daemon.components if isinstance(c, KvmHealth)]
        if isinstance(health.probes, LocalProbes):
            health.probes.runner = self.fake  # the scripted runner in place of the child process
        self.dra = next((c for c in self.s.daemon.components if isinstance(c, DraPlugin)), None)
        if self.dra is not None:
            # A failed write is retried within a step, not after the production backoff.
            self.dra.publisher.retry_s, self.dra.publisher.retry_cap_s = 0.01, 0.05
        self.task = asyncio.create_task(self.s.daemon.run())
        await self._kubelet_registers_dra()

    def _discover_from_model(self) -> None:
        """Setup's discovery asks ``discovered`` first: the model answers for every resource."""
        model = self.model

        class FromModel(dict[str, Discovery]):
            def get(self, name: str, default: Any = None) -> Discovery | None:  # type: ignore[override]
                # A resource of the config before a reload is applied: found() answers for it.
                r = next((r for r in model.resources if r.name == name), None)
                return None if r is None else model.discovery(ResourceConfig(name=r.name, devices=r.devices))

        self.s.discovered = FromModel()

    async def _kubelet_registers_dra(self) -> None:
        """What the kubelet's plugin watcher does with the registration socket."""
        if self.dra is not None:
            status = regpb.RegistrationStatus(plugin_registered=True)
            await self.dra.registration.NotifyRegistrationStatus(status, cast(Any, None))

    def teardown(self) -> None:
        try:
            self.runner.run(self._stop())
        finally:
            self.runner.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    async def _stop(self) -> None:
        await self._prober_leaves()
        self.s.daemon.request_stop("SIGTERM")
        await asyncio.wait_for(self.task, SETTLE_S)

    # --- config reloads ------------------------------------------------------------------

    def _reload(self, resources: list[Res]) -> None:
        self.model.resources = resources  # first: the reload's discovery asks the model
        self.runner.run(self._write(config_text(resources), "success"))

    async def _write(self, text: str, result: str) -> None:
        self.s.config.write_text(text)
        self.s.daemon.request_reload()
        self.reloads[result] += 1
        await self._until(lambda: self._reloads(result) >= self.reloads[result], f"reload {result}")

    def _reloads(self, result: str) -> float:
        return self.s.sample("ate_devplugin_config_reloads_total", result=result) or 0.0

    def _free(self, family: str) -> list[str]:
        taken = set(self.model.names())
        return [n for n in FAMILIES[family][0] if n not in taken]

    def _absent_families(self) -> list[str]:
        present = {r.family for r in self.model.resources}
        return [f for f in FAMILIES if f not in present]

    @precondition(lambda self: bool(self._absent_families()))
    @rule(data=st.data())
    def add_resource(self, data: st.DataObject) -> None:
        family = data.draw(st.sampled_from(self._absent_families()))
        name = data.draw(st.sampled_from(FAMILIES[family][0]))
        devices = data.draw(st.sampled_from(FAMILIES[family][1]))
        self._reload([*self.model.resources, Res(family, name, devices)])

    @precondition(lambda self: len(self.model.resources) > 1)
    @rule(data=st.data())
    def remove_resource(self, data: st.DataObject) -> None:
        gone = data.draw(st.sampled_from(self.model.names()))
        self._reload([r for r in self.model.resources if r.name != gone])

    @rule(data=st.data())
    def rename_resource(self, data: st.DataObject) -> None:
        old = data.draw(st.sampled_from(self.model.resources))
        new = data.draw(st.sampled_from(self._free(old.family)))
        self._reload(
            [Res(r.family, new, r.devices, r.units, r.restore) if r is old else r for r in self.model.resources]
        )

    @rule(data=st.data(), units=st.sampled_from([1, 2, 3]))
    def change_units(self, data: st.DataObject, units: int) -> None:
        target = data.draw(st.sampled_from(self.model.resources))
        if units == target.units:
            units = units % 3 + 1
        self._reload(
            [Res(r.family, r.name, r.devices, units, r.restore) if r is target else r for r in self.model.resources]
        )

    @precondition(lambda self: any(r.family == "vhost" for r in self.model.resources))
    @rule()
    def change_devices(self) -> None:
        lists = FAMILIES["vhost"][1]
        self._reload(
            [Res(r.family, r.name, lists[1 - lists.index(r.devices)], r.units, r.restore) if r.family == "vhost" else r
             for r in self.model.resources]
        )  # fmt: skip

    @precondition(lambda self: any(r.family == "kvm" for r in self.model.resources))
    @rule()
    def toggle_restore_profile(self) -> None:
        self._reload(
            [Res(r.family, r.name, r.devices, r.units, not r.restore) if r.family == "kvm" else r
             for r in self.model.resources]
        )  # fmt: skip

    @rule()
    def invalid_config(self) -> None:
        """Rejected: the running config is kept (the model does not change)."""
        self.invalid += 1
        text = f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], units: many{self.invalid}}}]\n"
        self.runner.run(self._write(text, "failure"))

    # --- device nodes --------------------------------------------------------------------

    def _node(self, path: str, node: tuple[int, int] | None) -> None:
        self.model.nodes[path] = node
        event = FsEvent(
            "deleted" if node is None else "created", str(self.tmp / "dev" / path[len("/dev/") :]), "", False
        )
        self.s.daemon.put(event)

    @rule(path=st.sampled_from(PATHS))
    def node_disappears(self, path: str) -> None:
        self._node(path, None)

    @rule(path=st.sampled_from(PATHS))
    def node_appears(self, path: str) -> None:
        self._node(path, KVM_NODE if path == "/dev/kvm" else (10, 200))

    @rule(node=st.sampled_from([(1, 3), (10, 200), KVM_NODE]))
    def kvm_turns_into(self, node: tuple[int, int]) -> None:
        self._node("/dev/kvm", node)

    # --- probes --------------------------------------------------------------------------

    @precondition(lambda self: self.probe != "off")
    @rule(reason=st.sampled_from(VERDICTS))
    def probe_answers(self, reason: Reason) -> None:
        self.model.answer = reason

    @precondition(lambda self: self.probe == "socket" and not self.model.prober)
    @rule()
    def prober_comes(self) -> None:
        devices = dict.fromkeys(FAMILIES["kvm"][0], "/dev/kvm")
        path = str(self.tmp / "run/prober.sock")
        self.prober_task = self.runner.run(self._spawn(serve(path, devices, "ns/prober", self.fake, 0.05)))
        self.model.prober = True

    @staticmethod
    async def _spawn(coro: Any) -> asyncio.Task[int]:
        return asyncio.create_task(coro)

    @precondition(lambda self: self.probe == "socket" and self.model.prober)
    @rule()
    def prober_goes(self) -> None:
        self.runner.run(self._prober_leaves())
        self.model.prober = False

    async def _prober_leaves(self) -> None:
        if self.prober_task is not None:
            self.prober_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.prober_task
            self.prober_task = None

    # --- the kubelet and the API server ---------------------------------------------------

    @rule()
    def kubelet_restarts(self) -> None:
        """A new socket (identity), its event; the new kubelet wipes the node's slices and
        registers the DRA driver again."""
        self.kubelet_id += 1
        self.s.fs.identities[self.s.kubelet_socket] = (1, self.kubelet_id, self.kubelet_id)
        if self.api is not None:
            self.api.wipe()
        self.s.daemon.put(FsEvent("created", self.s.kubelet_socket, "", False))
        self.runner.run(self._kubelet_registers_dra())

    @precondition(lambda self: self.api is not None)
    @rule(writes=st.integers(1, 3))
    def api_refuses_writes(self, writes: int) -> None:
        assert self.api is not None
        self.api.fail_writes = writes
        self.s.daemon.put(FsEvent("created", self.s.kubelet_socket, "", False))  # a batch: a view and a sync

    @precondition(lambda self: self.api is not None)
    @rule(gone=st.booleans())
    def api_ends_watches(self, gone: bool) -> None:
        assert self.api is not None
        self.api.end_watches(RuntimeError("410 Gone") if gone else None)

    @precondition(lambda self: self.api is not None and bool(self.api.slices))
    @rule(data=st.data())
    def another_client_writes_a_slice(self, data: st.DataObject) -> None:
        """Our slice rewritten behind our back: a conflict for a write under way, a drift to undo."""
        assert self.api is not None
        name = data.draw(st.sampled_from(sorted(self.api.slices)))
        pool = self.api.slices[name]["spec"]["pool"]
        self.api.add_slice(name, pool["name"], pool["generation"], devices=[])

    # --- what an operator relies on --------------------------------------------------------

    @invariant()
    def every_surface_agrees_with_the_view(self) -> None:
        self.runner.run(self._settle())

    async def _settle(self) -> None:
        await self._until(lambda: not self._disagreements(), "every surface agrees with the view")

    async def _until(self, check: Callable[[], bool], what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while not check():
            if self.task.done():
                self.task.result()  # the daemon ended: its error (TaskDiedError) is the failure
                raise AssertionError("the daemon stopped")
            if loop.time() > deadline:
                raise AssertionError(f"{what}: after {SETTLE_S}s still {self._disagreements()}")
            await asyncio.sleep(0.005)
        assert not self.task.done(), "the daemon runs"

    def _disagreements(self) -> list[str]:
        return list(self._check())

    def _check(self) -> Iterator[str]:  # one list of what an operator reads
        daemon, model, probe = self.s.daemon, self.model, self.probe
        view = daemon.views.last
        names = model.names()
        if list(view) != names:
            yield f"view has {list(view)}, the config {names}"
            return
        probed = {n for n, v in view.items() if v.config.probes_kvm}
        for name, v in view.items():
            if v.found != model.discovery(v.config):
                yield f"{name}: view found {v.found}, the host has {model.discovery(v.config)}"
            if v.config.probes_kvm:
                want = model.verdict(v.config, probe)
                got = None if v.verdict is None else v.verdict.reason
                if got is not want:
                    yield f"{name}: view's verdict {got}, expected {want}"
        # The device plugin: an agent per configured resource (and a prober's per probed one
        # in socket mode), advertising the view's health; the devices metric says the same.
        serves = self.mode != "dra"
        probers = {n + SUFFIX for n in probed} if probe == "socket" else set()
        if serves or probers:
            agents = self.s.plugin.agents
            want_agents = ({*names} if serves else set()) | probers
            if set(agents) != want_agents:
                yield f"agents {sorted(agents)}, expected {sorted(want_agents)}"
            for name, agent in agents.items():
                healthy = True if name in probers else view[name].healthy if name in view else None
                if healthy is None:
                    continue
                if (agent.state.health == HEALTHY) != healthy:
                    yield f"agent {name} advertises {agent.state.health}, the view says healthy={healthy}"
                units = agent.config.units
                advertised = units if agent.state.ever_present else 0
                counts = {"healthy": units if healthy else 0, "unhealthy": advertised - (units if healthy else 0)}
                for health, value in counts.items():
                    series = self.s.sample("ate_devplugin_devices", resource_name=name, health=health)
                    if series != value:
                        yield f"ate_devplugin_devices{{{name},{health}}} is {series}, expected {value}"
        # The DRA driver: published devices iff present, tainted iff failing; a health report
        # for every device of every configured resource, as the view says.
        if self.dra is not None and self.api is not None:
            owner = self.dra.device_resources()
            by_resource: dict[str, list[dict[str, Any]]] = {}
            for device in self.api.devices_json():
                resource = owner.get(device["name"])
                if resource is None:
                    yield f"slice device {device['name']} of no configured resource"
                    continue
                by_resource.setdefault(resource, []).append(device)
            for name, v in view.items():
                published = by_resource.get(name, [])
                if bool(published) != v.present:
                    yield f"{name}: {len(published)} devices in slices, present={v.present}"
                tainted = [d["name"] for d in published if d.get("taints")]
                if published and bool(tainted) != (v.failing is not None):
                    yield f"{name}: tainted {tainted}, failing={v.failing}"
                    continue
                if published and len(tainted) not in (0, len(published)):
                    yield f"{name}: only {tainted} of its devices tainted"
            reports = {r.device: r for r in self.dra.health.reports}
            report_owners = {owner.get(d) for d in reports}
            if report_owners != set(names):
                yield f"health reports of {sorted(map(str, report_owners))}, configured {names}"
            for device_name, report in reports.items():
                of = owner.get(device_name)
                if of is not None and of in view and report.healthy != view[of].healthy:
                    yield f"health report {device_name} healthy={report.healthy}, the view says {view[of].healthy}"
        # /readyz: ready, naming every failing KVM verdict and no other.
        ready, why = daemon.readiness()
        if not ready:
            yield f"not ready: {why}"
        said = why.split("; ")
        for name, v in view.items():
            if v.failing is not None and f"{failure_text(v.failing)} ({name})" not in said:
                yield f"/readyz does not say {name} fails: {why}"
            if v.failing is None and any(w.startswith("KVM probe failed") and w.endswith(f"({name})") for w in said):
                yield f"/readyz says {name} fails: {why}"
        # No series of a resource that left the config.
        known = {*names, *probers}
        for metric in daemon.metrics.registry.collect():
            if metric.name == "ate_devplugin_cdi_spec_updates":
                continue  # counts the spec's removal itself (test_daemon asserts it after the resource left)
            for sample in metric.samples:
                resource = sample.labels.get("resource_name")
                if resource is not None and resource not in known:
                    yield f"{sample.name}{sample.labels} of a resource not configured"
                    break


def machine(mode: str, probe: str) -> type[DaemonMachine]:
    return cast(type[DaemonMachine], type(f"Daemon_{mode}_{probe}", (DaemonMachine,), {"mode": mode, "probe": probe}))


CI = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,  # nothing written into the repository; failures are kept below as tests
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("mode", MODES)
def test_random_sequences_keep_every_surface_on_the_view(mode: str, probe: str) -> None:
    run_state_machine_as_test(machine(mode, probe), settings=CI)


# --- sequences the machine found, shrunk -------------------------------------------------


def test_a_resource_renamed_in_dra_mode_leaves_no_slice_gauges() -> None:
    """Found by the machine (dra, off): after a rename, ate_devplugin_dra_slice_devices and
    _dra_tainted_devices kept a series of the old name (at 0) for ever."""
    state = machine("dra", "off")()
    try:
        state.every_surface_agrees_with_the_view()
        state._reload([Res("kvm", "ate.dev/vm", ("/dev/kvm",))])  # rename_resource, drawn
        state.every_surface_agrees_with_the_view()
    finally:
        state.teardown()
