"""The file format, as the rules check it: defaults, every field, one-line errors naming the field."""

from __future__ import annotations

import pytest

from ate_devplugin.config import (
    DEFAULT_UNITS,
    ConfigError,
    parse_resources,
)

MINIMAL = "resources:\n  - name: ate.dev/kvm\n    devices: [/dev/kvm]\n"


def test_minimal_resource_gets_defaults() -> None:
    (r,) = parse_resources(MINIMAL)
    assert (r.name, r.devices, r.units, r.permissions) == ("ate.dev/kvm", ("/dev/kvm",), DEFAULT_UNITS, "rw")
    assert r.socket_name == "ate-ate-dev-kvm.sock"
    assert list(r.unit_ids())[:2] == ["kvm-0", "kvm-1"]
    assert r.preferred_allocation is False


def test_full_resource() -> None:
    (r,) = parse_resources(
        """
resources:
  - name: ate.dev/vhost
    devices: [/dev/vhost-net, /dev/net/tun]
    units: 16
    permissions: wr
    mounts: [{container_path: /etc/x, host_path: /etc/y}]
    env: {VHOST: "1", N: 2}
    preferred_allocation: true
"""
    )
    assert r.devices == ("/dev/vhost-net", "/dev/net/tun")
    assert r.permissions == "rw"
    assert r.mounts[0].read_only is True
    assert dict(r.env) == {"VHOST": "1", "N": "2"}
    assert r.preferred_allocation is True


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("resources: [", "line", "invalid YAML"),
        ("[]", "config", "mapping"),
        ("resources: []", "resources", "non-empty"),
        ("resources: [{name: ate.dev/kvm}]", "resources[0].devices", "required"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], colour: red}]", "resources[0].colour", "unknown key"),
        ("extra: 1\nresources: [{name: a.b/c, devices: [/dev/kvm]}]", "extra", "unknown key"),
        ("resources: [{name: kvm, devices: [/dev/kvm]}]", "resources[0].name", "<domain>/<name>"),
        ("resources: [{name: kubernetes.io/kvm, devices: [/dev/kvm]}]", "resources[0].name", "reserved"),
        ("resources: [{name: x.kubernetes.io/kvm, devices: [/dev/kvm]}]", "resources[0].name", "reserved"),
        ("resources: [{name: requests.ate.dev/kvm, devices: [/dev/kvm]}]", "resources[0].name", "requests."),
        ("resources: [{name: ATE.dev/kvm, devices: [/dev/kvm]}]", "resources[0].name", "DNS subdomain"),
        # A trailing newline must not slip past the patterns.
        ('resources: [{name: "ate.dev/kvm\\n", devices: [/dev/kvm]}]', "resources[0].name", "control character"),
        ('resources: [{name: "ate.dev\\n/kvm", devices: [/dev/kvm]}]', "resources[0].name", "control character"),
        (
            'resources: [{name: ate.dev/kvm, devices: [/dev/kvm], env: {"A\\n": x}}]',
            "resources[0].env.'A\\n'",
            "control character",
        ),
        ("resources: [{name: ate.dev/-kvm, devices: [/dev/kvm]}]", "resources[0].name", "name part"),
        ("resources: [{name: ate.dev/a/b, devices: [/dev/kvm]}]", "resources[0].name", "more than one"),
        (f"resources: [{{name: ate.dev/{'k' * 64}, devices: [/dev/kvm]}}]", "resources[0].name", "1-63"),
        ("resources: [{name: ate.dev/kvm, devices: [dev/kvm]}]", "resources[0].devices[0]", "absolute"),
        ("resources: [{name: ate.dev/kvm, devices: [/etc/passwd]}]", "resources[0].devices[0]", "under /dev"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/../etc/shadow]}]", "resources[0].devices[0]", "'..'"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev]}]", "resources[0].devices[0]", "under /dev"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm, /dev//kvm]}]", "resources[0].devices[1]", "normal path"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm, /dev/kvm]}]", "resources[0].devices[1]", "repeats"),
        ("resources: [{name: ate.dev/kvm, devices: []}]", "resources[0].devices", "non-empty"),
        ("resources: [{name: ate.dev/kvm, devices: [3]}]", "resources[0].devices[0]", "string"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 0}]", "resources[0].units", "positive"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: true}]", "resources[0].units", "positive"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: '8'}]", "resources[0].units", "positive"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 999999}]", "resources[0].units", "4 MiB"),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], preferred_allocation: 'yes'}]",
            "resources[0].preferred_allocation",
            "true or false",
        ),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], permissions: rwx}]", "resources[0].permissions", "rwm"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], permissions: rr}]", "resources[0].permissions", "once"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], permissions: ''}]", "resources[0].permissions", "rwm"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], env: {1X: a}}]", "resources[0].env.1X", "variable"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], env: {X: [a]}}]", "resources[0].env.X", "string"),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], mounts: [{container_path: x, host_path: /y}]}]",
            "resources[0].mounts[0].container_path",
            "absolute",
        ),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], mounts: [{container_path: /x}]}]",
            "resources[0].mounts[0].host_path",
            "required",
        ),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], allocate: CDI}]", "resources[0].allocate", "one of"),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: {file_mode: 0666}}]",  # YAML reads 438
            "resources[0].cdi.file_mode",
            "string",
        ),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: {file_mode: '4755'}}]",
            "resources[0].cdi.file_mode",
            "octal",
        ),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: {uid: -1}}]", "resources[0].cdi.uid", "0 to"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: {gid: 1.5}}]", "resources[0].cdi.gid", "0 to"),
        ("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: [x]}]", "resources[0].cdi", "mapping"),
        ("resources: [{name: 9ate.dev/kvm, devices: [/dev/kvm], allocate: cdi}]", "resources[0].name", "letter"),
        ("resources: [{name: ate.dev/9kvm, devices: [/dev/kvm], allocate: both}]", "resources[0].name", "letter"),
        (
            "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/kvm, devices: [/dev/fuse]}]",
            "resources[1].name",
            "collides",
        ),
        (
            "resources: [{name: a.b/c, devices: [/dev/kvm]}, {name: a-b/c, devices: [/dev/fuse]}]",
            "resources[1].name",
            "collides",
        ),
    ],
)
def test_bad_config_names_field_and_problem(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_resources(text)
    message = str(info.value)
    assert message.startswith(field), message
    assert words in message, message
    assert "\n" not in message


def test_cdi_settings() -> None:
    text = """resources:
- {name: ate.dev/kvm, devices: [/dev/kvm], allocate: cdi, cdi: {file_mode: '0666', uid: 0, gid: 4294967295}}
- {name: ate.dev/tun, devices: [/dev/net/tun], allocate: both}
- {name: ate.dev/fuse, devices: [/dev/fuse], cdi: {file_mode: '640'}}
- {name: 9.dev/9x, devices: [/dev/x]}
"""
    kvm, tun, fuse, digits = parse_resources(text)
    assert (kvm.allocate, kvm.cdi_file_mode, kvm.cdi_uid, kvm.cdi_gid) == ("cdi", 0o666, 0, 2**32 - 1)
    assert (kvm.uses_cdi, tun.uses_cdi, fuse.uses_cdi) == (True, True, False)
    assert (tun.cdi_file_mode, tun.cdi_uid, tun.cdi_gid) == (None, None, None)
    assert (fuse.allocate, fuse.cdi_file_mode) == ("devices", 0o640)
    assert not digits.uses_cdi  # not a CDI kind, and fine while it answers with device specs
