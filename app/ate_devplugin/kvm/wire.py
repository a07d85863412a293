"""The prober's protocol (``--kvm-probe socket``), defined once for both of its ends: the
daemon (kvmhealth/link.py) and the prober (kvm/prober.py) read every line through
:func:`decode`, so what one side refuses the other does too (docs/kvm-health.md, "The socket
protocol").

Newline-delimited JSON objects of at most ``MAX_LINE`` bytes, each with ``"v": VERSION`` and
one key naming its kind:

=======  ==================  =========================================================
kind     from                body
=======  ==================  =========================================================
hello    prober, first       ``{"pod": str, "devices": {resource: absolute path}}``
probe    daemon              ``{"resource": str, "timeout_s": seconds > 0}``
report   prober              ``{"resource": str, "result": ProbeResult.to_json()}``
restart  daemon              ``true``: the prober's device is stale, it exits to be restarted
=======  ==================  =========================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ate_devplugin.kvm.probe import ProbeResult

VERSION = 1
MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class Hello:
    pod: str  # namespace/name, for the daemon's log
    devices: Mapping[str, str]  # resource -> the device's path in the prober's container


@dataclass(frozen=True)
class ProbeRequest:
    resource: str
    timeout_s: float


@dataclass(frozen=True)
class Report:
    resource: str
    result: ProbeResult


@dataclass(frozen=True)
class Restart:
    pass


Message = Hello | ProbeRequest | Report | Restart


class WireError(ValueError):
    """A line that is not a message of this protocol. ``resource`` names the resource of a
    report whose result could not be read (its asker is owed an answer)."""

    def __init__(self, why: str, resource: str | None = None) -> None:
        super().__init__(why)
        self.resource = resource


def encode(message: Message) -> bytes:
    body: dict[str, Any]
    match message:
        case Hello(pod, devices):
            body = {"hello": {"pod": pod, "devices": dict(devices)}}
        case ProbeRequest(resource, timeout_s):
            body = {"probe": {"resource": resource, "timeout_s": timeout_s}}
        case Report(resource, result):
            body = {"report": {"resource": resource, "result": result.to_json()}}
        case Restart():
            body = {"restart": True}
    line = json.dumps({"v": VERSION, **body}, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise WireError(f"a message of {len(line)} bytes: the protocol's lines are at most {MAX_LINE}")
    return line


def decode(line: bytes) -> Message:
    """The message on ``line``; raises WireError saying what is wrong with it."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError("not a JSON object")
    if data.get("v") != VERSION:
        raise WireError(f"version {data.get('v')!r}, not {VERSION}")
    kinds = [k for k in ("hello", "probe", "report", "restart") if k in data]
    if len(kinds) != 1:
        raise WireError(f"{len(kinds)} kinds of message in one line, not one")
    body = data[kinds[0]]
    if kinds[0] == "restart":
        if body is not True:
            raise WireError("restart is not true")
        return Restart()
    if not isinstance(body, dict):
        raise WireError(f"{kinds[0]} is not an object")
    if kinds[0] == "hello":
        return Hello(_text(body, "pod", may_be_empty=True), _devices(body.get("devices")))
    resource = _text(body, "resource")
    if kinds[0] == "probe":
        timeout = body.get("timeout_s")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise WireError(f"probe timeout_s {timeout!r} is not a number of seconds above 0")
        return ProbeRequest(resource, float(timeout))
    try:
        return Report(resource, ProbeResult.from_json(body["result"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireError(f"the report on {resource} is not a probe result: {exc!r}", resource) from None


def _text(body: Mapping[str, Any], key: str, may_be_empty: bool = False) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not (value or may_be_empty):
        raise WireError(f"{key} {value!r} is not a {'' if may_be_empty else 'non-empty '}string")
    return value


def _devices(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(r, str) and r and isinstance(p, str) and p.startswith("/") for r, p in value.items()
    ):
        raise WireError("hello devices is not an object of resource names and absolute paths")
    return dict(value)
