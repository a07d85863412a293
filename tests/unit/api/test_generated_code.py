"""The committed generated API code matches what the proto generates today."""

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "app/ate_devplugin/api"
PACKAGES = (
    "deviceplugin/v1beta1",
    "pluginregistration/v1",
    "dra/v1",
    "dra/v1beta1",
    "drahealth/v1",
    "drahealth/v1alpha1",
    "podresources/v1",
)


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "tools/gen-proto.sh"), str(tmp_path)], check=True, timeout=120)
    for package in PACKAGES:
        fresh = tmp_path / "ate_devplugin/api" / package
        for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
            committed = (GENERATED / package / name).read_text()
            assert (fresh / name).read_text() == committed, f"{package}/{name} drifted: run tools/gen-proto.sh"


def test_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb

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


def test_registration_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.pluginregistration.v1 import api_pb2 as pb

    assert pb.DESCRIPTOR.package == "pluginregistration"
    service = pb.DESCRIPTOR.services_by_name["Registration"]
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert {f.name: f.number for f in pb.PluginInfo.DESCRIPTOR.fields} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert {f.name: f.number for f in pb.RegistrationStatus.DESCRIPTOR.fields} == {"plugin_registered": 1, "error": 2}


def test_dra_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.dra.v1 import api_pb2 as v1
    from ate_devplugin.api.dra.v1beta1 import api_pb2 as v1beta1

    for pb, version in ((v1, "v1"), (v1beta1, "v1beta1")):
        assert pb.DESCRIPTOR.package == f"k8s.io.kubelet.pkg.apis.dra.{version}"
        service = pb.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
        assert {f.name: f.number for f in pb.Claim.DESCRIPTOR.fields} == {"namespace": 1, "uid": 2, "name": 3}
        assert {f.name: f.number for f in pb.NodePrepareResourceResponse.DESCRIPTOR.fields} == {
            "devices": 1,
            "error": 2,
        }
        assert {f.name: f.number for f in pb.NodeUnprepareResourceResponse.DESCRIPTOR.fields} == {"error": 1}
    device = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert {f.name: f.number for f in v1beta1.Device.DESCRIPTOR.fields} == device
    assert {f.name: f.number for f in v1.Device.DESCRIPTOR.fields} == {**device, "share_id": 5}


def test_dra_health_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.drahealth.v1 import api_pb2 as v1
    from ate_devplugin.api.drahealth.v1alpha1 import api_pb2 as v1alpha1

    for pb, version in ((v1, "v1"), (v1alpha1, "v1alpha1")):
        assert pb.DESCRIPTOR.package == version
        (service,) = pb.DESCRIPTOR.services_by_name.values()
        assert service.full_name == f"{version}.DRAResourceHealth"
        [method] = service.methods
        assert (method.name, method.server_streaming) == ("NodeWatchResources", True)
        assert {v.name: v.number for v in pb.HealthStatus.DESCRIPTOR.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }
        assert {f.name: f.number for f in pb.DeviceIdentifier.DESCRIPTOR.fields} == {"pool_name": 1, "device_name": 2}
        assert {f.name: f.number for f in pb.DeviceHealth.DESCRIPTOR.fields} == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        assert {f.name: f.number for f in pb.NodeWatchResourcesResponse.DESCRIPTOR.fields} == {"devices": 1}


def test_pod_resources_wire_names_are_the_kubelets() -> None:
    from ate_devplugin.api.podresources.v1 import api_pb2 as pb

    assert pb.DESCRIPTOR.package == "v1"
    (service,) = pb.DESCRIPTOR.services_by_name.values()
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    numbers: dict[Any, dict[str, int]] = {
        pb.ListPodResourcesResponse: {"pod_resources": 1},
        pb.PodResources: {"name": 1, "namespace": 2, "containers": 3},
        pb.ContainerResources: {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        pb.ContainerDevices: {"resource_name": 1, "device_ids": 2, "topology": 3},
        pb.DynamicResource: {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
        pb.ClaimResource: {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        pb.GetPodResourcesRequest: {"pod_name": 1, "pod_namespace": 2},
    }
    for message, fields in numbers.items():
        assert {f.name: f.number for f in message.DESCRIPTOR.fields} == fields, message.DESCRIPTOR.name
