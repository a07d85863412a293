"""The agent's executor paths with fake ports: no root, no kubelet, no real waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.agent import ResourceAgent
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.settings import DevicePluginSettings, Timing, resolve
from ate_devplugin.tasks import Guard
from tests.unit.fakes import FakeClock, FakeFs, FakeKubelet, FakeServer, fake_ports, until

KUBELET = "/plugins/kubelet.sock"
KVM = ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",))
FOUND = Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True)
TIMING = Timing(agent_stop_s=0.5, server_stop_grace_s=0.0)
SETTINGS = replace(resolve({"plugin_dir": "/plugins"}, {}), timing=TIMING).part(DevicePluginSettings)


class World:
    def __init__(self) -> None:
        self.fs = FakeFs(present={KUBELET})
        self.kubelet = FakeKubelet()
        self.clock = FakeClock()
        self.servers: dict[str, FakeServer] = {}
        self.metrics = Metrics(CollectorRegistry())
        self.metrics.add_resource(KVM.name)
        self.deaths: list[str] = []
        self.guard = Guard(on_death=lambda name, exc: self.deaths.append(name))
        self.agent = ResourceAgent(
            KVM,
            SETTINGS,
            fake_ports(self.fs, self.kubelet, self.clock, self.servers),
            self.metrics,
            NoOpTracerProvider().get_tracer("test"),
        )
        self.kubelet.opens_stream.append(self.agent.state)

    @property
    def server(self) -> FakeServer:
        return self.servers[KVM.name]

    def registrations(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "ate_devplugin_registrations_total", {"resource_name": KVM.name, "result": result}
        )
        assert value is not None
        return value


@pytest.fixture
def world() -> World:
    return World()


async def started(world: World) -> ResourceAgent:
    agent = world.agent
    agent.start(world.guard)
    agent.apply(FOUND)
    await until(lambda: agent.serving, "serving")
    return agent


async def test_serves_registers_and_is_ready_with_the_kubelets_stream(world: World) -> None:
    agent = await started(world)
    assert world.server.starts == 1
    assert world.kubelet.calls == 1
    # The resource's options: GetPreferredAllocation not asked for, not advertised.
    assert [o.get_preferred_allocation_available for o in world.kubelet.options] == [False]
    assert world.registrations("success") == 1
    assert world.metrics.registry.get_sample_value("ate_devplugin_registered", {"resource_name": KVM.name}) == 1
    assert await agent.stop()
    assert world.server.stops >= 1
    assert agent.state.closed


async def test_nothing_happens_before_the_devices_are_present(world: World) -> None:
    world.agent.start(world.guard)
    await asyncio.sleep(0.01)
    assert world.servers[KVM.name].starts == 0
    world.agent.apply(Discovery(nodes=(), complete=False))
    await asyncio.sleep(0.01)
    assert world.server.starts == 0
    assert await world.agent.stop()


async def test_registration_failures_back_off_then_succeed(world: World) -> None:
    world.kubelet.outcomes = ["unavailable", "timeout", None]
    before = world.clock.now
    await started(world)
    assert world.kubelet.calls == 3
    assert world.registrations("unavailable") == 1
    assert world.registrations("timeout") == 1
    assert world.clock.now > before  # the backoff was slept, on the fake clock
    await world.agent.stop()


async def test_a_serve_failure_is_retried_after_a_backoff(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each retry waits its backoff (on the fake clock): the first delay drawn from
    [initial/2, initial], the next from twice that."""
    server, tries = world.server, []
    serve = server.start

    async def timed() -> None:
        tries.append(world.clock.now)
        await serve()

    monkeypatch.setattr(server, "start", timed)
    server.fail_starts = 2
    await started(world)
    assert server.starts == 3
    initial = TIMING.backoff_initial_s
    first, second = tries[1] - tries[0], tries[2] - tries[1]
    assert initial / 2 <= first <= initial
    assert initial <= second <= 2 * initial
    await world.agent.stop()


async def test_our_socket_gone_is_served_and_registered_again(world: World) -> None:
    agent = await started(world)
    world.server.intact = False  # removed or renamed over
    agent.wake()
    await until(lambda: world.server.starts == 2 and world.kubelet.calls == 2, "served and registered again")
    await agent.stop()


async def test_a_new_kubelet_ends_a_hanging_attempt_and_registers_at_once(world: World) -> None:
    world.kubelet.outcomes = ["unavailable", "unavailable", "hang"]
    agent = world.agent
    agent.start(world.guard)
    agent.apply(FOUND)
    await until(lambda: world.kubelet.calls == 3, "a hanging attempt")
    agent.kubelet_changed(restarted=True)
    await until(lambda: agent.serving, "registered with the new kubelet")
    assert world.kubelet.calls == 4
    await agent.stop()


async def test_a_foreign_stream_neither_makes_ready_nor_stops_reregistration(world: World) -> None:
    world.kubelet.opens_stream.clear()  # this kubelet opens no stream
    agent = world.agent
    agent.state.stream_opened()  # a local client's stream, before our Register
    agent.start(world.guard)
    agent.apply(FOUND)
    # Registered, but the only stream is foreign: not serving; after the grace (fake
    # clock), registered again, and again.
    await until(lambda: world.kubelet.calls >= 3, "registered again after each grace")
    assert not agent.serving
    await agent.stop()


async def test_the_kubelet_dropping_its_stream_leads_to_registering_again(world: World) -> None:
    agent = await started(world)
    token = agent.state.kubelet_stream
    assert token is not None
    agent.state.stream_closed(token)
    assert not agent.serving
    await until(lambda: world.kubelet.calls == 2 and agent.serving, "registered again after the grace")
    await agent.stop()


async def test_health_follows_the_devices(world: World) -> None:
    agent = await started(world)
    version = agent.state.version
    before = (world.server.starts, world.server.stops, world.kubelet.calls)
    changed = "ate_devplugin_device_health_last_change_timestamp_seconds"
    present_at = world.metrics.registry.get_sample_value(changed, {"resource_name": KVM.name})
    assert present_at is not None
    assert time.time() - 60 < present_at <= time.time(), "the first discovery (present) is a change"
    agent.apply(FOUND)  # the same health: no change
    assert world.metrics.registry.get_sample_value(changed, {"resource_name": KVM.name}) == present_at
    await asyncio.sleep(0.01)
    agent.apply(Discovery(nodes=(), complete=False))
    lost_at = world.metrics.registry.get_sample_value(changed, {"resource_name": KVM.name})
    assert lost_at is not None
    assert present_at < lost_at <= time.time()
    assert agent.state.health == "Unhealthy"
    assert agent.state.version == version + 1
    samples = {"resource_name": KVM.name, "health": "unhealthy"}
    assert world.metrics.registry.get_sample_value("ate_devplugin_devices", samples) == KVM.units
    assert world.metrics.registry.get_sample_value("ate_devplugin_device_health_changes_total", samples) == 1
    # Devices gone: the resource stays served and registered, as Unhealthy.
    await asyncio.sleep(0.05)
    assert agent.serving
    assert (world.server.starts, world.server.stops, world.kubelet.calls) == before
    await agent.stop()


async def test_health_follows_a_failing_check_beyond_existence(world: World) -> None:
    agent = await started(world)
    changes = world.metrics.registry.get_sample_value
    version = agent.state.version
    agent.apply(FOUND, "not-a-kvm-device")
    assert (agent.state.health, agent.state.version) == ("Unhealthy", version + 1)
    agent.apply(FOUND, "run-failed")  # another reason, the same health: the streams hear nothing
    assert agent.state.version == version + 1
    agent.apply(Discovery(nodes=(), complete=False), "run-failed")  # gone as well: still Unhealthy
    agent.apply(FOUND, "run-failed")  # back, but still failing
    assert (agent.state.health, agent.state.version) == ("Unhealthy", version + 1)
    agent.apply(FOUND)
    assert (agent.state.health, agent.state.version) == ("Healthy", version + 2)
    unhealthy = {"resource_name": KVM.name, "health": "unhealthy"}
    healthy = {"resource_name": KVM.name, "health": "healthy"}
    assert changes("ate_devplugin_device_health_changes_total", unhealthy) == 1
    assert changes("ate_devplugin_device_health_changes_total", healthy) == 2  # the first discovery, and now
    assert changes("ate_devplugin_devices", healthy) == KVM.units
    await agent.stop()


async def test_stop_is_bounded_when_the_task_swallows_cancellation(world: World) -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # as lost cancellations look
                await released.wait()

    agent = world.agent
    agent.task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    begin = loop.time()
    assert not await agent.stop()
    assert loop.time() - begin < 30  # a hang bound: the stubborn task never ends by itself
    assert world.server.stops == 1
    released.set()
    await agent.task


async def test_stop_ends_a_task_whose_first_cancellation_is_lost(world: World) -> None:
    lost = []

    async def loses_one() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            lost.append(1)
        await asyncio.sleep(10)

    world.agent.task = asyncio.create_task(loses_one())
    await asyncio.sleep(0)
    assert await world.agent.stop()
    assert lost == [1]


async def test_an_agent_that_dies_says_so(world: World) -> None:
    world.server.crash = True
    world.agent.start(world.guard)
    world.agent.apply(FOUND)
    await until(lambda: world.deaths, "death reported")
    assert world.deaths == [f"agent {KVM.name}"]
