"""Reading a List answer by walking its wire format: the same as protobuf reads, bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ate_devplugin.api.podresources.v1 import api_pb2 as pb
from ate_devplugin.podresources import answer
from ate_devplugin.podresources.answer import DecodeError, Key, Wanted, read_holdings
from tests.unit.fakes import KVM, TUN, claimed, pod

DRIVER = "ate.dev"
DEVICES = {"ate-dev-kvm": KVM, "ate-dev-kvm-0": KVM, "ate-dev-tun-0": TUN}


def held(response: pb.ListPodResourcesResponse, wanted: Wanted) -> dict[Key, int]:
    return read_holdings(response.SerializeToString(), wanted).held


def test_units_of_our_resources_are_counted_per_container() -> None:
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("vm", "worker", ("vmm", KVM, 1), ("sidecar", TUN, 2)),
            pod("vm", "idle", ("main", KVM, 0)),
            pod("gpu", "trainer", ("main", "nvidia.com/gpu", 1)),
        ]
    )
    response.pod_resources[0].containers[0].devices.add(resource_name=KVM, device_ids=["x", "y"])
    assert held(response, Wanted(frozenset({KVM}))) == {(KVM, "vm", "worker", "vmm"): 3}
    assert held(response, Wanted(frozenset({KVM, TUN}))) == {
        (KVM, "vm", "worker", "vmm"): 3,
        (TUN, "vm", "worker", "sidecar"): 2,
    }


def test_each_device_of_our_drivers_claims_is_a_unit_of_its_resource() -> None:
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            claimed("vm", "a", "vmm", ("a", DRIVER, "ate-dev-kvm"), ("a", DRIVER, "ate-dev-tun-0")),
            claimed("vm", "b", "vmm", ("b1", DRIVER, "ate-dev-kvm-0"), ("b2", DRIVER, "ate-dev-kvm")),
            claimed("vm", "c", "vmm", ("c", "other.example.com", "ate-dev-kvm")),
        ]
    )
    wanted = Wanted(frozenset({KVM, TUN}), DRIVER, DEVICES)
    assert held(response, wanted) == {
        (KVM, "vm", "a", "vmm"): 1,
        (TUN, "vm", "a", "vmm"): 1,
        (KVM, "vm", "b", "vmm"): 2,
    }
    assert held(response, Wanted(frozenset({KVM, TUN}))) == {}  # no DRA driver of ours: no claim counts


def _reference(response: pb.ListPodResourcesResponse, wanted: Wanted) -> dict[Key, int]:
    """What the answer says, read from protobuf's own parse of it."""
    found: dict[Key, int] = {}
    for p in pb.ListPodResourcesResponse.FromString(response.SerializeToString()).pod_resources:
        for c in p.containers:
            units = [(d.resource_name, len(d.device_ids)) for d in c.devices if d.resource_name in wanted.resources]
            if wanted.driver:
                units += [
                    (wanted.devices[r.device_name], 1)
                    for claim in c.dynamic_resources
                    for r in claim.claim_resources
                    if r.driver_name == wanted.driver and r.device_name in wanted.devices
                ]
            for resource, count in units:
                if count:
                    key = (resource, p.namespace, p.name, c.name)
                    found[key] = found.get(key, 0) + count
    return found


names = st.text(st.characters(codec="utf-8"), max_size=8)


@st.composite
def answers(draw: st.DrawFn) -> pb.ListPodResourcesResponse:
    response = pb.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, 4))):
        p = response.pod_resources.add(name=draw(names), namespace=draw(names))
        for _ in range(draw(st.integers(0, 3))):
            c = p.containers.add(name=draw(names), cpu_ids=draw(st.lists(st.integers(-(2**63), 2**63 - 1))))
            c.memory.add(memory_type="memory", size=draw(st.integers(0, 2**64 - 1)))
            for _ in range(draw(st.integers(0, 3))):
                d = c.devices.add(resource_name=draw(st.sampled_from([KVM, TUN, "nvidia.com/gpu", ""])))
                d.device_ids.extend(draw(st.lists(names, max_size=3)))
                d.topology.nodes.add(ID=draw(st.integers(0, 2**63 - 1)))
            for _ in range(draw(st.integers(0, 2))):
                claim = c.dynamic_resources.add(claim_name=draw(names), claim_namespace=draw(names))
                for _ in range(draw(st.integers(0, 3))):
                    r = claim.claim_resources.add(
                        driver_name=draw(st.sampled_from([DRIVER, "gpu.example.com", ""])),
                        pool_name=draw(names),
                        device_name=draw(st.sampled_from([*DEVICES, "gpu-0", ""])),
                    )
                    r.cdi_devices.add(name=draw(names))
                    if draw(st.booleans()):
                        r.share_id = draw(names)
    return response


@given(answers(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_wire_walk_reads_what_protobuf_reads(response: pb.ListPodResourcesResponse, dra: bool) -> None:
    wanted = Wanted(frozenset({KVM, TUN}), DRIVER if dra else "", DEVICES)
    assert held(response, wanted) == _reference(response, wanted)


def test_an_answer_cut_short_or_not_utf8_is_undecodable() -> None:
    data = pb.ListPodResourcesResponse(pod_resources=[pod("vm", "a", ("vmm", KVM, 2))]).SerializeToString()
    for cut in range(1, len(data)):
        with pytest.raises(DecodeError):
            read_holdings(data[:cut], Wanted(frozenset({KVM})))
    not_utf8 = data.replace(b"vmm", b"\xff\xfe\xfd")
    with pytest.raises(DecodeError):
        read_holdings(not_utf8, Wanted(frozenset({KVM})))


def test_names_are_cut_to_the_kubernetes_limits_and_entries_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    long_pod = pod("n" * 100, "p" * 300, ("c" * 100, KVM, 1))
    found = read_holdings(
        pb.ListPodResourcesResponse(pod_resources=[long_pod]).SerializeToString(), Wanted(frozenset({KVM}))
    )
    assert found.held == {(KVM, "n" * 63, "p" * 253, "c" * 63): 1}
    assert found.truncated == 1
    monkeypatch.setattr(answer, "MAX_HELD", 2)
    many = pb.ListPodResourcesResponse(pod_resources=[pod("vm", f"p{i}", ("vmm", KVM, 1)) for i in range(5)])
    found = read_holdings(many.SerializeToString(), Wanted(frozenset({KVM})))
    assert (len(found.held), found.dropped) == (2, 3)


# --- reading answer after answer: a pod entry seen in the last answer is not walked again ------------


def _encoded(*pods: pb.PodResources) -> bytes:
    return pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per pod entry walked."""
    calls: list[int] = []
    walk = answer._pod_rows

    def counting(*args: object) -> tuple[answer.Row, ...]:
        calls.append(1)
        return walk(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(answer, "_pod_rows", counting)
    return calls


def test_a_reader_walks_only_the_pods_the_last_answer_did_not_have(walked: list[int]) -> None:
    a, b, c = pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "b", ("vmm", KVM, 2)), pod("vm", "c", ("vmm", TUN, 1))
    wanted = Wanted(frozenset({KVM, TUN}))
    reader = answer.Reader()
    assert reader.read(_encoded(a, b), wanted).held == {(KVM, "vm", "a", "vmm"): 1, (KVM, "vm", "b", "vmm"): 2}
    assert len(walked) == 2
    found = reader.read(_encoded(b, c, a), wanted)  # in another order, c new
    assert found.held == {(KVM, "vm", "a", "vmm"): 1, (KVM, "vm", "b", "vmm"): 2, (TUN, "vm", "c", "vmm"): 1}
    assert len(walked) == 3
    b_grown = pod("vm", "b", ("vmm", KVM, 3))  # the same pod holding more: another entry
    assert reader.read(_encoded(b_grown), wanted).held == {(KVM, "vm", "b", "vmm"): 3}
    assert len(walked) == 4
    assert reader.read(_encoded(a), wanted).held == {(KVM, "vm", "a", "vmm"): 1}
    assert len(walked) == 5, "only the last answer's entries are remembered: a was forgotten"


def test_a_reader_reads_everything_again_when_what_is_wanted_changes(walked: list[int]) -> None:
    data = _encoded(pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "b", ("vmm", TUN, 1)))
    reader = answer.Reader()
    assert reader.read(data, Wanted(frozenset({KVM}))).held == {(KVM, "vm", "a", "vmm"): 1}
    assert reader.read(data, Wanted(frozenset({KVM, TUN}))).held == {
        (KVM, "vm", "a", "vmm"): 1,
        (TUN, "vm", "b", "vmm"): 1,
    }
    assert len(walked) == 4


def test_an_undecodable_answer_leaves_what_the_reader_remembers(walked: list[int]) -> None:
    a, c = pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "c", ("vmm", KVM, 1))
    wanted = Wanted(frozenset({KVM}))
    reader = answer.Reader()
    reader.read(_encoded(a), wanted)
    with pytest.raises(DecodeError):
        reader.read(_encoded(a, c) + b"\x0a\x05\x00", wanted)  # a third entry cut short
    assert len(walked) == 2  # a, then c
    assert reader.read(_encoded(a), wanted).held == {(KVM, "vm", "a", "vmm"): 1}
    assert reader.read(_encoded(c), wanted).held == {(KVM, "vm", "c", "vmm"): 1}
    assert len(walked) == 3, "a still remembered, c of the undecodable answer not"


def test_a_reader_remembers_within_its_bounds_and_reads_right_beyond(
    walked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answer, "REMEMBERED", 2)
    pods = [pod("vm", f"p{i}", ("vmm", KVM, 1)) for i in range(5)]
    reader = answer.Reader()
    expected = {(KVM, "vm", f"p{i}", "vmm"): 1 for i in range(5)}
    assert reader.read(_encoded(*pods), Wanted(frozenset({KVM}))).held == expected
    assert reader.read(_encoded(*pods), Wanted(frozenset({KVM}))).held == expected
    assert len(walked) == 5 + 3
    monkeypatch.setattr(answer, "REMEMBERED", 100)
    monkeypatch.setattr(answer, "REMEMBERED_BYTES", len(pods[0].SerializeToString()))
    reader = answer.Reader()
    reader.read(_encoded(*pods), Wanted(frozenset({KVM})))
    assert reader.read(_encoded(*pods), Wanted(frozenset({KVM}))).held == expected
    assert len(walked) == 8 + 5 + 4


@given(st.lists(answers(), min_size=2, max_size=4), st.booleans())
@settings(max_examples=100, deadline=None)
def test_a_reader_reads_each_answer_as_a_fresh_walk_does(
    responses: list[pb.ListPodResourcesResponse], dra: bool
) -> None:
    wanted = Wanted(frozenset({KVM, TUN}), DRIVER if dra else "", DEVICES)
    reader = answer.Reader()
    for response in [*responses, *reversed(responses)]:
        data = response.SerializeToString()
        assert reader.read(data, wanted) == read_holdings(data, wanted)
