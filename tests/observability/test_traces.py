"""Spans received by a real OTLP/gRPC receiver while the daemon works with the kubelet."""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.daemon import MakeDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.kubelet import KubeletBench
from tests.harness.monitoring import PREFERRED_CONFIG
from tests.harness.otlp import OtlpReceiver, ReceivedSpan

KVM = "ate.dev/kvm"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # OTLP SpanKind numbers


def only(spans: list[ReceivedSpan], what: str) -> ReceivedSpan:
    """The one span of ``spans``; else a failure that shows them all."""
    shown = "\n".join(f"  {s.name} {s.attributes} parent={s.parent_span_id} span={s.span_id}" for s in spans)
    assert len(spans) == 1, f"{len(spans)} spans of {what}, not one:\n{shown}"
    return spans[0]


def test_spans_follow_rpc_conventions_and_link_causes(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path
) -> None:
    with OtlpReceiver() as otlp:
        d = daemon(
            PREFERRED_CONFIG,
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_TRACES_SAMPLER": "always_on",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
                "K8S_NODE_NAME": "node-7",
                "K8S_POD_NAME": "ate-devplugin-x1",
                "K8S_NAMESPACE_NAME": "ate-system",
            },
        )
        kubelet.wait(KVM, allocatable=4096, timeout=30)
        kubelet.allocate("pod-a", "vm", {KVM: 1})
        kubelet.restart()
        kubelet.wait(KVM, allocatable=4096, timeout=30)
        remove_device_node(device_root, "kvm")
        kubelet.wait(KVM, allocatable=0, timeout=30)
        add_device_node(device_root, "kvm", "/dev/kvm")
        kubelet.wait(KVM, allocatable=4096, timeout=30)
        exemplars = openmetrics_exemplars(d.get("/metrics", {"Accept": "application/openmetrics-text"})[1])
        assert d.stop() == 0  # shutdown flushes the batch processor
        spans = otlp.spans

    def find(name: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.name == name]

    resource = spans[0].resource
    assert resource["service.name"] == "ate-devplugin"
    assert resource["k8s.node.name"] == "node-7"
    assert resource["k8s.pod.name"] == "ate-devplugin-x1"
    assert resource["k8s.namespace.name"] == "ate-system"
    assert resource["deployment.environment"] == "test"
    assert "service.version" in resource

    # Server spans of the kubelet's calls, with RPC attributes and status.
    allocate = only(find("v1beta1.DevicePlugin/Allocate"), "Allocate")
    assert allocate.kind == SERVER
    assert allocate.attributes["rpc.system"] == "grpc"
    assert allocate.attributes["rpc.service"] == "v1beta1.DevicePlugin"
    assert allocate.attributes["rpc.method"] == "Allocate"
    assert allocate.attributes["rpc.grpc.status_code"] == 0
    assert allocate.attributes["ate_devplugin.resource_name"] == KVM
    assert find("v1beta1.DevicePlugin/GetPreferredAllocation")

    # Register is a client span; the one after the restart is a child of the restart. The
    # new kubelet removes our socket as it starts: serving anew may register with it before
    # its own socket's change is seen, and the restart then registers once more.
    # That first attempt is abandoned (CANCELLED) if the restart is seen while it runs.
    registers = find("v1beta1.Registration/Register")
    assert all(r.kind == CLIENT for r in registers)
    codes = sorted(r.attributes["rpc.grpc.status_code"] for r in registers)
    assert codes in ([0, 0], [0, 0, 0], [0, 0, 1]), codes
    # One per registration the kubelet received (an abandoned one may have been).
    assert 2 <= len(find("v1beta1.DevicePlugin/GetDevicePluginOptions")) <= len(registers)
    restart = only(find("kubelet restart"), "the kubelet restart")
    assert restart.kind == INTERNAL
    assert any(r.parent_span_id == restart.span_id and r.trace_id == restart.trace_id for r in registers)

    # Each ListAndWatch update is its own short span; a device change parents the update it
    # causes on every stream open then (the killed kubelet's may not have ended yet).
    updates = find("v1beta1.DevicePlugin/ListAndWatch update")
    assert len(updates) >= 4  # two connects, one loss, one return
    assert {u.attributes["ate_devplugin.units"] for u in updates} == {4096}
    changes = [c for c in find("device change") if c.attributes["ate_devplugin.health"] == "Unhealthy"]
    loss = only(changes, "the device's loss")
    caused = [u for u in updates if u.parent_span_id == loss.span_id]
    assert caused
    assert all(u.attributes["ate_devplugin.health"] == "Unhealthy" and u.trace_id == loss.trace_id for u in caused)
    assert all(u.end_ns - u.start_ns < 5e9 for u in updates)

    # The Allocate histogram's exemplar points at the received Allocate span's trace.
    assert exemplars, "no exemplar on ate_devplugin_allocate_duration_seconds"
    assert allocate.trace_id in exemplars


def openmetrics_exemplars(body: bytes) -> set[str]:
    """trace_id values of exemplars on the Allocate histogram buckets."""
    found = set()
    for line in body.decode().splitlines():
        if line.startswith("ate_devplugin_allocate_duration_seconds_bucket") and " # " in line:
            match = re.search(r'trace_id="([0-9a-f]{32})"', line)
            if match:
                found.add(match.group(1))
    return found


def test_tracing_is_off_without_endpoint(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    with OtlpReceiver() as otlp:
        d = daemon(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SDK_DISABLED": ""})
        kubelet.wait(KVM, allocatable=4096, timeout=30)
        kubelet.allocate("pod-a", "vm", {KVM: 1})
        body = d.get("/metrics", {"Accept": "application/openmetrics-text"})[1]
        assert d.stop() == 0
        assert otlp.spans == []
    assert openmetrics_exemplars(body) == set()
