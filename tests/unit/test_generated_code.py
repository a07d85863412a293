"""The committed generated API code matches what the proto generates today."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "app/ate_devplugin/api/v1beta1"


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "tools/gen-proto.sh"), str(tmp_path)], check=True, timeout=120)
    fresh = tmp_path / "ate_devplugin/api/v1beta1"
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        assert (fresh / name).read_text() == (GENERATED / name).read_text(), f"{name} drifted: run tools/gen-proto.sh"


def test_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.v1beta1 import api_pb2 as pb

    assert pb.DESCRIPTOR.package == "v1beta1"
    services = {s.full_name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    assert {f.name: f.number for f in pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields} == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert pb.NUMANode.DESCRIPTOR.fields[0].name == "ID"
