"""This node's ResourceSlices: what to publish, and keeping the API server in step.

One pool per node (named after the node) holds every configured resource's devices.
A KVM device is shared, in two ways at once (docs/dra.md says why both):

* one shareable device per resource (``<resource>``, e.g. ``ate-dev-kvm``) with
  ``allowMultipleAllocations`` and a consumable capacity ``shares`` of the resource's
  units, one share per claim by default: every claim of one unit gets this device;
* ``slots`` named devices (``<resource>-0`` ...), one claim each, for requests of more
  than one device (N units are N distinct devices) and for API servers that drop
  ``allowMultipleAllocations`` (DRAConsumableCapacity off, the default before 1.36).

All of them map to the resource's one CDI device. The publisher reads back what the API
server stored: once it has dropped the field, only the slots are published from then on
(logged, ``ate_devplugin_dra_sharing``). A resource whose device nodes are missing
publishes no devices.

The kubelet deletes every slice of its node when it starts, and after 30 s without a
connected driver: the publisher watches its slices and writes them again whenever what
the API server holds differs from what it should hold.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.tasks import Guard, cancel

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128  # the API server's limit for plain devices
RESOURCE_ATTRIBUTE = "resource"  # the resource name, e.g. ate.dev/kvm; DeviceClass selectors match it
SHARES = "shares"  # the shareable device's consumable capacity: one share per claim by default
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


class SliceApi(Protocol):
    """The API server calls the publisher makes; objects are plain JSON dicts."""

    async def node_uid(self, node: str) -> str: ...
    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """The slices and the list's resourceVersion."""
        ...

    def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(ADDED | MODIFIED | DELETED, slice) until the server ends the watch."""
        ...

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None:
        """Deletes; a slice already gone is no error."""
        ...


@dataclass(frozen=True)
class SliceDevice:
    """One published device: a slot (``shares`` 0, one claim) or the resource's shareable
    device (``shares`` > 0: that many shares, one per claim unless a claim asks for more)."""

    name: str
    resource: str
    shares: int = 0

    def to_json(self) -> dict[str, Any]:
        device: dict[str, Any] = {"name": self.name, "attributes": {RESOURCE_ATTRIBUTE: {"string": self.resource}}}
        if self.shares:
            units = str(self.shares)
            device["allowMultipleAllocations"] = True
            policy = {"default": "1", "validRange": {"min": "1", "max": units, "step": "1"}}
            device["capacity"] = {SHARES: {"value": units, "requestPolicy": policy}}
        return device


def _label(resource: str) -> str:
    return _NOT_LABEL.sub("-", resource.lower()).strip("-")[:50].rstrip("-")


def device_name(resource: str, slot: int) -> str:
    """A DNS label for one slot of a resource: ``ate.dev/kvm`` slot 3 is ``ate-dev-kvm-3``."""
    return f"{_label(resource)}-{slot}"


def shared_device_name(resource: str) -> str:
    """The shareable device of a resource: ``ate.dev/kvm`` is ``ate-dev-kvm``."""
    return _label(resource)


def resource_devices(resource: str, units: int, slots: int, shared: bool) -> list[SliceDevice]:
    """What one resource publishes: its shareable device first (the scheduler tries devices
    in slice order, so single-device claims share it), then its slots."""
    first = [SliceDevice(shared_device_name(resource), resource, units)] if shared else []
    return first + [SliceDevice(device_name(resource, i), resource) for i in range(slots)]


def sharing_dropped(wanted: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]) -> bool:
    """Whether the API server stored a device we wrote as shareable without the flag (it
    drops allowMultipleAllocations while DRAConsumableCapacity is off)."""
    kept = {d.get("name"): bool(d.get("allowMultipleAllocations")) for d in stored}
    return any(d.get("allowMultipleAllocations") and kept.get(d["name"]) is False for d in wanted)


def chunks(devices: Sequence[SliceDevice]) -> list[list[dict[str, Any]]]:
    """The devices, in order, split into slices; an empty pool is still one (empty) slice."""
    items = [d.to_json() for d in devices]
    return [items[i : i + MAX_DEVICES_PER_SLICE] for i in range(0, len(items), MAX_DEVICES_PER_SLICE)] or [[]]


def _content(item: dict[str, Any]) -> list[dict[str, Any]]:
    """What of a slice we compare with what we want: its devices as stored."""
    devices: list[dict[str, Any]] = item.get("spec", {}).get("devices") or []
    return devices


class SlicePublisher:
    def __init__(
        self,
        api: SliceApi,
        driver: str,
        node: str,
        metrics: DraMetrics,
        retry_s: float = 1.0,
        retry_cap_s: float = 30.0,
        sharing: bool = True,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.metrics = metrics
        self.retry_s = retry_s
        self.retry_cap_s = retry_cap_s
        # Whether shareable devices are published: False from the start with slots only,
        # and from the moment the API server is seen dropping allowMultipleAllocations.
        self.sharing = sharing
        self.wanted: tuple[SliceDevice, ...] = ()  # what the driver asked for
        self.devices: tuple[SliceDevice, ...] = ()  # what is published of it
        self.generation = 0
        self.observed: dict[str, dict[str, Any]] = {}  # slice name -> slice, as the API server holds it
        self.synced = asyncio.Event()  # set while the API server holds what it should
        self._dirty = asyncio.Event()
        self._node_uid: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._set_sharing_metric()

    def publish(self, devices: Sequence[SliceDevice]) -> None:
        """The devices to publish from now on; shareable ones only while sharing is on."""
        self.wanted = tuple(devices)
        published = tuple(d for d in self.wanted if self.sharing or not d.shares)
        if published == self.devices:
            return
        for resource in {d.resource for d in (*self.devices, *published)}:
            self.metrics.slice_devices.labels(resource).set(sum(1 for d in published if d.resource == resource))
        self.devices = published
        self._changed()

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
        items, _ = await self.api.list_slices(self.driver, self.node)
        for item in items:
            await self._delete(item["metadata"]["name"])
        log.info("resource slices deleted", extra={"count": len(items)})

    # --- loops ----------------------------------------------------------------------

    def _changed(self) -> None:
        self.synced.clear()
        self.metrics.slices_in_sync.set(0)
        self._dirty.set()

    async def _watch_loop(self) -> None:
        delay = self.retry_s
        while True:
            try:
                items, version = await self.api.list_slices(self.driver, self.node)
                self.observed = {item["metadata"]["name"]: item for item in items}
                self._changed()
                async for kind, item in self.api.watch_slices(self.driver, self.node, version):
                    name = item["metadata"]["name"]
                    if kind == "DELETED":
                        self.observed.pop(name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self.observed[name] = item
                    else:
                        continue
                    delay = self.retry_s
                    if not self._matches():
                        self._changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watching resource slices failed, again in %.0fs: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(self.retry_cap_s, delay * 2)

    async def _sync_loop(self) -> None:
        delay = self.retry_s
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("writing resource slices failed, again in %.0fs: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(self.retry_cap_s, delay * 2)
                self._dirty.set()
                continue
            delay = self.retry_s

    # --- one pass -------------------------------------------------------------------

    def _matches(self) -> bool:
        wanted = chunks(self.devices)
        have = sorted(self.observed.values(), key=lambda s: s["metadata"]["name"])
        if len(have) != len(wanted):
            return False
        return all(
            _content(item) == devices
            and item["spec"]["pool"]
            == {"name": self.node, "generation": self.generation, "resourceSliceCount": len(wanted)}
            for item, devices in zip(have, wanted, strict=True)
        )

    async def _sync(self) -> None:
        if self._matches():
            self.synced.set()
            self.metrics.slices_in_sync.set(1)
            return
        wanted = chunks(self.devices)
        have = sorted(self.observed.values(), key=lambda s: s["metadata"]["name"])
        generations = [item["spec"]["pool"].get("generation", 0) for item in have]
        self.generation = max([self.generation, *generations]) + 1
        for item in have[len(wanted) :]:
            await self._delete(item["metadata"]["name"])
        for i, devices in enumerate(wanted):
            spec = self._spec(devices, len(wanted))
            written: dict[str, Any]
            if i < len(have):
                written = await self._write("update", self.api.replace_slice({**have[i], "spec": spec}))
            else:
                written = await self._write("create", self.api.create_slice(await self._new(spec)))
            self.observed[written["metadata"]["name"]] = written
            if self.sharing and sharing_dropped(devices, _content(written)):
                self._sharing_dropped()  # the next pass publishes the slots alone
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

    async def _new(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self._node_uid is None:
            self._node_uid = await self.api.node_uid(self.node)
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._node_uid, "controller": True}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            # The kubelet and garbage collector clean up after a node that is gone for good.
            "metadata": {"generateName": f"{self.node}-{self.driver}-", "ownerReferences": [owner]},
            "spec": spec,
        }

    async def _write(self, op: str, call: Awaitable[Any]) -> Any:
        try:
            result = await call
        except Exception:
            self.metrics.slice_writes.labels(op, "failure").inc()
            raise
        self.metrics.slice_writes.labels(op, "success").inc()
        return result

    async def _delete(self, name: str) -> None:
        await self._write("delete", self.api.delete_slice(name))
        self.observed.pop(name, None)
