"""The resource configuration file: one typed, versioned model, its only definition.

The rules are data (``RESOURCE`` below): each knows how to check a value and how to say
the same in JSON Schema, so the chart's ``values.schema.json`` for ``deviceConfig`` is
generated from here (tools/gen-config-schema.py) and cannot drift. The rules a schema
cannot say (units within the message limit for the name's length, unique names and
socket files, the socket path length, units in all) are ``_resource`` and
``check_across``, generated into the chart's ``_deviceconfig.tpl``.

Reading is bounded (``read_config_file``: a regular file of at most 1 MiB, never a
blocking open) and so is parsing (``decode_resources``: YAML aliases counted expanded);
both block and are safe to run in a worker thread.

Every problem becomes a ConfigError naming the field (e.g. ``resources[1].units``) and
what is wrong with it, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path
from typing import Any

import yaml

from ate_devplugin import cdi

CONFIG_VERSION = 1
DEFAULT_UNITS = 4096
DEFAULT_PERMISSIONS = "rw"
# The kubelet accepts gRPC messages of at most 4 MiB: a ListAndWatch update carries every
# unit of one resource, an Allocate answer every device, mount and env of one.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Memory, against the chart's 128 Mi limit: idle, one resource of 4096 units, 46 MiB
# resident; each more resource about 0.43 MiB, each unit about 110 bytes. 64 resources
# and 2^18 units in all (64 x 4096) measured 73 MiB.
MAX_RESOURCES = 64
MAX_TOTAL_UNITS = 64 * DEFAULT_UNITS
# With these caps the largest Allocate answer is about 1.1 MB (tests/unit/test_config.py
# builds it), and the env stays far below what execve accepts (ARG_MAX, 2 MiB).
MAX_DEVICES = 64
MAX_MOUNTS = 64
MAX_ENV = 64
MAX_PATH_CHARS = 1024
MAX_ENV_NAME_CHARS = 255
MAX_ENV_VALUE_CHARS = 4096
# The file: a ConfigMap holds at most 1 MiB, and the largest valid config has far fewer
# YAML nodes (aliases counted expanded) than this.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_NODES = 50_000
# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
# The kubelet checks the quota name "requests.<name>": the domain gets 9 characters less.
MAX_DOMAIN_CHARS = 253 - len("requests.")
MAX_NAME_PART_CHARS = 63

SOCKET_CHARS = "[/.]"  # replaced by '-' in the socket file name
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


def _shown(value: Any) -> str:
    """A value as an error shows it: repr, cut short (a value may be megabytes)."""
    try:
        text = repr(value)
    except RecursionError:  # nested thousands deep
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


# --- the rules, as data ------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """The whole string must match ``regex`` (or must not, when ``negate``).

    The regex is written in the common part of Python's re and Go's RE2 (helm's
    validator); the schema anchors it with ^(?:...)$, which in RE2 is the whole text.
    """

    regex: str
    problem: str
    negate: bool = False

    def holds(self, text: str) -> bool:
        return (re.fullmatch(self.regex, text) is None) is self.negate

    def schema(self) -> dict[str, Any]:
        match = {"pattern": f"^(?:{self.regex})$"}
        # A number matches no pattern, so "not" must say "a string that matches".
        return {"not": {"type": "string", **match}} if self.negate else match


@dataclass(frozen=True)
class Text:
    patterns: tuple[Pattern, ...]
    max_chars: int
    description: str = ""
    numbers: bool = False  # a number is taken as its text (env values)

    def check(self, raw: Any, where: str) -> str:
        if self.numbers and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            if not math.isfinite(raw):
                raise ConfigError(where, f"must be a string or a finite number (got {_shown(raw)})")
            try:
                raw = str(raw)
            except ValueError:  # more digits than Python converts: far too long anyway
                raise ConfigError(where, f"must be at most {self.max_chars} characters") from None
        if not isinstance(raw, str):
            kind = "a string or a number" if self.numbers else "a string"
            raise ConfigError(where, f"must be {kind} (got {_shown(raw)})")
        if len(raw) > self.max_chars:
            raise ConfigError(where, f"must be at most {self.max_chars} characters (got {len(raw)})")
        for p in self.patterns:
            if not p.holds(raw):
                raise ConfigError(where, f"{p.problem} (got {_shown(raw)})")
        return raw

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": ["string", "number"] if self.numbers else "string"}
        if self.description:
            out["description"] = self.description
        out["maxLength"] = self.max_chars
        rules = [p.schema() for p in self.patterns]
        if len(rules) == 1:
            out.update(rules[0])
        elif rules:
            out["allOf"] = rules
        return out


@dataclass(frozen=True)
class Integer:
    minimum: int
    description: str = ""
    maximum: int | None = None

    def check(self, raw: Any, where: str) -> int:
        # An integral float is the same number (helm cannot tell 8 from 8.0 either).
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < self.minimum:
            raise ConfigError(where, f"must be {self._kind()} (got {_shown(raw)})")
        if self.maximum is not None and raw > self.maximum:
            raise ConfigError(where, f"must be {self._kind()} (got {_shown(raw)})")
        return raw

    def _kind(self) -> str:
        if self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        return "a positive integer"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "minimum": self.minimum}
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Flag:
    description: str = ""

    def check(self, raw: Any, where: str) -> bool:
        if not isinstance(raw, bool):
            raise ConfigError(where, f"must be true or false (got {_shown(raw)})")
        return raw

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "boolean"}
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Items:
    item: Rule
    max_items: int
    min_items: int = 0
    unique: bool = False
    description: str = ""
    one_as_list: bool = False  # a single string stands for a list of one

    def check(self, raw: Any, where: str) -> list[Any]:
        if self.one_as_list and isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise ConfigError(where, "must be a list")
        if len(raw) < self.min_items:
            raise ConfigError(where, "must be a non-empty list")
        if len(raw) > self.max_items:
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        values = [self.item.check(x, f"{where}[{i}]") for i, x in enumerate(raw)]
        if self.unique:
            seen: dict[Any, int] = {}
            for i, v in enumerate(values):
                if v in seen:
                    raise ConfigError(f"{where}[{i}]", f"repeats {where}[{seen[v]}]")
                seen[v] = i
        return values

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if self.description:
            out["description"] = self.description
        if self.min_items:
            out["minItems"] = self.min_items
        out["maxItems"] = self.max_items
        if self.unique:
            out["uniqueItems"] = True
        out["items"] = self.item.schema()
        if self.one_as_list:
            description = out.pop("description", None)
            out = {"anyOf": [self.item.schema(), out]}
            if description:
                out["description"] = description
        return out


@dataclass(frozen=True)
class Table:
    """A mapping of names (``key``) to values."""

    key: Text
    value: Text
    max_items: int
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, str]:
        if not isinstance(raw, dict):
            raise ConfigError(where, "must be a mapping of names to values")
        if len(raw) > self.max_items:
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        out: dict[str, str] = {}
        for k, v in raw.items():
            name = _key(where, k)
            if not isinstance(k, str):
                raise ConfigError(name, "must be a string key")
            out[self.key.check(k, name)] = self.value.check(v, name)
        return out

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.description:
            out["description"] = self.description
        out["maxProperties"] = self.max_items
        out["propertyNames"] = {k: v for k, v in self.key.schema().items() if k not in ("type", "description")}
        out["additionalProperties"] = self.value.schema()
        return out


@dataclass(frozen=True)
class Field:
    rule: Rule
    required: bool = False


@dataclass(frozen=True)
class Record:
    fields: dict[str, Field]
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise ConfigError(where, "must be a mapping")
        for key in raw:
            if key not in self.fields:
                raise ConfigError(_key(where, key), f"unknown key (known: {', '.join(sorted(self.fields))})")
        for key in sorted(k for k, f in self.fields.items() if f.required):
            if key not in raw:
                raise ConfigError(_key(where, key), "is required")
        return {k: self.fields[k].rule.check(v, _key(where, k)) for k, v in raw.items()}

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": False}
        required = [k for k, f in self.fields.items() if f.required]
        if required:
            out["required"] = required
        if self.description:
            out["description"] = self.description
        out["properties"] = {k: f.rule.schema() for k, f in self.fields.items()}
        return out


Rule = Text | Integer | Flag | Items | Table | Record


def _key(where: str, key: Any) -> str:
    """The field name of a mapping key; one that is not plain text is quoted."""
    plain = isinstance(key, str) and key.isprintable() and key.strip() == key and len(key) <= 80
    shown = key if plain else _shown(key)
    return f"{where}.{shown}" if where != "config" else shown


_CONTROL = r"\x00-\x1f\x7f"
# One path segment: not empty, not '.' or '..', no '/' and no control character.
_SEGMENT = rf"(?:\.\.[^/{_CONTROL}]+|\.[^./{_CONTROL}][^/{_CONTROL}]*|[^./{_CONTROL}][^/{_CONTROL}]*)"
# Said as "contains none" (not "all are others"): Python's $ also matches before a final
# newline, so only this form means the same to python-jsonschema as to helm's RE2.
_NO_CONTROL = Pattern(rf"(?s:.*[{_CONTROL}].*)", "must not contain a control character (newline, NUL, ...)", True)
_ABSOLUTE = Pattern(r"/.*", "must be an absolute path")
_NORMAL = "must be a normal path: no '.', '..' or empty parts, no trailing '/'"
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"


def _path(description: str, under: str = "", problem: str = "") -> Text:
    inside = (Pattern(rf"{under}/.*", problem),) if under else ()
    return Text(
        (_NO_CONTROL, _ABSOLUTE, *inside, Pattern(rf"{under}(?:/{_SEGMENT})+", _NORMAL)),
        MAX_PATH_CHARS,
        description,
    )


_NAME = Text(
    (
        _NO_CONTROL,
        Pattern(r"(?s:.*/.*)", "must be <domain>/<name>, e.g. ate.dev/kvm"),
        Pattern(r"[^/]*/[^/]*", "has more than one '/'"),
        Pattern(r"(?s:.*kubernetes\.io/.*)", "is in the reserved kubernetes.io domain", negate=True),
        Pattern(r"(?s:requests\..*)", "must not start with 'requests.'", negate=True),
        Pattern(rf"[^/]{{1,{MAX_DOMAIN_CHARS}}}/[^/]*", f"domain must be 1-{MAX_DOMAIN_CHARS} characters"),
        Pattern(rf"{_LABEL}(?:\.{_LABEL})*/[^/]*", "domain must be a lower-case DNS subdomain"),
        Pattern(
            rf"[^/]*/[A-Za-z0-9](?:[-A-Za-z0-9_.]{{0,{MAX_NAME_PART_CHARS - 2}}}[A-Za-z0-9])?",
            f"name part must be 1-{MAX_NAME_PART_CHARS} characters of [A-Za-z0-9-_.], alphanumeric at both ends",
        ),
    ),
    MAX_DOMAIN_CHARS + 1 + MAX_NAME_PART_CHARS,
    "Extended resource name, <domain>/<name>, e.g. ate.dev/kvm (not in the kubernetes.io domain).",
)
_PERMISSIONS = Text(
    (
        _NO_CONTROL,
        Pattern(
            "|".join("".join(p) for n in (1, 2, 3) for p in permutations("rwm", n)),
            "must be letters from 'rwm', each at most once",
        ),
    ),
    3,
    f"cgroup device permissions, letters from r, w, m (default {DEFAULT_PERMISSIONS}).",
)
_MOUNT = Record(
    {
        "container_path": Field(_path("Path inside the consuming container."), required=True),
        "host_path": Field(_path("Path on the host."), required=True),
        "read_only": Field(Flag("Read-only bind mount (default true).")),
    }
)
# --- CDI: how Allocate answers, and the device node a CDI spec makes ------------------

ALLOCATE_DEVICES = "devices"  # device specs: what every runtime understands (containerd 1.6 too)
ALLOCATE_CDI = "cdi"  # the CDI device name only: the runtime applies the resource's spec
ALLOCATE_BOTH = "both"
ALLOCATE_MODES = (ALLOCATE_DEVICES, ALLOCATE_CDI, ALLOCATE_BOTH)
MAX_ID = 2**32 - 1  # uid and gid are uint32 in a CDI spec
CDI_FIELDS = {
    "allocate": Field(
        Text(
            (_NO_CONTROL, Pattern("|".join(ALLOCATE_MODES), f"must be one of {', '.join(ALLOCATE_MODES)}")),
            max(len(m) for m in ALLOCATE_MODES),
            f"How Allocate answers: '{ALLOCATE_DEVICES}' (device specs, the default), '{ALLOCATE_CDI}' (the CDI "
            f"device name; needs a CDI-enabled runtime such as containerd 2) or '{ALLOCATE_BOTH}'.",
        )
    ),
    "cdi": Field(
        Record(
            {
                "file_mode": Field(
                    Text(
                        (_NO_CONTROL, Pattern("0?[0-7]{3}", "must be an octal file mode in quotes, e.g. '0666'")),
                        4,
                        "Mode of the device node inside the container, octal in quotes (e.g. '0666'); "
                        "default: the host node's.",
                    )
                ),
                "uid": Field(Integer(0, "Owner of the node inside the container (default: its user).", MAX_ID)),
                "gid": Field(Integer(0, "Group of the node inside the container.", MAX_ID)),
            },
            "The device nodes of this resource's CDI spec.",
        )
    ),
}
# --- end CDI ---------------------------------------------------------------------------

RESOURCE = Record(
    {
        "name": Field(_NAME, required=True),
        "devices": Field(
            Items(
                _path("", "/dev", "must name a node under /dev"),
                MAX_DEVICES,
                min_items=1,
                unique=True,
                description="Host device paths or globs under /dev; all matches are handed out together.",
                one_as_list=True,
            ),
            required=True,
        ),
        "units": Field(Integer(1, f"Shareable units advertised (default {DEFAULT_UNITS}).")),
        "permissions": Field(_PERMISSIONS),
        "mounts": Field(Items(_MOUNT, MAX_MOUNTS, description="Extra bind mounts given to the consuming container.")),
        "env": Field(
            Table(
                Text(
                    (_NO_CONTROL, Pattern(r"[A-Za-z_][A-Za-z0-9_]*", "is not a valid environment variable name")),
                    MAX_ENV_NAME_CHARS,
                ),
                Text(
                    (Pattern(r"(?s:.*\x00.*)", "must not contain a NUL byte", True),), MAX_ENV_VALUE_CHARS, numbers=True
                ),
                MAX_ENV,
                "Environment variables given to the consuming container.",
            )
        ),
        **CDI_FIELDS,
    },
    "One extended resource the daemon advertises.",
)
RESOURCES = Items(RESOURCE, MAX_RESOURCES, min_items=1, description="Extended resources to advertise.")
DOCUMENT = Record(
    {
        "version": Field(Integer(1, f"Format version (only {CONFIG_VERSION}).")),
        "resources": Field(RESOURCES, required=True),
    }
)


# --- the model -----------------------------------------------------------------------


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
    # CDI: how Allocate answers, and the node the CDI spec makes (None: the runtime's default).
    allocate: str = ALLOCATE_DEVICES
    cdi_file_mode: int | None = None
    cdi_uid: int | None = None
    cdi_gid: int | None = None

    @property
    def uses_cdi(self) -> bool:
        """Allocate names the CDI device, so the resource's CDI spec must be in place."""
        return self.allocate != ALLOCATE_DEVICES

    @property
    def id_prefix(self) -> str:
        """Unit IDs are ``<prefix>-<n>``, the prefix being the name after the slash."""
        return self.name.rsplit("/", 1)[1]

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    def unit_ids(self) -> Iterator[str]:
        """The unit IDs in order, made on demand: a resource may have many."""
        prefix = self.id_prefix
        return (f"{prefix}-{n}" for n in range(self.units))


def socket_name(resource_name: str) -> str:
    return "ate-" + re.sub(SOCKET_CHARS, "-", resource_name) + ".sock"


DEFAULT_RESOURCES = (ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",)),)


def resources_from_document(doc: Any) -> tuple[ResourceConfig, ...]:
    """Validate a loaded document (YAML or chart values); raises ConfigError."""
    checked = DOCUMENT.check(doc, "config")
    version = checked.get("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        raise ConfigError("version", f"unsupported version {version} (supported: {CONFIG_VERSION})")
    resources = tuple(_resource(r, f"resources[{i}]") for i, r in enumerate(checked["resources"]))
    check_across(resources)
    return resources


def _resource(m: dict[str, Any], where: str) -> ResourceConfig:
    resource = ResourceConfig(
        name=m["name"],
        devices=tuple(m["devices"]),
        units=m.get("units", DEFAULT_UNITS),
        permissions="".join(c for c in "rwm" if c in m.get("permissions", DEFAULT_PERMISSIONS)),
        mounts=tuple(MountConfig(**x) for x in m.get("mounts", [])),
        env=m.get("env", {}),
        allocate=m.get("allocate", ALLOCATE_DEVICES),
        cdi_file_mode=int(m["cdi"]["file_mode"], 8) if "file_mode" in m.get("cdi", {}) else None,
        cdi_uid=m.get("cdi", {}).get("uid"),
        cdi_gid=m.get("cdi", {}).get("gid"),
    )
    if resource.uses_cdi and (problem := cdi.name_problem(resource.name)):
        raise ConfigError(f"{where}.name", problem)
    limit = max_units(len(resource.id_prefix))
    if resource.units > limit:
        raise ConfigError(
            f"{where}.units",
            f"{resource.units} units exceed the kubelet's 4 MiB message limit (at most {limit} for this name)",
        )
    return resource


def check_across(resources: tuple[ResourceConfig, ...], plugin_dir: str | None = None) -> None:
    """The rules across resources: unique names and socket files, (given the plugin
    directory) socket paths that fit a unix socket address, and units in all within the
    memory budget."""
    seen: dict[str, int] = {}
    for i, r in enumerate(resources):
        for key in (r.name, r.socket_name):
            if key in seen:
                raise ConfigError(f"resources[{i}].name", f"{r.name!r} collides with resources[{seen[key]}]")
            seen[key] = i
        if plugin_dir is not None:
            path = os.path.join(plugin_dir, r.socket_name)
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"resources[{i}].name",
                    f"socket path {path!r} is longer than the {MAX_SOCKET_PATH}-byte unix socket limit",
                )
    total = sum(r.units for r in resources)
    if total > MAX_TOTAL_UNITS:
        raise ConfigError(
            "resources", f"{total} units in all exceed {MAX_TOTAL_UNITS} (memory: the chart's 128 Mi limit)"
        )


def is_glob(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


def max_units(prefix_len: int) -> int:
    """The most units whose full ListAndWatch update still fits one kubelet message.

    Exact protobuf sizes: a Device carries ``ID`` (tag, length, bytes) and ``health``
    (tag, length, "Unhealthy", the longer state); each sits in the repeated field with
    its own tag and length.
    """

    def varint_len(n: int) -> int:
        return max(1, (n.bit_length() + 6) // 7)

    def device_len(n: int) -> int:
        id_len = prefix_len + 1 + len(str(n))
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


# --- reading the file: bounded, never blocking -----------------------------------------


def read_config_file(path: Path | str) -> bytes:
    """The file's bytes, if it resolves to a regular file of at most MAX_CONFIG_BYTES.

    A FIFO, a device or a directory is refused without being opened for reading data
    (a FIFO is opened non-blocking, a device never), so this never blocks.
    """
    where = str(path)
    try:
        st = os.stat(path)  # follows links: the ConfigMap's ..data swap keeps working
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(where, f"is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(where, _TOO_LARGE)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)  # the file opened, which a rename may have changed since
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(where, f"is not a regular file ({_kind(st.st_mode)})")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(where, _TOO_LARGE)
    return b"".join(chunks)


_TOO_LARGE = f"is larger than {MAX_CONFIG_BYTES} bytes (a ConfigMap holds at most 1 MiB)"


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device"}
    kinds |= {stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def load_resources(path: Path) -> tuple[ResourceConfig, ...]:
    """Read and validate a config file; raises ConfigError on any problem."""
    return decode_resources(read_config_file(path), str(path))


def decode_resources(data: bytes, source: str = "config") -> tuple[ResourceConfig, ...]:
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(source, _TOO_LARGE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "is not UTF-8 text") from exc
    try:
        return parse_resources(text)
    except MemoryError:
        raise ConfigError(source, "too large to load") from None


def parse_resources(text: str) -> tuple[ResourceConfig, ...]:
    try:
        _count_nodes(text)
        doc = yaml.load(text, Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "document"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(where, f"invalid YAML: {problem}") from exc
    except RecursionError as exc:
        raise ConfigError("document", "invalid YAML: nested too deeply") from exc
    except ConfigError:
        raise
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError("document", f"invalid YAML: {exc}") from exc
    return resources_from_document(doc)


# libyaml when PyYAML has it (the wheels do): about 20 times faster than pure Python.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _count_nodes(text: str) -> None:
    """Refuses a document of more than MAX_YAML_NODES nodes, each alias counted as the
    whole subtree it stands for, from the parser's events, before anything is built: a
    few hundred bytes of nested aliases cannot make a document of millions of nodes."""
    count = 0
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    started: list[tuple[str | None, int]] = []  # open collections: anchor, count at start
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in started):
                raise ConfigError("document", "invalid YAML: an alias refers to a node that contains it")
            count += sizes.get(event.anchor or "", 1)  # an undefined one: the loader reports it
        elif isinstance(event, yaml.ScalarEvent):
            count += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            started.append((event.anchor, count))
            count += 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, start = started.pop()
            if anchor:
                sizes[anchor] = count - start
        if count > MAX_YAML_NODES:
            raise ConfigError("document", f"more than {MAX_YAML_NODES} YAML nodes (aliases counted expanded)")
