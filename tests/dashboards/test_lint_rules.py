"""grafana/dashboard-linter's rules, checked on the Grafana dashboards.

The linter (a Go program) is not served here, so its default rule set is written out below,
one test per rule, with the rule's name. Each checks what the rule checks: templated
datasource, job and instance variables (multi-select, "All" = ``.+``, refreshed on time
range change, valid ``label_values`` queries), panels on the templated datasource with a
title, a description, a known unit and at least one target, every target valid PromQL (the
real parser: promtool), every selector matching ``job=~"$job"`` and ``instance=~"$instance"``,
``$__rate_interval`` in every rate and irate, counters (``_total``) only inside rate, irate or
increase, and dashboards that are not editable (the chart's dashboards.editable turns
editing on at install). The LogQL rules do not apply (no Loki targets).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.prometheus import INSTALL as PROMETHEUS_INSTALL
from tests.harness.require import require_tool

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
NAMES = sorted(p.name for p in DASHBOARDS.glob("*.json"))
Json = dict[str, Any]

# Panel types each panel rule looks at (the linter's own lists).
DATASOURCE_PANELS = {"singlestat", "graph", "table-old", "timeseries"}
TITLED_PANELS = {"stat", "singlestat", "graph", "table-old", "timeseries", "gauge"}
QUERY_PANELS = {"singlestat", "gauge", "table-old", "stat", "state-timeline", "timeseries"}
# Grafana's unit ids, as the linter enumerates them (valueFormats/categories.ts), less the
# currencies, energy, radiation and other physical families no panel here could mean.
VALID_UNITS = {
    "none",
    "string",
    "short",
    "percent",
    "percentunit",
    "humidity",
    "dB",
    "hex0x",
    "hex",
    "sci",
    "locale",
    "pixel",
    "bytes",
    "decbytes",
    "bits",
    "decbits",
    "kbytes",
    "deckbytes",
    "mbytes",
    "decmbytes",
    "gbytes",
    "decgbytes",
    "tbytes",
    "dectbytes",
    "pbytes",
    "decpbytes",
    "pps",
    "binBps",
    "Bps",
    "binbps",
    "bps",
    "KiBs",
    "Kibits",
    "KBs",
    "Kbits",
    "MiBs",
    "Mibits",
    "MBs",
    "Mbits",
    "GiBs",
    "Gibits",
    "GBs",
    "Gbits",
    "dateTimeAsIso",
    "dateTimeAsIsoNoDateIfToday",
    "dateTimeAsUS",
    "dateTimeAsUSNoDateIfToday",
    "dateTimeAsLocal",
    "dateTimeAsLocalNoDateIfToday",
    "dateTimeAsSystem",
    "dateTimeFromNow",
    "hertz",
    "ns",
    "µs",
    "ms",
    "s",
    "m",
    "h",
    "d",
    "dtdurationms",
    "dtdurations",
    "dthms",
    "dtdhms",
    "timeticks",
    "clockms",
    "clocks",
    "cps",
    "ops",
    "reqps",
    "rps",
    "wps",
    "iops",
    "cpm",
    "opm",
    "rpm",
    "wpm",
    "mps",
    "mpm",
    "bool",
    "bool_yes_no",
    "bool_on_off",
}
VARIABLE_FUNCTIONS = {"label_names", "label_values", "metrics", "query_result"}
DATASOURCE_UIDS = {"$datasource", "${datasource}"}


def load(name: str) -> Json:
    data: Json = json.loads((DASHBOARDS / name).read_text())
    return data


def panels(dashboard: Json) -> Iterator[Json]:
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def targets(dashboard: Json) -> Iterator[tuple[Json, Json]]:
    for panel in panels(dashboard):
        if panel["type"] in QUERY_PANELS or panel["type"] == "table":
            for target in panel["targets"]:
                yield panel, target


def template(dashboard: Json, name: str) -> Json | None:
    return next((v for v in dashboard["templating"]["list"] if v["name"] == name), None)


def variable_query(variable: Json) -> str:
    query = variable["query"]
    text: str = query["query"] if isinstance(query, dict) else query
    return text


# --- a small PromQL reader: the selectors of an expression and the call each sits in ------

TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<ident>[A-Za-z_:][\w:]*)|(?P<number>\d+(?:\.\d*)?(?:e[+-]?\d+)?)'
    r"|(?P<range>\[[^\]]*\])|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},]))"
)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "group"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # label, op, value
    range: str | None = None  # what is between [ and ]
    call: str = ""  # the function whose argument it is ("" at the top or in parentheses)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = TOKEN.match(expr, pos)
        assert m, f"cannot read {expr[pos:]!r} in {expr}"
        assert m.lastgroup
        out.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    return out


def selectors(expr: str) -> list[Selector]:
    toks = tokens(expr)
    found: list[Selector] = []
    calls: list[str] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in LABEL_LISTS and following == "(":
            i = _skip_parens(toks, i + 1)
            continue
        if kind == "ident" and following == "(":
            calls.append(text)
            i += 2
            continue
        if kind == "op" and text == "(":
            calls.append("")
        elif kind == "op" and text == ")":
            calls.pop()
        elif (kind == "ident" and text not in KEYWORDS | AGGREGATIONS) or (kind, text) == ("op", "{"):
            selector = Selector(text if kind == "ident" else "", call=calls[-1] if calls else "")
            if kind == "ident" and following == "{":
                i += 1
            if toks[i][1] == "{":
                i = _matchers(toks, i + 1, selector)
            if i + 1 < len(toks) and toks[i + 1][0] == "range":
                i += 1
                selector.range = toks[i][1][1:-1]
            found.append(selector)
        i += 1
    assert not calls, f"unbalanced parentheses in {expr}"
    return found


def _skip_parens(toks: list[tuple[str, str]], i: int) -> int:
    """The index after the ``)`` closing the ``(`` at ``i``."""
    depth = 0
    for j in range(i, len(toks)):
        depth += {"(": 1, ")": -1}.get(toks[j][1], 0)
        if depth == 0:
            return j + 1
    raise AssertionError("unbalanced parentheses")


def _matchers(toks: list[tuple[str, str]], i: int, selector: Selector) -> int:
    """Reads ``label op "value"`` pairs up to ``}``; returns the index of the ``}``."""
    while toks[i][1] != "}":
        (_, label), (_, op), (kind, value) = toks[i : i + 3]
        assert kind == "string", f"matcher {label}{op}{value}"
        selector.matchers.append((label, op, json.loads(value)))
        i += 3
        if toks[i][1] == ",":
            i += 1
    return i


def test_the_reader_finds_selectors_and_their_calls() -> None:
    """The reader the rules use, on forms the dashboards have (and one they must not)."""
    (s,) = selectors('sum by (node) (increase(x_total{job=~"$job"}[$__rate_interval])) > 0')
    assert (s.metric, s.matchers, s.range, s.call) == (
        "x_total",
        [("job", "=~", "$job")],
        "$__rate_interval",
        "increase",
    )
    a, b = selectors('count((a{i="1"} == 0) and on (job, instance) (b{j!="2"} > 0)) or vector(0)')
    assert (a.metric, a.call, b.metric, b.call) == ("a", "", "b", "")
    (bare,) = selectors("time() - max(process_start_time_seconds)")
    assert (bare.metric, bare.matchers, bare.call) == ("process_start_time_seconds", [], "max")
    (q,) = selectors('histogram_quantile(0.99, sum by (le) (rate(h_bucket{a="b"}[5m]))) >= 0')
    assert (q.metric, q.range, q.call) == ("h_bucket", "5m", "rate")


# --- dashboard rules -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_template_datasource_rule(name: str) -> None:
    sources = [v for v in load(name)["templating"]["list"] if v["type"] == "datasource"]
    assert len(sources) == 1, "one templated data source"
    assert sources[0]["query"] == "prometheus"
    assert sources[0]["name"] in ("datasource", "prometheus_datasource")
    assert sources[0]["label"] in ("Data source", "Prometheus data source")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("variable", ["job", "instance"])
def test_template_job_and_instance_rules(name: str, variable: str) -> None:
    t = template(load(name), variable)
    assert t is not None, f"no {variable} template"
    assert t["datasource"]["uid"] in DATASOURCE_UIDS
    assert t["type"] == "query"
    assert t["label"] == variable.title()
    assert t["multi"], f"{variable} is not multi-select"
    assert t.get("allValue") == ".+"


@pytest.mark.parametrize("name", NAMES)
def test_template_on_time_change_reload_rule(name: str) -> None:
    for v in load(name)["templating"]["list"]:
        if v["type"] == "query":
            assert v["refresh"] == 2, f"{v['name']}: refresh on time range change (2), not {v['refresh']}"


@pytest.mark.parametrize("name", NAMES)
def test_uneditable_dashboard_rule(name: str) -> None:
    assert load(name)["editable"] is False


# --- panel rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_panel_datasource_rule(name: str) -> None:
    for panel in panels(load(name)):
        if panel["type"] in DATASOURCE_PANELS:
            assert panel["datasource"]["uid"] in DATASOURCE_UIDS, panel["title"]


@pytest.mark.parametrize("name", NAMES)
def test_panel_title_description_rule(name: str) -> None:
    for panel in panels(load(name)):
        if panel["type"] in TITLED_PANELS:
            assert panel.get("title"), panel
            assert panel.get("description"), f"{panel['title']}: no description"


@pytest.mark.parametrize("name", NAMES)
def test_panel_units_rule(name: str) -> None:
    for panel in panels(load(name)):
        if panel["type"] not in TITLED_PANELS:
            continue
        if panel["type"] == "stat" and panel["options"]["reduceOptions"].get("fields", "") != "":
            continue  # a non-numeric field: the linter skips it
        defaults = panel["fieldConfig"]["defaults"]
        if defaults.get("mappings"):
            continue  # value mappings replace the number: no unit needed (the linter skips these too)
        units = [p["value"] for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"]
        unit = units[-1] if units else defaults.get("unit", "")
        assert unit in VALID_UNITS, f"{panel['title']}: unit {unit!r}"


@pytest.mark.parametrize("name", NAMES)
def test_panel_no_targets_rule(name: str) -> None:
    for panel in panels(load(name)):
        if panel["type"] in TITLED_PANELS:
            assert panel.get("targets"), f"{panel['title']}: no targets"


# --- target rules --------------------------------------------------------------------------


def sample_values(expr: str) -> str:
    """Variables replaced by sample values, as the linter does before parsing."""
    for var, value in (("$__rate_interval", "1m"), ("$__range", "1h"), ("$__interval", "15s")):
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: f"{m.group(1)}-sample", expr)


def test_target_promql_rule_and_template_label_promql_rule(tmp_path: Path) -> None:
    """Every target and every variable's label_values() selector parse as PromQL (promtool)."""
    exprs: dict[str, str] = {}
    for name in NAMES:
        d = load(name)
        for panel, target in targets(d):
            assert target["expr"].strip(), f"{name} {panel['title']}: empty query"
            exprs[f"{name} {panel['title']} {target['refId']}"] = target["expr"]
        for v in d["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"(\w+)\((.*)\)", variable_query(v), re.DOTALL)
            assert m, f"{name} {v['name']}: not a function call"
            assert m.group(1) in VARIABLE_FUNCTIONS, f"{name} {v['name']}: {m.group(1)}()"
            if m.group(1) == "label_values":
                selector, _, label = m.group(2).rpartition(",")
                assert re.fullmatch(r"\s*\w+\s*", label), f"{name} {v['name']}: label {label!r}"
                exprs[f"{name} variable {v['name']}"] = selector
    promtool = require_tool("promtool", PROMETHEUS_INSTALL)
    rules = tmp_path / "queries.yaml"
    groups = [
        {"name": "q", "rules": [{"record": f"q{i}", "expr": sample_values(e)} for i, e in enumerate(exprs.values())]}
    ]
    rules.write_text(yaml.safe_dump({"groups": groups}))
    out = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60, check=False
    )
    where = dict(enumerate(exprs))
    assert out.returncode == 0, f"{out.stdout}{out.stderr}\n(rule qN is query N of {json.dumps(where, indent=1)})"


JOBS_ONLY = [("cluster", "=", "$cluster"), ("job", "=~", "$job")]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("label", ["job", "instance"])
def test_target_job_and_instance_rules(name: str, label: str) -> None:
    """Every selector of every query has ``label=~"$label"``, but two, the exclusions a .lint
    file would list: kube-state-metrics' series of the release's DaemonSet (another job's), and
    the build_info that keeps ``up`` to the daemons' jobs (an instance that is down has none)."""
    for panel, target in targets(load(name)):
        for s in selectors(target["expr"]):
            if s.metric.startswith("kube_") and {m[2] for m in s.matchers} & {"$daemonset"}:
                continue
            if s.metric == "kube_pod_status_phase":  # joined on the release's pods
                continue
            if (s.metric, s.matchers) == ("ate_devplugin_build_info", JOBS_ONLY) and label == "instance":
                continue
            assert (label, "=~", f"${label}") in s.matchers, f"{panel['title']} {target['refId']}: {s.metric}"


@pytest.mark.parametrize("name", NAMES)
def test_target_rate_interval_rule(name: str) -> None:
    for panel, target in targets(load(name)):
        for s in selectors(target["expr"]):
            if s.range is not None and s.call in ("rate", "irate"):
                assert s.range == "$__rate_interval", f"{panel['title']}: {s.call}() over [{s.range}]"


@pytest.mark.parametrize("name", NAMES)
def test_target_counter_agg_rule(name: str) -> None:
    for panel, target in targets(load(name)):
        for s in selectors(target["expr"]):
            if s.metric.endswith("_total"):
                assert s.range is not None, f"{panel['title']}: {s.metric} is a counter, read without a range"
                assert s.call in ("rate", "irate", "increase"), f"{panel['title']}: {s.metric} in {s.call or '()'}"
