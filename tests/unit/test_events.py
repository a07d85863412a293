"""Routing raw filesystem events to typed lifecycle events, one row per situation."""

from __future__ import annotations

import pytest

from ate_devplugin.events import (
    ConfigChanged,
    DirectoryAppeared,
    DirectoryGone,
    Event,
    KubeletSocketCreated,
    Paths,
    PodResourcesChanged,
    SocketGone,
    route,
)
from ate_devplugin.watcher import FsEvent

D = "/var/lib/kubelet/device-plugins"
PATHS = Paths(
    kubelet_socket=f"{D}/kubelet.sock", sockets={f"{D}/kvm.sock": "ate.dev/kvm"}, config="/etc/ate/config.yaml"
)


def fs(kind: str, path: str, dest: str = "", is_dir: bool = False) -> FsEvent:
    return FsEvent(kind=kind, path=path, dest_path=dest, is_directory=is_dir)


ROWS: list[tuple[str, list[FsEvent], list[Event]]] = [
    ("kubelet.sock created", [fs("created", f"{D}/kubelet.sock")], [KubeletSocketCreated()]),
    ("kubelet.sock renamed into place", [fs("moved", f"{D}/.tmp", f"{D}/kubelet.sock")], [KubeletSocketCreated()]),
    ("kubelet.sock deleted: nothing to do until it comes back", [fs("deleted", f"{D}/kubelet.sock")], []),
    ("our socket deleted", [fs("deleted", f"{D}/kvm.sock")], [SocketGone("ate.dev/kvm")]),
    ("a file renamed over our socket", [fs("moved", f"{D}/intruder", f"{D}/kvm.sock")], [SocketGone("ate.dev/kvm")]),
    ("our socket renamed away", [fs("moved", f"{D}/kvm.sock", f"{D}/elsewhere")], [SocketGone("ate.dev/kvm")]),
    ("another plugin's socket: nothing", [fs("created", f"{D}/other.sock"), fs("deleted", f"{D}/other.sock")], []),
    ("a device node: no event, rediscovery follows every batch", [fs("created", "/dev/kvm")], []),
    ("config edited in place", [fs("closed", "/etc/ate/config.yaml")], [ConfigChanged()]),
    ("ConfigMap ..data swap", [fs("moved", "/etc/ate/..data_tmp", "/etc/ate/..data")], [ConfigChanged()]),
    ("many config events: one reload", [fs("closed", "/etc/ate/config.yaml")] * 5, [ConfigChanged()]),
    ("a watched directory removed", [fs("deleted", "/dev/net", is_dir=True)], [DirectoryGone("/dev/net")]),
    (
        "a directory made (perhaps the plugin dir)",
        [fs("created", "/var/lib/kubelet", is_dir=True)],
        [DirectoryAppeared()],
    ),
]


@pytest.mark.parametrize(("why", "batch", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_route(why: str, batch: list[FsEvent], expected: list[Event]) -> None:
    assert route(batch, PATHS) == expected, why


def test_no_config_file_no_config_events() -> None:
    paths = Paths(kubelet_socket=PATHS.kubelet_socket, sockets={}, config=None)
    assert route([fs("closed", "/etc/ate/config.yaml")], paths) == []


POD_PATHS = Paths(
    kubelet_socket=PATHS.kubelet_socket,
    sockets={},
    config=None,
    checkpoint=f"{D}/kubelet_internal_checkpoint",
    pod_resources_socket="/var/lib/kubelet/pod-resources/kubelet.sock",
)
POD_ROWS: list[tuple[str, list[FsEvent], list[Event]]] = [
    (
        "checkpoint rewritten (temp file renamed over it)",
        [
            fs("created", f"{D}/.tmp1"),
            fs("closed", f"{D}/.tmp1"),
            fs("moved", f"{D}/.tmp1", f"{D}/kubelet_internal_checkpoint"),
        ],
        [PodResourcesChanged()],
    ),
    ("checkpoint written in place", [fs("closed", f"{D}/kubelet_internal_checkpoint")], [PodResourcesChanged()]),
    ("checkpoint removed: nothing", [fs("deleted", f"{D}/kubelet_internal_checkpoint")], []),
    (
        "PodResources socket made anew",
        [fs("created", "/var/lib/kubelet/pod-resources/kubelet.sock")],
        [PodResourcesChanged()],
    ),
    ("PodResources socket gone: nothing", [fs("deleted", "/var/lib/kubelet/pod-resources/kubelet.sock")], []),
]


@pytest.mark.parametrize(("why", "batch", "expected"), POD_ROWS, ids=[r[0] for r in POD_ROWS])
def test_route_pod_resources(why: str, batch: list[FsEvent], expected: list[Event]) -> None:
    assert route(batch, POD_PATHS) == expected, why


def test_pods_not_read_no_pod_events() -> None:
    paths = Paths(kubelet_socket=PATHS.kubelet_socket, sockets={}, config=None)
    assert route([fs("moved", f"{D}/.tmp", f"{D}/kubelet_internal_checkpoint")], paths) == []
