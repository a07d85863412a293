import os
from pathlib import Path

import pytest

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.config import (
    DEFAULT_UNITS,
    MAX_CONFIG_BYTES,
    MAX_DEVICES,
    MAX_ENV,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_MOUNTS,
    MAX_PATH_CHARS,
    ConfigError,
    max_units,
    parse_resources,
    read_config_file,
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


def test_unreadable_file(tmp_path: Path) -> None:
    from ate_devplugin.config import load_resources

    with pytest.raises(ConfigError, match="cannot read"):
        load_resources(tmp_path / "missing.yaml")


@pytest.mark.parametrize("prefix", ["kvm", "a" * 63])
def test_max_units_is_exactly_the_message_limit(prefix: str) -> None:
    def size(units: int) -> int:
        ids = [f"{prefix}-{n}" for n in range(units)]
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Unhealthy") for i in ids]).ByteSize()

    n = max_units(len(prefix))
    assert size(n) <= MAX_MESSAGE_BYTES < size(n + 1)


def test_the_largest_allocate_answer_fits_one_message() -> None:
    """Every count and length at its cap, every character 4 bytes of UTF-8: still one message."""
    path = "/" + "\U0001f600" * (MAX_PATH_CHARS - 1)
    answer = pb.AllocateResponse(
        container_responses=[
            pb.ContainerAllocateResponse(
                envs={f"{n:0{MAX_ENV_NAME_CHARS}d}": "\U0001f600" * MAX_ENV_VALUE_CHARS for n in range(MAX_ENV)},
                mounts=[pb.Mount(container_path=path, host_path=path, read_only=True)] * MAX_MOUNTS,
                devices=[pb.DeviceSpec(container_path=path, host_path=path, permissions="rwm")] * MAX_DEVICES,
            )
        ]
    )
    assert answer.ByteSize() <= MAX_MESSAGE_BYTES


def test_version_is_checked() -> None:
    assert parse_resources("version: 1\n" + MINIMAL)
    with pytest.raises(ConfigError, match=r"^version: unsupported version 2"):
        parse_resources("version: 2\n" + MINIMAL)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "resources: [" + ", ".join(f"{{name: a.b/r{i}, devices: [/dev/kvm]}}" for i in range(65)) + "]",
            "resources",
            "at most 64",
        ),
        (
            f"resources: [{{name: a.b/c, devices: [/dev/kvm], env: {{A: {'x' * 5_000_000}}}}}]",
            "resources[0].env.A",
            "at most 4096",
        ),
        ('resources: [{name: a.b/c, devices: ["/dev/kvm\\n"]}]', "resources[0].devices[0]", "control character"),
        ("resources: [{name: a.b/c, devices: [/dev/kvm], env: {A: 1" + "0" * 5000 + "}}]", "document", "invalid YAML"),
    ],
)
def test_configs_that_can_never_work_are_refused(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_resources(text)
    assert str(info.value).startswith(f"{field}: "), str(info.value)
    assert words in str(info.value)
    assert len(str(info.value)) < 300  # the value is not echoed whole


BOMB = "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10 if n else ['x'] * 10)}]\n" for n in range(9))


def test_a_yaml_alias_bomb_is_refused_while_composing() -> None:
    assert len(BOMB) < 600
    with pytest.raises(ConfigError, match=r"^document: more than 50000 YAML nodes"):
        parse_resources(BOMB + "resources: [*l8]\n")


def test_aliases_within_the_cap_and_a_recursive_one() -> None:
    shared = parse_resources("resources: [{name: a.b/c, devices: &d [/dev/kvm]}, {name: a.b/d, devices: *d}]\n")
    assert [r.devices for r in shared] == [("/dev/kvm",), ("/dev/kvm",)]
    with pytest.raises(ConfigError, match=r"^document: invalid YAML: an alias refers to a node that contains it"):
        parse_resources("resources: &r [*r]\n")


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path: Path) -> None:
    good = tmp_path / "data" / "config.yaml"
    good.parent.mkdir()
    good.write_text(MINIMAL)
    (tmp_path / "..data").symlink_to("data")  # as a ConfigMap volume lays it out
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    assert read_config_file(tmp_path / "config.yaml") == MINIMAL.encode()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: costs no disk
    edge = tmp_path / "edge.yaml"
    edge.write_bytes(b"#" * MAX_CONFIG_BYTES)
    assert len(read_config_file(edge)) == MAX_CONFIG_BYTES
    edge.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    for path, words in [
        (fifo, "is not a regular file (a FIFO)"),
        (Path("/dev/zero"), "is not a regular file (a character device)"),
        (tmp_path, "is not a regular file (a directory)"),
        (huge, "is larger than 1048576 bytes"),
        (edge, "is larger than 1048576 bytes"),
        (tmp_path / "absent", "cannot read: No such file or directory"),
    ]:
        with pytest.raises(ConfigError) as info:
            read_config_file(path)
        assert str(info.value) == f"{path}: {words}" or str(info.value).startswith(f"{path}: {words}"), info.value
