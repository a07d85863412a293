"""``ate-devplugin verify``: does a VM run here? For a person or a ``helm test`` pod.

It probes the device the way the daemon does (a child process, a deadline), then prints
what it saw and a verdict line, and returns the exit code: 0 when the guest ran to its
expected exits, 1 otherwise. The output, for a pod's log::

    ate-devplugin verify /dev/kvm
      device:          character device 10:232, crw------- (0600) owner 0:0 here
      process:         uid 0, gid 0, groups 0; no capabilities
      KVM API version: 12
      guest exits:     out 0x3f8 '4', out 0x3f8 '\\n', hlt (expected out 0x3f8 '4', out 0x3f8 '\\n', hlt)
      KVM:             pvm, software (no VMX/SVM): small guests run, stock kernels may not
      CPU:             amd64 GenuineIntel family 6 model 167 stepping 1, "Intel(R) Xeon(R) Processor", a VM itself
      guest CPUID:     e4da580d0f0efc260d1b9abad8ce7814: cx16 gfni hypervisor invtsc la57 rtm ...
      kernel:          6.18.44-fc-v1147
    PASS: a VM ran guest code on /dev/kvm in 7.9 ms

or, on failure, the lines it could fill and ``FAIL <reason>: <message>``; a node this
process may not open (``no-permission``) adds why, from the node's mode and owner and the
process's user, groups and capabilities, and what would change it (access.py). With
``as_json`` it prints one JSON object instead (``result``, ``node``, ``access``), for
scripts checking every node.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from ate_devplugin.kvm import access, guest
from ate_devplugin.kvm.facts import NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.runner import probe_once

DEFAULT_TIMEOUT_S = 10.0
Probe = Callable[[str, float], Awaitable[ProbeResult]]


def lines(
    result: ProbeResult, node: NodeFacts, device_node: access.Node | None, identity: access.Identity
) -> list[str]:
    """The report: what was seen, then the verdict. ``device_node`` is the device as this
    container sees it, ``identity`` this process's."""
    out = [f"ate-devplugin verify {result.device}"]

    def row(label: str, text: str) -> None:
        out.append(f"  {label + ':' if label else '':<16} {text}")

    if result.rdev or device_node:
        kind = f"character device {result.rdev}" if result.rdev else "device node"
        row("device", f"{kind}, {device_node.describe()} here" if device_node else kind)
    row("process", identity.describe())
    if result.api_version is not None:
        row("KVM API version", str(result.api_version))
    if result.exits or result.ran_guest:
        row("guest exits", f"{', '.join(result.exits) or 'none'} (expected {guest.describe(guest.EXPECTED)})")
    row("KVM", _implementation(node))
    row("CPU", _cpu(node))
    facts = result.device_facts
    if facts is not None and facts.cpuid_digest:
        row("guest CPUID", f"{facts.cpuid_digest}: {' '.join(facts.cpu_features) or 'no notable features'}")
    row("kernel", node.kernel_release)
    if result.reason is Reason.NO_PERMISSION:
        cause, changes = access.refusal(device_node, identity, result.message)
        row("refused", cause)
        for i, change in enumerate(changes):
            row("to open it" if i == 0 else "", f"{'or ' if i else ''}{change}")
    if result.passed:
        ran = (
            "a VM ran guest code"
            if result.ran_guest
            else "a VM and a vCPU were made (guest not run on this architecture)"
        )
        out.append(f"PASS: {ran} on {result.device} in {result.duration_s * 1000:.1f} ms")
    else:
        out.append(f"FAIL {result.reason}: {result.message}")
    return out


def _implementation(node: NodeFacts) -> str:
    name = node.kvm_implementation
    if not name:
        return "no KVM module loaded"
    if node.kvm_hardware:
        return f"{name}, hardware virtualisation"
    if name == "pvm":
        return "pvm, software (no VMX/SVM): small guests run, stock kernels may not"
    return f"{name}: more than one implementation loaded, which serves the device is unknown"


def _cpu(node: NodeFacts) -> str:
    signature = " ".join(
        f"{label} {value}"
        for label, value in (("family", node.cpu_family), ("model", node.cpu_model), ("stepping", node.cpu_stepping))
        if value is not None
    )
    parts = [" ".join(p for p in (node.architecture, node.cpu_vendor, signature) if p)]
    if node.cpu_model_name:
        parts.append(json.dumps(node.cpu_model_name))
    if node.nested:
        parts.append("a VM itself")
    return ", ".join(parts)


async def verify(
    node: NodeFacts,
    out: TextIO,
    device: str = "/dev/kvm",
    timeout: float = DEFAULT_TIMEOUT_S,
    as_json: bool = False,
    probe: Probe = probe_once,
) -> int:
    """Probes ``device``, writes the report to ``out``; 0 when it passed, else 1."""
    result = await probe(device, timeout)
    device_node, identity = access.read_node(device), access.current_identity()
    if as_json:
        seen: dict[str, Any] = {
            "device_node": device_node.to_json() if device_node else None, "process": identity.to_json(),
        }  # fmt: skip
        if result.reason is Reason.NO_PERMISSION:
            seen["refused"], seen["changes"] = access.refusal(device_node, identity, result.message)
        out.write(json.dumps({"result": result.to_json(), "node": node.to_json(), "access": seen}) + "\n")
    else:
        out.write("\n".join(lines(result, node, device_node, identity)) + "\n")
    return 0 if result.passed else 1
