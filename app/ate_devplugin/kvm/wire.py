"""The probe's protocol, defined once for both of its channels and all four ends: the
prober's socket (``--kvm-probe socket``: the daemon, kvmhealth/link.py, and the prober,
kvm/prober.py) and the probe's pipe (kvm/runner.py and its child, kvm/worker.py). Every end
reads every line through :func:`decode`, so what one side refuses the other does too
(docs/kvm-health.md, "The socket protocol").

Newline-delimited JSON objects of at most ``MAX_LINE`` bytes, each with ``"v": VERSION`` and
one key naming its kind:

=======  ==================  =========================================================
kind     from                body
=======  ==================  =========================================================
hello    prober, first       ``{"pod": str, "devices": {resource: absolute path}, "ids": true}``
probe    daemon              ``{"resource": str, "timeout_s": seconds > 0, "id": int}``
report   prober              ``{"resource": str, "id": int, "result": ProbeResult.to_json()}``
wait     daemon              ``{"reason": str}``: another prober is heard; this one waits its turn
restart  daemon              ``true``: the prober's device is stale, it exits to be restarted
check    runner (pipe)       ``{"device": path, "deadline_s": seconds > 0}``: probe it now
checked  worker (pipe)       ``{"result": ProbeResult.to_json()}``: the answer to the check
=======  ==================  =========================================================

The pipe's two kinds never cross the socket (an end refuses a kind it is not sent): its
ends are one install's parent and child, so they need no ids and no older version.

Unknown keys are ignored, so a field can be added within a version: ``id`` and ``ids`` came
after 0.1.0, whose prober echoes no id (its reports are matched by resource, as then) and
whose daemon sends none. A result's ``detail`` (its text without the path, which is
``device``) came later still: a prober before it sends ``message`` alone (its path is cut
off here, the one place), and a daemon before it reads ``message``, which is still sent.

Every value is checked here, type, range and size, before either end believes it: a
report's device facts reach the CPU profile code (cpu/), which takes CPUID registers for
32-bit values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from ate_devplugin.cpu.features import Register
from ate_devplugin.kvm.facts import DeviceFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

VERSION = 1
MAX_LINE = 64 * 1024
KINDS = ("hello", "probe", "report", "wait", "restart", "check", "checked")
# Bounds of what a probe writes, with room: a line within MAX_LINE can still carry lists a
# consumer would iterate for long, or numbers of any size.
MAX_NAME = 253  # a resource name (a Kubernetes qualified name), a capability or feature name
MAX_PATH = 4096
MAX_TEXT = 4096  # a message, an exit's description
MAX_ITEMS = 64  # devices, exits, capabilities
MAX_REGISTERS = 1024  # CPUID registers (the covered ones are ~40; a profile may keep more)
MAX_FEATURES = 2048
MAX_ID = 2**63 - 1
MAX_TIMEOUT_S = 24 * 3600.0
U32 = 2**32 - 1
_RDEV = re.compile(r"[0-9]{1,10}:[0-9]{1,10}")
_DIGEST = re.compile(r"[0-9a-f]{0,128}")
_REASONS = frozenset(str(r) for r in Reason)


@dataclass(frozen=True)
class Hello:
    pod: str  # namespace/name, for the daemon's log
    devices: Mapping[str, str]  # resource -> the device's path in the prober's container
    ids: bool = False  # echoes each request's id in its report (after 0.1.0)


@dataclass(frozen=True)
class ProbeRequest:
    resource: str
    timeout_s: float
    request: int | None = None  # its id; None only from a daemon of 0.1.0


@dataclass(frozen=True)
class Report:
    resource: str
    result: ProbeResult
    request: int | None = None  # the request's id; None from a prober of 0.1.0


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Restart:
    pass


@dataclass(frozen=True)
class Check:
    device: str  # the path to probe, as the worker sees it
    deadline_s: float  # the worker's own bound on the probe (probe.check's SIGALRM)


@dataclass(frozen=True)
class Checked:
    result: ProbeResult  # its device is "" when the worker could not read the check


Message = Hello | ProbeRequest | Report | Wait | Restart | Check | Checked


class WireError(ValueError):
    """A line that is not a message of this protocol; ``field`` names where (bounded: a
    log or a metric may key on it), ``resource`` and ``request`` the request a report answered
    where they could be read."""

    def __init__(self, why: str, field: str = "", resource: str | None = None, request: int | None = None) -> None:
        super().__init__(f"{field}: {why}" if field else why)
        self.why, self.field, self.resource, self.request = why, field, resource, request


class VersionError(WireError):
    """A message of another version of the protocol."""

    def __init__(self, version: int) -> None:
        super().__init__(f"protocol version {version}; this end speaks {VERSION}", "v")
        self.version = version


def encode(message: Message) -> bytes:
    body: dict[str, Any]
    match message:
        case Hello(pod, devices, ids):
            body = {"hello": {"pod": pod, "devices": dict(devices), **({"ids": True} if ids else {})}}
        case ProbeRequest(resource, timeout_s, request):
            body = {"probe": {"resource": resource, "timeout_s": timeout_s, **_id(request)}}
        case Report(resource, result, request):
            body = {"report": {"resource": resource, **_id(request), "result": result.to_json()}}
        case Wait(reason):
            body = {"wait": {"reason": reason}}
        case Restart():
            body = {"restart": True}
        case Check(device, deadline_s):
            body = {"check": {"device": device, "deadline_s": deadline_s}}
        case Checked(result):
            body = {"checked": {"result": result.to_json()}}
    line = json.dumps({"v": VERSION, **body}, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise WireError(f"a message of {len(line)} bytes: the protocol's lines are at most {MAX_LINE}")
    return line


def decode(line: bytes) -> Message:
    """The message on ``line``; raises WireError saying what is wrong with it (VersionError
    for a message of another version)."""
    if len(line) > MAX_LINE:
        raise WireError(f"{len(line)} bytes: the protocol's lines are at most {MAX_LINE}")
    try:
        data = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError("not a JSON object")
    version = data.get("v")
    if not _is_int(version):
        raise WireError(f"{version!r} is not a version number", "v")
    if version != VERSION:
        raise VersionError(version)
    kinds = [k for k in KINDS if k in data]
    if len(kinds) != 1:
        raise WireError(f"{len(kinds)} kinds of message in one line, not one")
    kind, body = kinds[0], data[kinds[0]]
    if kind == "restart":
        if body is not True:
            raise WireError("not true", "restart")
        return Restart()
    if not isinstance(body, dict):
        raise WireError("not an object", kind)
    if kind == "hello":
        ids = body.get("ids", False)
        if not isinstance(ids, bool):
            raise WireError("not true or false", "hello.ids")
        return Hello(_text(body, "pod", "hello", MAX_NAME + 64, may_be_empty=True), _devices(body.get("devices")), ids)
    if kind == "wait":
        return Wait(_text(body, "reason", "wait", MAX_TEXT, may_be_empty=True))
    if kind == "check":
        return Check(_text(body, "device", "check", MAX_PATH), _seconds(body, "deadline_s", kind))
    if kind == "checked":
        try:
            return Checked(_result(body.get("result"), unknown_device=True))
        except WireError as exc:
            raise WireError(exc.why, f"checked.{exc.field}") from None
    resource = _text(body, "resource", kind, MAX_NAME)
    request = body.get("id")
    if request is not None and not (_is_int(request) and 0 <= request <= MAX_ID):
        raise WireError(f"{_show(request)} is not a request id (0..2**63-1)", f"{kind}.id", resource)
    if kind == "probe":
        return ProbeRequest(resource, _seconds(body, "timeout_s", kind), request)
    try:
        return Report(resource, _result(body.get("result")), request)
    except WireError as exc:
        raise WireError(exc.why, f"report.{exc.field}", resource, request) from None


# --- a probe's result, field by field ----------------------------------------------------


def _result(data: object, unknown_device: bool = False) -> ProbeResult:
    """``unknown_device``: the device may be "" (a worker's answer to a check it could not read)."""
    if not isinstance(data, dict):
        raise WireError("not an object", "result")
    reason = data.get("reason")
    if not isinstance(reason, str) or reason not in _REASONS:
        raise WireError(f"{_show(reason)} is not a probe's reason", "result.reason")
    passed = data.get("passed", reason == Reason.PASSED)
    if passed is not (reason == Reason.PASSED):
        raise WireError(f"{_show(passed)} contradicts the reason {reason}", "result.passed")
    duration = data.get("duration_s")
    if not (_is_number(duration) and 0 <= duration <= MAX_TIMEOUT_S):
        raise WireError(f"{_show(duration)} is not a duration in seconds", "result.duration_s")
    rdev = data.get("rdev") or ""
    if not isinstance(rdev, str) or (rdev and not _RDEV.fullmatch(rdev)):
        raise WireError(f"{_show(rdev)} is not major:minor", "result.rdev")
    exits = data.get("exits") or []
    if not _list_of_text(exits, MAX_ITEMS, MAX_TEXT):
        raise WireError(f"not a list of at most {MAX_ITEMS} texts", "result.exits")
    ran = data.get("ran_guest", False)
    if not isinstance(ran, bool):
        raise WireError("not true or false", "result.ran_guest")
    facts = data.get("device_facts")
    device = _text(data, "device", "result", MAX_PATH, may_be_empty=unknown_device)
    message = _text(data, "message", "result", MAX_TEXT, may_be_empty=True)
    return ProbeResult(
        device=device,
        reason=Reason(reason),
        detail=_detail(data, device, message),
        duration_s=float(duration),
        rdev=rdev,
        api_version=_count(data, "api_version", "result", 2**31 - 1, optional=True),
        exits=tuple(exits),
        ran_guest=ran,
        device_facts=None if facts is None else _facts(facts),
    )


def _detail(data: Mapping[str, Any], device: str, message: str) -> str:
    """The text without the path: ``detail``, or from a prober before it, its message, which
    began with its path (the one place a path is cut from a text, for those probers only)."""
    if "detail" in data:
        return _text(data, "detail", "result", MAX_TEXT, may_be_empty=True)
    return message.removeprefix(f"{device}: ") if device else message


def _facts(data: object) -> DeviceFacts:
    where = "result.device_facts"
    if not isinstance(data, dict):
        raise WireError("not an object", where)
    capabilities = data.get("capabilities") or {}
    if not (
        isinstance(capabilities, dict)
        and len(capabilities) <= MAX_ITEMS
        and all(_short(k, MAX_NAME) and _is_int(v) and -(2**31) <= v < 2**31 for k, v in capabilities.items())
    ):
        raise WireError(f"not an object of at most {MAX_ITEMS} names and 32-bit ints", f"{where}.capabilities")
    digest = data.get("cpuid_digest") or ""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise WireError(f"{_show(digest)} is not a hex digest", f"{where}.cpuid_digest")
    features = data.get("cpu_features") or []
    if not _list_of_text(features, MAX_FEATURES, MAX_NAME):
        raise WireError(f"not a list of at most {MAX_FEATURES} names", f"{where}.cpu_features")
    return DeviceFacts(
        api_version=_count(data, "api_version", where, 2**31 - 1),
        capabilities=dict(capabilities),
        cpuid_digest=digest,
        cpu_features=tuple(features),
        cpuid_registers=_registers(data.get("cpuid_registers") or {}, f"{where}.cpuid_registers"),
        tsc_khz=_count(data, "tsc_khz", where, U32, optional=True, least=1),
    )


def _registers(data: object, where: str) -> dict[Register, int]:
    if not isinstance(data, dict) or len(data) > MAX_REGISTERS:
        raise WireError(f"not an object of at most {MAX_REGISTERS} registers", where)
    out = {}
    for key, value in data.items():
        try:
            register = Register.parse(key)
        except ValueError:
            raise WireError(f"{_show(key)} is not a CPUID register", where) from None
        if not (_is_int(value) and 0 <= value <= U32):
            raise WireError(f"{register.key()} is {_show(value)}, not a 32-bit value", where)
        out[register] = value
    return out


# --- values ------------------------------------------------------------------------------


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return (_is_int(value) and abs(value) <= 2**53) or (isinstance(value, float) and math.isfinite(value))


def _short(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _list_of_text(value: object, items: int, chars: int) -> bool:
    return isinstance(value, list) and len(value) <= items and all(_short(v, chars) for v in value)


def _show(value: object) -> str:
    """A value for a message: short whatever was sent."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _id(request: int | None) -> dict[str, int]:
    return {} if request is None else {"id": request}


def _text(body: Mapping[str, Any], key: str, kind: str, limit: int, may_be_empty: bool = False) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not (value or may_be_empty) or len(value) > limit:
        empty = "" if may_be_empty else "non-empty "
        raise WireError(f"{_show(value)} is not a {empty}string of at most {limit} characters", f"{kind}.{key}")
    return value


def _seconds(body: Mapping[str, Any], key: str, kind: str) -> float:
    value = body.get(key)
    if not (_is_number(value) and 0 < value <= MAX_TIMEOUT_S):
        raise WireError(f"{_show(value)} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}]", f"{kind}.{key}")
    return float(value)


def _count(body: Mapping[str, Any], key: str, where: str, most: int, optional: bool = False, least: int = 0) -> Any:
    value = body.get(key)
    if value is None and optional:
        return None
    if not (_is_int(value) and least <= value <= most):
        raise WireError(f"{_show(value)} is not a whole number in {least}..{most}", f"{where}.{key}")
    return value


def _devices(value: object) -> dict[str, str]:
    if not (
        isinstance(value, dict)
        and len(value) <= MAX_ITEMS
        and all(_short(r, MAX_NAME) and _short(p, MAX_PATH) and p.startswith("/") for r, p in value.items())
    ):
        raise WireError(f"not an object of at most {MAX_ITEMS} resource names and absolute paths", "hello.devices")
    return dict(value)
