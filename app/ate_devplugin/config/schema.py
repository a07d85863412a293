"""The config file's format, stated in rules: the one definition of what a file may say.

``RESOURCE.schema()`` is the chart's ``deviceConfig`` schema (tools/gen-config-schema.py).
"""

from __future__ import annotations

from itertools import permutations

from ate_devplugin.config.model import (
    ALLOCATE_BOTH,
    ALLOCATE_CDI,
    ALLOCATE_DEVICES,
    ALLOCATE_MODES,
    CONFIG_VERSION,
    DEFAULT_PERMISSIONS,
    DEFAULT_UNITS,
    HEALTH_CHECKS,
    HEALTH_EXISTS,
    HEALTH_KVM,
    KVM_DEVICE,
    MAX_DEVICES,
    MAX_DOMAIN_CHARS,
    MAX_ENV,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ID,
    MAX_MOUNTS,
    MAX_NAME_PART_CHARS,
    MAX_PATH_CHARS,
    MAX_RESOURCES,
)
from ate_devplugin.config.rules import Field, Flag, Integer, Items, Pattern, Record, Table, Text

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
CDI_FIELDS = {
    "allocate": Field(
        Text(
            (_NO_CONTROL, Pattern("|".join(ALLOCATE_MODES), f"must be one of {', '.join(ALLOCATE_MODES)}")),
            max(len(m) for m in ALLOCATE_MODES),
            f"How Allocate answers: '{ALLOCATE_DEVICES}' (device specs, the default), '{ALLOCATE_CDI}' (the CDI "
            f"device name; needs a CDI-enabled runtime such as containerd 2) or '{ALLOCATE_BOTH}'.",
            choices=ALLOCATE_MODES,
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
        "health": Field(
            Text(
                (_NO_CONTROL, Pattern("|".join(HEALTH_CHECKS), f"must be one of {', '.join(HEALTH_CHECKS)}")),
                max(len(h) for h in HEALTH_CHECKS),
                f"How the units' health is judged: '{HEALTH_EXISTS}' (the device nodes exist) or '{HEALTH_KVM}' "
                f"(and the first device, not a glob, passes the functional KVM probe: docs/kvm-health.md). "
                f"Default: '{HEALTH_KVM}' when the devices are {KVM_DEVICE} alone, '{HEALTH_EXISTS}' otherwise.",
                choices=HEALTH_CHECKS,
            )
        ),
        # --- admission -----------------------------------------------------------------
        "preferred_allocation": Field(
            Flag(
                "Advertise GetPreferredAllocation and prefer the lowest-numbered free units (default false:"
                " units are interchangeable, and without it the kubelet makes one call per admission, not two)."
            )
        ),
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
