"""CDI specs: the document for a resource, its name, and the atomic writer."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.config import MountConfig, ResourceConfig
from ate_devplugin.host import cdi
from ate_devplugin.host.cdi import CdiSpecs, _OnDisk, device_id, spec
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.tasks import Guard
from ate_devplugin.view import build

KVM = ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",), allocate="cdi")


KVM_NODE = DeviceNode("/dev/kvm", 10, 232)


def test_device_id_is_kind_and_the_name_after_the_slash() -> None:
    assert device_id("ate.dev/kvm") == "ate.dev/kvm=kvm"
    assert device_id("example.com/vfio.gpu") == "example.com/vfio.gpu=vfio.gpu"
    assert cdi.spec_file_name("ate.dev/kvm") == "ate.dev-kvm.json"


def test_spec_of_a_plain_resource() -> None:
    assert spec(KVM, [KVM_NODE]) == {
        "cdiVersion": "0.3.0",
        "kind": "ate.dev/kvm",
        "devices": [
            {
                "name": "kvm",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232, "permissions": "rw"}]
                },
            }
        ],
    }


def test_spec_carries_mode_owner_mounts_env_and_every_node() -> None:
    resource = ResourceConfig(
        name="ate.dev/vfio",
        devices=("/dev/vfio/*",),
        permissions="rwm",
        mounts=(MountConfig("/etc/ate", "/var/ate"), MountConfig("/scratch", "/srv/scratch", read_only=False)),
        env={"ATE": "1", "B": "x=y"},
        cdi_file_mode=0o666,
        cdi_uid=10001,
        cdi_gid=0,
    )
    nodes = [DeviceNode("/dev/vfio/1", 243, 1), DeviceNode("/dev/vfio/vfio", 10, 196)]
    doc = spec(resource, nodes)
    assert doc["cdiVersion"] == "0.4.0"  # mount type
    (device,) = doc["devices"]
    edits = device["containerEdits"]
    assert [(n["path"], n["major"], n["minor"]) for n in edits["deviceNodes"]] == [
        ("/dev/vfio/1", 243, 1),
        ("/dev/vfio/vfio", 10, 196),
    ]
    assert {(n["fileMode"], n["uid"], n["gid"], n["permissions"]) for n in edits["deviceNodes"]} == {
        (438, 10001, 0, "rwm")
    }
    assert edits["mounts"] == [
        {"hostPath": "/var/ate", "containerPath": "/etc/ate", "type": "bind", "options": ["rbind", "ro"]},
        {"hostPath": "/srv/scratch", "containerPath": "/scratch", "type": "bind", "options": ["rbind", "rw"]},
    ]
    assert edits["env"] == ["ATE=1", "B=x=y"]


def test_a_dot_in_the_class_needs_version_0_6_0() -> None:
    resource = ResourceConfig(name="ate.dev/kvm.v2", devices=("/dev/kvm",))
    assert spec(resource, [KVM_NODE])["cdiVersion"] == "0.6.0"


class Writer:
    """The CDI component on a temporary directory, driven as the daemon drives it."""

    def __init__(self, tmp_path: Path, *resources: ResourceConfig) -> None:
        self.dir = tmp_path / "run" / "cdi"  # made by the first write
        self.metrics = Metrics(CollectorRegistry())
        self.specs = CdiSpecs(str(self.dir), self.metrics)
        self.file = self.dir / "ate.dev-kvm.json"
        self.resources = resources or (KVM,)
        self.nodes: dict[str, tuple[DeviceNode, ...]] = {}

    async def discovered(self, nodes: Sequence[DeviceNode] = (KVM_NODE,), resource: str = KVM.name) -> bool:
        """A discovery of ``nodes`` for ``resource`` (the others as before); whether every
        spec is in place after it."""
        await self.specs.on_resources(self.resources)
        self.nodes[resource] = tuple(nodes)
        self.specs.on_view(
            build(self.resources, {r.name: Discovery(self.nodes.get(r.name, ()), True) for r in self.resources}, {})
        )
        return self.specs.readiness()[0]

    def files(self) -> list[str]:
        return sorted(os.listdir(self.dir)) if self.dir.exists() else []

    def count(self, action: str, result: str, resource: str = "ate.dev/kvm") -> float:
        value = self.metrics.registry.get_sample_value(
            "ate_devplugin_cdi_spec_updates_total", {"resource_name": resource, "action": action, "result": result}
        )
        return value or 0.0


async def test_a_discovery_puts_the_spec_in_place_and_rewrites_it_only_on_change(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    assert await w.discovered([KVM_NODE])
    assert json.loads(w.file.read_text()) == spec(KVM, [KVM_NODE])
    assert w.file.stat().st_mode & 0o777 == 0o644
    assert w.files() == ["ate.dev-kvm.json"]  # no temp file left
    inode = w.file.stat().st_ino

    assert await w.discovered([KVM_NODE])  # the same: untouched
    assert w.file.stat().st_ino == inode
    assert w.count("write", "success") == 1

    nodes = [KVM_NODE, DeviceNode("/dev/kvm1", 10, 233)]
    assert await w.discovered(nodes)  # replaced by rename: a new inode, never a partial file
    assert w.file.stat().st_ino != inode
    assert json.loads(w.file.read_text()) == spec(KVM, nodes)
    assert w.count("write", "success") == 2
    assert w.specs.cdi_ready("ate.dev/kvm")


async def test_no_node_present_means_no_spec(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    assert await w.discovered([])  # never written: nothing to remove
    assert not w.dir.exists()
    assert await w.discovered([KVM_NODE])
    assert await w.discovered([])
    assert not w.file.exists()
    assert w.count("remove", "success") == 1
    assert not w.specs.cdi_ready("ate.dev/kvm")


async def test_remove_all_removes_only_its_own_files(tmp_path: Path) -> None:
    tun = ResourceConfig(name="ate.dev/tun", devices=("/dev/net/tun",), allocate="both")
    w = Writer(tmp_path, KVM, tun)
    await w.discovered([KVM_NODE])
    await w.discovered([DeviceNode("/dev/net/tun", 10, 200)], tun.name)
    (w.dir / "vendor-other.json").write_text("{}")
    w.file.unlink()  # gone already: fine
    assert w.specs.remove_all()
    assert w.files() == ["vendor-other.json"]


async def test_failures_are_counted_said_once_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ate_devplugin")
    w = Writer(tmp_path)
    w.dir.parent.mkdir()
    w.dir.write_text("not a directory")
    assert not await w.discovered([KVM_NODE])
    assert w.count("write", "failure") == 1
    assert not w.specs.sync()  # tried again: counted again, not logged again
    assert w.count("write", "failure") == 2
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("CDI spec not in place")] == [
        f"CDI spec not in place: cannot write {w.file}: Not a directory"
    ]
    w.dir.unlink()
    assert w.specs.sync()  # the retry (with backoff) finds it writable
    assert w.file.exists()
    assert "CDI spec in place again" in [r.getMessage() for r in caplog.records]

    w.file.unlink()
    w.file.mkdir()  # unlink of a directory fails
    (w.file / "x").write_text("")
    assert not w.specs.remove("ate.dev/kvm")
    assert w.count("remove", "failure") == 1
    await w.specs.stop(1.0)


async def test_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    w.dir.mkdir(parents=True)
    w.file.mkdir()  # rename onto a directory fails after the temp file was written
    assert not await w.discovered([KVM_NODE])
    assert w.files() == ["ate.dev-kvm.json"]
    await w.specs.stop(1.0)


async def test_the_directory_is_watched_from_the_start_when_a_resource_uses_cdi(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    assert w.specs.watches().dirs == frozenset()
    await w.specs.start((KVM,), Guard(lambda name, error: None))  # before the first discovery
    assert w.specs.watches().dirs == {str(w.dir)}


async def test_ours_is_restored_a_foreign_spec_is_left_alone(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    assert await w.discovered([KVM_NODE])
    assert w.specs.cdi_ready("ate.dev/kvm")
    tampered = spec(KVM, [DeviceNode("/dev/sda", 8, 0)])
    w.file.write_text(json.dumps(tampered))  # our kind, other nodes: ours to restore
    assert not w.specs.cdi_ready("ate.dev/kvm")
    assert w.specs.sync()
    assert json.loads(w.file.read_text()) == spec(KVM, [KVM_NODE])
    assert w.specs.cdi_ready("ate.dev/kvm")

    foreign = '{"cdiVersion": "0.6.0", "kind": "other.vendor/kvm", "devices": []}'
    w.file.write_text(foreign)
    assert not w.specs.sync()
    assert w.file.read_text() == foreign
    assert "kind 'other.vendor/kvm'" in w.specs.readiness()[1]
    assert not w.specs.cdi_ready("ate.dev/kvm")
    assert "other.vendor/kvm" in w.specs.cdi_problem("ate.dev/kvm")
    assert not w.specs.remove_all()  # not ours: left in place
    assert w.file.read_text() == foreign
    await w.specs.stop(1.0)


async def test_never_through_a_symlinked_directory(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    w.dir.parent.mkdir()
    w.dir.symlink_to(elsewhere)
    assert not await w.discovered([KVM_NODE])
    assert os.listdir(elsewhere) == []
    assert "a symlink in place of the directory" in w.specs.readiness()[1]
    (elsewhere / "ate.dev-kvm.json").write_text(json.dumps(spec(KVM, [KVM_NODE])))
    w.specs._written["ate.dev/kvm"] = _OnDisk(b"", (0, 0, 0, 0))  # as if written before the swap
    assert not w.specs.remove("ate.dev/kvm")
    assert os.listdir(elsewhere) == ["ate.dev-kvm.json"]
    await w.specs.stop(1.0)
