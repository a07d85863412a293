"""The resource configuration file: parsing and validation, before anything starts.

Every problem becomes a ConfigError naming the field (e.g. ``resources[1].units``) and
what is wrong with it, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_UNITS = 4096
DEFAULT_PERMISSIONS = "rw"
# The kubelet accepts gRPC messages of at most 4 MiB, and every ListAndWatch update
# carries the full unit list of one resource, so the unit count is bounded by that.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GLOB_CHARS = frozenset("*?[")


class ConfigError(ValueError):
    """A configuration value is wrong; ``str()`` is one line naming field and problem."""

    def __init__(self, field_name: str, problem: str) -> None:
        # Names and values come from the file: escape what would break the one line.
        self.field_name = _printable(field_name)
        self.problem = _printable(problem)
        super().__init__(f"{self.field_name}: {self.problem}")


def _printable(text: str) -> str:
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _key(where: str, key: Any) -> str:
    """The field name of a mapping key; one that is not plain text is quoted."""
    shown = key if isinstance(key, str) and key.isprintable() and key.strip() == key else repr(key)
    return f"{where}.{shown}" if where != "config" else shown


@dataclass(frozen=True)
class MountConfig:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ResourceConfig:
    name: str
    devices: tuple[str, ...]
    units: int = DEFAULT_UNITS
    permissions: str = DEFAULT_PERMISSIONS
    mounts: tuple[MountConfig, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def id_prefix(self) -> str:
        """Unit IDs are ``<prefix>-<n>``, the prefix being the name after the slash."""
        return self.name.rsplit("/", 1)[1]

    @property
    def socket_name(self) -> str:
        return "ate-" + re.sub(r"[/.]", "-", self.name) + ".sock"

    def unit_ids(self) -> Iterator[str]:
        """The unit IDs in order, made on demand: a resource may have many."""
        prefix = self.id_prefix
        return (f"{prefix}-{n}" for n in range(self.units))


DEFAULT_RESOURCES = (ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",)),)


def load_resources(path: Path) -> tuple[ResourceConfig, ...]:
    """Read and validate a config file; raises ConfigError on any problem."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    return decode_resources(data, str(path))


def decode_resources(data: bytes, source: str = "config") -> tuple[ResourceConfig, ...]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "is not UTF-8 text") from exc
    return parse_resources(text)


def parse_resources(text: str) -> tuple[ResourceConfig, ...]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "document"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(where, f"invalid YAML: {problem}") from exc
    except RecursionError as exc:
        raise ConfigError("document", "invalid YAML: nested too deeply") from exc
    top = _mapping(doc, "config", required={"resources"}, optional=set())
    items = top["resources"]
    if not isinstance(items, list) or not items:
        raise ConfigError("resources", "must be a non-empty list")
    resources = tuple(_resource(item, f"resources[{i}]") for i, item in enumerate(items))
    _check_unique(resources)
    return resources


def _resource(raw: Any, where: str) -> ResourceConfig:
    m = _mapping(raw, where, required={"name", "devices"}, optional={"units", "permissions", "mounts", "env"})
    name = _string(m["name"], f"{where}.name")
    _check_resource_name(name, f"{where}.name")
    devices = m["devices"]
    if isinstance(devices, str):
        devices = [devices]
    if not isinstance(devices, list) or not devices:
        raise ConfigError(f"{where}.devices", "must be a non-empty list of paths under /dev")
    paths = tuple(_device_path(d, f"{where}.devices[{i}]") for i, d in enumerate(devices))
    if len(set(paths)) != len(paths):
        raise ConfigError(f"{where}.devices", "lists the same path twice")
    resource = ResourceConfig(
        name=name,
        devices=paths,
        units=_units(m.get("units", DEFAULT_UNITS), f"{where}.units"),
        permissions=_permissions(m.get("permissions", DEFAULT_PERMISSIONS), f"{where}.permissions"),
        mounts=tuple(
            _mount(x, f"{where}.mounts[{i}]") for i, x in enumerate(_list(m.get("mounts", []), f"{where}.mounts"))
        ),
        env=_env(m.get("env", {}), f"{where}.env"),
    )
    limit = max_units(resource.id_prefix)
    if resource.units > limit:
        raise ConfigError(
            f"{where}.units",
            f"{resource.units} units exceed the kubelet's 4 MiB message limit (at most {limit} for this name)",
        )
    return resource


def _check_unique(resources: tuple[ResourceConfig, ...]) -> None:
    seen: dict[str, int] = {}
    for i, r in enumerate(resources):
        for key in (r.name, r.socket_name):
            if key in seen:
                raise ConfigError(f"resources[{i}].name", f"{r.name!r} collides with resources[{seen[key]}]")
            seen[key] = i


def _check_resource_name(name: str, where: str) -> None:
    """The kubelet's rules for an extended resource name."""
    if "/" not in name:
        raise ConfigError(where, f"{name!r} must be <domain>/<name>, e.g. ate.dev/kvm")
    if "kubernetes.io/" in name:
        raise ConfigError(where, f"{name!r} is in the reserved kubernetes.io domain")
    if name.startswith("requests."):
        raise ConfigError(where, f"{name!r} must not start with 'requests.'")
    prefix, _, part = ("requests." + name).partition("/")
    if "/" in part:
        raise ConfigError(where, f"{name!r} has more than one '/'")
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        raise ConfigError(where, f"{name!r}: domain must be a lower-case DNS subdomain")
    if len(part) > 63 or not _QUALIFIED_NAME_PART.fullmatch(part):
        raise ConfigError(
            where, f"{name!r}: name part must be 1-63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"
        )


def _device_path(raw: Any, where: str) -> str:
    path = _string(raw, where)
    if "\x00" in path:
        raise ConfigError(where, "contains a NUL byte")
    if not path.startswith("/"):
        raise ConfigError(where, f"{path!r} must be an absolute path")
    if ".." in path.split("/"):
        raise ConfigError(where, f"{path!r} must not contain '..'")
    normal = os.path.normpath(path)
    if not normal.startswith("/dev/"):
        raise ConfigError(where, f"{path!r} must name a node under /dev")
    return normal


def is_glob(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


def _units(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigError(where, f"must be a positive integer (got {raw!r})")
    return raw


def _permissions(raw: Any, where: str) -> str:
    perms = _string(raw, where)
    if not perms or set(perms) - set("rwm") or len(set(perms)) != len(perms):
        raise ConfigError(where, f"must be letters from 'rwm', each at most once (got {perms!r})")
    return "".join(c for c in "rwm" if c in perms)


def _mount(raw: Any, where: str) -> MountConfig:
    m = _mapping(raw, where, required={"container_path", "host_path"}, optional={"read_only"})
    paths = []
    for key in ("container_path", "host_path"):
        p = _string(m[key], f"{where}.{key}")
        if not p.startswith("/") or "\x00" in p:
            raise ConfigError(f"{where}.{key}", f"{p!r} must be an absolute path")
        paths.append(os.path.normpath(p))
    read_only = m.get("read_only", True)
    if not isinstance(read_only, bool):
        raise ConfigError(f"{where}.read_only", f"must be true or false (got {read_only!r})")
    return MountConfig(container_path=paths[0], host_path=paths[1], read_only=read_only)


def _env(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ConfigError(where, "must be a mapping of variable names to strings")
    env: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ConfigError(_key(where, key), "is not a valid environment variable name")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(_key(where, key), f"must be a string (got {value!r})")
        env[key] = str(value)
    return env


def _mapping(raw: Any, where: str, *, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(where, "must be a mapping")
    for key in raw:
        if key not in required | optional:
            known = ", ".join(sorted(required | optional))
            raise ConfigError(_key(where, key), f"unknown key (known: {known})")
    for key in sorted(required):
        if key not in raw:
            raise ConfigError(_key(where, key), "is required")
    return raw


def _list(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise ConfigError(where, "must be a list")
    return raw


def _string(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(where, f"must be a string (got {raw!r})")
    return raw


def max_units(id_prefix: str) -> int:
    """The most units whose full ListAndWatch update still fits one kubelet message.

    Exact protobuf sizes: a Device carries ``ID`` (tag, length, bytes) and ``health``
    (tag, length, "Unhealthy", the longer state); each sits in the repeated field with
    its own tag and length.
    """

    def varint_len(n: int) -> int:
        return max(1, (n.bit_length() + 6) // 7)

    def device_len(n: int) -> int:
        id_len = len(id_prefix) + 1 + len(str(n))
        body = 1 + varint_len(id_len) + id_len + 1 + 1 + len("Unhealthy")
        return 1 + varint_len(body) + body

    total, n = 0, 0
    # Units are numbered from 0, so the sum is a series over digit widths.
    width_start = 0
    while True:
        width_end = 10 ** len(str(width_start))
        per = device_len(width_start)
        fit = (MAX_MESSAGE_BYTES - total) // per
        if fit < width_end - width_start:
            return n + fit
        total += per * (width_end - width_start)
        n += width_end - width_start
        width_start = width_end
