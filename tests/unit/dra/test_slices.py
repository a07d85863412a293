"""This node's slices as data: the shareable device, the slots, reading back what was kept."""

from __future__ import annotations

from ate_devplugin.dra.slices import SliceDevice, chunks, device_name, resource_devices, sharing_dropped


def test_a_resource_publishes_its_shareable_device_first_then_its_slots() -> None:
    assert resource_devices("ate.dev/kvm", 4096, 2, shared=True) == [
        SliceDevice("ate-dev-kvm", "ate.dev/kvm", 4096),
        SliceDevice("ate-dev-kvm-0", "ate.dev/kvm"),
        SliceDevice("ate-dev-kvm-1", "ate.dev/kvm"),
    ]
    assert [d.name for d in resource_devices("ate.dev/tun", 8, 2, shared=False)] == ["ate-dev-tun-0", "ate-dev-tun-1"]
    assert device_name("Example.COM/" + "x" * 80, 7) == "example-com-" + "x" * 38 + "-7"


def test_the_shareable_device_has_one_share_per_unit_and_one_per_claim_by_default() -> None:
    [[shared, slot]] = chunks(resource_devices("ate.dev/kvm", 110, 1, shared=True))
    assert shared == {
        "name": "ate-dev-kvm",
        "attributes": {"resource": {"string": "ate.dev/kvm"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "shares": {
                "value": "110",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "110", "step": "1"}},
            }
        },
    }
    assert slot == {"name": "ate-dev-kvm-0", "attributes": {"resource": {"string": "ate.dev/kvm"}}}


def test_a_dropped_flag_is_seen_in_what_the_api_server_stored() -> None:
    [wanted] = chunks(resource_devices("ate.dev/kvm", 4, 1, shared=True))
    assert not sharing_dropped(wanted, wanted)
    # What a 1.35 API server (DRAConsumableCapacity off) keeps of it: the capacity's value only.
    stored = [{**wanted[0], "capacity": {"shares": {"value": "4"}}}, wanted[1]]
    del stored[0]["allowMultipleAllocations"]
    assert sharing_dropped(wanted, stored)
    assert not sharing_dropped(wanted[1:], stored)  # slots only: nothing to drop
    assert not sharing_dropped(wanted, [])  # not stored (yet): nothing seen
