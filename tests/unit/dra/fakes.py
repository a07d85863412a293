"""An in-memory API server for the DRA driver's unit tests (claims, nodes, slices with watch)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ate_devplugin.dra.service import ClaimNotFoundError

MAX_INT64 = 2**63 - 1


class FakeApi:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.fail_writes = 0  # the next N writes fail
        self.consumable_capacity = True  # False: drops what DRAConsumableCapacity adds, as 1.35 does
        self.device_taints = True  # False: drops devices' taints, as 1.35 does (DRADeviceTaints off)
        self.claim_error: Exception | None = None
        self.writes: list[str] = []
        self.lists = 0
        self.claim_reads = 0
        self.calls_cancelled = 0
        self.watches = 0
        self.watch_ends = False  # every watch ends at once, without an event
        self.page = 100
        self.list_gate: asyncio.Event | None = None  # lists are answered once it is set
        self.hang = False  # every call waits for ever, as an API server that accepts and never answers
        self.closed = False
        self._versions = itertools.count(1)
        self._names = itertools.count()
        self._watchers: list[asyncio.Queue[tuple[str, dict[str, Any]] | BaseException | None]] = []
        self._history: list[tuple[str, dict[str, Any]]] = []  # every event, for a watch from a resourceVersion
        self.watched_from: list[str] = []  # the resourceVersion each watch asked for

    # --- claims and nodes ---

    def add_claim(self, namespace: str, name: str, uid: str, results: list[dict[str, Any]] | None) -> None:
        status = {} if results is None else {"allocation": {"devices": {"results": results}}}
        self.claims[namespace, name] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": status,
        }

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.claim_reads += 1
        await self._maybe_hang()
        if self.claim_error is not None:
            raise self.claim_error
        try:
            return self.claims[namespace, name]
        except KeyError:
            raise ClaimNotFoundError(f"{namespace}/{name}") from None

    async def node_uid(self, node: str) -> str:
        return f"uid-of-{node}"

    async def _maybe_hang(self) -> None:
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.calls_cancelled += 1
                raise

    async def close(self) -> None:
        self.closed = True

    # --- slices ---

    async def list_slices(self, driver: str, node: str) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """Pages of ``page`` slices, as the API server answers a list with a limit."""
        self.lists += 1
        await self._maybe_hang()
        version = str(next(self._versions))
        items = [copy.deepcopy(s) for s in self.slices.values()]  # the snapshot is taken when asked ...
        if self.list_gate is not None:
            await self.list_gate.wait()  # ... the answer arrives when the gate opens
        for i in range(0, max(1, len(items)), self.page):
            yield items[i : i + self.page], version

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The events after ``resource_version``, then every new one, as the API server sends them."""
        self.watches += 1
        self.watched_from.append(resource_version)
        if self.watch_ends:
            return
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | BaseException | None] = asyncio.Queue()
        for kind, item in self._history:
            if int(item["metadata"]["resourceVersion"]) > int(resource_version):
                queue.put_nowait((kind, copy.deepcopy(item)))
        self._watchers.append(queue)
        try:
            while (event := await queue.get()) is not None:
                if isinstance(event, BaseException):
                    raise event
                yield event
        finally:
            self._watchers.remove(queue)

    def end_watches(self, error: BaseException | None = None) -> None:
        """The server ends every watch (its timeout), or fails it with ``error`` (410 Gone, a restart)."""
        for queue in self._watchers:
            queue.put_nowait(error)

    def _notify(self, kind: str, item: dict[str, Any]) -> None:
        event = (kind, copy.deepcopy(item))
        self._history.append(event)
        for queue in self._watchers:
            queue.put_nowait((kind, copy.deepcopy(item)))

    def _write(self, op: str, body: dict[str, Any] | None = None) -> None:
        self.writes.append(op)
        if self.fail_writes:
            self.fail_writes -= 1
            raise RuntimeError(f"{op} refused")
        if body is not None and not 0 <= body["spec"]["pool"]["generation"] <= MAX_INT64:
            raise RuntimeError("spec.pool.generation: Invalid value")  # as the API server validates it

    def add_slice(self, name: str, pool: str, generation: int, devices: Sequence[str] = ()) -> None:
        """A slice of the driver on the node that another client wrote."""
        item = {
            "metadata": {"name": name, "resourceVersion": str(next(self._versions))},
            "spec": {"pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": d} for d in devices]},
        }  # fmt: skip
        self.slices[name] = item
        self._notify("ADDED", item)

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        item = copy.deepcopy(body)
        if not self.consumable_capacity:
            for device in item["spec"].get("devices") or []:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
        if not self.device_taints:
            for device in item["spec"].get("devices") or []:
                device.pop("taints", None)
        return item

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._write("create", body)
        item = self._stored(body)
        name = item["metadata"].pop("generateName") + str(next(self._names))
        item["metadata"].update(name=name, resourceVersion=str(next(self._versions)))
        self.slices[name] = item
        self._notify("ADDED", item)
        return copy.deepcopy(item)

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._write("update", body)
        name = body["metadata"]["name"]
        if self.slices[name]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise RuntimeError("conflict")
        item = self._stored(body)
        item["metadata"]["resourceVersion"] = str(next(self._versions))
        self.slices[name] = item
        self._notify("MODIFIED", item)
        return copy.deepcopy(item)

    async def delete_slice(self, name: str) -> None:
        await self._maybe_hang()
        self._write("delete")
        item = self.slices.pop(name, None)
        if item is not None:
            self._deleted(item)

    def wipe(self) -> None:
        """What the kubelet does at start: every slice of the node goes."""
        for name in list(self.slices):
            self._deleted(self.slices.pop(name))

    def _deleted(self, item: dict[str, Any]) -> None:
        item["metadata"]["resourceVersion"] = str(next(self._versions))  # the deletion's, as the server sends it
        self._notify("DELETED", item)

    def devices(self) -> list[str]:
        return sorted(d["name"] for s in self.slices.values() for d in s["spec"]["devices"])

    def devices_json(self) -> list[dict[str, Any]]:
        """Every stored device, in slice order."""
        return [d for s in self.slices.values() for d in s["spec"]["devices"]]


def cdi_id(resource: str) -> str:
    return f"{resource}={resource.rpartition('/')[2]}"
