"""What filesystem events mean to the device plugin, one row per situation."""

from __future__ import annotations

import pytest

from ate_devplugin.deviceplugin.events import DirectoryAppeared, Event, KubeletSocketCreated, SocketGone, route
from ate_devplugin.host.watcher import FsEvent

D = "/var/lib/kubelet/device-plugins"


KUBELET = f"{D}/kubelet.sock"


SOCKETS = {f"{D}/kvm.sock": "ate.dev/kvm"}


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
