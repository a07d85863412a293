"""The Grafana dashboards: generated from one source (with their Perses twins), built to
conventions, and every query answered with data by a real Prometheus that scraped the daemon.
grafana/dashboard-linter's rules are in test_lint_rules.py, the rendered Perses dashboards
in test_dashboards_rendered.py."""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboards import writer
from tests.harness.monitoring import (
    RESOURCE,
    FleetScenario,
    reads_dra,
    reads_kube_state_metrics,
    reads_pod_resources,
)
from tests.harness.prometheus import Prometheus, PrometheusError
from tests.harness.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
# Stable: links, bookmarks and the chart's ConfigMaps depend on them. Never change one.
EXPECTED_UIDS = {
    "ate-devplugin-fleet.json": "ate-devplugin-fleet",
    "ate-devplugin-node.json": "ate-devplugin-node",
}
DS_UID = "${datasource}"
ALLOWED_RANGES = {"$__rate_interval", "$__range"}
RANGE_FUNCTION = re.compile(r"\b(irate|rate|increase)\(\s*[A-Za-z_:][\w:]*(?:\{[^}]*\})?\[([^\]]+)\]\s*\)")
RANGE_SELECTOR = re.compile(r"\[([^\]]+)\]")

Json = dict[str, Any]


def load(name: str) -> Json:
    data: Json = json.loads((DASHBOARDS / name).read_text())
    return data


ALL = {name: load(name) for name in sorted(p.name for p in DASHBOARDS.glob("*.json"))}


def panels(dashboard: Json) -> Iterator[Json]:
    """Every panel, rows' nested panels included, rows excluded."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dashboard: Json) -> Iterator[tuple[str, str, bool]]:
    """(where, PromQL, instant) for every panel target and Prometheus annotation."""
    for panel in panels(dashboard):
        for t in panel["targets"]:
            yield f"panel {panel['title']!r} target {t['refId']}", t["expr"], bool(t.get("instant"))
    for a in dashboard["annotations"]["list"]:
        if not a.get("builtIn"):
            yield f"annotation {a['name']!r}", a["expr"], False


def query_variables(dashboard: Json) -> list[Json]:
    return [v for v in dashboard["templating"]["list"] if v["type"] == "query"]


def variable_query(variable: Json) -> str:
    """The query a variable runs: a string, or the Prometheus editor's {"query": ...} object."""
    query = variable["query"]
    text: str = query["query"] if isinstance(query, dict) else query
    return text


# --- one source ----------------------------------------------------------------------


def test_json_matches_the_generator() -> None:
    assert set(writer.DASHBOARDS) == set(ALL), "a dashboard JSON file without generator entry, or the reverse"
    written = {p for p in DASHBOARDS.rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts}
    generated = writer.generated()
    assert written == set(generated), "a generated file the generator no longer writes, or the reverse"
    for path, text in generated.items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} differs from dashboards/generate.py: run python dashboards/generate.py"
        )


def test_perses_twins_have_the_same_panels() -> None:
    """Each Perses dashboard shows the Grafana one's panels, rows and queries, in the same order."""
    for name, grafana in ALL.items():
        perses = json.loads((DASHBOARDS / "perses" / name).read_text())["spec"]
        assert perses["display"]["name"] == grafana["title"]
        rows = [p for p in grafana["panels"] if p["type"] == "row"]
        assert [layout["spec"]["display"]["title"] for layout in perses["layouts"]] == [r["title"] for r in rows]
        assert [not layout["spec"]["display"]["collapse"]["open"] for layout in perses["layouts"]] == [
            r["collapsed"] for r in rows
        ]
        grafana_panels = [(p["title"], [t["expr"] for t in p["targets"]]) for p in panels(grafana)]
        perses_panels = [
            (
                perses["panels"][item["content"]["$ref"].split("/")[-1]]["spec"]["display"]["name"],
                [
                    q["spec"]["plugin"]["spec"]["query"]
                    for q in perses["panels"][item["content"]["$ref"].split("/")[-1]]["spec"]["queries"]
                ],
            )
            for layout in perses["layouts"]
            for item in layout["spec"]["items"]
        ]
        assert perses_panels == grafana_panels, name
        variables = [v for v in grafana["templating"]["list"] if v["type"] != "datasource"]
        assert [v["spec"]["name"] for v in perses["variables"]] == [v["name"] for v in variables]
        for mine, theirs in zip(perses["variables"], variables, strict=True):
            if theirs["type"] == "constant":  # the chart sets its value for the release
                assert mine["kind"] == "TextVariable"
                assert (mine["spec"]["value"], mine["spec"]["constant"]) == (theirs["query"], True)


def test_the_generator_runs_on_the_pinned_sdk() -> None:
    """The JSON carries the SDK's defaults, so another SDK version fails the drift check above."""
    pins = re.findall(r'"grafana-foundation-sdk==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert len(pins) == 1, "pyproject.toml pins grafana-foundation-sdk exactly, once"
    installed = importlib.metadata.version("grafana-foundation-sdk")
    assert installed == pins[0], (
        f"grafana-foundation-sdk {installed} installed, {pins[0]} pinned: pip install -e .[dev]"
    )


# --- conventions -----------------------------------------------------------------------


def test_uids_are_the_stable_ones_and_unique() -> None:
    assert set(ALL) == set(EXPECTED_UIDS)
    for name, d in ALL.items():
        assert d["uid"] == EXPECTED_UIDS[name], name
    uids = [d["uid"] for d in ALL.values()]
    titles = [d["title"] for d in ALL.values()]
    assert len(set(uids)) == len(uids)
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_no_import_placeholders(name: str) -> None:
    text = (DASHBOARDS / name).read_text()
    d = ALL[name]
    assert "__inputs" not in d
    assert "__requires" not in d
    assert "${DS_" not in text, "import-time datasource placeholder: use the datasource variable"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_datasource_variable(name: str) -> None:
    ds = [v for v in ALL[name]["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1
    assert ds[0]["name"] == "datasource"
    assert ds[0]["query"] == "prometheus"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_everything_queries_through_the_datasource_variable(name: str) -> None:
    d = ALL[name]
    for panel in panels(d):
        assert panel["datasource"] == {"type": "prometheus", "uid": DS_UID}, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for t in panel["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": DS_UID}, (panel["title"], t["refId"])
    for a in d["annotations"]["list"]:
        if not a.get("builtIn"):
            assert a["datasource"]["uid"] == DS_UID, a["name"]
    for v in query_variables(d):
        assert v["datasource"]["uid"] == DS_UID, v["name"]


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_every_panel_has_a_unit_and_a_description(name: str) -> None:
    for panel in panels(ALL[name]):
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert len(panel.get("description", "")) >= 20, f"{panel['title']}: no useful description"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_ranges_use_grafana_intervals(name: str) -> None:
    for where, expr, _ in queries(ALL[name]):
        for selector in RANGE_SELECTOR.findall(expr):
            assert selector in ALLOWED_RANGES, f"{where}: fixed range [{selector}] in {expr}"
        for func, selector in RANGE_FUNCTION.findall(expr):
            if func in ("rate", "irate"):
                assert selector == "$__rate_interval", f"{where}: {func}() over [{selector}]"
        assert expr.count("rate(") + expr.count("increase(") == len(RANGE_FUNCTION.findall(expr)), (
            f"{where}: a rate/increase the checks cannot read: {expr}"
        )


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_layout(name: str) -> None:
    d = ALL[name]
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        covered = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not covered & cells, f"{p['title']} overlaps another panel"
        cells |= covered


def test_variables() -> None:
    fleet = {v["name"]: v for v in query_variables(ALL["ate-devplugin-fleet.json"])}
    node = {v["name"]: v for v in query_variables(ALL["ate-devplugin-node.json"])}
    assert list(fleet) == list(node) == ["cluster", "job", "node", "instance", "resource"]
    assert fleet["node"]["multi"], "the fleet view filters on any set of nodes"
    assert fleet["node"]["includeAll"]
    assert not node["node"]["multi"], "the drill-down shows one node"
    assert not node["node"]["includeAll"]
    for d in (fleet, node):
        # The kubernetes-mixin convention: a hidden, single-valued cluster; an empty value matches
        # series without the label, so one-cluster setups need nothing.
        assert d["cluster"]["hide"] == 2
        assert not d["cluster"]["multi"]
        assert d["job"]["multi"]
        assert d["job"]["includeAll"]
        assert d["job"]["allValue"] == ".+"


def test_fleet_links_to_the_node_drill_down() -> None:
    text = (DASHBOARDS / "ate-devplugin-fleet.json").read_text()
    assert f"/d/{EXPECTED_UIDS['ate-devplugin-node.json']}/" in text


# --- against a real Prometheus ---------------------------------------------------------


def substitute(expr: str, node: str) -> str:
    """Fill the variables as Grafana would, with a fleet scenario's values.

    Multi-value variables are regex-escaped by Grafana, hence ``ate\\\\.dev/kvm`` (PromQL
    reads ``ate\\.dev/kvm``); $__rate_interval is what Grafana computes for a 15 s scrape.
    """
    values = {
        "$__rate_interval": "1m",
        "$__range": "1h",
        "$cluster": "",  # the Prometheus adds no cluster label
        "$instance": ".+",
        "$job": "ate-devplugin",
        "$node": node,
        "$resource": RESOURCE.replace(".", "\\\\."),
        "$daemonset": "ate-devplugin",  # the constant's default: the default release's DaemonSet
    }
    for var, value in values.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unfilled variable in {expr}"
    return expr


def has_data(prom: Prometheus, expr: str, instant: bool, start: float, end: float) -> str | None:
    """None when the query gives at least one finite value; else what it gave."""
    step = 2.0
    # Evaluation times run back from ``end`` so that the last one sees the newest samples.
    start = end - step * math.ceil((end - start) / step)
    try:
        if instant:
            values = [s.value for s in prom.query(expr, at=end)]
        else:
            values = [v for series in prom.query_range(expr, start, end, step) for _, v in series.values]
    except PrometheusError as exc:
        return str(exc)
    if any(math.isfinite(v) for v in values):
        return None
    return f"{len(values)} values, none finite"


CASES = [
    ("ate-devplugin-fleet.json", "node-a"),
    ("ate-devplugin-fleet.json", ".*"),  # the "All" choice
    ("ate-devplugin-node.json", "node-a"),
]


@pytest.mark.parametrize(("name", "node"), CASES, ids=[f"{n.split('.')[0]}-{v}" for n, v in CASES])
def test_every_query_returns_data(fleet: FleetScenario, name: str, node: str) -> None:
    prom = fleet.prometheus
    end = time.time()
    empty = []
    checked = 0
    for where, expr, instant in queries(ALL[name]):
        if reads_pod_resources(expr):
            continue  # PodResources off, none in the bench: tests/e2e/test_pods_holding_units.py runs these
        if reads_dra(expr):
            continue  # device-plugin mode in the bench: tests/e2e/test_dra.py runs these
        if reads_kube_state_metrics(expr):
            continue  # no API server here: test_dashboards_rendered.py runs these on real kube-state-metrics
        filled = substitute(expr, node)
        problem = has_data(prom, filled, instant, fleet.started, end)
        checked += 1
        if problem:
            empty.append(f"{where}: {problem}\n    {filled}")
    assert checked >= 10
    assert not empty, f"{len(empty)} of {checked} queries gave no data (kubelet: {fleet.driver_kind}):\n" + "\n".join(
        empty
    )


def label_values(prom: Prometheus, definition: str, node: str) -> list[str]:
    """What Grafana asks Prometheus for a ``label_values(selector, label)`` variable."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert m, f"unexpected variable query {definition}"
    selector = substitute(m.group(1), node)
    values: list[str] = prom.api(f"label/{m.group(2)}/values", {"match[]": selector})
    return values


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_variables_offer_the_scraped_values(fleet: FleetScenario, name: str) -> None:
    variables = {v["name"]: variable_query(v) for v in query_variables(ALL[name])}
    prom = fleet.prometheus
    assert label_values(prom, variables["cluster"], ".*") == []
    assert label_values(prom, variables["job"], ".*") == ["ate-devplugin"]
    assert label_values(prom, variables["node"], ".*") == ["node-a", "node-b"]
    assert label_values(prom, variables["instance"], "node-a") == [fleet.nodes["node-a"].target.address]
    assert label_values(prom, variables["resource"], "node-a") == [RESOURCE]


def test_latency_exemplars_carry_trace_ids_that_were_exported(fleet: FleetScenario) -> None:
    """The Allocate latency panels show exemplars; each must lead to a received trace."""
    prom = fleet.prometheus
    exemplars = prom.query_exemplars(
        'ate_devplugin_allocate_duration_seconds_bucket{node="node-a"}', fleet.started - 60, time.time() + 60
    )
    ids = {e.labels.get("trace_id") for e in exemplars}
    assert exemplars, "no exemplars stored for the Allocate histogram"
    assert None not in ids, exemplars
    # Spans are exported in batches.
    wait_until(lambda: ids <= fleet.trace_ids(), 60, "every exemplar's trace id at the OTLP receiver", 0.5)


def test_runbook_names_real_panels() -> None:
    """docs/runbook.md sends on-call to panels as **Fleet / Title** and **Node / Title**."""
    titles = {
        "Fleet": {p["title"] for p in panels(ALL["ate-devplugin-fleet.json"])},
        "Node": {p["title"] for p in panels(ALL["ate-devplugin-node.json"])},
    }
    refs = re.findall(r"\*\*(Fleet|Node) / ([^*]+)\*\*", (REPO / "docs" / "runbook.md").read_text())
    assert len(refs) >= 10
    missing = sorted({f"{board} / {title}" for board, title in refs if title not in titles[board]})
    assert not missing, f"runbook names panels that do not exist: {missing}"
