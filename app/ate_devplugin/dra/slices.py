"""This node's ResourceSlices: what to publish, and keeping the API server in step.

One pool per node (named after the node) holds every configured resource's devices.
A KVM device is shared: each resource is published as ``slots`` named devices
(``<resource>-0`` ...), each of which maps to the resource's one CDI device, so up to
``slots`` claims on the node can hold it at once (see docs/dra.md for why slots rather
than multiple allocations). A resource whose device nodes are missing publishes no slots.

The kubelet deletes every slice of its node when it starts, and after 30 s without a
connected driver: the publisher watches its slices and writes them again whenever what
the API server holds differs from what it should hold.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, Protocol

from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.tasks import Guard, cancel

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128  # the API server's limit for plain devices
RESOURCE_ATTRIBUTE = "resource"  # the resource name, e.g. ate.dev/kvm; DeviceClass selectors match it
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


def device_name(resource: str, slot: int) -> str:
    """A DNS label for one slot of a resource: ``ate.dev/kvm`` slot 3 is ``ate-dev-kvm-3``."""
    base = _NOT_LABEL.sub("-", resource.lower()).strip("-")[:50].rstrip("-")
    return f"{base}-{slot}"


def slot_devices(present: Sequence[str], slots: int) -> dict[str, str]:
    """Device name -> resource name, for the resources whose device nodes are all present."""
    return {device_name(resource, i): resource for resource in present for i in range(slots)}


def _devices_json(devices: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        {"name": name, "attributes": {RESOURCE_ATTRIBUTE: {"string": resource}}}
        for name, resource in sorted(devices.items(), key=lambda item: _natural(item[0]))
    ]


def _natural(name: str) -> tuple[str, int]:
    base, _, slot = name.rpartition("-")
    return base, int(slot) if slot.isdigit() else -1


def chunks(devices: Mapping[str, str]) -> list[list[dict[str, Any]]]:
    """The devices split into slices; an empty pool is still one (empty) slice."""
    items = _devices_json(devices)
    return [items[i : i + MAX_DEVICES_PER_SLICE] for i in range(0, len(items), MAX_DEVICES_PER_SLICE)] or [[]]


def _content(item: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What of a slice's devices we compare: names and resource attribute."""
    return [
        (d.get("name", ""), ((d.get("attributes") or {}).get(RESOURCE_ATTRIBUTE) or {}).get("string", ""))
        for d in (item.get("spec", {}).get("devices") or [])
    ]


class SlicePublisher:
    def __init__(
        self,
        api: SliceApi,
        driver: str,
        node: str,
        metrics: DraMetrics,
        retry_s: float = 1.0,
        retry_cap_s: float = 30.0,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.metrics = metrics
        self.retry_s = retry_s
        self.retry_cap_s = retry_cap_s
        self.devices: dict[str, str] = {}
        self.generation = 0
        self.observed: dict[str, dict[str, Any]] = {}  # slice name -> slice, as the API server holds it
        self.synced = asyncio.Event()  # set while the API server holds what it should
        self._dirty = asyncio.Event()
        self._node_uid: str | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def publish(self, devices: Mapping[str, str]) -> None:
        """The devices to publish from now on (device name -> resource)."""
        if dict(devices) == self.devices:
            return
        for resource in {*self.devices.values(), *devices.values()}:
            self.metrics.slice_devices.labels(resource).set(sum(1 for r in devices.values() if r == resource))
        self.devices = dict(devices)
        self._changed()

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
            _content(item) == [(d["name"], d["attributes"][RESOURCE_ATTRIBUTE]["string"]) for d in devices]
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
