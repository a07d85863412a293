"""Reading a List answer: which containers hold units of our resources, in bounded memory.

The answer is untrusted input. Its wire format is walked for the few fields that matter,
without building the message (a 4 MiB answer of empty entries would take over 100 MiB as
protobuf objects), and at most MAX_HELD containers are kept. Label values are cut to the
Kubernetes name limits.

A container holds units of a resource two ways: the device plugin's (``devices``: one unit
per device ID of the resource's name) and a DRA claim's (``dynamic_resources``: one unit
per device of a claim that our driver prepared, mapped to its resource by the device's
name). The kubelet lists each claim resource's CDI devices after those of the claim's
devices before it, so the device name, not the CDI name, says which resource it is.

Every List answers every pod of the node, and between two Lists few of them changed: a
:class:`Reader` remembers what each pod's entry of the last answer held, by its bytes, and
walks only the entries it has not seen (within a bound of memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ate_devplugin.api.podresources.v1 import api_pb2 as pb

# Containers holding units kept per List (the rest only counted as dropped): a bound on
# memory whatever the answer says.
MAX_HELD = 4096
# The Kubernetes limits of these names (DNS label, DNS subdomain, DNS label): a longer
# value is cut to the limit, and counted.
MAX_NAMESPACE_CHARS = 63
MAX_POD_CHARS = 253
MAX_CONTAINER_CHARS = 63

# Pod entries of the last answer remembered by a Reader, and their bytes, at most: the
# entries of a node's few hundred pods, whatever an answer holds.
REMEMBERED = MAX_HELD
REMEMBERED_BYTES = 1024 * 1024

# (resource name, namespace, pod, container)
Key = tuple[str, str, str, str]
# What one container of a pod holds: (namespace, pod, container, ((resource, units), ...))
Row = tuple[str, str, str, tuple[tuple[str, int], ...]]


class DecodeError(Exception):
    """The answer is not a ListPodResourcesResponse."""


@dataclass(frozen=True)
class Wanted:
    """What of an answer is ours: the device plugin's resources by name, and the devices
    our DRA driver (``driver``, "" for none) publishes, by name, with their resource."""

    resources: frozenset[str]
    driver: str = ""
    devices: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Holdings:
    """What one answer says: units held per container, and what was left out or cut."""

    held: dict[Key, int] = field(default_factory=dict)
    dropped: int = 0  # containers holding units over MAX_HELD
    truncated: int = 0  # containers whose label values were cut


def _number(message: Any, name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


_POD = _number(pb.ListPodResourcesResponse, "pod_resources")
_POD_NAME, _POD_NAMESPACE, _CONTAINERS = (_number(pb.PodResources, n) for n in ("name", "namespace", "containers"))
_CONTAINER_NAME, _DEVICES, _CLAIMS = (
    _number(pb.ContainerResources, n) for n in ("name", "devices", "dynamic_resources")
)
_RESOURCE, _DEVICE_IDS = (_number(pb.ContainerDevices, n) for n in ("resource_name", "device_ids"))
_CLAIM_RESOURCES = _number(pb.DynamicResource, "claim_resources")
_DRIVER, _DEVICE_NAME = (_number(pb.ClaimResource, n) for n in ("driver_name", "device_name"))


def read_holdings(data: bytes, wanted: Wanted) -> Holdings:
    """Units of the wanted resources held, per container (pods holding none are left
    out), from an encoded answer; memory bounded by MAX_HELD. Raises DecodeError."""
    return Reader().read(data, wanted)


class Reader:
    """Reads answer after answer, each pod entry the last answer had (byte for byte) not
    walked again. One answer at a time (the watch's worker thread reads them in turn)."""

    def __init__(self) -> None:
        self._wanted: Wanted | None = None
        self._rows: dict[bytes, tuple[Row, ...]] = {}  # a pod entry of the last answer -> what it holds

    def read(self, data: bytes, wanted: Wanted) -> Holdings:
        """As :func:`read_holdings`."""
        if wanted != self._wanted:
            self._wanted, self._rows = wanted, {}
        resources = {r.encode(): r for r in wanted.resources}
        driver = wanted.driver.encode()
        devices = {d.encode(): r for d, r in wanted.devices.items()} if driver else {}
        last, rows, remembered = self._rows, dict[bytes, tuple[Row, ...]](), 0
        found = Holdings()
        for _, start, end in _fields(data, 0, len(data), _POD):
            entry = data[start:end]
            pod_rows = last.get(entry)
            if pod_rows is None:
                pod_rows = _pod_rows(data, start, end, resources, driver, devices)
            if len(rows) < REMEMBERED and remembered + len(entry) <= REMEMBERED_BYTES and entry not in rows:
                rows[entry] = pod_rows
                remembered += len(entry)
            for namespace, name, container, units in pod_rows:
                _add(found, namespace, name, container, units)
        self._rows = rows  # only once the whole answer was read: an undecodable one changes nothing
        return found


def _pod_rows(
    data: bytes,
    pod_start: int,
    pod_end: int,
    resources: Mapping[bytes, str],
    driver: bytes,
    devices: Mapping[bytes, str],
) -> tuple[Row, ...]:
    """What the containers of one pod entry hold (those holding none left out)."""
    name = namespace = b""
    containers = []
    for number, start, end in _fields(data, pod_start, pod_end, _POD_NAME, _POD_NAMESPACE, _CONTAINERS):
        if number == _CONTAINERS:
            containers.append((start, end))
        elif number == _POD_NAME:
            name = data[start:end]
        else:
            namespace = data[start:end]
    rows = []
    for c_start, c_end in containers:
        container, units = b"", dict[str, int]()
        for number, start, end in _fields(data, c_start, c_end, _CONTAINER_NAME, _DEVICES, _CLAIMS):
            if number == _CONTAINER_NAME:
                container = data[start:end]
            elif number == _DEVICES:
                _count(units, *_plugin_units(data, start, end, resources))
            elif devices:
                for resource in _claim_units(data, start, end, driver, devices):
                    _count(units, resource, 1)
        if units:
            rows.append((_text(namespace), _text(name), _text(container), tuple(units.items())))
    return tuple(rows)


def _plugin_units(data: bytes, start: int, end: int, resources: Mapping[bytes, str]) -> tuple[str, int]:
    """The resource of one ContainerDevices entry ("" when not ours) and its device IDs."""
    resource, count = b"", 0
    for number, d_start, d_end in _fields(data, start, end, _RESOURCE, _DEVICE_IDS):
        if number == _RESOURCE:
            resource = data[d_start:d_end]
        else:
            count += 1
    return resources.get(resource, ""), count


def _claim_units(data: bytes, start: int, end: int, driver: bytes, devices: Mapping[bytes, str]) -> Iterator[str]:
    """The resource of each device of one claim (DynamicResource) that our driver prepared."""
    for _, r_start, r_end in _fields(data, start, end, _CLAIM_RESOURCES):
        by, device = b"", b""
        for number, f_start, f_end in _fields(data, r_start, r_end, _DRIVER, _DEVICE_NAME):
            if number == _DRIVER:
                by = data[f_start:f_end]
            else:
                device = data[f_start:f_end]
        if by == driver and device in devices:
            yield devices[device]


def _count(units: dict[str, int], resource: str, count: int) -> None:
    if resource and count:
        units[resource] = units.get(resource, 0) + count


def _add(found: Holdings, namespace: str, pod: str, container: str, units: tuple[tuple[str, int], ...]) -> None:
    cut = (namespace[:MAX_NAMESPACE_CHARS], pod[:MAX_POD_CHARS], container[:MAX_CONTAINER_CHARS])
    if cut != (namespace, pod, container):
        found.truncated += 1
    for resource, count in units:
        key = (resource, *cut)
        if key in found.held:
            found.held[key] += count
        elif len(found.held) < MAX_HELD:
            found.held[key] = count
        else:
            found.dropped += 1


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("a name that is not UTF-8") from exc


def _fields(data: bytes, pos: int, end: int, *numbers: int) -> Iterator[tuple[int, int, int]]:
    """(number, start, end) of the length-delimited fields ``numbers`` in ``data[pos:end]``;
    every other field is skipped."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        wire_type = key & 7
        if wire_type == 2:  # length-delimited: strings, bytes, messages, packed numbers
            length, pos = _varint(data, pos, end)
            start, pos = pos, pos + length
            if pos > end:
                raise DecodeError("a field runs past its message")
            if key >> 3 in numbers:
                yield key >> 3, start, pos
        elif wire_type == 0:
            _, pos = _varint(data, pos, end)
        elif wire_type in (1, 5):  # 64 and 32 bits
            pos += 8 if wire_type == 1 else 4
        else:
            raise DecodeError(f"wire type {wire_type}")
    if pos != end:
        raise DecodeError("a field runs past its message")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise DecodeError("a truncated or overlong varint")
