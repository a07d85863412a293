"""The typed model of the config: what the daemon runs on, and the limits every part keeps."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from ate_devplugin.cpu.restore import RestoreProfile

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
# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
# The kubelet checks the quota name "requests.<name>": the domain gets 9 characters less.
MAX_DOMAIN_CHARS = 253 - len("requests.")
MAX_NAME_PART_CHARS = 63

SOCKET_CHARS = "[/.]"  # replaced by '-' in the socket file name
_GLOB_CHARS = frozenset("*?[")

# How Allocate answers, and the device node a CDI spec makes.
ALLOCATE_DEVICES = "devices"  # device specs: what every runtime understands (containerd 1.6 too)
ALLOCATE_CDI = "cdi"  # the CDI device name only: the runtime applies the resource's spec
ALLOCATE_BOTH = "both"
ALLOCATE_MODES = (ALLOCATE_DEVICES, ALLOCATE_CDI, ALLOCATE_BOTH)
MAX_ID = 2**32 - 1  # uid and gid are uint32 in a CDI spec

# How a resource's health is judged: its nodes exist, or (kvm) the first device answers
# the functional KVM probe too (docs/kvm-health.md). A resource whose only device is
# KVM_DEVICE is probed unless its config says otherwise.
HEALTH_EXISTS = "exists"
HEALTH_KVM = "kvm"
HEALTH_CHECKS = (HEALTH_EXISTS, HEALTH_KVM)
KVM_DEVICE = "/dev/kvm"

# Restore profiles (cpu/restore.py): each is answered per KVM resource as a DRA attribute
# restore_<name> and a node label <domain>/restore_<name>. A DRA device has at most 32
# attributes and capacities: 22 KVM attributes and the shareable device's capacity leave
# 9; one is kept for a fact to come. A name fits a C identifier of 32 with the prefix.
MAX_RESTORE_PROFILES = 8
RESTORE_PREFIX = "restore_"
MAX_PROFILE_NAME_CHARS = 32 - len(RESTORE_PREFIX)
MAX_PROFILE_FEATURES = 1024
MAX_TEMPLATE_LEAVES = 256  # a Firecracker template as its helper dumps it: one entry per leaf KVM offers
KVM_IMPLEMENTATIONS = ("vmx", "svm", "pvm")
CPU_VENDORS = ("GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls")


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

    # --- admission
    preferred_allocation: bool = False
    # --- health: None is the default for the devices (default_health)
    health: str | None = None
    # --- what snapshots this node can restore, judged from the KVM probe's CPU profile
    restore_profiles: tuple[RestoreProfile, ...] = ()

    def serves_as(self, other: ResourceConfig) -> bool:
        """Whether it is served as ``other`` is: equal but for the restore profiles, which
        change what is said of the node, not what is served (a reload then restarts nothing)."""
        return replace(self, restore_profiles=()) == replace(other, restore_profiles=())

    @property
    def probes_kvm(self) -> bool:
        """Its health is the KVM probe's verdict on its first device, besides existence."""
        return (self.health or default_health(self.devices)) == HEALTH_KVM

    @property
    def probed_device(self) -> str:
        """The device the KVM probe opens (a host path: the config refuses a glob there)."""
        return self.devices[0]

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


def socket_name(resource_name: str, suffix: str = "") -> str:
    """The resource's socket file; a suffix (the pod's UID) lets two plugin pods serve it on
    one node while a rolling update overlaps them."""
    return "ate-" + re.sub(SOCKET_CHARS, "-", resource_name) + (f"-{suffix}" if suffix else "") + ".sock"


DEFAULT_RESOURCES = (ResourceConfig(name="ate.dev/kvm", devices=(KVM_DEVICE,)),)


def default_health(devices: tuple[str, ...]) -> str:
    """kvm for a resource whose devices are the KVM device alone, exists for any other."""
    return HEALTH_KVM if devices == (KVM_DEVICE,) else HEALTH_EXISTS


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
