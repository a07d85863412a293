"""This node's ResourceSlices: what to publish, and keeping the API server in step.

One pool per node (named after the node) holds every configured resource's devices.
A KVM device is shared, in two ways at once (docs/dra.md says why both):

* one shareable device per resource (``<resource>``, e.g. ``ate-dev-kvm``) with
  ``allowMultipleAllocations`` and a consumable capacity ``shares`` of the resource's
  units, one share per claim by default: every claim of one unit gets this device;
* ``slots`` named devices (``<resource>-0`` ...), one claim each, for requests of more
  than one device (N units are N distinct devices) and for API servers that drop
  ``allowMultipleAllocations`` (DRAConsumableCapacity off, the default before 1.36).

All of them map to the resource's one CDI device, and carry the same attributes (the
resource's name and, for KVM, the node's virtualisation facts: dra/attributes.py) and the
same taints (a KVM resource that fails its probe: dra/taints.py). The publisher reads back
what the API server stored: once it has dropped ``allowMultipleAllocations``, only the
slots are published from then on (logged, ``ate_devplugin_dra_sharing``); once it has
dropped ``taints`` (DRADeviceTaints off), devices are published without them (logged,
``ate_devplugin_dra_taints_dropped``), so what is wanted and what is held agree again. A
resource whose device nodes are missing publishes no devices.

The kubelet deletes every slice of its node when it starts, and after 30 s without a
connected driver: the publisher watches its slices and writes them again whenever what
the API server holds differs from what it should hold. When the server ends a watch, the
next takes up from where it ended: a node lists its slices only at start and after a
failed watch.

Whatever the API server holds, the loop stays responsive: a watch event costs the one
slice it carries (the sync loop compares, once per wake-up, digests it keeps instead of
the objects), slices not ours to keep are deleted in batches, and a watch or write that
fails or ends at once is retried after a capped, jittered backoff. The pool generation
goes up from the last one written and those of the slices kept, never from a slice
deleted; when one past it would not fit an int64 (only another writer can put a slice there), the
pool is deleted and written afresh from generation 1 (docs/dra.md).

Nothing is written before the first list is answered, and a list answered after this
process wrote keeps what it wrote since (by resourceVersion): otherwise a slice created
while the list was under way looks missing and is created twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ate_devplugin.dra import attributes as typed
from ate_devplugin.dra.taints import DeviceTaint
from ate_devplugin.kvm.attributes import Value
from ate_devplugin.observability.logs import reason
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.tasks import Backoff, Guard, cancel

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128  # the API server's limit for plain devices ...
MAX_TAINTED_DEVICES_PER_SLICE = 64  # ... and for a slice in which any device has taints
RESOURCE_ATTRIBUTE = "resource"  # the resource name, e.g. ate.dev/kvm; DeviceClass selectors match it
SHARES = "shares"  # the shareable device's consumable capacity: one share per claim by default
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
MAX_GENERATION = 2**63 - 1  # spec.pool.generation is an int64
DELETE_BATCH = 32
WATCH_HEALTHY_S = 30.0  # a watch that lasted this long ended normally: the next starts at once


class SliceApi(Protocol):
    """The API server calls the publisher makes; objects are plain JSON dicts."""

    async def node_uid(self, node: str) -> str: ...
    def list_slices(self, driver: str, node: str) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """The slices a page at a time, each page with the list's resourceVersion."""
        ...

    def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(ADDED | MODIFIED | DELETED | BOOKMARK, slice) until the server ends the watch."""
        ...

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None:
        """Deletes; a slice already gone is no error."""
        ...


@dataclass(frozen=True)
class SliceDevice:
    """One published device: a slot (``shares`` 0, one claim) or the resource's shareable
    device (``shares`` > 0: that many shares, one per claim unless a claim asks for more),
    with the resource's attributes (besides ``resource``) and taints."""

    name: str
    resource: str
    shares: int = 0
    attributes: tuple[tuple[str, Value], ...] = ()
    taints: tuple[DeviceTaint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        named = {RESOURCE_ATTRIBUTE: self.resource, **dict(self.attributes)}
        device: dict[str, Any] = {"name": self.name, "attributes": typed.to_json(named, 1 if self.shares else 0)}
        if self.shares:
            units = str(self.shares)
            device["allowMultipleAllocations"] = True
            policy = {"default": "1", "validRange": {"min": "1", "max": units, "step": "1"}}
            device["capacity"] = {SHARES: {"value": units, "requestPolicy": policy}}
        if self.taints:
            device["taints"] = [t.to_json() for t in self.taints]
        return device


def _label(resource: str) -> str:
    return _NOT_LABEL.sub("-", resource.lower()).strip("-")[:50].rstrip("-")


def device_name(resource: str, slot: int) -> str:
    """A DNS label for one slot of a resource: ``ate.dev/kvm`` slot 3 is ``ate-dev-kvm-3``."""
    return f"{_label(resource)}-{slot}"


def shared_device_name(resource: str) -> str:
    """The shareable device of a resource: ``ate.dev/kvm`` is ``ate-dev-kvm``."""
    return _label(resource)


def resource_devices(
    resource: str,
    units: int,
    slots: int,
    shared: bool,
    attributes: Mapping[str, Value] | None = None,
    taints: Sequence[DeviceTaint] = (),
) -> list[SliceDevice]:
    """What one resource publishes: its shareable device first (the scheduler tries devices
    in slice order, so single-device claims share it), then its slots; each with the
    resource's attributes and taints."""
    extra = tuple((attributes or {}).items())
    if any(name == RESOURCE_ATTRIBUTE for name, _ in extra):
        raise ValueError(f"the attribute {RESOURCE_ATTRIBUTE!r} is the resource's name")
    marks = tuple(taints)
    first = [SliceDevice(shared_device_name(resource), resource, units, extra, marks)] if shared else []
    return first + [SliceDevice(device_name(resource, i), resource, 0, extra, marks) for i in range(slots)]


def sharing_dropped(wanted: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]) -> bool:
    """Whether the API server stored a device we wrote as shareable without the flag (it
    drops allowMultipleAllocations while DRAConsumableCapacity is off)."""
    kept = {d.get("name"): bool(d.get("allowMultipleAllocations")) for d in stored}
    return any(d.get("allowMultipleAllocations") and kept.get(d["name"]) is False for d in wanted)


def taints_dropped(wanted: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]) -> bool:
    """Whether the API server stored a device we wrote with taints without them (it drops
    the field while DRADeviceTaints is off)."""
    kept = {d.get("name"): bool(d.get("taints")) for d in stored}
    return any(d.get("taints") and kept.get(d["name"]) is False for d in wanted)


def chunks(devices: Sequence[SliceDevice]) -> list[list[dict[str, Any]]]:
    """The devices, in order, split into slices (smaller ones when any device has taints:
    the API's limit); an empty pool is still one (empty) slice."""
    items = [d.to_json() for d in devices]
    size = MAX_TAINTED_DEVICES_PER_SLICE if any(d.taints for d in devices) else MAX_DEVICES_PER_SLICE
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def _content(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What of a slice we compare with what we want: its devices as stored."""
    devices: list[dict[str, Any]] = item.get("spec", {}).get("devices") or []
    return devices


@dataclass(frozen=True)
class Seen:
    """What the publisher keeps of a slice the API server holds: enough to compare and to
    write it, not the object (a node may hold many slices that are not ours to keep)."""

    name: str
    resource_version: str
    pool: str
    generation: int
    count: int
    content: int  # a digest of _content(slice)


def seen(item: Mapping[str, Any]) -> Seen:
    meta, pool = item.get("metadata") or {}, (item.get("spec") or {}).get("pool") or {}
    return Seen(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        pool=str(pool.get("name", "")),
        generation=_int(pool.get("generation")),
        count=_int(pool.get("resourceSliceCount")),
        content=_digest(item),
    )


def _digest(item: Mapping[str, Any]) -> int:
    """Equal for equal content, whatever order the API server gave its keys in."""
    return hash(json.dumps(_content(item), sort_keys=True, default=str))


def _int(value: Any) -> int:
    """An int64 field as the API server holds it (anything else counts as 0)."""
    return value if isinstance(value, int) and 0 <= value <= MAX_GENERATION else 0


def _newer(version: str, than: str) -> bool:
    """Whether a resourceVersion is later than another (etcd's are increasing integers;
    anything else is not known to be later)."""
    return version.isdigit() and than.isdigit() and int(version) > int(than)


def next_generation(kept: Sequence[Seen], written: int) -> int | None:
    """The pool generation to write over the slices kept: one past the highest of theirs
    and of the last one written (the API server took both), or None when that would not
    fit an int64 (then the pool must start again)."""
    generation = max([written, *(s.generation for s in kept)]) + 1
    return generation if generation <= MAX_GENERATION else None


class SlicePublisher:
    def __init__(
        self,
        api: SliceApi,
        driver: str,
        node: str,
        metrics: DraMetrics,
        retry_s: float = 1.0,
        retry_cap_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        sharing: bool = True,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.metrics = metrics
        self.retry_s = retry_s
        self.retry_cap_s = retry_cap_s
        self.sleep = sleep
        self.rng = rng
        # Whether shareable devices are published: False from the start with slots only,
        # and from the moment the API server is seen dropping allowMultipleAllocations.
        self.sharing = sharing
        self.taints = True  # whether taints are published: until the API server is seen dropping them
        self.wanted: tuple[SliceDevice, ...] = ()  # what the driver asked for
        self.devices: tuple[SliceDevice, ...] = ()  # what is published of it
        self.generation = 0  # the last one written
        self.observed: dict[str, Seen] = {}  # slice name -> slice, as the API server holds it
        # What this process wrote (None: deleted) since the list under way was asked for:
        # its answer may be older than these writes.
        self._written: dict[str, Seen | None] = {}
        self._listed = asyncio.Event()  # the first list was answered: observed is known
        self.synced = asyncio.Event()  # set while the API server holds what it should
        self._dirty = asyncio.Event()
        self._node_uid: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._set_sharing_metric()

    def publish(self, devices: Sequence[SliceDevice]) -> None:
        """The devices to publish from now on; shareable ones only while sharing is on,
        their taints only while the API server keeps them."""
        self.wanted = tuple(devices)
        published = tuple(
            d if self.taints or not d.taints else dataclasses.replace(d, taints=())
            for d in self.wanted
            if self.sharing or not d.shares
        )
        if published == self.devices:
            return
        for resource in {d.resource for d in (*self.devices, *self.wanted)}:
            self.metrics.slice_devices.labels(resource).set(sum(1 for d in published if d.resource == resource))
            tainted = sum(1 for d in published if d.resource == resource and d.taints)
            self.metrics.tainted_devices.labels(resource).set(tainted)
        self.devices = published
        self._changed()

    def _taints_dropped(self) -> None:
        log.warning(
            "the API server dropped the devices' taints (DRADeviceTaints is off): publishing devices without "
            "them; a device that fails its probe is still reported unhealthy to the kubelet",
            extra={"driver": self.driver, "node": self.node},
        )
        self.taints = False
        self.metrics.taints_dropped.set(1)
        self.publish(self.wanted)

    def _sharing_dropped(self) -> None:
        log.warning(
            "the API server dropped allowMultipleAllocations (DRAConsumableCapacity is off): "
            "publishing slots only, one claim per slot",
            extra={"driver": self.driver, "node": self.node},
        )
        self.sharing = False
        self._set_sharing_metric()
        self.publish(self.wanted)

    def _set_sharing_metric(self) -> None:
        self.metrics.sharing.labels("capacity").set(int(self.sharing))
        self.metrics.sharing.labels("slots").set(int(not self.sharing))

    def start(self, guard: Guard) -> None:
        self._tasks = [
            guard.spawn("slice_watch", self._watch_loop(), "resourceslice watch"),
            guard.spawn("slice_sync", self._sync_loop(), "resourceslice sync"),
        ]

    async def stop(self, deadline_s: float = 1.0) -> None:
        """Stops watching (each task within ``deadline_s``) and deletes this node's slices
        (best effort: the caller bounds it)."""
        await asyncio.gather(*(cancel(task, deadline_s) for task in self._tasks))
        self._tasks = []
        count = 0
        async for items, _ in self.api.list_slices(self.driver, self.node):
            await self._delete_all([str(item["metadata"]["name"]) for item in items])
            count += len(items)
        log.info("resource slices deleted", extra={"count": count})

    # --- loops ----------------------------------------------------------------------

    def _changed(self) -> None:
        self.synced.clear()
        self.metrics.slices_in_sync.set(0)
        self._dirty.set()

    async def _watch_loop(self) -> None:
        """List, then watch from there; every event wakes the sync loop, which compares.

        A watch the server ends (its timeout) is taken up again from the last
        resourceVersion it gave (an event's or a bookmark's): no list. A watch that fails
        (the resourceVersion too old, the server away) lists again. Either is started
        after a backoff, which starts afresh only after a watch that lasted
        ``WATCH_HEALTHY_S``: a server that ends every watch at once is asked again at most
        every ``retry_cap_s``, not in a loop."""
        backoff = Backoff(self.retry_s, self.retry_cap_s, self.rng)
        loop = asyncio.get_running_loop()
        version = ""  # where the next watch starts; empty: list first
        while True:
            began = loop.time()
            try:
                version = version or await self._list()
                async for kind, item in self.api.watch_slices(self.driver, self.node, version):
                    meta = item.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    name = str(meta.get("name", ""))
                    if kind == "DELETED":
                        self.observed.pop(name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        record, held = seen(item), self.observed.get(name)
                        if held is not None and _newer(held.resource_version, record.resource_version):
                            continue  # older than the answer to our own write, already kept
                        self.observed[name] = record
                    else:
                        continue
                    self._dirty.set()
                    await asyncio.sleep(0)  # events read from one buffer come without a pause
                why = "the API server ended the watch"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                version = ""
                why = f"watching resource slices failed: {reason(exc)}"
            lasted = loop.time() - began
            if lasted >= WATCH_HEALTHY_S:
                backoff.reset()
            delay = backoff.next()
            level = logging.DEBUG if lasted >= WATCH_HEALTHY_S else logging.WARNING
            log.log(level, "%s after %.1fs; watching again in %.1fs", why, lasted, delay)
            await self.sleep(delay)

    async def _list(self) -> str:
        """What the API server holds now, a page at a time; the list's resourceVersion."""
        observed: dict[str, Seen] = {}
        version = ""
        self._written = {}
        async for items, page_version in self.api.list_slices(self.driver, self.node):
            for item in items:
                record = seen(item)
                observed[record.name] = record
            version = page_version
        for name, wrote in self._written.items():  # what was written after the list's snapshot
            if wrote is None:
                observed.pop(name, None)
            elif _newer(wrote.resource_version, version):
                observed[name] = wrote
        self.observed = observed
        self._listed.set()
        self._dirty.set()
        return version

    async def _sync_loop(self) -> None:
        backoff = Backoff(self.retry_s, self.retry_cap_s, self.rng)
        await self._listed.wait()  # before it, a create could add a second copy of a slice
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next()
                log.warning("writing resource slices failed, again in %.1fs: %s", delay, reason(exc))
                await self.sleep(delay)
                self._dirty.set()
                continue
            backoff.reset()

    # --- one pass -------------------------------------------------------------------

    def _matches(self, wanted: list[list[dict[str, Any]]]) -> bool:
        """The API server holds the wanted slices, all of one generation (whichever)."""
        if len(self.observed) != len(wanted):
            return False
        have = list(self.observed.values())
        if len({s.generation for s in have}) != 1:
            return False
        if any(s.pool != self.node or s.count != len(wanted) for s in have):
            return False
        return sorted(s.content for s in have) == sorted(_digest({"spec": {"devices": d}}) for d in wanted)

    async def _sync(self) -> None:
        wanted = chunks(self.devices)
        if self._matches(wanted):
            self.synced.set()
            self.metrics.slices_in_sync.set(1)
            return
        self.synced.clear()
        self.metrics.slices_in_sync.set(0)
        # Only our pool's slices can be written over (a slice's pool name cannot change),
        # those of the lowest generations: a stray slice far ahead is one deleted.
        ours = sorted((s for s in self.observed.values() if s.pool == self.node), key=lambda s: (s.generation, s.name))
        kept = ours[: len(wanted)]
        keep = {s.name for s in kept}
        await self._delete_all([name for name in self.observed if name not in keep])
        generation = next_generation(kept, self.generation)
        if generation is None:
            # Nothing can follow an int64's last value: delete the pool and start it again.
            # The scheduler sees no devices of this node until the new slices are written.
            log.warning("pool generation at its limit: writing this node's pool afresh")
            await self._delete_all([s.name for s in kept])
            kept, generation = [], 1
        self.generation = generation
        for i, devices in enumerate(wanted):
            spec = self._spec(devices, len(wanted))
            written: dict[str, Any]
            if i < len(kept):
                body = await self._body(spec, name=kept[i].name, resource_version=kept[i].resource_version)
                written = await self._write("update", self.api.replace_slice(body))
            else:
                written = await self._write("create", self.api.create_slice(await self._body(spec)))
            record = seen(written)
            self.observed[record.name] = self._written[record.name] = record
            if self.sharing and sharing_dropped(devices, _content(written)):
                self._sharing_dropped()  # the next pass publishes the slots alone
                return
            if self.taints and taints_dropped(devices, _content(written)):
                self._taints_dropped()  # the next pass publishes the devices without taints
                return
        log.info(
            "resource slices published",
            extra={"generation": self.generation, "slices": len(wanted), "devices": len(self.devices)},
        )
        self.synced.set()
        self.metrics.slices_in_sync.set(1)

    def _spec(self, devices: list[dict[str, Any]], count: int) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "pool": {"name": self.node, "generation": self.generation, "resourceSliceCount": count},
            "nodeName": self.node,
            "devices": devices,
        }

    async def _body(self, spec: dict[str, Any], name: str = "", resource_version: str = "") -> dict[str, Any]:
        """A slice to create (no name), or to write over the one named at that version."""
        if self._node_uid is None:
            self._node_uid = await self.api.node_uid(self.node)
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._node_uid, "controller": True}
        # The kubelet and garbage collector clean up after a node that is gone for good.
        meta: dict[str, Any] = {"ownerReferences": [owner]}
        if name:
            meta.update(name=name, resourceVersion=resource_version)
        else:
            meta["generateName"] = f"{self.node}-{self.driver}-"
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": spec}

    async def _write(self, op: str, call: Awaitable[Any]) -> Any:
        try:
            result = await call
        except Exception:
            self.metrics.slice_writes.labels(op, "failure").inc()
            raise
        self.metrics.slice_writes.labels(op, "success").inc()
        return result

    async def _delete_all(self, names: Sequence[str]) -> None:
        """A batch at a time (the API client bounds how many are on the wire); the loop
        runs between batches."""
        for i in range(0, len(names), DELETE_BATCH):
            batch = names[i : i + DELETE_BATCH]
            await asyncio.gather(*(self._write("delete", self.api.delete_slice(name)) for name in batch))
            for name in batch:
                self.observed.pop(name, None)
                self._written[name] = None
            await asyncio.sleep(0)
