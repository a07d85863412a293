"""Who may open a device node here, and what to change when this process may not.

The node a container sees was made by its runtime: containerd and CRI-O copy the host
node's owner and mode, unless ``device_ownership_from_security_context`` gives it to the
pod's user and group; a CDI spec's ``file_mode``, ``uid`` and ``gid`` win over both. Set
beside this process's user, groups and effective capabilities, the node's mode and owner
say why an open was refused (the file mode: EACCES; the mode allows it but the device
cgroup does not: EPERM) and which change removes the cause. ``verify`` prints them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

CAP_DAC_OVERRIDE = 1  # bypasses the file mode: root without it gets the owner's bits only
READ_WRITE = 0o6  # one class's bits for O_RDWR, the probe's open


@dataclass(frozen=True)
class Node:
    """A device node's mode and owner, as this container sees it."""

    mode: int  # st_mode: type and permission bits
    uid: int
    gid: int

    def bits(self, shift: int) -> int:
        return (self.mode >> shift) & 0o7

    def describe(self) -> str:
        return f"{stat.filemode(self.mode)} ({stat.S_IMODE(self.mode):04o}) owner {self.uid}:{self.gid}"

    def to_json(self) -> dict[str, Any]:
        return {"mode": f"{stat.S_IMODE(self.mode):04o}", "type": stat.filemode(self.mode)[0], "uid": self.uid,
                "gid": self.gid}  # fmt: skip


@dataclass(frozen=True)
class Identity:
    """This process: the user and groups the kernel checks a file's mode against."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    capabilities: int  # the effective set (CapEff); -1 when unknown

    @property
    def group_list(self) -> str:
        return ",".join(str(g) for g in self.groups) or "none"

    def describe(self) -> str:
        if self.capabilities == 0:
            caps = "no capabilities"
        elif self.capabilities < 0:
            caps = "capabilities unknown"
        else:
            caps = f"capabilities 0x{self.capabilities:x}"
        return f"uid {self.uid}, gid {self.gid}, groups {self.group_list}; {caps}"

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups), "capabilities": self.capabilities}


def read_node(path: str) -> Node | None:
    """The node at ``path``; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return Node(st.st_mode, st.st_uid, st.st_gid)


def current_identity(status: str = "/proc/self/status") -> Identity:
    caps = -1
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    groups = tuple(sorted({os.getegid(), *os.getgroups()}))
    return Identity(os.geteuid(), os.getegid(), groups, caps)


def mode_allows(node: Node, who: Identity) -> bool:
    """Whether the node's mode lets ``who`` open it read-write (what the kernel checks first)."""
    if who.capabilities > 0 and who.capabilities & (1 << CAP_DAC_OVERRIDE):
        return True
    if who.uid == node.uid:
        shift = 6
    elif node.gid == who.gid or node.gid in who.groups:
        shift = 3
    else:
        shift = 0
    return node.bits(shift) & READ_WRITE == READ_WRITE


def refusal(node: Node | None, who: Identity, message: str) -> tuple[str, list[str]]:
    """Why ``who`` could not open ``node`` (the probe's ``message`` names the errno), and the
    changes that would let it: (the cause, one change a line)."""
    if node is None:
        return "the node cannot be stat'ed here", []
    if mode_allows(node, who):
        if "EPERM" not in message:
            return f"its mode lets uid {who.uid} read and write it: a security module (SELinux, AppArmor) refused", []
        return (
            f"its mode lets uid {who.uid} read and write it, but the container's device rules do not",
            [
                "ask for the device as a pod does (resources.limits or a claim): the runtime then allows it",
                "give the resource read-write permissions (deviceConfig.resources[].permissions: rw)",
            ],
        )
    changes = []
    if node.bits(6) & READ_WRITE == READ_WRITE and who.uid != node.uid:
        user = "uid 0 with every capability dropped (root without CAP_DAC_OVERRIDE has the owner's bits only)"
        changes.append(f"run as {user if node.uid == 0 else f'uid {node.uid}'}")
    if node.bits(3) & READ_WRITE == READ_WRITE and node.gid not in who.groups:
        changes.append(f"add gid {node.gid}, the node's group, to the pod's supplementalGroups (it may differ by node)")
    changes += [
        "give the node to the pod's user: device_ownership_from_security_context = true in the runtime "
        "(containerd, CRI-O)",
        'give the resource a CDI mode: cdi: {file_mode: "0666"} with allocate: cdi (containerd 2)',
        'make the node 0666 on the host (a udev rule: KERNEL=="kvm", MODE="0666")',
    ]
    copied = "the runtime copies the host node's mode and owner unless its device ownership or a CDI spec sets them"
    return f"its mode gives uid {who.uid} (groups {who.group_list}) no read-write access ({copied})", changes
