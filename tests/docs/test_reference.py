"""The reference pages agree with the daemon: every flag of ``ate-devplugin run`` in
docs/configuration.md with its environment variable and default (a table generated from the
daemon's table of options, tools/gen-settings-doc.py), every field of the
config file in its example, the check-config examples as the command prints them, every
metric in docs/observability.md or docs/dra.md with its labels; the README installs as
docs/install.md does."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.daemon_facts import OPTIONS, metric_labels, run_flags
from tests.harness.chart import doc_block

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
METRIC_PAGES = (REPO / "docs" / "observability.md", REPO / "docs" / "dra.md")


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else None]


def _table_rows(text: str) -> list[list[str]]:
    rows = [line.strip().strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows if not set(row[0]) <= {"-", " "}]


def _flag_rows() -> dict[str, list[str]]:
    rows = _table_rows(_section(CONFIGURATION.read_text(), "## Flags and environment"))
    return {m.group(1): row for row in rows[1:] if (m := re.match(r"`(--[a-z-]+)", row[0]))}


def test_the_flag_table_is_generated_from_the_table_of_options() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen-settings-doc.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_every_flag_is_documented_with_its_environment_variable_and_default() -> None:
    """Read back from the page: the parser's flags, each with its variable and default."""
    rows = _flag_rows()
    flags = run_flags()
    assert sorted(rows) == sorted(flags), "docs/configuration.md's flag table and `ate-devplugin run` differ"
    for flag in flags:
        option = OPTIONS[flag[2:].replace("-", "_")]
        _, env, default, *_ = rows[flag]
        assert f"`{option.variable}`" in env, f"{flag}: its variable is {option.variable}"
        if option.default and not option.doc:
            assert option.shown_default in default, f"{flag}: its default is {option.shown_default!r}"
        else:
            assert default, f"{flag}: say what happens when it is not given"


def test_the_check_config_examples_print_what_the_page_shows() -> None:
    """Each block marked ``<!-- check-config: FILE -->`` is the command and its whole output."""
    examples = re.findall(
        r"<!-- check-config: \S+ -->\n```\n\$ ate-devplugin ([^\n]*)\n(.*?)```", CONFIGURATION.read_text(), re.DOTALL
    )
    assert examples, "docs/configuration.md shows no check-config example"
    for args, shown in examples:
        result = subprocess.run(
            [sys.executable, "-m", "ate_devplugin", *shlex.split(args)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.stdout + result.stderr == shown, f"ate-devplugin {args} prints:\n{result.stdout}{result.stderr}"


def test_the_config_example_shows_every_field() -> None:
    schema = json.loads((REPO / "chart" / "values.schema.json").read_text())
    resource = schema["properties"]["deviceConfig"]["properties"]["resources"]["items"]["properties"]
    fields = set(resource)
    fields |= set(resource["cdi"]["properties"]) | set(resource["mounts"]["items"]["properties"])
    example = _section(CONFIGURATION.read_text(), "## The config file").split("```yaml\n", 1)[1].split("```", 1)[0]
    missing = sorted(f for f in fields if not re.search(rf"\b{f}:", example))
    assert not missing, f"docs/configuration.md's example leaves out {missing}"


def _documented_metrics() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for page in METRIC_PAGES:
        for row in _table_rows(page.read_text()):
            if m := re.match(r"`(ate_devplugin_[a-z_]+)(?:\{([^}]*)\})?`", row[0]):
                out[m.group(1)] = {label.strip() for label in (m.group(2) or "").split(",") if label.strip()}
    return out


def test_every_metric_is_documented_with_its_labels() -> None:
    documented = _documented_metrics()
    exported = metric_labels()
    assert sorted(documented) == sorted(exported), (
        f"not documented: {sorted(set(exported) - set(documented))}; "
        f"documented but not exported: {sorted(set(documented) - set(exported))}"
    )
    for name, labels in exported.items():
        # resource_name is on every series unless a row says otherwise; a row may name it.
        assert documented[name] - {"resource_name"} == labels - {"resource_name"}, f"{name}: labels {sorted(labels)}"


@pytest.mark.parametrize("block", ["install", "verify", "helm-test"])
def test_the_readme_installs_as_the_install_page_does(block: str) -> None:
    """The README's install commands are docs/install.md's, which the real-cluster suite
    runs as printed (tests/e2e/test_user_path.py)."""
    assert doc_block(block, REPO / "README.md") == doc_block(block)
