"""Routing raw filesystem events to typed lifecycle events, one row per situation."""

from __future__ import annotations

import pytest

from ate_devplugin.deviceplugin.events import (
    ConfigChanged,
    DirectoryAppeared,
    DirectoryGone,
    Event,
    KubeletSocketCreated,
    Paths,
    PodResourcesChanged,
    SocketGone,
    matters,
    route,
)
from ate_devplugin.host.watcher import FsEvent

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


@pytest.mark.parametrize(
    ("event", "quiet_dir", "kept"),
    [
        # The kubelet's checkpoint rewrite: a temporary file written, then renamed over.
        (fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), D, False),
        (fs("closed", f"{D}/.kubelet_internal_checkpoint.tmp"), D, False),
        (fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", f"{D}/kubelet_internal_checkpoint"), D, False),
        (fs("created", f"{D}/kubelet.sock"), D, True),
        (fs("deleted", f"{D}/kvm.sock"), D, True),
        (fs("moved", f"{D}/x.tmp", f"{D}/kvm.sock"), D, True),
        (fs("moved", f"{D}/checkpoint", "/elsewhere/checkpoint"), D, True),
        (fs("created", f"{D}/sub", is_dir=True), D, True),
        (fs("deleted", D, is_dir=True), D, True),
        # Not quiet (nothing given, or another directory): everything is kept.
        (fs("created", f"{D}/kubelet_internal_checkpoint"), None, True),
        (fs("created", "/dev/kvm"), D, True),
    ],
)
def test_only_sockets_and_directories_matter_in_the_quiet_directory(
    event: FsEvent, quiet_dir: str | None, kept: bool
) -> None:
    assert matters(event, quiet_dir) is kept


def test_the_checkpoint_matters_while_pods_are_read() -> None:
    checkpoint = f"{D}/kubelet_internal_checkpoint"
    renamed = fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", checkpoint)
    assert matters(renamed, D, also=checkpoint)
    assert matters(fs("closed", checkpoint), D, also=checkpoint)
    assert not matters(fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), D, also=checkpoint)


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
