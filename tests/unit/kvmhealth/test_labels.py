"""The NFD feature file from the probe's verdicts: written when its text changes, the last
pass's device facts kept while the probe fails, a write error said once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ate_devplugin.kvm import nfd
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvmhealth.labels import FeatureFile

NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc")
DEVICE = DeviceFacts(12, {"max_vcpus": 1024}, "e4da580d", ("cx16", "la57"))


def verdict(reason: Reason, facts: DeviceFacts | None = None) -> ProbeResult:
    return ProbeResult("/dev/kvm", reason, f"/dev/kvm: {reason}", 0.001, device_facts=facts)


def labels(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#"))


def test_the_file_follows_the_verdicts(tmp_path: Path) -> None:
    path = tmp_path / nfd.FILE_NAME
    file = FeatureFile(str(tmp_path), "ate.dev", lambda: NODE)
    file.on_kvm_verdict("ate.dev/kvm", verdict(Reason.NOT_KVM))  # node facts alone
    node_only = labels(path)
    assert node_only["ate.dev/kvmImplementation"] == "pvm"
    assert node_only["ate.dev/kvmHardware"] == "false"
    assert node_only["ate.dev/cpuModelName"] == "Intel-R-Xeon-R-Processor"
    assert "ate.dev/cpuidDigest" not in node_only
    file.on_kvm_verdict("ate.dev/kvm", verdict(Reason.PASSED, DEVICE))
    probed = labels(path)
    assert (probed["ate.dev/cpuidDigest"], probed["ate.dev/kvmApiVersion"]) == ("e4da580d", "12")
    assert (probed["ate.dev/cpuid.cx16"], probed["ate.dev/cpuid.la57"]) == ("true", "true")
    written = path.stat().st_mtime_ns
    file.on_kvm_verdict("ate.dev/kvm", verdict(Reason.RUN))  # failing: the last pass's facts stay
    file.on_kvm_verdict("ate.dev/kvm", None)
    assert labels(path) == probed
    assert path.stat().st_mtime_ns == written  # equal text: not rewritten, nfd-worker not woken


def test_a_directory_it_cannot_write_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    file = FeatureFile(str(tmp_path / "absent"), "ate.dev", lambda: NODE)
    for _ in range(3):
        file.on_kvm_verdict("ate.dev/kvm", verdict(Reason.PASSED, DEVICE))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["cannot write the NFD feature file"]
