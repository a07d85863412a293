"""The rules a schema cannot say: within one resource (units within the kubelet's message
limit for the name's length, a CDI-able name) and across resources (unique names and
socket files, socket paths that fit a unix socket address, units in all, restore profile
names defined once on the node). The chart carries the same rules in ``_deviceconfig.tpl``
(tools/gen-config-schema.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from ate_devplugin.config.errors import ConfigError, Problem, Problems
from ate_devplugin.config.model import (
    ALLOCATE_DEVICES,
    CONFIG_VERSION,
    DEFAULT_PERMISSIONS,
    DEFAULT_UNITS,
    MAX_SOCKET_PATH,
    MAX_TOTAL_UNITS,
    MountConfig,
    ResourceConfig,
    is_glob,
    max_units,
    socket_name,
)
from ate_devplugin.config.rules import Field, Then
from ate_devplugin.config.schema import DOCUMENT, RESOURCE, RESOURCES
from ate_devplugin.cpu.features import canonical
from ate_devplugin.cpu.restore import RestoreProfile, TscRule
from ate_devplugin.cpu.template import Effect, effect, modifier

# A profile's answer is a node label too: one name, one profile, on the node ({} is the
# resource's index).
PROFILE_COLLISION = "is defined in resources[{}] already: its answer is one node label, so a name is defined once"


def cdi_name_problem(resource_name: str) -> str | None:
    """What keeps a valid resource name from being a CDI kind, or None.

    The name rules already keep both parts to CDI's characters and ends; CDI also wants
    the vendor (the domain) and the class to start with a letter."""
    vendor, _, cls = resource_name.partition("/")
    if not vendor[:1].isalpha() or not cls[:1].isalpha():
        return "for CDI, the domain and the name after the slash must start with a letter"
    return None


def resources_from_document(doc: Any) -> tuple[ResourceConfig, ...]:
    """Validate a loaded document (YAML or chart values); raises ConfigError with every
    problem found. The rules across resources are checked once each resource is valid."""
    # Another version's file is judged by its version alone: its fields follow other rules.
    version = doc.get("version", CONFIG_VERSION) if isinstance(doc, dict) else CONFIG_VERSION
    if isinstance(version, (int, float)) and not isinstance(version, bool) and version != CONFIG_VERSION:
        raise ConfigError("version", f"unsupported version {version} (supported: {CONFIG_VERSION})")
    resources = tuple(_DOCUMENT.check(doc, "config")["resources"])
    check_across(resources)
    return resources


def resource_from(m: dict[str, Any], where: str) -> ResourceConfig:
    resource = ResourceConfig(
        name=m["name"],
        devices=tuple(m["devices"]),
        units=m.get("units", DEFAULT_UNITS),
        permissions="".join(c for c in "rwm" if c in m.get("permissions", DEFAULT_PERMISSIONS)),
        mounts=tuple(MountConfig(**x) for x in m.get("mounts", [])),
        env=m.get("env", {}),
        allocate=m.get("allocate", ALLOCATE_DEVICES),
        cdi_file_mode=int(m["cdi"]["file_mode"], 8) if "file_mode" in m.get("cdi", {}) else None,
        cdi_uid=m.get("cdi", {}).get("uid"),
        cdi_gid=m.get("cdi", {}).get("gid"),
        preferred_allocation=m.get("preferred_allocation", False),
        health=m.get("health"),
        # by name: their order in the file means nothing (helm's toYaml sorts them, for one)
        restore_profiles=tuple(restore_profile(n, p) for n, p in sorted(m.get("restore_profiles", {}).items())),
    )
    problems = Problems()
    if resource.probes_kvm and is_glob(resource.probed_device):
        problems.add(ConfigError(f"{where}.devices[0]", "health kvm probes the first device: it must not be a glob"))
    if resource.uses_cdi and (problem := cdi_name_problem(resource.name)):
        problems.add(ConfigError(f"{where}.name", problem))
    limit = max_units(len(resource.id_prefix))
    if resource.units > limit:
        problems.add(
            ConfigError(
                f"{where}.units",
                f"{resource.units} units exceed the kubelet's 4 MiB message limit (at most {limit} for this name)",
            )
        )
    problems.raise_any()
    return resource


def restore_profile(name: str, m: dict[str, Any]) -> RestoreProfile:
    """A checked restore profile as the model's: canonical feature names, less what its
    template clears and with what it sets."""
    named = frozenset(canonical(f) or f for f in m.get("features", ()))
    template = m.get("cpu_template")
    tsc = m.get("tsc")
    return RestoreProfile(
        name=name,
        features=template_effect(template).apply(named) if template is not None else named,
        vendor=m.get("vendor", ""),
        kvm_implementations=frozenset(m.get("kvm_implementations", ())),
        tsc=None if tsc is None else TscRule(**tsc),  # its keys are the rule's fields
    )


# What no node offers: the KVM implementations a vendor's CPU runs (pvm needs no hardware
# virtualization), and the other vendor's virtualization feature.
_IMPLEMENTATIONS_OF = {
    "GenuineIntel": ("vmx", "pvm"),
    "CentaurHauls": ("vmx", "pvm"),
    "AuthenticAMD": ("svm", "pvm"),
    "HygonGenuine": ("svm", "pvm"),
}
_VIRTUALIZATION_OF = {"vmx": ("GenuineIntel", "CentaurHauls"), "svm": ("AuthenticAMD", "HygonGenuine")}
# Beyond 10 % a TSC rule no longer says which frequency a snapshot needs (KVM's own
# tolerance is 250 ppm); 1000000 ppm lets any frequency from 0 to twice the node's pass.
MAX_MEANINGFUL_PPM = 100_000


def profile_warnings(resources: Sequence[ResourceConfig]) -> Iterator[Problem]:
    """Valid restore profiles that no node can match, or whose TSC rule says nothing."""
    for i, r in enumerate(resources):
        for p in r.restore_profiles:
            yield from restore_profile_warnings(p, f"resources[{i}].restore_profiles.{p.name}")


def restore_profile_warnings(profile: RestoreProfile, where: str) -> Iterator[Problem]:
    vendor, implementations = profile.vendor, profile.kvm_implementations
    if vendor and implementations and not implementations & set(_IMPLEMENTATIONS_OF.get(vendor, implementations)):
        runs = " or ".join(_IMPLEMENTATIONS_OF[vendor])
        said = " or ".join(sorted(implementations))
        yield Problem(
            f"{where}.kvm_implementations",
            f"cannot match any node: KVM on a {vendor} CPU is {runs}, never {said}",
        )
    for feature, vendors in _VIRTUALIZATION_OF.items():
        if vendor and feature in profile.features and vendor not in vendors:
            yield Problem(
                f"{where}.features",
                f"cannot match any node: {feature} is the virtualization of {' and '.join(vendors)} CPUs, not {vendor}",
            )
    if profile.tsc is not None and profile.tsc.tolerance_ppm > MAX_MEANINGFUL_PPM:
        yield Problem(
            f"{where}.tsc.tolerance_ppm",
            f"{profile.tsc.tolerance_ppm} ppm lets almost any TSC frequency pass: above {MAX_MEANINGFUL_PPM} the "
            "rule says nothing",
            "KVM's own tolerance is 250 ppm; leave khz out to accept any frequency",
        )


def profile_entry(profile: RestoreProfile) -> dict[str, Any]:
    """A profile as the config file says it (what restore_profile reads back as it is)."""
    entry: dict[str, Any] = {}
    if profile.vendor:
        entry["vendor"] = profile.vendor
    if profile.kvm_implementations:
        entry["kvm_implementations"] = sorted(profile.kvm_implementations)
    if profile.features:
        entry["features"] = sorted(profile.features)
    if (tsc := profile.tsc) is not None:
        khz = {} if tsc.khz is None else {"khz": tsc.khz}
        entry["tsc"] = {**khz, "tolerance_ppm": tsc.tolerance_ppm, "scaling": tsc.scaling}
    return entry


def template_effect(template: dict[str, Any]) -> Effect:
    """What a checked Firecracker template (schema.CPU_TEMPLATE) does to a guest's features."""
    return effect(
        modifier(leaf["leaf"], leaf["subleaf"], m["register"], m["bitmap"])
        for leaf in template.get("cpuid_modifiers", ())
        for m in leaf["modifiers"]
    )


# The document as the daemon reads it: each resource is made (and its model rules checked)
# as soon as its fields are valid, so one pass finds the problems of every resource.
_DOCUMENT = replace(
    DOCUMENT,
    fields={
        **DOCUMENT.fields,
        "resources": Field(replace(RESOURCES, item=Then(RESOURCE, resource_from)), required=True),
    },
)


def check_across(resources: tuple[ResourceConfig, ...], plugin_dir: str | None = None, socket_suffix: str = "") -> None:
    """The rules across resources: unique names and socket files, (given the plugin
    directory) socket paths that fit a unix socket address, with ``socket_suffix`` in
    their names, and units in all within the memory budget. Raises ConfigError with every problem found."""
    problems = Problems()
    seen: dict[str, int] = {}
    profiles: dict[str, int] = {}
    for i, r in enumerate(resources):
        for p in r.restore_profiles:
            if p.name in profiles:
                problems.add(
                    ConfigError(f"resources[{i}].restore_profiles.{p.name}", PROFILE_COLLISION.format(profiles[p.name]))
                )
            profiles.setdefault(p.name, i)
        collides = next((seen[key] for key in (r.name, r.socket_name) if key in seen), None)
        if collides is not None:
            problems.add(ConfigError(f"resources[{i}].name", f"{r.name!r} collides with resources[{collides}]"))
        seen.setdefault(r.name, i)
        seen.setdefault(r.socket_name, i)
        if plugin_dir is not None:
            path = os.path.join(plugin_dir, socket_name(r.name, socket_suffix))
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                problems.add(
                    ConfigError(
                        f"resources[{i}].name",
                        f"socket path {path!r} is longer than the {MAX_SOCKET_PATH}-byte unix socket limit",
                    )
                )
    total = sum(r.units for r in resources)
    if total > MAX_TOTAL_UNITS:
        problems.add(
            ConfigError(
                "resources", f"{total} units in all exceed {MAX_TOTAL_UNITS} (memory: the chart's 128 Mi limit)"
            )
        )
    problems.raise_any()
