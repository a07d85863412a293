"""Settings: flags over environment over defaults, each value checked, each subsystem's
part, and the table of options every one of these comes from."""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import pytest

from ate_devplugin.config import DEFAULT_RESOURCES, ConfigError, ResourceConfig
from ate_devplugin.config.checks import check_across
from ate_devplugin.settings import (
    OPTIONS,
    PARTS,
    DaemonSettings,
    DevicePluginSettings,
    DraSettings,
    PodResourcesSettings,
    RuntimeSettings,
    Timing,
    idle_fields,
    resolve,
    value_of,
)

KVM = DEFAULT_RESOURCES[0]


def test_flags_win_over_env() -> None:
    settings = resolve(
        {"device_root": "/host/dev"}, {"ATE_DEVPLUGIN_DEVICE_ROOT": "/x", "ATE_DEVPLUGIN_PLUGIN_DIR": "/p"}
    )
    assert (settings.values["device_root"], settings.values["plugin_dir"]) == ("/host/dev", "/p")
    assert settings.part(DevicePluginSettings).kubelet_socket == "/p/kubelet.sock"


def pods(flags: dict[str, str], env: dict[str, str] | None = None) -> PodResourcesSettings:
    return resolve(flags, env or {}).part(PodResourcesSettings)


def test_pod_resources_settings() -> None:
    default = resolve({}, {})
    assert default.part(RuntimeSettings).pod_resources  # on by default (issue 29)
    assert not resolve({"pod_resources": "off"}, {}).part(RuntimeSettings).pod_resources
    assert pods({}).pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert pods({}).pod_resources_interval == 60
    # The socket follows the kubelet's root unless given (or given empty).
    assert pods({"plugin_dir": "/k/device-plugins"}).pod_resources_socket == "/k/pod-resources/kubelet.sock"
    assert (
        pods({"plugin_dir": "/k/dp", "pod_resources_socket": ""}).pod_resources_socket
        == "/k/pod-resources/kubelet.sock"
    )
    given = resolve(
        {"pod_resources_interval": "0"},
        {"ATE_DEVPLUGIN_POD_RESOURCES": "ON", "ATE_DEVPLUGIN_POD_RESOURCES_SOCKET": "/run//pr.sock"},
    )
    part = given.part(PodResourcesSettings)
    assert (given.values["pod_resources"], part.pod_resources_socket, part.pod_resources_interval) == (
        True,
        "/run/pr.sock",
        0,
    )


@pytest.mark.parametrize(
    ("flags", "env", "problem"),
    [
        (
            {"mode": "dra"},
            {},
            "--node-name: is required in mode dra: set NODE_NAME (downward API), ATE_DEVPLUGIN_NODE_NAME"
            " or --node-name",
        ),
        ({"mode": "kubelet"}, {}, "--mode: must be one of device-plugin, dra, both (got 'kubelet')"),
        ({"mode": "both", "dra_slots": "0"}, {"NODE_NAME": "n"}, "--dra-slots: must be an integer from 1 to 1024"),
        ({"registry_dir": "plugins_registry"}, {}, "--registry-dir: must be an absolute path"),
    ],
)
def test_dra_settings_are_checked(flags: dict[str, str], env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(flags, env)
    assert str(caught.value).startswith(problem)


@pytest.mark.parametrize(
    ("flags", "env", "line"),
    [
        ({}, {"ATE_DEVPLUGIN_MODE": "dra-only"}, "ATE_DEVPLUGIN_MODE: must be one of device-plugin, dra, both"),
        ({"mode": "x"}, {"ATE_DEVPLUGIN_MODE": "dra"}, "--mode: must be one of"),  # the flag wins, and is named
        ({}, {"ATE_DEVPLUGIN_DEVICE_ROOT": "dev"}, "ATE_DEVPLUGIN_DEVICE_ROOT: must be an absolute path (got 'dev')"),
        ({"metrics_address": "localhost"}, {}, "--metrics-address: must be HOST:PORT"),
        (
            {},
            {"ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "soon"},
            "ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL: must be a number",
        ),
        ({"pod_resources_socket": "kubelet.sock"}, {}, "--pod-resources-socket: must be an absolute path"),
        ({}, {"ATE_DEVPLUGIN_MODE": "both"}, "--node-name: is required in mode both"),
    ],
)
def test_an_error_names_the_flag_or_variable_the_user_set(
    flags: dict[str, str], env: dict[str, str], line: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(flags, env)
    assert str(caught.value).startswith(line), caught.value


def test_every_bad_setting_is_reported_in_the_order_of_the_table() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(
            {"device_root": "dev", "log_level": "loud", "dra_slots": "many", "plugin_dir": "p"},
            {"ATE_DEVPLUGIN_LOG_FORMAT": "xml", "ATE_DEVPLUGIN_POD_RESOURCES": "yes", "ATE_DEVPLUGIN_CDI_DIR": "cdi"},
        )
    assert caught.value.lines() == [
        "--device-root: must be an absolute path (got 'dev')",
        "--plugin-dir: must be an absolute path (got 'p')",
        "ATE_DEVPLUGIN_LOG_FORMAT: must be one of auto, json, text (got 'xml')",
        "--log-level: must be one of debug, info, warning, error (got 'loud')",
        "ATE_DEVPLUGIN_CDI_DIR: must be an absolute path (got 'cdi')",
        "--dra-slots: must be an integer from 1 to 1024 (got 'many')",
        "ATE_DEVPLUGIN_POD_RESOURCES: must be one of on, off (got 'yes')",
    ]


def test_settings_that_do_nothing_in_the_mode_are_warned_about() -> None:
    settings = resolve(
        {"dra_slots": "8", "pod_resources_interval": "5", "dra_sharing": "slots", "pod_resources": "off"},
        {"ATE_DEVPLUGIN_REGISTRY_DIR": "/r", "ATE_DEVPLUGIN_POD_RESOURCES_SOCKET": "/p.sock", "NODE_NAME": "n"},
    )
    assert [str(p) for p in settings.idle] == [
        "ATE_DEVPLUGIN_REGISTRY_DIR: does nothing in mode device-plugin: only the DRA driver (--mode dra or both)"
        " uses it",
        "--dra-slots: does nothing in mode device-plugin: only the DRA driver (--mode dra or both) uses it",
        "--dra-sharing: does nothing in mode device-plugin: only the DRA driver (--mode dra or both) uses it",
        "ATE_DEVPLUGIN_POD_RESOURCES_SOCKET: does nothing while --pod-resources is off",
        "--pod-resources-interval: does nothing while --pod-resources is off",
    ]
    # By default PodResources is on: its settings do something.
    assert resolve({"pod_resources_interval": "5"}, {}).idle == ()
    # The same settings where they do something; NODE_NAME alone (the chart's) is never idle.
    used = resolve(
        {
            "dra_slots": "8",
            "mode": "both",
            "pod_resources": "on",
            "pod_resources_interval": "5",
            "dra_sharing": "slots",
        },
        {"NODE_NAME": "n"},
    )
    assert used.idle == ()
    # The device plugin's sockets' suffix does nothing without the device plugin; PodResources
    # works in every mode.
    dra = resolve({"mode": "dra", "socket_suffix": "x", "pod_resources": "on"}, {"NODE_NAME": "n"})
    assert [str(p) for p in dra.idle] == [
        "--socket-suffix: does nothing in mode dra: only the device plugin (--mode device-plugin or both) uses it"
    ]
    off = resolve({"pod_resources_interval": "5"}, {"ATE_DEVPLUGIN_POD_RESOURCES": "off"})
    assert [str(p) for p in off.idle] == [
        "--pod-resources-interval: does nothing while ATE_DEVPLUGIN_POD_RESOURCES is off"
    ]


def test_config_fields_that_do_nothing_in_the_mode_are_warned_about() -> None:
    resources = (
        ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",), cdi_file_mode=0o666),  # allocate: devices
        ResourceConfig(name="ate.dev/tun", devices=("/dev/net/tun",), allocate="cdi", cdi_uid=0),
        ResourceConfig(name="ate.dev/fuse", devices=("/dev/fuse",), preferred_allocation=True, units=8),
    )
    assert [str(p) for p in idle_fields(resources, "device-plugin")] == [
        "resources[0].cdi: does nothing with allocate: devices in mode device-plugin: no CDI spec is written"
        " (hint: set allocate: cdi or both to answer with the CDI device)"
    ]
    assert list(idle_fields(resources, "both")) == []  # DRA writes every resource's spec; the plugin allocates
    assert [str(p) for p in idle_fields(resources, "dra")] == [
        "resources[1].allocate: does nothing in mode dra: it says how the device plugin answers Allocate"
        " (the DRA driver always hands out the CDI device)",
        "resources[2].preferred_allocation: does nothing in mode dra: only the device plugin answers"
        " GetPreferredAllocation",
        "resources[2].units: does nothing in mode dra: the DRA driver publishes --dra-slots slots per resource",
    ]
    settings = resolve({"dra_slots": "8"}, {})
    assert [p.field for p in settings.warnings(resources)] == ["--dra-slots", "resources[0].cdi"]


def test_the_mode_alone_names_its_source() -> None:
    assert value_of("mode", None, {}) == "device-plugin"
    assert value_of("mode", "DRA", {"ATE_DEVPLUGIN_MODE": "x"}) == "dra"
    with pytest.raises(ConfigError, match=r"^ATE_DEVPLUGIN_MODE: must be one of"):
        value_of("mode", None, {"ATE_DEVPLUGIN_MODE": "x"})


def test_dra_settings_default_to_the_kubelet_paths() -> None:
    default = resolve({}, {"NODE_NAME": "n"})
    assert (default.part(RuntimeSettings).mode, default.part(RuntimeSettings).dra) == ("device-plugin", False)
    assert default.part(DevicePluginSettings).serves_resources
    both = resolve({"mode": "BOTH"}, {"ATE_DEVPLUGIN_NODE_NAME": "m", "NODE_NAME": "n"})
    runtime = both.part(RuntimeSettings)
    dra = both.part(DraSettings)
    assert (both.part(DevicePluginSettings).serves_resources, runtime.dra, dra.node_name, dra.dra_slots) == (
        True,
        True,
        "m",
        32,
    )
    assert dra.registration_socket == "/var/lib/kubelet/plugins_registry/ate.dev-reg.sock"
    assert dra.socket == "/var/lib/kubelet/plugins/ate.dev/dra.sock"
    # An empty flag or variable is not a name: NODE_NAME is read then.
    assert resolve({"mode": "dra", "node_name": ""}, {"NODE_NAME": "n"}).part(DraSettings).node_name == "n"


def test_each_subsystem_gets_its_own_part() -> None:
    flags = {"plugin_dir": "/k/device-plugins", "mode": "both", "pod_resources": "on"}
    settings = replace(resolve(flags, {"NODE_NAME": "n"}), timing=Timing(agent_stop_s=0.5, event_deadline_s=2.0))
    plugin = settings.part(DevicePluginSettings)
    assert (plugin.kubelet_socket, plugin.agent_stop_s) == ("/k/device-plugins/kubelet.sock", 0.5)
    kvm = ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",))
    assert plugin.socket_path(kvm) == "/k/device-plugins/ate-ate-dev-kvm.sock"
    pods = settings.part(PodResourcesSettings)
    assert (pods.pod_resources_socket, pods.checkpoint) == (
        "/k/pod-resources/kubelet.sock",
        "/k/device-plugins/kubelet_internal_checkpoint",
    )
    dra = settings.part(DraSettings)
    assert (dra.node_name, dra.dra_slots, dra.socket) == ("n", 32, "/var/lib/kubelet/plugins/ate.dev/dra.sock")
    assert settings.part(DaemonSettings).event_deadline_s == 2.0
    # No part carries another's knobs.
    assert "event_deadline_s" not in {f.name for f in fields(plugin)}
    assert "agent_stop_s" not in {f.name for f in fields(DaemonSettings)}
    # Without the device plugin nobody watches its directory: no checkpoint to follow.
    dra_only = resolve({"mode": "dra", "pod_resources": "on"}, {"NODE_NAME": "n"})
    assert dra_only.part(PodResourcesSettings).checkpoint is None


def _makes(check: Any) -> Any:
    """The type of value an option's check makes (a function, or an object called)."""
    return typing.get_type_hints(check if inspect.isfunction(check) else type(check).__call__)["return"]


@pytest.mark.parametrize("part", PARTS, ids=[p.__name__ for p in PARTS])
def test_each_part_field_is_an_option_or_a_timing_of_its_type(part: type[Any]) -> None:
    """Every part of the registry (settings.PARTS): a field names an option or a timing (or
    keeps its default), holds the type that option's check makes, and is filled with its value."""
    timing = typing.get_type_hints(Timing)
    hints = typing.get_type_hints(part)
    for f in fields(part):
        if f.name in OPTIONS:
            assert hints[f.name] == _makes(OPTIONS[f.name].check), f"{part.__name__}.{f.name}"
        elif f.name in timing:
            assert hints[f.name] == timing[f.name], f"{part.__name__}.{f.name}"
        else:
            assert f.default is not MISSING, f"{part.__name__}.{f.name}: no option or timing of that name"
    settings = resolve({"mode": "both"}, {"NODE_NAME": "n"})
    built = settings.part(part)
    assert isinstance(built, part)
    for f in fields(part):
        if f.name in OPTIONS:
            assert getattr(built, f.name) == settings.values[f.name], f"{part.__name__}.{f.name}"
        elif f.name in timing:
            assert getattr(built, f.name) == getattr(settings.timing, f.name), f"{part.__name__}.{f.name}"


def test_a_class_that_is_not_a_part_cannot_be_made() -> None:
    @dataclass(frozen=True)
    class Typo:
        dra_slot: int  # not a part: nobody says how to fill it

    with pytest.raises(TypeError, match="Typo is not a settings part"):
        resolve({}, {}).part(Typo)


def test_a_socket_suffix_names_the_device_plugin_sockets() -> None:
    plain = resolve({}, {}).part(DevicePluginSettings)
    assert plain.socket_path(KVM) == "/var/lib/kubelet/device-plugins/ate-ate-dev-kvm.sock"
    uid = "0f3c9a6e-5b1d-4c1e-9d2a-7e8f6a5b4c3d"
    suffixed = resolve({}, {"ATE_DEVPLUGIN_SOCKET_SUFFIX": uid}).part(DevicePluginSettings)
    assert suffixed.socket_path(KVM) == f"/var/lib/kubelet/device-plugins/ate-ate-dev-kvm-{uid}.sock"
    for bad in ("-x", "a/b", "x" * 65):
        with pytest.raises(ConfigError, match=r"^--socket-suffix: must be up to 64 letters, digits and '-'"):
            resolve({"socket_suffix": bad}, {})


def test_the_socket_path_limit_counts_the_suffix() -> None:
    plugin_dir = "/var/lib/kubelet/device-plugins"
    long = (ResourceConfig(name="ate.dev/" + "k" * 40, devices=("/dev/kvm",)),)
    check_across(long, plugin_dir)  # 89 bytes; 126 with a pod UID
    with pytest.raises(ConfigError, match="longer than the 107-byte unix socket limit"):
        check_across(long, plugin_dir, "0f3c9a6e-5b1d-4c1e-9d2a-7e8f6a5b4c3d")
