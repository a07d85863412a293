"""The rules a schema cannot say: the version, configs that can never work, CDI names."""

from __future__ import annotations

import pytest

from ate_devplugin.config import (
    ConfigError,
    cdi_name_problem,
    parse_resources,
)

MINIMAL = "resources:\n  - name: ate.dev/kvm\n    devices: [/dev/kvm]\n"


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


@pytest.mark.parametrize(
    ("name", "ok"),
    [("ate.dev/kvm", True), ("a/b", True), ("9ate.dev/kvm", False), ("ate.dev/9kvm", False), ("ate.dev/_x", False)],
)
def test_a_cdi_kind_starts_each_part_with_a_letter(name: str, ok: bool) -> None:
    assert (cdi_name_problem(name) is None) is ok
