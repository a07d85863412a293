"""The config reader (reload.py): a read that outlives its timeout never blocks the next
one. The slow check is a stand-in that waits on an event the test holds: whether it timed
out never depends on the clock, and the valid file's read gets a generous timeout."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin import config
from ate_devplugin.config import ConfigError, ResourceConfig
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.reload import MAX_LEFT_RUNNING, ConfigReader

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
RUNNING = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"
SLOW = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 1}]  # judged slowly\n"
VALID = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 8}]\n"
SHORT_S = 0.05  # the slow check never ends within it: it waits for the test
LONG_S = 60.0  # the valid file's read ends well within it, however loaded the machine


class SlowChecker:
    """config.read_again, but a file holding "judged slowly" waits until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self.ended = threading.Semaphore(0)  # released as each slow check ends

    def __call__(
        self, path: Path, plugin_dir: str, previous: bytes | None, suffix: str
    ) -> tuple[bytes, tuple[ResourceConfig, ...] | ConfigError | None]:
        if b"judged slowly" in path.read_bytes():
            self.started += 1
            self.release.wait()
            self.ended.release()
        return config.read_again(path, plugin_dir, previous, suffix)


@pytest.fixture
def slow() -> Iterator[SlowChecker]:
    checker = SlowChecker()
    yield checker
    checker.release.set()  # the threads left running end with the test


def reader_of(path: Path, check: SlowChecker) -> tuple[ConfigReader, Metrics]:
    metrics = Metrics(CollectorRegistry())
    return ConfigReader(path, PLUGIN_DIR, metrics, SHORT_S, settle_s=0, check=check), metrics


def failures(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("ate_devplugin_config_reloads_total", {"result": "failure"})


async def test_a_valid_file_after_a_timed_out_read_is_applied_on_its_own(tmp_path: Path, slow: SlowChecker) -> None:
    path = tmp_path / "config.yaml"
    running = config.parse_resources(RUNNING)
    reader, metrics = reader_of(path, slow)
    path.write_text(SLOW)
    assert await reader.read(running) is None  # timed out: the running config stays
    assert slow.started == 1
    assert failures(metrics) == 1
    assert metrics.registry.get_sample_value("ate_devplugin_config_rejected") == 1
    path.write_text(VALID)  # its event's read: the slow one still runs
    reader.timeout_s = LONG_S
    resources = await reader.read(running)
    assert resources is not None
    assert resources[0].units == 8
    assert metrics.registry.get_sample_value("ate_devplugin_config_rejected") == 0


async def test_reads_that_all_hang_cost_a_bounded_number_of_threads(tmp_path: Path, slow: SlowChecker) -> None:
    """A filesystem where every read hangs: a few are left running, then reads are refused
    (counted) until one of them ends, and the next read after that is judged again."""
    path = tmp_path / "config.yaml"
    running = config.parse_resources(RUNNING)
    reader, metrics = reader_of(path, slow)
    path.write_text(SLOW)
    for _ in range(MAX_LEFT_RUNNING + 2):
        assert await reader.read(running) is None
    assert slow.started == MAX_LEFT_RUNNING  # the rest were refused without a thread
    assert failures(metrics) == 2  # "did not finish", then "have not finished": each said once
    slow.release.set()
    for _ in range(MAX_LEFT_RUNNING):
        await asyncio.to_thread(slow.ended.acquire)
    path.write_text(VALID)
    reader.timeout_s = LONG_S
    for _ in range(100):  # a thread's last step (it marks itself ended) may lag its check's end
        if (resources := await reader.read(running)) is not None:
            break
        await asyncio.sleep(0.05)
    assert resources is not None
    assert resources[0].units == 8


async def test_a_profile_that_no_node_can_match_is_warned_about_on_reload(
    tmp_path: Path, slow: SlowChecker, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: "
        "{amd: {vendor: GenuineIntel, kvm_implementations: [svm]}}}]\n"
    )
    reader, _ = reader_of(path, slow)
    reader.timeout_s = LONG_S
    with caplog.at_level(logging.WARNING, "ate_devplugin.reload"):
        resources = await reader.read(config.parse_resources(RUNNING))
    assert resources is not None  # a warning, not a rejection
    assert [r.getMessage() for r in caplog.records] == [
        "config reload: resources[0].restore_profiles.amd.kvm_implementations: cannot match any node: KVM on a "
        "GenuineIntel CPU is vmx or pvm, never svm"
    ]
