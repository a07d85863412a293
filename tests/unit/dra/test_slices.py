"""This node's slices as data: device names and slots."""

from __future__ import annotations


def test_other_resources_get_their_own_slots() -> None:
    from ate_devplugin.dra.slices import device_name, slot_devices

    assert slot_devices(["ate.dev/kvm", "ate.dev/tun"], 2) == {
        "ate-dev-kvm-0": "ate.dev/kvm",
        "ate-dev-kvm-1": "ate.dev/kvm",
        "ate-dev-tun-0": "ate.dev/tun",
        "ate-dev-tun-1": "ate.dev/tun",
    }
    assert device_name("Example.COM/" + "x" * 80, 7) == "example-com-" + "x" * 38 + "-7"
