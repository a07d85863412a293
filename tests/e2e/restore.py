"""Restore placement (docs/restore-placement.md) on the real clusters: what its checks in both
modes share (tests/e2e/test_restore_placement.py in dra mode on 1.37, the restore tests of
tests/e2e/test_nfd_labels.py through the real NFD on 1.35).

This node's CPU profile is recorded as a user records it: ``ate-devplugin cpu-profile`` in a
pod granted the device (the project's image, uid 0 with every capability dropped: it opens
the node it was given); ``ate-devplugin restore-profile`` builds a profile of it (``here``).
Two more ask what this node cannot give: ``one_more``, here's features and one this node's
KVM does not offer; ``other_tsc``, here's with a TSC frequency 10 % higher (this machine's
KVM cannot scale the TSC). :meth:`Profiles.flipped` is the config change that makes
``one_more`` restorable (its extra feature dropped), which the daemon answers without a restart.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ate_devplugin.cpu.features import FEATURES
from ate_devplugin.cpu.profile import CpuProfile
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.images import PLUGIN_IMAGE
from tests.e2e.userpath import METRICS_PORT, NAMESPACE, metrics

PROFILES = ("here", "one_more", "other_tsc")
ANSWER_METRIC = "ate_devplugin_kvm_restore_answer"


def recorder_pod(name: str, namespace: str, claim_template: str | None = None) -> dict[str, Any]:
    """A pod running ``ate-devplugin cpu-profile`` on the /dev/kvm it is granted: one unit of
    ate.dev/kvm, or the claim of ``claim_template`` (dra mode). uid 0 with no capability, no
    privilege escalation, a read-only root: a root-owned 0600 node opens for it."""
    container: dict[str, Any] = {
        "name": "record", "image": PLUGIN_IMAGE, "imagePullPolicy": "Never",
        "command": ["ate-devplugin"], "args": ["cpu-profile", "--device=/dev/kvm"],
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "privileged": False,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }  # fmt: skip
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    if claim_template:
        spec["resourceClaims"] = [{"name": "kvm", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "kvm"}]}
    else:
        container["resources"] = {"limits": {"ate.dev/kvm": 1}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def record(cluster: Cluster, pod: dict[str, Any]) -> tuple[str, str]:
    """Run the recorder ``pod`` to its end: (the profile it printed, the node it ran on)."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    cluster.apply(pod)
    try:
        phase = wait_until(
            f"{name} done",
            lambda: (p := cluster.get_json("pod", "-n", namespace, name)["status"].get("phase")) in
            ("Succeeded", "Failed") and p,
            120,
        )  # fmt: skip
        out = cluster.kubectl("logs", "-n", namespace, name)
        assert phase == "Succeeded", f"{name} {phase}: {out}"
        node: str = cluster.get_json("pod", "-n", namespace, name)["spec"]["nodeName"]
        return out, node
    finally:
        cluster.kubectl("delete", "pod", "-n", namespace, name, "--ignore-not-found", "--wait=true", timeout=120)


def _cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "ate_devplugin", *args], capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert out.returncode == 0, f"ate-devplugin {' '.join(args)}: {out.stderr}"
    return out.stdout


@dataclass(frozen=True)
class Profiles:
    """The node's recorded profile and the three restore profiles built of it."""

    recorded: CpuProfile
    built: str  # what restore-profile printed for ``here``
    profiles: dict[str, Any]  # restore_profiles: here, one_more, other_tsc
    lacking: str  # the feature one_more adds, which this node's KVM does not offer
    other_khz: int

    def flipped(self) -> dict[str, Any]:
        """The profiles with one_more asking no more than here: restorable."""
        return {**self.profiles, "one_more": copy.deepcopy(self.profiles["here"])}

    def said(self) -> dict[str, str]:
        """What the daemon's log says of each profile (docs/restore-placement.md's table)."""
        node = self.recorded
        assert node.tsc.khz is not None
        why = "and the profile ignores scaling" if node.tsc.scaling else "and its KVM cannot scale the TSC"
        off = (node.tsc.khz - self.other_khz) * 100 / self.other_khz
        return {
            "here": "restore profile here: restorable",
            "one_more": f"restore profile one_more: not restorable: 1 feature missing: {self.lacking}",
            "other_tsc": f"restore profile other_tsc: not restorable: TSC {self.other_khz} kHz ± 250 ppm wanted, "
            f"this node's is {node.tsc.khz} kHz ({off:+.3g} %) {why}",
        }


def build(text: str, work: Path) -> Profiles:
    """The three profiles of the recorded ``text``, ``here`` built by ``ate-devplugin
    restore-profile`` as an operator runs it."""
    data = json.loads(text[text.index("{") : text.rindex("}") + 1])
    recorded = CpuProfile.from_json(data)
    assert recorded.has_cpuid, text
    assert recorded.tsc.khz, text
    work.mkdir(parents=True, exist_ok=True)
    (work / "node.json").write_text(text)
    built = _cli("restore-profile", "--name", "here", str(work / "node.json"))
    here = yaml.safe_load(built)["here"]
    lacking = sorted(set(FEATURES) - recorded.features)[0]  # 3dnow on these machines' PVM
    other_khz = recorded.tsc.khz * 11 // 10
    # A KVM that scales the TSC passes any frequency with `accept`: then the frequency alone counts.
    scaling = "ignore" if recorded.tsc.scaling else "accept"
    profiles = {
        "here": here,
        "one_more": {**here, "features": [*here["features"], lacking]},
        "other_tsc": {**here, "tsc": {**here["tsc"], "khz": other_khz, "scaling": scaling}},
    }
    return Profiles(recorded, built, profiles, lacking, other_khz)


def excerpt(text: str, features: int = 5) -> str:
    """cpu-profile's JSON with its feature and register lists shortened (for a record)."""
    data = json.loads(text)
    data["features"] = [*data["features"][:features], f"... {len(data['features'])} in all"]
    data["cpuid"] = dict(list(data["cpuid"].items())[:2]) | {"...": f"{len(data['cpuid'])} registers in all"}
    return json.dumps(data, indent=1)


def said(cluster: Cluster, pod: dict[str, Any]) -> list[str]:
    """The daemon pod's log lines about restore profiles, in order."""
    out = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"])
    lines = []
    for line in out.splitlines():
        try:
            msg = str(json.loads(line).get("msg", ""))
        except ValueError:
            continue
        if msg.startswith("restore profile "):
            lines.append(msg)
    return lines


def last_said(cluster: Cluster, pod: dict[str, Any]) -> dict[str, str]:
    """The last line the daemon logged of each profile."""
    found: dict[str, str] = {}
    for line in said(cluster, pod):
        found[line.split()[2].rstrip(":")] = line
    return found


def answers(cluster: Cluster, pod: dict[str, Any]) -> dict[str, str]:
    """ate_devplugin_kvm_restore_answer of the daemon pod: {profile: the answer at 1}."""
    found: dict[str, str] = {}
    for (name, labels), value in metrics(cluster, pod).items():
        if name == ANSWER_METRIC and value == 1:
            label = dict(labels)
            assert label["profile"] not in found, f"two answers at 1 for {label['profile']}"
            found[label["profile"]] = label["answer"]
    return found


def answer_lines(cluster: Cluster, pod: dict[str, Any]) -> list[str]:
    """The daemon pod's /metrics lines of the restore answers at 1, as it serves them."""
    status, text = cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics")
    assert status == 200, text
    return [line for line in text.splitlines() if line.startswith(f"{ANSWER_METRIC}{{") and line.endswith(" 1.0")]


def identity(pod: dict[str, Any]) -> tuple[str, int]:
    """(uid, restartCount) of a daemon pod: the same after a live change."""
    return pod["metadata"]["uid"], pod["status"]["containerStatuses"][0]["restartCount"]


def unschedulable(cluster: Cluster, namespace: str, name: str) -> str:
    """The scheduler's message while the pod cannot be scheduled; "" otherwise."""
    pod = cluster.get_json("pod", "-n", namespace, name)
    for c in pod["status"].get("conditions", []):
        if (c["type"], c["status"], c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(c.get("message") or "")
    return ""
