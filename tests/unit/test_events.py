"""Routing raw filesystem events to what they mean, one row per situation: the device
plugin's typed events, the config file, removed directories, the quiet directory's filter
and the PodResources triggers."""

from __future__ import annotations

import pytest

from ate_devplugin.deviceplugin.events import DirectoryAppeared, Event, KubeletSocketCreated, SocketGone, route
from ate_devplugin.deviceplugin.podresources import asks_for_list
from ate_devplugin.host.watcher import FsEvent, matters, removed_dirs, touches

D = "/var/lib/kubelet/device-plugins"
KUBELET = f"{D}/kubelet.sock"
SOCKETS = {f"{D}/kvm.sock": "ate.dev/kvm"}
CONFIG_DIR = "/etc/ate"


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
    ("the config file: not the device plugin's", [fs("closed", "/etc/ate/config.yaml")], []),
    (
        "a directory made (perhaps the plugin dir)",
        [fs("created", "/var/lib/kubelet", is_dir=True)],
        [DirectoryAppeared()],
    ),
    ("many events of one kind: one event", [fs("deleted", f"{D}/kvm.sock")] * 3, [SocketGone("ate.dev/kvm")]),
]


@pytest.mark.parametrize(("why", "batch", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_route(why: str, batch: list[FsEvent], expected: list[Event]) -> None:
    assert route(batch, KUBELET, SOCKETS) == expected, why


CONFIG_ROWS: list[tuple[str, list[FsEvent], bool]] = [
    ("config edited in place", [fs("closed", "/etc/ate/config.yaml")], True),
    ("ConfigMap ..data swap", [fs("moved", "/etc/ate/..data_tmp", "/etc/ate/..data")], True),
    ("renamed into the directory", [fs("moved", "/tmp/x", "/etc/ate/config.yaml")], True),
    ("another directory", [fs("closed", "/etc/other/config.yaml")], False),
    ("a device node", [fs("created", "/dev/kvm")], False),
]


@pytest.mark.parametrize(("why", "batch", "changed"), CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_config_events(why: str, batch: list[FsEvent], changed: bool) -> None:
    assert touches(batch, CONFIG_DIR) is changed, why


def test_removed_directories_are_named() -> None:
    batch = [
        fs("deleted", "/dev/net", is_dir=True),
        fs("moved", "/dev/old", "/dev/new", is_dir=True),
        fs("deleted", "/dev/kvm"),
        fs("created", "/dev/made", is_dir=True),
    ]
    assert removed_dirs(batch) == ["/dev/net", "/dev/old"]


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
    assert matters(event, {quiet_dir} if quiet_dir else set()) is kept


def test_the_checkpoint_matters_while_pods_are_read() -> None:
    checkpoint = f"{D}/kubelet_internal_checkpoint"
    renamed = fs("moved", f"{D}/.kubelet_internal_checkpoint.tmp", checkpoint)
    assert matters(renamed, {D}, also={checkpoint})
    assert matters(fs("closed", checkpoint), {D}, also={checkpoint})
    assert not matters(fs("created", f"{D}/.kubelet_internal_checkpoint.tmp"), {D}, also={checkpoint})


CHECKPOINT = f"{D}/kubelet_internal_checkpoint"
POD_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
POD_ROWS: list[tuple[str, list[FsEvent], bool]] = [
    (
        "checkpoint rewritten (temp file renamed over it)",
        [
            fs("created", f"{D}/.tmp1"),
            fs("closed", f"{D}/.tmp1"),
            fs("moved", f"{D}/.tmp1", f"{D}/kubelet_internal_checkpoint"),
        ],
        True,
    ),
    ("checkpoint written in place", [fs("closed", f"{D}/kubelet_internal_checkpoint")], True),
    ("checkpoint removed: nothing", [fs("deleted", f"{D}/kubelet_internal_checkpoint")], False),
    ("PodResources socket made anew", [fs("created", POD_SOCKET)], True),
    ("PodResources socket gone: nothing", [fs("deleted", POD_SOCKET)], False),
]


@pytest.mark.parametrize(("why", "batch", "asks"), POD_ROWS, ids=[r[0] for r in POD_ROWS])
def test_what_asks_for_a_pod_resources_list(why: str, batch: list[FsEvent], asks: bool) -> None:
    assert asks_for_list(batch, CHECKPOINT, POD_SOCKET) is asks, why


def test_pods_not_read_by_the_device_plugin_no_checkpoint_events() -> None:
    assert not asks_for_list([fs("moved", f"{D}/.tmp", CHECKPOINT)], None, POD_SOCKET)
