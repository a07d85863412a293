"""The KVM prober's resource (``--kvm-probe socket``), served beside each probed resource.

For a resource ``R`` whose health is the KVM probe, the device plugin serves ``R-prober``:
``UNITS`` units of the same device, advertised Healthy whether or not the device is there.
The chart's prober pods request one, so they are admitted on every node (on a node without
the device they are given none, and have nothing to probe) and while ``R`` itself is
Unhealthy: the prober is what can say that the device works again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ate_devplugin.config import MAX_NAME_PART_CHARS, MAX_SOCKET_PATH, ResourceConfig
from ate_devplugin.config.model import HEALTH_EXISTS

SUFFIX = "-prober"
UNITS = 4  # one prober, one more while its DaemonSet rolls, and room


def prober_resource(probed: ResourceConfig) -> ResourceConfig:
    return ResourceConfig(
        name=probed.name + SUFFIX,
        devices=(probed.probed_device,),
        units=UNITS,
        permissions=probed.permissions,
        health=HEALTH_EXISTS,
    )


def problem(prober: ResourceConfig, served: Mapping[str, ResourceConfig], socket_path: str) -> str:
    """Why the prober's resource cannot be served beside ``served`` ("" when it can)."""
    if len(prober.name.rsplit("/", 1)[1]) > MAX_NAME_PART_CHARS:
        return f"its name part is longer than {MAX_NAME_PART_CHARS} characters"
    clash = next((r.name for r in served.values() if prober.socket_name in (r.name, r.socket_name)), None)
    if prober.name in served or clash:
        return f"it collides with the configured resource {prober.name if prober.name in served else clash!r}"
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
        return f"its socket path {socket_path!r} is longer than the {MAX_SOCKET_PATH}-byte unix socket limit"
    return ""
