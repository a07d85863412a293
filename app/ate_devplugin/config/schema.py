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
    CPU_VENDORS,
    DEFAULT_PERMISSIONS,
    DEFAULT_UNITS,
    HEALTH_CHECKS,
    HEALTH_EXISTS,
    HEALTH_KVM,
    KVM_DEVICE,
    KVM_IMPLEMENTATIONS,
    MAX_DEVICES,
    MAX_DOMAIN_CHARS,
    MAX_ENV,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ID,
    MAX_MOUNTS,
    MAX_NAME_PART_CHARS,
    MAX_PATH_CHARS,
    MAX_PROFILE_FEATURES,
    MAX_PROFILE_NAME_CHARS,
    MAX_RESOURCES,
    MAX_RESTORE_PROFILES,
    MAX_TEMPLATE_LEAVES,
    RESTORE_PREFIX,
)
from ate_devplugin.config.rules import Field, Flag, Integer, Items, Pattern, Record, Table, Text, Unsupported
from ate_devplugin.cpu.features import FEATURES, MAX_NAME_CHARS, NAME_PATTERN, REGISTER_NAMES
from ate_devplugin.cpu.restore import (
    DEFAULT_TOLERANCE_PPM,
    PPM,
    SCALING,
    SCALING_ACCEPT,
    SCALING_IGNORE,
    SCALING_REQUIRE,
)
from ate_devplugin.cpu.template import BITMAP_PATTERN, NUMBER_PATTERN

_CONTROL = r"\x00-\x1f\x7f"
# One path segment: not empty, not '.' or '..', no '/' and no control character.
_SEGMENT = rf"(?:\.\.[^/{_CONTROL}]+|\.[^./{_CONTROL}][^/{_CONTROL}]*|[^./{_CONTROL}][^/{_CONTROL}]*)"
# Said as "contains none" (not "all are others"): Python's $ also matches before a final
# newline, so only this form means the same to python-jsonschema as to helm's RE2.
_NO_CONTROL = Pattern(rf"(?s:.*[{_CONTROL}].*)", "must not contain a control character (newline, NUL, ...)", True)
_ABSOLUTE = Pattern(r"/.*", "must be an absolute path")
_NORMAL = "must be a normal path: no '.', '..' or empty parts, no trailing '/'"
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"


def _choice(choices: tuple[str, ...], description: str, noun: str) -> Text:
    """One of ``choices``; anything else is "unknown <noun> 'x' (expected ...)", at any length."""
    return Text(
        (_NO_CONTROL, Pattern("|".join(choices), f"must be one of {', '.join(choices)}")),
        max(len(c) for c in choices),
        description,
        choices=choices,
        noun=noun,
    )


def _number(description: str) -> Text:
    return Text((_NO_CONTROL, Pattern(NUMBER_PATTERN, _NUMBER)), 40, description)


_NUMBER = "must be a number of at most 32 bits in quotes, 0x... (hex) or 0b... (binary), as Firecracker reads it"
_BITMAP = "must be a bitmap of at most 32 digits from 0, 1 and x ('0b' may lead, '_' separates)"
_FEATURE = "is not a CPUID feature: /proc/cpuinfo's name, or cpuid_<leaf in hex>_<subleaf>_<register>_<bit>"


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

# --- restore profiles (cpu/restore.py, docs/restore-placement.md) ------------------------
_X86_ONLY = "restore profiles read x86 CPUID: an aarch64 template is not supported"
CPU_TEMPLATE = Record(
    {
        "cpuid_modifiers": Field(
            Items(
                Record(
                    {
                        "leaf": Field(_number("CPUID leaf, 0x or 0b (e.g. 0x7)."), required=True),
                        "subleaf": Field(_number("CPUID subleaf, 0x or 0b."), required=True),
                        "flags": Field(Integer(0, "KVM's flags (1: the subleaf counts).", MAX_ID), required=True),
                        "modifiers": Field(
                            Items(
                                Record(
                                    {
                                        "register": Field(
                                            _choice(REGISTER_NAMES, "Register.", "register"), required=True
                                        ),
                                        "bitmap": Field(
                                            Text(
                                                (_NO_CONTROL, Pattern(BITMAP_PATTERN, _BITMAP)),
                                                80,
                                                "32 bits, most significant first: 1 sets, 0 clears, x keeps the "
                                                "host's ('0b' may lead, '_' separates, missing leading bits are x).",
                                            ),
                                            required=True,
                                        ),
                                    }
                                ),
                                16,
                            ),
                            required=True,
                        ),
                    }
                ),
                MAX_TEMPLATE_LEAVES,
            )
        ),
        "msr_modifiers": Field(
            Unsupported("MSR modifiers are not supported: a restore profile judges CPUID and the TSC; remove them")
        ),
        "kvm_capabilities": Field(
            Unsupported("kvm_capabilities are not supported: a restore profile judges CPUID and the TSC; remove them")
        ),
        "reg_modifiers": Field(Unsupported(_X86_ONLY)),
        "vcpu_features": Field(Unsupported(_X86_ONLY)),
    },
    "A Firecracker custom CPU template (x86): its cpuid_modifiers' set bits are required, its cleared bits are not.",
)
RESTORE_PROFILE = Record(
    {
        "features": Field(
            Items(
                Text(
                    (_NO_CONTROL, Pattern(NAME_PATTERN, _FEATURE)),
                    MAX_NAME_CHARS,
                    choices=tuple(FEATURES),
                ),
                MAX_PROFILE_FEATURES,
                unique=True,
                description="CPUID features this node's KVM must offer, as /proc/cpuinfo names them "
                "(cpu/features.py), or cpuid_<leaf>_<subleaf>_<register>_<bit>.",
            )
        ),
        "cpu_template": Field(CPU_TEMPLATE),
        "vendor": Field(_choice(CPU_VENDORS, "The CPU vendor the snapshot was taken on (default: any).", "CPU vendor")),
        "kvm_implementations": Field(
            Items(
                _choice(KVM_IMPLEMENTATIONS, "", "KVM implementation"),
                len(KVM_IMPLEMENTATIONS),
                unique=True,
                description="The KVM implementations that may restore it (default: any).",
            )
        ),
        "tsc": Field(
            Record(
                {
                    "khz": Field(Integer(1, "The snapshot's TSC frequency in kHz (default: any).", MAX_ID)),
                    "tolerance_ppm": Field(
                        Integer(0, f"How far the node's may be (default {DEFAULT_TOLERANCE_PPM}, KVM's).", PPM)
                    ),
                    "scaling": Field(
                        _choice(
                            SCALING,
                            f"What a node whose KVM scales the TSC counts for: '{SCALING_ACCEPT}' (default: it "
                            f"passes at any frequency), '{SCALING_IGNORE}' (the frequency alone counts) or "
                            f"'{SCALING_REQUIRE}' (only such nodes pass).",
                            "TSC scaling rule",
                        )
                    ),
                },
                "The TSC rule.",
            )
        ),
    },
    "What a snapshot needs of the node that restores it.",
)
RESTORE_PROFILES = Table(
    Text(
        (
            _NO_CONTROL,
            Pattern(
                rf"[a-z0-9](?:[a-z0-9_]{{0,{MAX_PROFILE_NAME_CHARS - 2}}}[a-z0-9])?",
                f"must be 1-{MAX_PROFILE_NAME_CHARS} characters of a-z, 0-9 and '_', alphanumeric at both ends "
                f"(it names the DRA attribute {RESTORE_PREFIX}<name>, a C identifier)",
            ),
        ),
        MAX_PROFILE_NAME_CHARS,
    ),
    RESTORE_PROFILE,
    MAX_RESTORE_PROFILES,
    "Named restore profiles: whether this node can restore each is judged from the KVM probe's CPU profile.",
)
# --- end restore profiles -----------------------------------------------------------------

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
        "restore_profiles": Field(RESTORE_PROFILES),
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
