"""What was set but does nothing here: warnings, not errors.

Options given (by flag or variable) where their record says they do nothing (options.py,
``applies``), and fields of the config file that do nothing in the mode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ate_devplugin.config import ALLOCATE_DEVICES, DEFAULT_UNITS, Problem, ResourceConfig, profile_warnings
from ate_devplugin.settings.options import GROUPS, OPTIONS


def idle_options(values: Mapping[str, Any], given: Mapping[str, str]) -> Iterator[Problem]:
    """Each option given (``given``: key -> the flag or variable that set it) that does
    nothing with these values, in the order of the table."""
    mode = values["mode"]
    for option in (o for g in GROUPS for o in g.options if o.key in given):
        applies = option.applies
        if mode not in applies.modes:
            modes = " or ".join(m for m in applies.modes if m != "both")
            yield Problem(
                given[option.key],
                f"does nothing in mode {mode}: only {applies.who} (--mode {modes} or both) uses it",
            )
        elif applies.switch and values[applies.switch] in (False, "off"):
            switch = given.get(applies.switch, OPTIONS[applies.switch].flag)
            yield Problem(given[option.key], f"does nothing while {switch} is off")


def idle_fields(resources: Sequence[ResourceConfig], mode: str) -> Iterator[Problem]:
    """The config's fields that do nothing in this mode, then restore profiles that can match
    no node (warned about at start, by check-config, and on a reload: reload.py)."""
    yield from _idle_in_mode(resources, mode)
    yield from profile_warnings(resources)


def _idle_in_mode(resources: Sequence[ResourceConfig], mode: str) -> Iterator[Problem]:
    for i, r in enumerate(resources):
        where = f"resources[{i}]"
        if r.restore_profiles and not r.probes_kvm:
            yield Problem(
                f"{where}.restore_profiles",
                "does nothing: a profile is judged from the KVM probe's CPU profile, and this resource is not probed",
                "set health: kvm",
            )
        if mode == "device-plugin" and not r.uses_cdi and (r.cdi_file_mode, r.cdi_uid, r.cdi_gid) != (None,) * 3:
            yield Problem(
                f"{where}.cdi",
                f"does nothing with allocate: {ALLOCATE_DEVICES} in mode device-plugin: no CDI spec is written",
                "set allocate: cdi or both to answer with the CDI device",
            )
        if mode == "dra":
            if r.preferred_allocation:
                yield Problem(
                    f"{where}.preferred_allocation",
                    "does nothing in mode dra: only the device plugin answers GetPreferredAllocation",
                )
            if r.uses_cdi:
                yield Problem(
                    f"{where}.allocate",
                    "does nothing in mode dra: it says how the device plugin answers Allocate "
                    "(the DRA driver always hands out the CDI device)",
                )
            if r.units != DEFAULT_UNITS:
                yield Problem(
                    f"{where}.units",
                    "does nothing in mode dra: the DRA driver publishes --dra-slots slots per resource",
                )
