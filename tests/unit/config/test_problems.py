"""Every problem of a config at once, each naming its field, with hints for the common mistakes."""

from __future__ import annotations

import pytest

from ate_devplugin.config import MAX_PROBLEMS, ConfigError, Problem, check_across, parse_resources, resource_from

KVM = "name: ate.dev/kvm, devices: [/dev/kvm]"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_resources(text)
    return info.value.lines()


def test_every_problem_of_every_resource_is_reported_in_file_order() -> None:
    text = """resources:
- {name: ate.dev/kvm, devices: [/dev/kvm, kvm], units: 0, permissions: rwx}
- {name: ate.dev/tun, devices: [/dev/net/tun], mounts: [{container_path: a}]}
- {devices: [/dev/fuse], env: {1A: x, B: [y]}}
"""
    assert problems(text) == [
        "resources[0].devices[1]: must be an absolute path (got 'kvm')",
        "resources[0].units: must be a positive integer (got 0)",
        "resources[0].permissions: must be letters from 'rwm', each at most once (got 'rwx')",
        "resources[1].mounts[0].container_path: must be an absolute path (got 'a')",
        "resources[1].mounts[0].host_path: is required",
        "resources[2].env.1A: is not a valid environment variable name (got '1A')",
        "resources[2].env.B: must be a string or a number (got ['y'])",
        "resources[2].name: is required",
    ]


def test_str_is_one_line_of_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        parse_resources("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 0, permissions: x}]")
    error = info.value
    assert str(error) == (
        "resources[0].units: must be a positive integer (got 0); "
        "resources[0].permissions: must be letters from 'rwm', each at most once (got 'x')"
    )
    assert (error.problems[0].field, error.problem) == ("resources[0].units", "must be a positive integer (got 0)")


def test_model_rules_of_each_resource_are_all_reported() -> None:
    """Units over the message limit and a name CDI cannot use, in two resources."""
    text = f"""resources:
- {{name: ate.dev/9kvm, devices: [/dev/kvm], allocate: cdi}}
- {{name: ate.dev/tun, devices: [/dev/net/tun], units: 10000000}}
- {{{KVM}, units: -1}}
"""
    lines = problems(text)
    assert [line.split(":")[0] for line in lines] == ["resources[0].name", "resources[1].units", "resources[2].units"]


def test_rules_across_resources_report_every_collision_and_the_total() -> None:
    resources = [
        resource_from({"name": n, "devices": ["/dev/kvm"], "units": 131072}, f"resources[{i}]")
        for i, n in enumerate(["a.b/c", "a-b/c", "a.b/c"])
    ]
    with pytest.raises(ConfigError) as info:
        check_across(tuple(resources))
    assert info.value.lines() == [
        "resources[1].name: 'a-b/c' collides with resources[0]",
        "resources[2].name: 'a.b/c' collides with resources[0]",
        "resources: 393216 units in all exceed 262144 (memory: the chart's 128 Mi limit)",
    ]


def test_another_version_is_reported_alone() -> None:
    """Its fields follow other rules: their problems would mislead."""
    assert problems("version: 2\nresources: [{name: x, shape: round}]\n") == [
        "version: unsupported version 2 (supported: 1)"
    ]


def test_a_long_list_of_problems_is_cut_with_a_count() -> None:
    devices = ", ".join(f"dev/d{i}" for i in range(50))
    lines = problems(f"resources: [{{name: ate.dev/kvm, devices: [{devices}]}}]")
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[0] == "resources[0].devices[0]: must be an absolute path (got 'dev/d0')"
    assert lines[-1] == f"config: {50 - MAX_PROBLEMS} more problems not shown"


def test_a_list_over_its_bound_is_not_looked_into() -> None:
    many = ", ".join("{name: x}" for _ in range(65))
    assert problems(f"resources: [{many}]") == ["resources: must have at most 64 entries (got 65)"]


@pytest.mark.parametrize(
    ("resource", "line"),
    [
        (
            "cdi: {file_mode: 0666}",
            "resources[0].cdi.file_mode: must be a string (got 438) "
            "(hint: YAML reads an unquoted 0666 as the octal number 438: write '0666', in quotes)",
        ),
        (
            "cdi: {file_mode: 640}",  # not octal to YAML: 640 itself
            "resources[0].cdi.file_mode: must be a string (got 640) (hint: write it in quotes: '640')",
        ),
        ("cdi: {file_mode: 99999}", "resources[0].cdi.file_mode: must be a string (got 99999)"),
        ("units: '8'", "resources[0].units: must be a positive integer (got '8') (hint: write it without quotes: 8)"),
        ("devise: [/dev/kvm]", "resources[0].devise: unknown key (hint: did you mean 'devices'?)"),
        ("Units: 8", "resources[0].Units: unknown key (hint: did you mean 'units'?)"),
        ("file_mode: '0666'", "resources[0].file_mode: unknown key (hint: file_mode goes under cdi)"),
        (
            "colour: red",
            "resources[0].colour: unknown key (known: allocate, cdi, devices, env, health, mounts, name, permissions, "
            "preferred_allocation, restore_profiles, units)",
        ),
        ("cdi: {mode: '0666'}", "resources[0].cdi.mode: unknown key (hint: did you mean 'file_mode'?)"),
        (
            "allocate: CDI",
            "resources[0].allocate: must be one of devices, cdi, both (got 'CDI') (hint: did you mean 'cdi'?)",
        ),
        (
            "env: {DEBUG: yes}",
            "resources[0].env.DEBUG: must be a string or a number (got True) "
            "(hint: YAML reads an unquoted yes, no, on, off, true or false as a boolean: write it in quotes)",
        ),
        (
            "env: [A=1]",
            "resources[0].env: must be a mapping of names to values (hint: write NAME: value entries, not a list)",
        ),
        (
            "mounts: {container_path: /a, host_path: /b}",
            "resources[0].mounts: must be a list (hint: start each entry with '- ')",
        ),
        (
            "mounts: [{container_path: /a, host_path: /b, read_only: 'false'}]",
            "resources[0].mounts[0].read_only: must be true or false (got 'false') "
            "(hint: write true or false, without quotes)",
        ),
    ],
)
def test_hints_for_the_common_mistakes(resource: str, line: str) -> None:
    assert problems(f"resources: [{{{KVM}, {resource}}}]") == [line]


def test_a_value_left_out_is_null_to_yaml() -> None:
    assert problems("resources:\n  - name: ate.dev/kvm\n    devices:\n") == [
        "resources[0].devices: must be a list (hint: nothing follows the colon, and YAML reads that as null)"
    ]


def test_hints_at_the_top_of_the_file() -> None:
    assert problems("resource: []\n") == [
        "resource: unknown key (hint: did you mean 'resources'?)",
        "resources: is required",
    ]
    assert problems("name: ate.dev/kvm\nresources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n") == [
        "name: unknown key (hint: name goes in each entry of resources)"
    ]
    assert problems("resources: [ate.dev/kvm]\n") == [
        "resources[0]: must be a mapping (hint: write its fields as key: value (name: ..., devices: ...))"
    ]


def test_a_problem_is_one_printable_line() -> None:
    problem = Problem("env.A\nB", "bad\x00", "quote\tit")
    assert str(problem) == "env.A\\nB: bad\\x00 (hint: quote\\tit)"
