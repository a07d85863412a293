"""The DRA driver: registration, node service and device health over real gRPC sockets,
slices on a fake API server."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from ate_devplugin.api.dra.v1 import api_pb2 as v1
from ate_devplugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from ate_devplugin.api.dra.v1beta1 import api_pb2 as v1beta1
from ate_devplugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from ate_devplugin.api.pluginregistration.v1 import api_pb2 as reg
from ate_devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from ate_devplugin.components import ClaimsChanged, Notice
from ate_devplugin.config import DEFAULT_RESOURCES, ResourceConfig
from ate_devplugin.cpu.restore import Answer
from ate_devplugin.dra import service
from ate_devplugin.dra.kube import ApiError
from ate_devplugin.dra.plugin import DraPlugin
from ate_devplugin.dra.service import MAX_CLAIMS_PER_CALL, ClaimRef
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvmstate import KvmState, KvmStates
from ate_devplugin.observability.logs import MAX_REASON
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.settings import DRA_DRIVER, DraSettings, Settings, resolve
from ate_devplugin.tasks import Guard
from ate_devplugin.view import build
from tests.unit.dra.fakes import FakeApi, cdi_id
from tests.unit.fakes import until

NODE = "node-a"


KVM = DEFAULT_RESOURCES[0]


PRESENT = {KVM.name: Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True)}


ABSENT = {KVM.name: Discovery(nodes=(), complete=False)}


def dra_settings(tmp_path: Path, **flags: str) -> Settings:
    return resolve(
        {
            "mode": "dra",
            "registry_dir": str(tmp_path / "plugins_registry"),
            "dra_dir": str(tmp_path / "plugins" / DRA_DRIVER),
            "dra_slots": "4",
            **flags,
        },
        {"NODE_NAME": NODE},
    )


NODE_FACTS = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc")


SLOTS = [f"ate-dev-kvm-{i}" for i in range(4)]
SHARED = "ate-dev-kvm"


class Rig:
    def __init__(
        self, tmp_path: Path, consumable_capacity: bool = True, kvm_facts: NodeFacts | None = None, **flags: str
    ) -> None:
        """``kvm_facts``: the KVM probe runs, and at start tells this node's facts with no verdict yet."""
        self.settings = dra_settings(tmp_path, **flags).part(DraSettings)
        self.api = FakeApi()
        self.registry = CollectorRegistry()
        self.cdi_problems: dict[str, str] = {}  # resource -> why its CDI spec is not on disk
        self.plugin = DraPlugin(
            self.settings,
            self.api,
            cdi_id,
            DraMetrics(self.registry),
            NoOpTracer(),
            lambda resource: self.cdi_problems.get(resource, ""),
        )
        self.notices: list[Notice] = []  # what it tells the other components
        self.plugin.tell_to(self.notices.append)
        self.kvm_facts = kvm_facts
        self.api.consumable_capacity = consumable_capacity
        self.deaths: list[str] = []
        self.guard = Guard(lambda name, error: self.deaths.append(name))
        self.resources: tuple[ResourceConfig, ...] = (KVM,)
        self.found: dict[str, Discovery] = {}  # the last discovery
        self.kvm: KvmStates = {}  # the last KVM state told

    async def start(self) -> None:
        await self.plugin.start(self.resources, self.guard)
        if self.kvm_facts is not None:
            self.tell_kvm(None)

    def discover(self, found: dict[str, Discovery]) -> None:
        """A batch's view, as the daemon builds it (view.build), of the last KVM state told."""
        self.found = found
        self.plugin.on_view(build(self.resources, found, self.kvm))

    async def reload(self, resources: tuple[ResourceConfig, ...]) -> None:
        self.resources = resources
        await self.plugin.on_resources(resources)

    def tell_kvm(
        self, verdict: ProbeResult | None, facts: DeviceFacts | None = None, restore: tuple[Answer, ...] = ()
    ) -> None:
        """The KVM state as the KVM health component tells it: the daemon renders a new view."""
        assert self.kvm_facts is not None
        self.tell_states({KVM.name: KvmState("/dev/kvm", verdict, self.kvm_facts, facts, restore)})

    def tell_states(self, states: KvmStates) -> None:
        self.kvm = states
        if self.found:
            self.discover(self.found)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def channel(self, path: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{path}")


@pytest.fixture
async def rig(tmp_path: Path) -> Any:
    rig = Rig(tmp_path)
    await rig.start()
    rig.discover(PRESENT)
    await until(lambda: rig.plugin.publisher.synced.is_set(), "slices published")
    yield rig
    if rig.plugin._servers:
        await rig.plugin.stop(2.0)


def allocated(
    *devices: str, request: str = "kvm", pool: str = NODE, driver: str = DRA_DRIVER, share: str = ""
) -> list[dict[str, Any]]:
    results = [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]
    return [{**r, "shareID": share} if share else r for r in results]


async def test_registration_tells_the_kubelet_the_driver_and_every_version(rig: Rig) -> None:
    sock = rig.settings.registration_socket
    assert sock.endswith(f"plugins_registry/{DRA_DRIVER}-reg.sock")
    assert os.stat(sock).st_mode & 0o777 == 0o600
    async with rig.channel(sock) as channel:
        stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        info = await stub.GetInfo(reg.InfoRequest())
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRA_DRIVER, rig.settings.socket)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        assert rig.plugin.readiness() == (False, "DRA driver not registered with the kubelet")
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="bad name"))
        assert rig.plugin.readiness() == (False, "DRA driver not registered with the kubelet: bad name")
        assert rig.sample("ate_devplugin_dra_registered") == 0
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
    assert rig.plugin.readiness() == (True, "DRA driver registered, slices published")
    assert rig.sample("ate_devplugin_dra_registered") == 1


@pytest.mark.parametrize(("pb", "grpc_mod"), [(v1, v1_grpc), (v1beta1, v1beta1_grpc)])
async def test_prepare_answers_the_cdi_device_of_each_allocated_slot(rig: Rig, pb: Any, grpc_mod: Any) -> None:
    rig.api.add_claim("ns", "one", "u1", allocated("ate-dev-kvm-0", request="kvm/fast"))
    rig.api.add_claim("ns", "two", "u2", allocated("ate-dev-kvm-3") + allocated("gpu-0", driver="other.example"))
    claims = [pb.Claim(namespace="ns", uid="u1", name="one"), pb.Claim(namespace="ns", uid="u2", name="two")]
    async with rig.channel(rig.settings.socket) as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        for _ in range(2):  # again, as after a kubelet restart: the same answer
            response = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims))
            assert set(response.claims) == {"u1", "u2"}
            for uid, device in (("u1", "ate-dev-kvm-0"), ("u2", "ate-dev-kvm-3")):
                answer = response.claims[uid]
                assert answer.error == ""
                assert [
                    (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices
                ] == [(["kvm"], NODE, device, ["ate.dev/kvm=kvm"])]
        assert rig.plugin.driver.prepared == {"u1", "u2"}
        assert rig.sample("ate_devplugin_dra_claims_prepared") == 2
        gone = await stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[*claims, pb.Claim(namespace="ns", uid="never", name="seen")])
        )
        assert set(gone.claims) == {"u1", "u2", "never"}
        assert all(answer.error == "" for answer in gone.claims.values())
    assert rig.sample("ate_devplugin_dra_claims_prepared") == 0
    assert rig.sample("ate_devplugin_dra_claims_total", method="NodePrepareResources", result="success") == 4
    assert rig.sample("ate_devplugin_dra_claims_total", method="NodeUnprepareResources", result="success") == 3
    assert rig.sample("ate_devplugin_dra_call_duration_seconds_count", method="NodePrepareResources") == 2


async def test_prepare_fails_each_bad_claim_alone(rig: Rig) -> None:
    rig.api.add_claim("ns", "ok", "u-ok", allocated("ate-dev-kvm-1"))
    rig.api.add_claim("ns", "pending", "u-p", None)
    rig.api.add_claim("ns", "replaced", "u-new", allocated("ate-dev-kvm-1"))
    rig.api.add_claim("ns", "stray", "u-s", allocated("ate-dev-kvm-99"))
    rig.api.add_claim("ns", "elsewhere", "u-e", allocated("ate-dev-kvm-1", pool="node-b"))
    names = {"ok": "u-ok", "pending": "u-p", "replaced": "u-old", "stray": "u-s", "elsewhere": "u-e", "gone": "u-g"}
    claims = [v1.Claim(namespace="ns", uid=uid, name=name) for name, uid in names.items()]
    async with rig.channel(rig.settings.socket) as channel:
        response = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(  # type: ignore[no-untyped-call]
            v1.NodePrepareResourcesRequest(claims=claims)
        )
    errors = {uid: answer.error for uid, answer in response.claims.items()}
    assert errors == {
        "u-ok": "",
        "u-p": "claim ns/pending is not allocated",
        "u-old": "claim ns/replaced was replaced: UID u-new, expected u-old",
        "u-s": "claim ns/stray: device ate-dev-kvm-99 is not published by this node",
        "u-e": "claim ns/elsewhere: device ate-dev-kvm-1 is from pool node-b, not this node's pool node-a",
        "u-g": "claim ns/gone not found",
    }
    assert rig.sample("ate_devplugin_dra_claims_total", method="NodePrepareResources", result="error") == 5
    rig.api.claim_error = RuntimeError("connection refused")
    result = await rig.plugin.driver.prepare([ClaimRef("ns", "u-ok", "ok")])
    assert result["u-ok"].error == "cannot read claim ns/ok: connection refused"


async def test_slices_carry_the_slots_the_owner_and_the_pool(rig: Rig) -> None:
    [item] = rig.api.slices.values()
    assert item["metadata"]["name"].startswith(f"{NODE}-{DRA_DRIVER}-")
    assert item["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-of-{NODE}", "controller": True}
    ]
    spec = item["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRA_DRIVER,
        NODE,
        {"name": NODE, "generation": 1, "resourceSliceCount": 1},
    )
    assert [d["name"] for d in spec["devices"]] == [SHARED, *SLOTS]
    assert spec["devices"][0]["allowMultipleAllocations"] is True
    assert spec["devices"][0]["capacity"]["shares"]["value"] == str(KVM.units)
    assert spec["devices"][1] == {"name": SLOTS[0], "attributes": {"resource": {"string": "ate.dev/kvm"}}}
    assert rig.sample("ate_devplugin_dra_slice_devices", resource_name="ate.dev/kvm") == 5
    assert rig.sample("ate_devplugin_dra_sharing", model="capacity") == 1
    assert rig.sample("ate_devplugin_dra_sharing", model="slots") == 0
    assert rig.sample("ate_devplugin_dra_slices_in_sync") == 1


async def test_each_health_change_of_a_resource_is_timed(tmp_path: Path) -> None:
    """The "since" of the dashboards: set when the devices' health flips, kept otherwise,
    gone with the resource."""
    rig = Rig(tmp_path)
    await rig.start()
    changed = "ate_devplugin_device_health_last_change_timestamp_seconds"
    try:
        rig.discover(ABSENT)
        assert rig.sample(changed, resource_name=KVM.name) == 0, "absent from the start: no change yet"
        rig.discover(PRESENT)
        present_at = rig.sample(changed, resource_name=KVM.name)
        assert present_at is not None
        assert time.time() - 60 < present_at <= time.time()
        rig.discover(PRESENT)
        assert rig.sample(changed, resource_name=KVM.name) == present_at
        await asyncio.sleep(0.01)
        rig.discover(ABSENT)
        lost_at = rig.sample(changed, resource_name=KVM.name)
        assert lost_at is not None
        assert present_at < lost_at <= time.time()
        await rig.reload(())
        rig.discover({})
        assert rig.sample(changed, resource_name=KVM.name) is None
    finally:
        await rig.plugin.stop(2.0)


async def test_slices_follow_device_health_and_come_back_after_a_wipe(rig: Rig) -> None:
    rig.discover(ABSENT)
    await until(lambda: rig.api.devices() == [], "slots withdrawn")
    [item] = rig.api.slices.values()  # an empty pool is still published
    assert item["spec"]["pool"]["generation"] == 2
    rig.discover(PRESENT)
    await until(lambda: len(rig.api.devices()) == 5, "devices back")
    writes = len(rig.api.writes)
    rig.api.wipe()  # the kubelet started
    await until(lambda: len(rig.api.devices()) == 5, "slices written again")
    assert rig.api.writes[writes:] == ["create"]
    [item] = rig.api.slices.values()
    assert item["spec"]["pool"]["generation"] == 4


async def test_many_slots_take_several_slices_and_failed_writes_are_retried(tmp_path: Path) -> None:
    rig = Rig(tmp_path, dra_slots="300")
    rig.plugin.publisher.retry_s = 0.01
    rig.api.fail_writes = 2
    await rig.start()
    try:
        rig.discover(PRESENT)
        await until(lambda: len(rig.api.devices()) == 301, "three slices")
        counts = sorted(len(s["spec"]["devices"]) for s in rig.api.slices.values())
        assert counts == [45, 128, 128]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in rig.api.slices.values()} == {3}
        assert rig.sample("ate_devplugin_dra_slice_writes_total", op="create", result="failure") == 2
        rig.discover(ABSENT)
        await until(lambda: len(rig.api.slices) == 1 and rig.api.devices() == [], "down to one empty slice")
    finally:
        await rig.plugin.stop(2.0)


async def test_stop_removes_sockets_and_slices(rig: Rig) -> None:
    await rig.plugin.stop(2.0)
    assert not os.path.exists(rig.settings.registration_socket)
    assert not os.path.exists(rig.settings.socket)
    assert rig.api.slices == {}
    assert rig.api.closed


async def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    os.makedirs(os.path.dirname(rig.settings.socket))
    Path(rig.settings.socket).write_text("left behind")
    await rig.start()
    try:
        async with rig.channel(rig.settings.socket) as channel:
            response = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(  # type: ignore[no-untyped-call]
                v1.NodeUnprepareResourcesRequest(claims=[v1.Claim(namespace="n", uid="u", name="c")])
            )
        assert list(response.claims) == ["u"]
    finally:
        await rig.plugin.stop(2.0)


# --- bounds: what a call may hold, reasons never empty, names, the kubelet's error ---


async def test_a_call_with_too_many_claims_reads_the_first_and_refuses_each_of_the_rest(rig: Rig) -> None:
    count = MAX_CLAIMS_PER_CALL + 50
    for i in range(count):
        rig.api.add_claim("ns", f"c{i}", f"u{i}", allocated("ate-dev-kvm-0"))
    claims = [v1.Claim(namespace="ns", uid=f"u{i}", name=f"c{i}") for i in range(count)]
    async with rig.channel(rig.settings.socket) as channel:
        response = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(  # type: ignore[no-untyped-call]
            v1.NodePrepareResourcesRequest(claims=claims)
        )
    errors = [response.claims[f"u{i}"].error for i in range(count)]
    assert errors[:MAX_CLAIMS_PER_CALL] == [""] * MAX_CLAIMS_PER_CALL
    assert set(errors[MAX_CLAIMS_PER_CALL:]) == {
        f"more than {MAX_CLAIMS_PER_CALL} claims in one call; this one is not read"
    }
    assert rig.api.claim_reads == MAX_CLAIMS_PER_CALL


@pytest.mark.parametrize("error", [TimeoutError(), RuntimeError(""), ApiError(0, "GET x: no answer within 5s")])
async def test_every_failure_has_a_reason(rig: Rig, error: Exception) -> None:
    rig.api.add_claim("ns", "ok", "u-ok", allocated("ate-dev-kvm-1"))
    rig.api.claim_error = error
    [result] = (await rig.plugin.driver.prepare([ClaimRef("ns", "u-ok", "ok")])).values()
    assert result.error.startswith("cannot read claim ns/ok: ")
    assert result.error.removeprefix("cannot read claim ns/ok: ") == (str(error) or type(error).__name__)


async def test_claims_not_read_within_the_budget_fail_saying_so(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "PREPARE_BUDGET_S", 0.05)
    rig.api.add_claim("ns", "slow", "u-s", allocated("ate-dev-kvm-1"))
    rig.api.hang = True
    [result] = (await rig.plugin.driver.prepare([ClaimRef("ns", "u-s", "slow")])).values()
    assert result.error == "claim ns/slow not read within 0.05s"
    assert rig.sample("ate_devplugin_dra_claims_total", method="NodePrepareResources", result="error") == 1
    rig.api.hang = False


async def test_no_claim_read_outlives_a_call_the_kubelet_gave_up_on(rig: Rig) -> None:
    rig.api.hang = True
    call = asyncio.ensure_future(rig.plugin.driver.prepare([ClaimRef("ns", f"u{i}", f"c{i}") for i in range(3)]))
    await until(lambda: rig.api.claim_reads == 3, "the reads under way")
    call.cancel()
    await until(lambda: rig.api.calls_cancelled == 3, "the reads cancelled with the call")
    rig.api.hang = False


async def test_a_bad_claim_name_fails_alone_and_is_never_asked_for(rig: Rig) -> None:
    rig.api.add_claim("ns", "ok", "u-ok", allocated("ate-dev-kvm-1"))
    refs = [ClaimRef("ns", "u1", "../../api/v1/x"), ClaimRef("a/b", "u2", "c"), ClaimRef("ns", "u-ok", "ok")]
    results = await rig.plugin.driver.prepare(refs)
    assert results["u1"].error == (
        "claim ns/../../api/v1/x: claim name '../../api/v1/x' is not a valid object name (DNS-1123 subdomain)"
    )
    assert results["u2"].error == "claim a/b/c: namespace 'a/b' is not a valid namespace (DNS-1123 label)"
    assert results["u-ok"].error == ""
    assert rig.api.claim_reads == 1


async def test_a_huge_registration_error_is_clipped_and_logged_once(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    huge = "e" * (1 << 20)
    async with rig.channel(rig.settings.registration_socket) as channel:
        stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        for error in (huge, huge, huge, "other", huge):
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error=error))
    ready, why = rig.plugin.readiness()
    assert not ready
    assert why.startswith("DRA driver not registered with the kubelet: eee")
    assert len(why) < MAX_REASON + 100
    refusals = [r.getMessage() for r in caplog.records if "refused the DRA driver" in r.getMessage()]
    assert len(refusals) == 2  # the huge one once, "other" once
    assert max(len(line) for line in refusals) < MAX_REASON + 100


async def test_stop_is_bounded_when_the_api_server_does_not_answer(rig: Rig) -> None:
    rig.api.hang = True
    await rig.plugin.stop(3.0)  # returns: the slices are the kubelet's to delete now
    assert not os.path.exists(rig.settings.socket)
    assert rig.api.closed


@pytest.mark.parametrize(("pb", "grpc_mod"), [(v1, v1_grpc), (v1beta1, v1beta1_grpc)])
async def test_prepare_answers_a_share_with_its_share_id_and_each_request_its_device_once(
    rig: Rig, pb: Any, grpc_mod: Any
) -> None:
    # Two claims share the shareable device; a generated claim asks for two devices in one
    # request (ate.dev/kvm: 2) and one in another container's request.
    rig.api.add_claim("ns", "a", "ua", allocated(SHARED, share="5e1c-a"))
    rig.api.add_claim("ns", "b", "ub", allocated(SHARED, share="5e1c-b"))
    two = allocated(SHARED, request="container-0-request-0", share="5e1c-c") + allocated(
        SLOTS[0], request="container-0-request-0"
    )
    rig.api.add_claim("ns", "c", "uc", two + allocated(SLOTS[1], request="container-1-request-0"))
    claims = [pb.Claim(namespace="ns", uid=f"u{n}", name=n) for n in "abc"]
    async with rig.channel(rig.settings.socket) as channel:
        response = await grpc_mod.DRAPluginStub(channel).NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=claims)
        )
    got = {
        uid: [
            (list(d.request_names), d.device_name, list(d.cdi_device_ids), getattr(d, "share_id", None))
            for d in answer.devices
        ]
        for uid, answer in response.claims.items()
    }
    share = (lambda s: s) if pb is v1 else (lambda s: None)  # v1beta1 has no share_id
    assert got == {
        "ua": [(["kvm"], SHARED, ["ate.dev/kvm=kvm"], share("5e1c-a"))],
        "ub": [(["kvm"], SHARED, ["ate.dev/kvm=kvm"], share("5e1c-b"))],
        "uc": [
            (["container-0-request-0"], SHARED, ["ate.dev/kvm=kvm"], share("5e1c-c")),
            (["container-0-request-0"], SLOTS[0], [], share("")),
            (["container-1-request-0"], SLOTS[1], ["ate.dev/kvm=kvm"], share("")),
        ],
    }


async def test_an_api_server_that_drops_sharing_gets_the_slots_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(tmp_path, consumable_capacity=False)
    await rig.start()
    try:
        rig.discover(PRESENT)
        await until(lambda: rig.plugin.publisher.synced.is_set(), "slices published")
        assert rig.api.devices() == SLOTS
        # Written once with the shareable device, read back without its flag, written again.
        assert rig.api.writes == ["create", "update"]
        assert rig.sample("ate_devplugin_dra_sharing", model="slots") == 1
        assert rig.sample("ate_devplugin_dra_sharing", model="capacity") == 0
        assert rig.sample("ate_devplugin_dra_slice_devices", resource_name="ate.dev/kvm") == 4
        assert "dropped allowMultipleAllocations" in caplog.text
        # A claim the scheduler gave the shareable device in that moment still prepares.
        rig.api.add_claim("ns", "early", "ue", allocated(SHARED))
        [result] = (await rig.plugin.driver.prepare([ClaimRef("ns", "ue", "early")])).values()
        assert (result.error, [d.device for d in result.devices]) == ("", [SHARED])
        # A later change publishes slots only, without trying the shareable device again.
        rig.discover(ABSENT)
        await until(lambda: rig.plugin.publisher.synced.is_set() and rig.api.devices() == [], "devices withdrawn")
        rig.discover(PRESENT)
        await until(lambda: rig.plugin.publisher.synced.is_set() and rig.api.devices() == SLOTS, "slots back")
        assert rig.api.writes[2:] == ["update", "update"]
    finally:
        await rig.plugin.stop(2.0)


async def test_slots_only_when_configured(tmp_path: Path) -> None:
    rig = Rig(tmp_path, dra_sharing="slots")
    await rig.start()
    try:
        rig.discover(PRESENT)
        await until(lambda: rig.plugin.publisher.synced.is_set(), "slices published")
        assert rig.api.devices() == SLOTS
        assert rig.api.writes == ["create"]
        assert rig.sample("ate_devplugin_dra_sharing", model="slots") == 1
    finally:
        await rig.plugin.stop(2.0)


async def test_a_claim_is_not_prepared_while_its_cdi_spec_is_not_on_disk(rig: Rig) -> None:
    rig.discover(PRESENT)
    await until(lambda: rig.plugin.publisher.synced.is_set(), "slices published")
    rig.api.add_claim("ns", "c", "uc", allocated(SLOTS[0]))
    rig.cdi_problems[KVM.name] = "/var/run/cdi: Read-only file system"
    [result] = (await rig.plugin.driver.prepare([ClaimRef("ns", "uc", "c")])).values()
    assert result.error == (
        f"claim ns/c: the CDI spec of device {SLOTS[0]} is not in place: /var/run/cdi: Read-only file system"
    )
    assert result.devices == []
    del rig.cdi_problems[KVM.name]  # written again: the kubelet's retry prepares it
    [result] = (await rig.plugin.driver.prepare([ClaimRef("ns", "uc", "c")])).values()
    assert (result.error, [d.cdi_ids for d in result.devices]) == ("", [("ate.dev/kvm=kvm",)])


async def test_who_reads_pods_hears_of_every_prepare_and_unprepare_and_knows_every_device(rig: Rig) -> None:
    """The PodResources watch lists after each answered call, and maps claimed devices to
    resources by name: every device a resource may publish, present or not."""
    rig.notices.clear()
    rig.api.add_claim("ns", "one", "u1", allocated("ate-dev-kvm-0"))
    async with rig.channel(rig.settings.socket) as channel:
        stub = v1_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        await stub.NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid="u1", name="one")])
        )
        assert rig.notices == [ClaimsChanged()]
        await stub.NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid="u1", name="one")])
        )
    assert rig.notices == [ClaimsChanged(), ClaimsChanged()]
    expected = {SHARED: KVM.name, **dict.fromkeys(SLOTS, KVM.name)}
    assert rig.plugin.device_resources() == expected
    rig.discover(ABSENT)  # unpublished: still known
    assert rig.plugin.device_resources() == expected


def verdict(reason: Reason, facts: DeviceFacts | None = None) -> ProbeResult:
    return ProbeResult(device="/dev/kvm", reason=reason, detail=str(reason), duration_s=0.001,
                       device_facts=facts)  # fmt: skip


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
async def test_with_the_kvm_probe_devices_carry_its_facts_taint_and_health(tmp_path: Path, effect: str) -> None:
    rig = Rig(tmp_path, kvm_facts=NODE_FACTS, dra_taint_effect=effect.lower())  # any case: spelled as the API wants
    await rig.start()
    rig.discover(PRESENT)
    await until(lambda: rig.plugin.publisher.synced.is_set(), "published")
    [item] = rig.api.slices.values()
    attrs = item["spec"]["devices"][0]["attributes"]
    assert (attrs["kvmImplementation"], attrs["kvmHardware"], attrs["cpuModel"]) == (
        {"string": "pvm"}, {"bool": False}, {"int": 167}
    )  # fmt: skip
    assert "kvmApiVersion" not in attrs  # not probed yet

    learned = DeviceFacts(12, {"max_vcpus": 1024}, "e4da")
    rig.tell_kvm(verdict(Reason.PASSED, learned), learned, (Answer("snap"), Answer("old", reasons=(("tsc", "x"),))))
    await until(lambda: "kvmApiVersion" in rig.api.devices_json()[0]["attributes"], "device facts")
    assert rig.api.devices_json()[0]["attributes"]["cpuidDigest"] == {"string": "e4da"}
    # whether the node can restore each restore profile: one plain term selects it
    assert {d["attributes"]["restore_snap"]["bool"] for d in rig.api.devices_json()} == {True}
    assert {d["attributes"]["restore_old"]["bool"] for d in rig.api.devices_json()} == {False}
    assert all(r.healthy for r in rig.plugin.health.reports)

    rig.tell_kvm(verdict(Reason.NOT_KVM), learned)  # the last pass's facts kept
    await until(lambda: all("taints" in d for d in rig.api.devices_json()), "tainted")
    taints = [d["taints"] for d in rig.api.devices_json()]
    assert all([(t["key"], t["value"], t["effect"]) for t in ts] ==
               [("ate.dev/kvm-unhealthy", "not-a-kvm-device", effect)] for ts in taints)  # fmt: skip
    assert rig.api.devices_json()[0]["attributes"]["cpuidDigest"] == {"string": "e4da"}  # the last pass's facts
    assert rig.sample("ate_devplugin_dra_tainted_devices", resource_name=KVM.name) == 5
    assert {(r.healthy, r.message) for r in rig.plugin.health.reports} == {
        (False, "ate.dev/kvm: KVM probe failed: not-a-kvm-device: /dev/kvm: not-a-kvm-device")
    }

    rig.tell_kvm(None, learned)  # no verdict holds (the node gone, or the prober)
    await until(lambda: not any("taints" in d for d in rig.api.devices_json()), "untainted")
    assert all(r.healthy for r in rig.plugin.health.reports)
    await rig.plugin.stop(2.0)


async def test_without_the_kvm_probe_devices_carry_the_resource_alone(rig: Rig) -> None:
    rig.tell_states({})  # no resource probed
    await asyncio.sleep(0.05)
    assert rig.api.devices_json()[1] == {"name": SLOTS[0], "attributes": {"resource": {"string": "ate.dev/kvm"}}}
    assert not any("taints" in d for d in rig.api.devices_json())
