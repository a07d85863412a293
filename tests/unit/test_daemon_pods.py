"""The daemon reading which pods hold units: what makes it list again (real inotify on
temporary directories, a fake PodResources server on a unix socket)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.podresources import PodResourcesWatch
from ate_devplugin.host.devices import Discovery
from ate_devplugin.host.watcher import FsEvent
from tests.unit.fakes import until
from tests.unit.test_daemon import Setup, running
from tests.unit.test_podresources import KVM, FakeLister, pod, serve


class Pods:
    def __init__(self, tmp_path: Path, setup: Setup, lister: FakeLister, server: grpc.aio.Server) -> None:
        self.s = setup
        self.lister = lister
        self.server = server
        self.plugins = tmp_path / "plugins"

    def write_checkpoint(self) -> None:
        """As the kubelet's device manager does: a temporary file renamed over it."""
        tmp = self.plugins / ".tmp-checkpoint"
        tmp.write_text("{}")
        os.rename(tmp, self.plugins / "kubelet_internal_checkpoint")


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[Pods]:
    (tmp_path / "pod-resources").mkdir()
    lister = FakeLister()
    lister.pods = [pod("vm", "worker", ("vmm", KVM, 1))]
    server = await serve(tmp_path / "pod-resources/kubelet.sock", lister)
    setup = Setup(tmp_path, flags={"pod_resources": "on", "pod_resources_interval": "0"}, pod_resources_debounce_s=0.0)
    try:
        yield Pods(tmp_path, setup, lister, server)
    finally:
        await server.stop(None)


def units(s: Setup, pod_name: str) -> float | None:
    return s.sample("ate_devplugin_pod_units", resource_name=KVM, namespace="vm", pod=pod_name, container="vmm")


async def test_the_checkpoint_written_lists_again(pods: Pods) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    pods.lister.pods.append(pod("vm", "new", ("vmm", KVM, 1)))
    pods.write_checkpoint()
    await until(lambda: units(s, "new") == 1, "a List after the checkpoint was written")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_new_pod_resources_socket_is_dialled(pods: Pods) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    calls = pods.lister.calls
    s.daemon.put(FsEvent("created", s.settings.pod_resources_socket, "", False))
    await until(lambda: pods.lister.calls > calls, "a List on the new socket")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_lost_device_counts_and_names_the_pods_holding_it(pods: Pods, caplog: pytest.LogCaptureFixture) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    assert s.sample("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0

    def absent(config: ResourceConfig, root: str) -> Discovery:
        return Discovery(nodes=(), complete=False)

    s.daemon._discover = absent
    s.daemon.put(FsEvent("deleted", "/dev/kvm", "", False))
    await until(lambda: s.sample("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 1, "counted")
    await until(lambda: any(r.message.startswith("device lost") for r in caplog.records), "logged")
    (line,) = [r for r in caplog.records if r.message.startswith("device lost")]
    assert line.levelno == logging.WARNING
    assert line.__dict__["pods"] == ["vm/worker"]
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_off_by_default_reads_no_pods(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    task = await running(s)
    assert not [c for c in s.daemon.components if isinstance(c, PodResourcesWatch)]
    assert s.sample("ate_devplugin_pod_resources_requests_total", result="unavailable") is None
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
