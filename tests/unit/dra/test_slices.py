"""This node's slices as data: the shareable device, the slots, reading back what was kept."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.dra.kube import GONE, ApiError
from ate_devplugin.dra.slices import (
    MAX_GENERATION,
    Seen,
    SliceDevice,
    SlicePublisher,
    chunks,
    device_name,
    next_generation,
    resource_devices,
    sharing_dropped,
    taints_dropped,
)
from ate_devplugin.dra.taints import DeviceTaint
from ate_devplugin.kvm.attributes import Value, Version
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.settings import DRA_DRIVER
from ate_devplugin.tasks import Guard, cancel
from tests.unit.dra.fakes import FakeApi
from tests.unit.fakes import until

NODE = "node-a"
KVM = "ate.dev/kvm"


def test_a_resource_publishes_its_shareable_device_first_then_its_slots() -> None:
    assert resource_devices("ate.dev/kvm", 4096, 2, shared=True) == [
        SliceDevice("ate-dev-kvm", "ate.dev/kvm", 4096),
        SliceDevice("ate-dev-kvm-0", "ate.dev/kvm"),
        SliceDevice("ate-dev-kvm-1", "ate.dev/kvm"),
    ]
    assert [d.name for d in resource_devices("ate.dev/tun", 8, 2, shared=False)] == ["ate-dev-tun-0", "ate-dev-tun-1"]
    assert device_name("Example.COM/" + "x" * 80, 7) == "example-com-" + "x" * 38 + "-7"


# --- the publisher against a fake API server: backoff, foreign slices, the generation ---


class Sleeps:
    """The publisher's sleep: records each delay and returns at once (no real time), until
    ``limit`` delays, then waits for ever so the test reads a fixed list."""

    def __init__(self, limit: int) -> None:
        self.delays: list[float] = []
        self.limit = limit

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) >= self.limit:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


def publisher(api: FakeApi, sleeps: Sleeps | None = None, **kwargs: Any) -> SlicePublisher:
    return SlicePublisher(
        api, DRA_DRIVER, NODE, DraMetrics(CollectorRegistry()), sleep=sleeps or Sleeps(10**9), **kwargs
    )


@contextlib.asynccontextmanager
async def running(pub: SlicePublisher) -> AsyncIterator[SlicePublisher]:
    deaths: list[str] = []
    pub.start(Guard(lambda name, error: deaths.append(name)))
    try:
        yield pub
    finally:
        for task in pub._tasks:
            await cancel(task, 1.0)
        assert deaths == []


def envelope(delays: list[float], initial: float, cap: float) -> list[tuple[float, float]]:
    """Where each delay must lie: [d/2, d] of the doubling, capped bound d."""
    bounds = []
    d = initial
    for _ in delays:
        bounds.append((d / 2, d))
        d = min(cap, d * 2)
    return bounds


async def test_a_watch_that_ends_at_once_is_retried_with_capped_jittered_backoff() -> None:
    api = FakeApi()
    api.watch_ends = True
    sleeps = Sleeps(limit=12)
    pub = publisher(api, sleeps, retry_s=1.0, retry_cap_s=30.0, rng=random.Random(3))
    async with running(pub):
        await until(lambda: len(sleeps.delays) == 12, "twelve watches ended")
        # One watch per delay, each taken up where the last ended: nothing is asked again
        # without a delay, and nothing listed again.
        assert (api.watches, api.lists) == (12, 1)
        bounds = envelope(sleeps.delays, 1.0, 30.0)
        assert all(low <= d <= high for d, (low, high) in zip(sleeps.delays, bounds, strict=True)), sleeps.delays
        assert max(sleeps.delays) <= 30.0
        assert sleeps.delays[-1] >= 15.0
        assert len(set(sleeps.delays)) == 12  # jittered: no two alike


async def test_failed_writes_back_off_the_same_way_and_succeed_after() -> None:
    api = FakeApi()
    api.fail_writes = 4
    sleeps = Sleeps(limit=10**9)
    pub = publisher(api, sleeps, retry_s=0.5, retry_cap_s=4.0, rng=random.Random(5))
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published after the failures")
    assert api.writes == ["create"] * 5
    bounds = envelope(sleeps.delays, 0.5, 4.0)
    assert len(sleeps.delays) == 4
    assert all(low <= d <= high for d, (low, high) in zip(sleeps.delays, bounds, strict=True)), sleeps.delays


async def test_many_foreign_slices_are_deleted_in_few_comparisons() -> None:
    api = FakeApi()
    for i in range(2000):  # our driver and node, not our pool: written by someone else
        api.add_slice(f"foreign-{i}", "other-pool", 1, [f"x-{i}"])
    pub = publisher(api)
    compares = 0
    matches = pub._matches

    def counted(wanted: list[list[dict[str, Any]]]) -> bool:
        nonlocal compares
        compares += 1
        return matches(wanted)

    pub._matches = counted  # type: ignore[method-assign]
    pub.publish(resource_devices(KVM, 1, 4, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set() and len(api.slices) == 1, "only ours left", timeout=30)
    assert api.devices() == [f"ate-dev-kvm-{i}" for i in range(4)]
    assert api.writes.count("delete") == 2000  # none written over: a slice's pool cannot change
    # Each of the 2000 deletions is a watch event; they wake the sync loop, which compares
    # once per wake-up (a batch of events), not once per event.
    assert compares <= 2000 / 10, compares
    assert all(isinstance(s, Seen) for s in pub.observed.values())


def test_the_generation_goes_up_from_what_is_kept_and_never_past_an_int64() -> None:
    def kept(*generations: int) -> list[Seen]:
        return [Seen(f"s{i}", "1", NODE, g, 1, 0) for i, g in enumerate(generations)]

    assert next_generation(kept(), 0) == 1
    assert next_generation(kept(3, 5), 4) == 6
    assert next_generation(kept(), 7) == 8  # the kubelet wiped the pool: still up from the last written
    assert next_generation(kept(MAX_GENERATION - 1), 2) == MAX_GENERATION
    assert next_generation(kept(MAX_GENERATION), 2) is None


async def test_a_stray_slice_at_the_last_generation_is_deleted_and_writes_go_on() -> None:
    api = FakeApi()
    pub = publisher(api)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published")
        api.add_slice("intruder", NODE, MAX_GENERATION)  # another client, in our pool
        await until(lambda: "intruder" not in api.slices and pub.synced.is_set(), "stray deleted")
        [ours] = api.slices.values()
        assert ours["spec"]["pool"]["generation"] == 2
        pub.publish(resource_devices(KVM, 1, 3, shared=False))  # and later writes still go through
        await until(lambda: pub.synced.is_set() and len(api.devices()) == 3, "written again")
    assert _results(pub) == {"success"}


async def test_our_own_slice_pushed_to_the_last_generation_makes_the_pool_start_again() -> None:
    api = FakeApi()
    pub = publisher(api)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published")
        [name] = api.slices
        item = copy.deepcopy(api.slices[name])
        item["spec"]["pool"]["generation"] = MAX_GENERATION  # another client's update
        api.slices[name] = item
        api._notify("MODIFIED", item)
        await until(lambda: pub.observed[name].generation == MAX_GENERATION, "seen")
        pub.publish(resource_devices(KVM, 1, 3, shared=False))
        await until(lambda: pub.synced.is_set() and len(api.devices()) == 3, "pool written afresh")
    [item] = api.slices.values()
    assert item["metadata"]["name"] != name  # deleted, then created anew
    assert item["spec"]["pool"]["generation"] == 1


def _results(pub: SlicePublisher) -> set[str]:
    return {
        sample.labels["result"]
        for metric in pub.metrics.slice_writes.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.value
    }


async def test_nothing_is_written_before_the_first_list_is_answered() -> None:
    api = FakeApi()
    api.list_gate = asyncio.Event()
    pub = publisher(api)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: api.lists == 1, "the first list asked for")
        for _ in range(100):
            await asyncio.sleep(0)
        assert api.writes == []  # it would not know which slices exist
        api.list_gate.set()
        await until(lambda: pub.synced.is_set(), "published")
    assert api.writes == ["create"]


async def test_a_slice_written_while_a_list_is_under_way_is_not_written_twice() -> None:
    api = FakeApi()
    pub = publisher(api)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published")
        api.wipe()  # the kubelet started: every slice gone ...
        await until(lambda: pub.synced.is_set() and len(api.slices) == 1, "written again")
        lists = api.lists
        api.list_gate = asyncio.Event()
        api.end_watches(ApiError(GONE, "too old resource version"))  # ... the watch fails: a list, answered late
        await until(lambda: api.lists == lists + 1, "the list asked for")
        pub.publish(resource_devices(KVM, 1, 3, shared=False))  # meanwhile a change is written
        await until(lambda: api.writes.count("update") == 1, "the change written")
        api.list_gate.set()  # the list, older than the update, arrives
        await until(lambda: api.watches == lists + 1, "watching again")
        for _ in range(100):
            await asyncio.sleep(0)
        assert pub.synced.is_set()
    assert api.writes == ["create", "create", "update"]  # nothing written again over the old list
    assert len(api.devices()) == 3


def test_the_shareable_device_has_one_share_per_unit_and_one_per_claim_by_default() -> None:
    [[shared, slot]] = chunks(resource_devices("ate.dev/kvm", 110, 1, shared=True))
    assert shared == {
        "name": "ate-dev-kvm",
        "attributes": {"resource": {"string": "ate.dev/kvm"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "shares": {
                "value": "110",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "110", "step": "1"}},
            }
        },
    }
    assert slot == {"name": "ate-dev-kvm-0", "attributes": {"resource": {"string": "ate.dev/kvm"}}}


def test_a_dropped_flag_is_seen_in_what_the_api_server_stored() -> None:
    [wanted] = chunks(resource_devices("ate.dev/kvm", 4, 1, shared=True))
    assert not sharing_dropped(wanted, wanted)
    # What a 1.35 API server (DRAConsumableCapacity off) keeps of it: the capacity's value only.
    stored = [{**wanted[0], "capacity": {"shares": {"value": "4"}}}, wanted[1]]
    del stored[0]["allowMultipleAllocations"]
    assert sharing_dropped(wanted, stored)
    assert not sharing_dropped(wanted[1:], stored)  # slots only: nothing to drop
    assert not sharing_dropped(wanted, [])  # not stored (yet): nothing seen


class Gate:
    """The publisher's sleep, held until the test opens it: the time between two watches."""

    def __init__(self) -> None:
        self.waiting = 0
        self.open = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.waiting += 1
        await self.open.wait()
        self.open.clear()


async def test_a_watch_the_server_ends_is_taken_up_where_it_ended_without_a_list() -> None:
    api = FakeApi()
    gate = Gate()
    pub = SlicePublisher(api, DRA_DRIVER, NODE, DraMetrics(CollectorRegistry()), sleep=gate)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set() and api.watches == 1, "published and watching")
        last = max(int(s["metadata"]["resourceVersion"]) for s in api.slices.values())
        api.end_watches()  # the watch's timeout
        await until(lambda: gate.waiting == 1, "between two watches")
        api.wipe()  # the kubelet started meanwhile: nobody watching
        gate.open.set()
        await until(lambda: pub.synced.is_set() and len(api.slices) == 1, "written again")
    # The second watch asked for what followed the first's last event, and saw the wipe.
    assert api.watched_from == [api.watched_from[0], str(last)]
    assert api.lists == 1
    assert api.writes == ["create", "create"]


async def test_a_watch_that_fails_lists_again() -> None:
    api = FakeApi()
    pub = publisher(api)
    pub.publish(resource_devices(KVM, 1, 2, shared=False))
    async with running(pub):
        await until(lambda: pub.synced.is_set() and api.watches == 1, "published and watching")
        api.end_watches(ApiError(GONE, "too old resource version"))
        await until(lambda: api.watches == 2, "watching again")
        assert api.lists == 2
    assert api.writes == ["create"]


# --- attributes and taints ----------------------------------------------------------

TAINT = DeviceTaint("ate.dev/kvm-unhealthy", "not-a-kvm-device", "NoSchedule", "2026-12-03T10:00:00Z")
FACTS: dict[str, Value] = {
    "cpuModel": 167,
    "kvmHardware": False,
    "kvmImplementation": "pvm",
    "kernelVersion": Version("6.18.44"),
}


def test_every_device_of_a_resource_carries_its_attributes_and_taints() -> None:
    [[shared, slot]] = chunks(resource_devices(KVM, 4, 1, shared=True, attributes=FACTS, taints=[TAINT]))
    attributes = {
        "resource": {"string": KVM},
        "cpuModel": {"int": 167},
        "kvmHardware": {"bool": False},
        "kvmImplementation": {"string": "pvm"},
        "kernelVersion": {"version": "6.18.44"},
    }
    taints = [{"key": "ate.dev/kvm-unhealthy", "value": "not-a-kvm-device", "effect": "NoSchedule",
               "timeAdded": "2026-12-03T10:00:00Z"}]  # fmt: skip
    assert (shared["attributes"], shared["taints"]) == (attributes, taints)
    assert slot == {"name": "ate-dev-kvm-0", "attributes": attributes, "taints": taints}
    with pytest.raises(ValueError, match="the attribute 'resource' is the resource's name"):
        resource_devices(KVM, 4, 1, shared=True, attributes={"resource": "x"})


def test_a_slice_with_taints_holds_at_most_64_devices() -> None:
    plain = chunks(resource_devices(KVM, 4, 200, shared=True))
    tainted = chunks(resource_devices(KVM, 4, 200, shared=True, taints=[TAINT]))
    assert [len(c) for c in plain] == [128, 73]
    assert [len(c) for c in tainted] == [64, 64, 64, 9]


def test_dropped_taints_are_seen_in_what_the_api_server_stored() -> None:
    [wanted] = chunks(resource_devices(KVM, 4, 1, shared=True, taints=[TAINT]))
    assert not taints_dropped(wanted, wanted)
    stored = [{k: v for k, v in d.items() if k != "taints"} for d in wanted]  # 1.35: DRADeviceTaints off
    assert taints_dropped(wanted, stored)
    assert not taints_dropped(stored, stored)  # none wanted: nothing to drop
    assert not taints_dropped(wanted, [])


async def test_an_api_server_that_drops_taints_gets_the_devices_without_them_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeApi()
    api.device_taints = False
    metrics = DraMetrics(CollectorRegistry())
    pub = SlicePublisher(api, DRA_DRIVER, NODE, metrics, sleep=Sleeps(10**9))
    pub.publish(resource_devices(KVM, 4, 2, shared=True, attributes=FACTS, taints=[TAINT]))
    assert metrics.tainted_devices.labels(KVM)._value.get() == 3
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published without taints")
        assert (pub.taints, metrics.taints_dropped._value.get()) == (False, 1)
        assert metrics.tainted_devices.labels(KVM)._value.get() == 0
        stored = [d for item in api.slices.values() for d in item["spec"]["devices"]]
        assert [d["attributes"]["kvmImplementation"] for d in stored] == [{"string": "pvm"}] * 3
        assert not any("taints" in d for d in stored)
        writes = len(api.writes)
        # The next verdict changes the taint: nothing to write, as none is published.
        later = DeviceTaint(TAINT.key, "timed-out", "NoSchedule", TAINT.time_added)
        pub.publish(resource_devices(KVM, 4, 2, shared=True, attributes=FACTS, taints=[later]))
        await asyncio.sleep(0.05)
        assert pub.synced.is_set()
        assert len(api.writes) == writes
    assert sum("dropped the devices' taints" in r.getMessage() for r in caplog.records) == 1


async def test_a_taint_comes_and_goes_with_the_verdict_where_the_api_server_keeps_it() -> None:
    api = FakeApi()
    metrics = DraMetrics(CollectorRegistry())
    pub = SlicePublisher(api, DRA_DRIVER, NODE, metrics, sleep=Sleeps(10**9))
    pub.publish(resource_devices(KVM, 4, 1, shared=True, attributes=FACTS))
    async with running(pub):
        await until(lambda: pub.synced.is_set(), "published")
        pub.publish(resource_devices(KVM, 4, 1, shared=True, attributes=FACTS, taints=[TAINT]))
        await until(lambda: pub.synced.is_set(), "tainted")
        stored = [d for item in api.slices.values() for d in item["spec"]["devices"]]
        assert [d["taints"][0]["value"] for d in stored] == ["not-a-kvm-device"] * 2
        assert metrics.tainted_devices.labels(KVM)._value.get() == 2
        pub.publish(resource_devices(KVM, 4, 1, shared=True, attributes=FACTS))
        await until(lambda: pub.synced.is_set(), "untainted")
        stored = [d for item in api.slices.values() for d in item["spec"]["devices"]]
        assert not any("taints" in d for d in stored)
    assert (pub.taints, metrics.taints_dropped._value.get()) == (True, 0)
    assert api.writes == ["create", "update", "update"]
