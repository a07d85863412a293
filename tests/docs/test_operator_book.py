"""The operator's pages say what the chart does: every value they quote as ``key=value``
exists and is one the schema accepts, the flags they quote at their default say so, the
example pod the README shows is the file it names, the chart sets every option of the
daemon as its README says, and nothing calls the chart or image published while the
chart's home is the placeholder. Each test keeps one contradiction of issue 44 from coming
back."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.docs.daemon_facts import OPTIONS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

#: The pages an operator reads: the path, the chart's reference, the runbook and the pages
#: they send an operator to for a value.
OPERATOR_PAGES = [
    REPO / "README.md",
    CHART / "README.md",
    REPO / "docs" / "install.md",
    REPO / "docs" / "upgrade.md",
    REPO / "docs" / "uninstall.md",
    REPO / "docs" / "runbook.md",
    REPO / "docs" / "kvm-health.md",
    REPO / "docs" / "dra.md",
    REPO / "docs" / "configuration.md",
    REPO / "docs" / "observability.md",
    REPO / "docs" / "non-root-consumers.md",
    REPO / "docs" / "microvm-workers.md",
]
PAGE_IDS = [str(p.relative_to(REPO)) for p in OPERATOR_PAGES]

# `key.path=value`, the way the pages quote a value to set (--set syntax).
QUOTED_VALUE = re.compile(r"`([a-z][A-Za-z0-9]*(?:\.(?:[A-Za-z0-9_-]+|<[a-z]+>))+)=([^`\s]+)`")


def _quoted_values(text: str) -> list[tuple[str, str]]:
    return [(path, value) for path, value in QUOTED_VALUE.findall(text) if path.split(".")[0] in VALUES]


def _with(path: str, value: str) -> dict[str, Any]:
    """The default values with ``path`` set to ``value`` as `helm --set` would (a pool's
    placeholder name made a real one)."""
    values: dict[str, Any] = copy.deepcopy(VALUES)
    keys = [("example" if k.startswith("<") else k) for k in path.split(".")]
    node: dict[str, Any] = values
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        assert isinstance(node, dict), f"{path}: {key} is not a map"
    node[keys[-1]] = yaml.safe_load(value)
    return values


@pytest.mark.parametrize("page", OPERATOR_PAGES, ids=PAGE_IDS)
def test_every_quoted_value_is_one_the_chart_accepts(page: Path) -> None:
    """A page that says `pools.<pool>.kvmProbe.enabled=false` or `dra.taintEffect=NoExecute`
    names a value the schema has and accepts there (a pool's kvmProbe once was refused while
    the runbook told on-call to set it)."""
    validator = jsonschema.Draft7Validator(SCHEMA)
    problems = []
    for path, value in _quoted_values(page.read_text()):
        if "<" in value or "$" in value:
            continue  # a placeholder: the key is checked through the others
        errors = [e.message for e in validator.iter_errors(_with(path, value))]
        if errors:
            problems.append(f"`{path}={value}`: {errors[0]}")
    assert not problems, f"{page.name} quotes values the chart refuses:\n" + "\n".join(problems)


def test_the_quoted_value_check_catches_a_refused_value() -> None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    assert list(validator.iter_errors(_with("pools.<pool>.kvmProbe.socketDir", "/x")))
    assert list(validator.iter_errors(_with("dra.taintEffect", "PreferNoSchedule")))
    assert not list(validator.iter_errors(_with("pools.<pool>.kvmProbe.enabled", "false")))


@pytest.mark.parametrize("page", OPERATOR_PAGES, ids=PAGE_IDS)
def test_no_page_moves_the_kubelets_device_plugin_directory(page: Path) -> None:
    """The kubelet hard-codes /var/lib/kubelet/device-plugins whatever its --root-dir: no page
    tells an operator to set hostPaths.devicePlugins elsewhere (the runbook once did, while the
    chart README said to keep it)."""
    text = page.read_text()
    assert not re.search(r"\bset `hostPaths\.devicePlugins`", text)
    assert not re.search(r"`hostPaths\.devicePlugins=(?!/var/lib/kubelet/device-plugins`)", text)


def test_the_chart_readme_keeps_the_device_plugin_directory() -> None:
    assert "Keep `hostPaths.devicePlugins` at its default everywhere." in (CHART / "README.md").read_text()
    assert VALUES["hostPaths"]["devicePlugins"] == "/var/lib/kubelet/device-plugins"


def test_the_chart_sets_every_option_as_its_readme_says() -> None:
    """chart/README.md says daemon.extraArgs stays empty because the chart sets every option of
    `ate-devplugin run` from a value: so every option names the value that sets it."""
    readme = (CHART / "README.md").read_text()
    assert "Today the chart sets every option, so this stays empty" in readme
    unset = sorted(o.flag for o in OPTIONS.values() if not o.chart)
    assert not unset, f"options with no chart value (only daemon.extraArgs could set them): {unset}"
    for option in OPTIONS.values():
        value = re.match(r"use ([A-Za-z]+\.[A-Za-z.]+)", option.chart)
        if value:
            node: Any = VALUES
            for key in value[1].split("."):
                assert key in node, f"{option.flag}: {option.chart!r} names no value"
                node = node[key]


# `--flag value` as the pages quote an option with its value.
QUOTED_FLAG = re.compile(r"`(--[a-z-]+)[ =]([^`\s|]+)`")


@pytest.mark.parametrize("page", [REPO / "README.md", CHART / "README.md"], ids=["README.md", "chart/README.md"])
def test_a_flag_quoted_at_its_default_says_it_is_the_default(page: Path) -> None:
    """The README once called PodResources attribution optional (`--pod-resources on`) though
    it is on by default: a flag quoted with its default value is said to be the default in the
    same sentence."""
    flags = {o.flag: o for o in OPTIONS.values()}
    text = re.sub(r"\s+", " ", page.read_text())
    for sentence in re.split(r"(?<=[.:;])\s", text):
        for flag, value in QUOTED_FLAG.findall(sentence):
            option = flags.get(flag)
            if option is not None and value == option.default:
                assert "default" in sentence, f"{page.name}: `{flag} {value}` is the default; say so: {sentence!r}"


def test_dra_mode_is_not_called_resource_claims_only() -> None:
    """dra mode serves the prober's resource through the device-plugin API: where a page or
    values.yaml says "ResourceClaims only", it says that too."""
    for page in [*OPERATOR_PAGES, CHART / "values.yaml"]:
        text = page.read_text()
        for found in re.finditer("ResourceClaims only", text):
            nearby = text[max(0, found.start() - 300) : found.end() + 300]
            assert "prober" in nearby, f"{page.name}: 'ResourceClaims only' without the prober's resource"


EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```yaml\n(.*?)```\n", re.DOTALL)


def test_the_readmes_example_pod_is_the_file_it_names() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## A pod that uses /dev/kvm") :]
    section = section[: section.index("\n## ")]
    shown = EXAMPLE.findall(section)
    assert [name for name, _ in shown] == ["docs/examples/kvm-consumer-pod.yaml"]


@pytest.mark.parametrize("page", OPERATOR_PAGES, ids=PAGE_IDS)
def test_every_example_block_is_its_file(page: Path) -> None:
    for name, shown in EXAMPLE.findall(page.read_text()):
        assert shown == (REPO / name).read_text(), f"{page.name}: the block marked {name} is not that file"


PUBLISHED = re.compile(r"\bpublished (chart|image)|\b(chart|image)s? (is|are) published|\bare published together", re.I)


@pytest.mark.parametrize("page", OPERATOR_PAGES, ids=PAGE_IDS)
def test_nothing_is_called_published_under_the_placeholder_home(page: Path) -> None:
    """While `home` is the project's placeholder organisation (ate-dev), no page calls the
    chart or image published; the install page says what is and is not, and how to publish."""
    if "/ate-dev/" not in VALUES["home"] + "/":
        pytest.skip("home is a real organisation's")
    found = PUBLISHED.search(re.sub(r"\s+", " ", page.read_text()))
    assert not found, f"{page.name}: {found[0]!r}, while home is the placeholder"


def test_the_install_page_says_what_is_published_and_how_to_publish() -> None:
    install = re.sub(r"\s+", " ", (REPO / "docs" / "install.md").read_text())
    assert "The project publishes no image and no chart of its own." in install
    assert "placeholder organisation" in install
    assert "REGISTRY=registry.example.com/platform tools/release.sh" in install


def test_the_operator_pages_come_first() -> None:
    """README and chart README link the install, upgrade and uninstall pages before any other
    page, right after the README's first two commands."""
    readme = (REPO / "README.md").read_text()
    assert readme.index("make demo") < readme.index("make test") < readme.index("(docs/install.md)")
    first_link = re.search(r"\]\(([^)#]+)", readme[readme.index("make test") :])
    assert first_link
    assert first_link[1] == "docs/install.md"
    chart = (CHART / "README.md").read_text()
    first = re.search(r"\]\(([^)#]+)", chart)
    assert first
    assert first[1] == "../docs/install.md"
    for page in ("upgrade.md", "uninstall.md"):
        assert f"(docs/{page})" in readme
        assert f"(../docs/{page})" in chart
