"""The facts as an NFD feature file: valid label values, the file's text, atomic writes."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ate_devplugin.kvm import nfd
from ate_devplugin.kvm.attributes import Version, attributes
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts

# A label value as the API server validates it (k8s.io/apimachinery validation.IsValidLabelValue).
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
LABEL_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)

NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc-v1147")
DEVICE = DeviceFacts(12, {"max_vcpus": 1024, "irqchip": 1}, "e4da580d0f0efc260d1b9abad8ce7814", ("cx16", "sse4_1"))


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (True, "true"),
        (167, "167"),
        ("Intel(R) Xeon(R) Processor", "Intel-R-Xeon-R-Processor"),
        ("AMD EPYC 7763 64-Core Processor", "AMD-EPYC-7763-64-Core-Processor"),
        (Version("6.18.44"), "6.18.44"),
        ("-" * 5 + "x" * 70 + "-", "x" * 63),
        ("x" * 62 + "()y", "x" * 62),  # cut at 63, then the edge stripped again
        ("((()))", ""),
    ],
)
def test_values_become_valid_label_values(value: bool | int | str | Version, label: str) -> None:
    assert nfd.label_value(value) == label
    assert LABEL_VALUE.fullmatch(label)


def test_the_labels_are_the_attributes_and_the_features_in_the_drivers_domain() -> None:
    labels = nfd.labels(attributes(NODE, DEVICE), DEVICE.cpu_features, "ate.dev")
    assert labels["ate.dev/kvmImplementation"] == "pvm"
    assert labels["ate.dev/kvmHardware"] == "false"
    assert labels["ate.dev/cpuModelName"] == "Intel-R-Xeon-R-Processor"
    assert labels["ate.dev/cpuid.sse4_1"] == "true"
    assert labels["ate.dev/kvmMaxVcpus"] == "1024"
    assert all(LABEL_NAME.fullmatch(name) and len(name.split("/")[1]) <= 63 for name in labels), labels
    assert all(LABEL_VALUE.fullmatch(value) for value in labels.values())


def test_the_file_lists_the_labels_sorted_with_an_optional_expiry() -> None:
    text = nfd.render({"ate.dev/b": "2", "ate.dev/a": "1"}, datetime(2026, 12, 3, 10, 0, tzinfo=UTC))
    assert text.splitlines()[1:] == ["# +expiry-time=2026-12-03T10:00:00Z", "ate.dev/a=1", "ate.dev/b=2"]
    assert text.startswith("# Written by ate-devplugin")
    assert len(nfd.render({"ate.dev/a": "1"}).splitlines()) == 2  # no expiry: the comment and the label
    with pytest.raises(ValueError, match="nfd-worker reads at most 65536"):
        nfd.render({f"ate.dev/x{i}": "y" * 60 for i in range(2000)})


def test_a_write_replaces_the_file_atomically_and_an_equal_one_is_left_alone(tmp_path: Path) -> None:
    assert nfd.write(str(tmp_path), "a=1\n") is True
    path = tmp_path / nfd.FILE_NAME
    inode = path.stat().st_ino
    assert nfd.write(str(tmp_path), "a=1\n") is False
    assert path.stat().st_ino == inode
    assert nfd.write(str(tmp_path), "a=2\n") is True
    assert (path.read_text(), path.stat().st_ino != inode, oct(path.stat().st_mode & 0o777)) == ("a=2\n", True, "0o644")
    assert sorted(os.listdir(tmp_path)) == [nfd.FILE_NAME]  # no temp file left (NFD skips dot-files anyway)
    with pytest.raises(FileNotFoundError):
        nfd.write(str(tmp_path / "absent"), "a=1\n")
