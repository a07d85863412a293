"""Writes the dashboards in this folder, Grafana's and Perses', from this file, their one source.

    python dashboards/generate.py          # rewrite the generated files
    python dashboards/generate.py --check  # exit 1 if a generated file differs from this code

The panels are defined once, as the project's own small model (``Stat``, ``TimeSeries``,
``StateTimeline``, ``Table``, grouped in rows of a ``Board``); two writers turn a board into
a Grafana dashboard (with Grafana's own SDK, grafana-foundation-sdk, pinned in
pyproject.toml) and into a Perses dashboard (the ``Dashboard`` resource of Perses' API,
with the upstream panel plugins: StatChart, TimeSeriesChart, StatusHistoryChart, Table).
Generated:

    ate-devplugin-{fleet,node}.json         Grafana (the chart ships them as ConfigMaps)
    perses/ate-devplugin-{fleet,node}.json  Perses, for `percli apply` (project ate-devplugin)
    perses/persesdashboards.yaml            the same as PersesDashboard objects (perses-operator)

A row's panels are laid out left to right, wrapping at 24 columns (keep a row's widths
adding up to lines of 24). To add a panel: append a ``stat``, ``timeseries``,
``state_timeline`` or ``table`` call to its row in ``fleet()`` or ``node()``, run this file
and tools/sync-chart-files.py (the chart ships a copy). The live test runs the new query
against the fleet scenario of tests/harness/monitoring.py, so the scenario must produce
the series it reads; queries on the DRA driver's series (ate_devplugin_dra_*, in the
collapsed "DRA driver" rows) are run by tests/e2e/test_dra.py instead, as the PodResources
ones (collapsed "Pods" rows) are by test_pods_holding_units.py.

tests/dashboards/ fails when a generated file drifts from this code, checks the conventions
and grafana/dashboard-linter's rules, runs every query against a real Prometheus that
scraped the daemon, and renders the Perses dashboards in Chromium (docs/dashboards.md).

Label sets are those of the chart's ServiceMonitor: job, instance, namespace, pod, node,
plus resource_name on the daemon's own series, and cluster where the Prometheus adds one
(a hidden variable, as the kubernetes-mixin dashboards have it: empty matches no label).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as c
from grafana_foundation_sdk.models import dashboard as m
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import statetimeline as statetimeline_model

HERE = Path(__file__).resolve().parent
DS = m.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["ate-devplugin", "kubernetes", "device-plugin"]
FLEET_UID = "ate-devplugin-fleet"
NODE_UID = "ate-devplugin-node"
PERSES_PROJECT = "ate-devplugin"

# Label matchers shared by every query; Grafana and Perses fill the variables.
DAEMON = 'cluster="$cluster", job=~"$job", instance=~"$instance", node=~"$node"'
RES = DAEMON + ', resource_name=~"$resource"'

# Grafana's named colours and the same ones as hex for Perses.
GREEN, RED = "green", "red"
HEX = {GREEN: "#73BF69", RED: "#F2495C", "orange": "#FF9830"}


# --- the project's panel model ----------------------------------------------------------

Step = tuple[float | None, str]  # from this value up (None: from the lowest), this colour
ValueText = tuple[int, str, str]  # a value, the text shown for it, its colour


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    exemplar: bool = False
    color: str = ""  # one colour for all its series (green: success, red: failure); else the palette


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: Sequence[Query]
    unit: str  # Grafana's unit id; UNITS gives the Perses format
    width: int
    height: int


@dataclass(frozen=True)
class Stat(Panel):
    steps: Sequence[Step]
    mappings: Sequence[ValueText]
    label_as_value: str = ""  # show this label's value instead of the number (e.g. version)


@dataclass(frozen=True)
class TimeSeries(Panel):
    bars: bool = False
    stack: bool = False
    list_legend: bool = False  # names only, side by side; else a table with the last and highest value


@dataclass(frozen=True)
class StateTimeline(Panel):
    mappings: Sequence[ValueText] = ()


@dataclass(frozen=True)
class ColumnStyle:
    """How one table column is shown: its value mapping, threshold colours, a link."""

    mappings: Sequence[ValueText] = ()
    steps: Sequence[Step] = ()
    link: dict[str, str] | None = None


@dataclass(frozen=True)
class Table(Panel):
    columns: dict[str, str] = field(default_factory=dict)  # label or "#A" (query A's value) -> header
    styles: dict[str, ColumnStyle] = field(default_factory=dict)  # header -> style
    sort_by: str = ""
    problems: bool = False  # every value column counts problems: 0 is fine, more is not


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    text: str
    color: str


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: Sequence[tuple[str, Sequence[Panel]]]
    collapsed: Sequence[tuple[str, Sequence[Panel]]]  # closed until clicked: modes many nodes do not run
    multi_node: bool
    annotations: Sequence[Annotation] = ()


# --- building blocks ---------------------------------------------------------------------


def target(expr: str, legend: str = "", *, instant: bool = False, exemplar: bool = False, color: str = "") -> Query:
    return Query(expr, legend, instant, exemplar, color)


def good_and_bad(
    counter: str, selector: str, label: str, good: str, *, by: str = "", fn: str = "increase"
) -> list[Query]:
    """Two queries of a counter: its series with ``label`` = ``good`` in green, the others in red."""
    group = f"sum by ({by}, {label})" if by else f"sum by ({label})"
    legend = (f"{{{{{by}}}}} " if by else "") + f"{{{{{label}}}}}"
    return [
        target(f'{group} ({fn}({counter}{{{selector}, {label}{op}"{good}"}}[$__rate_interval]))', legend, color=color)
        for op, color in (("=", GREEN), ("!=", RED))
    ]


REGISTERED = [(0, "not registered", RED), (1, "registered", GREEN)]
UP = [(0, "down", RED), (1, "up", GREEN)]
PRESENT = [(0, "absent", RED), (1, "present", GREEN)]
YES_IS_BAD = [(0, "no", GREEN), (1, "yes", RED)]
OK_IF_ZERO: list[Step] = [(None, GREEN), (1, RED)]
OK_IF_POSITIVE: list[Step] = [(None, RED), (1, GREEN)]
NEUTRAL: list[Step] = [(None, GREEN)]


def stat(
    title: str,
    description: str,
    targets: Sequence[Query],
    unit: str = "none",
    *,
    steps: Sequence[Step] = NEUTRAL,
    mappings: Sequence[ValueText] = (),
    width: int = 3,
    label_as_value: str = "",
) -> Stat:
    return Stat(title, description, targets, unit, width, 4, steps, mappings, label_as_value)


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Query],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
    bars: bool = False,
    stack: bool = False,
) -> TimeSeries:
    # Bars count events, the names say enough, unless there is one per node (a fleet: a table scrolls).
    list_legend = bars and not any("{{node}}" in t.legend for t in targets)
    return TimeSeries(title, description, targets, unit, width, height, bars, stack, list_legend)


def state_timeline(
    title: str, description: str, targets: Sequence[Query], mappings: Sequence[ValueText], *, width: int = 12
) -> StateTimeline:
    return StateTimeline(title, description, targets, "none", width, 8, mappings)


def table(
    title: str,
    description: str,
    targets: Sequence[Query],
    columns: dict[str, str],
    *,
    styles: dict[str, ColumnStyle] | None = None,
    sort_by: str = "",
    problems: bool = False,
    width: int = 24,
    height: int = 8,
) -> Table:
    """Instant queries joined on their labels; ``columns`` names the columns ("#A" for query A's value)."""
    return Table(title, description, targets, "none", width, height, columns, styles or {}, sort_by, problems)


def quantiles(selector: str, by: str, *qs: float, exemplar_on: float | None = None) -> list[Query]:
    group = f"{by}, le" if by else "le"
    out = []
    for q in qs:
        # >= 0 drops the NaN of windows without a call: gaps, not "NaN" in the legends.
        expr = (
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate(ate_devplugin_allocate_duration_seconds_bucket{{{selector}}}[$__rate_interval]))) >= 0"
        )
        prefix = f"p{round(q * 100)}"
        legend = f"{prefix} {{{{{by}}}}}" if by else prefix
        out.append(target(expr, legend, exemplar=q == exemplar_on))
    return out


def rows_layout(panels: Sequence[Panel]) -> list[tuple[Panel, int, int]]:
    """(panel, x, y) within a row: left to right, a new line where the next one does not fit."""
    out, x, y, line_height = [], 0, 0, 0
    for panel in panels:
        if x + panel.width > 24:
            x, y, line_height = 0, y + line_height, 0
        out.append((panel, x, y))
        x += panel.width
        line_height = max(line_height, panel.height)
    return out


# --- variables (shared by both writers) -----------------------------------------------


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    selector: str  # the series whose label values are offered
    multi: bool
    hidden: bool = False


def variables(*, multi_node: bool) -> list[Variable]:
    daemons = "ate_devplugin_build_info"
    return [
        Variable("cluster", "Cluster", daemons, multi=False, hidden=True),
        Variable("job", "Job", f'{daemons}{{cluster="$cluster"}}', multi=True),
        Variable("node", "Node", f'{daemons}{{cluster="$cluster", job=~"$job"}}', multi=multi_node),
        Variable("instance", "Instance", f'{daemons}{{cluster="$cluster", job=~"$job", node=~"$node"}}', multi=True),
        Variable("resource", "Resource", f"ate_devplugin_devices{{{DAEMON}}}", multi=True),
    ]


def label_name(variable: Variable) -> str:
    return "resource_name" if variable.name == "resource" else variable.name


# --- Grafana -----------------------------------------------------------------------------

AnyBuilder = Builder[m.Panel]
AnyPanel = TypeVar("AnyPanel", stat_panel.Panel, timeseries_panel.Panel, statetimeline.Panel, table_panel.Panel)


def grafana_target(query: Query, ref_id: str) -> prometheus.Dataquery:
    built = (
        prometheus.Dataquery()
        .datasource(DS)
        .editor_mode(pm.QueryEditorMode.CODE)
        .expr(query.expr)
        .legend_format(query.legend or "__auto")
        .exemplar(query.exemplar)
        .ref_id(ref_id)
    )
    return built.instant().format(pm.PromQueryFormat.TABLE) if query.instant else built.range()


def grafana_thresholds(steps: Sequence[Step]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(m.ThresholdsMode.ABSOLUTE).steps([m.Threshold(v, color) for v, color in steps])


def grafana_mappings(entries: Sequence[ValueText]) -> list[m.ValueMapping]:
    if not entries:
        return []
    results = {
        str(v): m.ValueMappingResult(text=text, color=color, index=i) for i, (v, text, color) in enumerate(entries)
    }
    return [m.ValueMap(options=results)]


def grafana_common(builder: AnyPanel, panel: Panel) -> AnyPanel:
    """What every panel has: its queries (refIds A, B, ...) through the datasource variable, a unit, a size."""
    builder.title(panel.title).description(panel.description).datasource(DS).unit(panel.unit)
    builder.span(panel.width).height(panel.height)
    for i, query in enumerate(panel.queries):
        ref_id = chr(ord("A") + i)
        builder.with_target(grafana_target(query, ref_id))
        if query.color:
            fixed = {"mode": "fixed", "fixedColor": query.color}
            builder.override_by_query(ref_id, [m.DynamicConfigValue("color", fixed)])
    return builder


def grafana_stat(panel: Stat) -> AnyBuilder:
    return (
        grafana_common(stat_panel.Panel(), panel)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(c.BigValueColorMode.BACKGROUND)
        .graph_mode(c.BigValueGraphMode.NONE)
        .text_mode(c.BigValueTextMode.NAME if panel.label_as_value else c.BigValueTextMode.AUTO)
        .justify_mode(c.BigValueJustifyMode.AUTO)
        .orientation(c.VizOrientation.AUTO)
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.THRESHOLDS))
        .thresholds(grafana_thresholds(panel.steps))
        .mappings(grafana_mappings(panel.mappings))
    )


def grafana_timeseries(panel: TimeSeries) -> AnyBuilder:
    return (
        grafana_common(timeseries_panel.Panel(), panel)
        .legend(
            # Bars count events: a list of names; lines: a table with the last and highest value.
            cb.VizLegendOptions()
            .display_mode(c.LegendDisplayMode.LIST if panel.list_legend else c.LegendDisplayMode.TABLE)
            .placement(c.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs([] if panel.list_legend else ["lastNotNull", "max"])
        )
        .tooltip(cb.VizTooltipOptions().mode(c.TooltipDisplayMode.MULTI).sort(c.SortOrder.DESCENDING))
        .min(0)
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.PALETTE_CLASSIC))
        .draw_style(c.GraphDrawStyle.BARS if panel.bars else c.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(60 if panel.bars else 10)
        .show_points(c.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(cb.StackingConfig().mode(c.StackingMode.NORMAL if panel.stack else c.StackingMode.NONE).group("A"))
    )


def grafana_state_timeline(panel: StateTimeline) -> AnyBuilder:
    builder = (
        grafana_common(statetimeline.Panel(), panel)
        .merge_values(True)
        .show_value(c.VisibilityMode.NEVER)
        .align_value(c.TimelineValueAlignment.LEFT)
        .row_height(0.9)
        .legend(
            cb.VizLegendOptions()
            .display_mode(c.LegendDisplayMode.LIST)
            .placement(c.LegendPlacement.BOTTOM)
            .show_legend(False)
        )
        .tooltip(cb.VizTooltipOptions().mode(c.TooltipDisplayMode.SINGLE).sort(c.SortOrder.NONE))
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.THRESHOLDS))
        .thresholds(grafana_thresholds(NEUTRAL))
        .mappings(grafana_mappings(panel.mappings))
        .fill_opacity(80)
        .line_width(0)
    )
    options = builder.build().options
    assert isinstance(options, statetimeline_model.Options)
    options.per_page = None  # the SDK's default (20) would page the rows of a large fleet; show them all
    return builder


def grafana_table(panel: Table) -> AnyBuilder:
    rename = {(f"Value {k}" if k.startswith("#") else k): v for k, v in panel.columns.items()}
    if len(panel.queries) == 1 and "#A" in panel.columns:
        rename["Value"] = panel.columns["#A"]  # Grafana omits the "#A" when there is one query
    builder = (
        grafana_common(table_panel.Panel(), panel)
        .show_header(True)
        .cell_height(c.TableCellHeight.SM)
        .footer(cb.TableFooterOptions().show(False).reducer(["sum"]))
        .sort_by([cb.TableSortByFieldState().display_name(panel.sort_by).desc(panel.problems)] if panel.sort_by else [])
        .align(c.FieldTextAlignment.AUTO)
        .cell_options(c.TableAutoCellOptions())
        .with_transformation(m.DataTransformerConfig("merge", options={}))
        .with_transformation(
            m.DataTransformerConfig(
                "organize", options={"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": rename}
            )
        )
    )
    for name, style in panel.styles.items():
        properties: list[m.DynamicConfigValue] = []
        if style.link:
            properties.append(m.DynamicConfigValue("links", [style.link]))
        if style.mappings:
            properties.append(m.DynamicConfigValue("mappings", grafana_mappings(style.mappings)))
        if style.steps:
            properties.append(m.DynamicConfigValue("thresholds", grafana_thresholds(style.steps).build()))
        if style.mappings or style.steps:
            properties.append(m.DynamicConfigValue("custom.cellOptions", {"type": "color-text"}))
            properties.append(m.DynamicConfigValue("decimals", 0))
        builder.override_by_name(name, properties)
    return builder


def grafana_panel(panel: Panel) -> AnyBuilder:
    if isinstance(panel, Stat):
        return grafana_stat(panel)
    if isinstance(panel, TimeSeries):
        return grafana_timeseries(panel)
    if isinstance(panel, StateTimeline):
        return grafana_state_timeline(panel)
    assert isinstance(panel, Table), panel
    return grafana_table(panel)


def grafana_variable(variable: Variable) -> db.QueryVariable:
    built = (
        db.QueryVariable(variable.name)
        .label(variable.label)
        .datasource(DS)
        .query(
            {
                "query": f"label_values({variable.selector}, {label_name(variable)})",
                "refId": f"{variable.name}-variable",
            }
        )
        .multi(variable.multi)
        .include_all(variable.multi)
        .refresh(m.VariableRefresh.ON_TIME_RANGE_CHANGED)  # nodes come and go
        .sort(m.VariableSort.ALPHABETICAL_ASC)
    )
    if variable.hidden:
        built.hide(m.VariableHide.HIDE_VARIABLE)
    # .+ (dashboard-linter's rule): "All" is every series that has the label.
    return built.all_value(".+" if variable.name in ("job", "instance") else ".*") if variable.multi else built


class PrometheusAnnotation(m.AnnotationQuery):
    """An annotation from a Prometheus query. The SDK's model lacks the fields the Prometheus
    data source reads to title and describe each event, so they are added here."""

    def __init__(self, name: str, expr: str, text: str, color: str) -> None:
        super().__init__(name=name, datasource=DS, icon_color=color, expr=expr, built_in=None)
        self.text_format = text

    def to_json(self) -> dict[str, object]:
        extra = {"step": "30s", "titleFormat": self.name, "textFormat": self.text_format, "useValueForTime": False}
        return super().to_json() | extra


class AnnotationBuilder(Builder[m.AnnotationQuery]):
    def __init__(self, annotation: m.AnnotationQuery) -> None:
        self.annotation = annotation

    def build(self) -> m.AnnotationQuery:
        return self.annotation


BUILT_IN_ANNOTATIONS = (
    db.AnnotationQuery()
    .name("Annotations & Alerts")
    .datasource(m.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
    .built_in(1)
    .type("dashboard")
    .enable(True)
    .hide(True)
    .icon_color("rgba(0, 211, 255, 1)")
)


def grafana(board: Board) -> m.Dashboard:
    """Open rows, then the collapsed ones. Not editable (dashboard-linter's rule): the chart's
    dashboards.editable turns editing on."""
    built_annotations: list[Builder[m.AnnotationQuery]] = [
        AnnotationBuilder(PrometheusAnnotation(a.name, a.expr, a.text, a.color)) for a in board.annotations
    ]
    dashboard = (
        db.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(TAGS)
        .readonly()
        .tooltip(m.DashboardCursorSync.CROSSHAIR)
        .timezone("browser")
        .refresh("30s")
        .time("now-6h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .version(1)
        .link(
            db.DashboardLink("ate-devplugin")
            .type(m.DashboardLinkType.DASHBOARDS)
            .tags(["ate-devplugin"])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
            .icon("external link")
            .target_blank(False)
            .tooltip("")
            .url("")
        )
        .annotations([BUILT_IN_ANNOTATIONS, *built_annotations])
        .variables(
            [
                db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
                *(grafana_variable(v) for v in variables(multi_node=board.multi_node)),
            ]
        )
    )
    for row_title, panels in board.rows:
        dashboard.with_row(db.Row(row_title).collapsed(False))
        for panel in panels:
            dashboard.with_panel(grafana_panel(panel))
    for row_title, panels in board.collapsed:
        row = db.Row(row_title).collapsed(True)
        for panel in panels:
            row.with_panel(grafana_panel(panel))
        dashboard.with_row(row)
    built = dashboard.build()
    every = [p for top in built.panels or [] for p in [top, *(getattr(top, "panels", None) or [])]]
    for panel_id, panel_or_row in enumerate(every, start=1):
        panel_or_row.id_val = panel_id  # Grafana keeps ids unique; stable ones keep the JSON stable
    return built


# --- Perses ------------------------------------------------------------------------------

# Grafana unit -> Perses format (@perses-dev/core's units). Perses writes rates out
# ("0.3 requests/sec" in every legend cell and axis label): numbers, and the axis says per what.
UNITS: dict[str, dict[str, object]] = {
    "none": {"unit": "decimal"},
    "short": {"unit": "decimal", "shortValues": True},
    "s": {"unit": "seconds"},
    "reqps": {"unit": "decimal", "decimalPlaces": 2},
    "ops": {"unit": "decimal", "decimalPlaces": 2},
    "bytes": {"unit": "bytes"},
    "percentunit": {"unit": "percent-decimal"},
}
PER_SECOND = {"reqps": "per second", "ops": "per second"}

Json = dict[str, Any]


def perses_color(color: str) -> str:
    return HEX.get(color, color)


def perses_thresholds(steps: Sequence[Step]) -> Json:
    (first, base), *rest = steps
    assert first is None, "the first step is the base colour"
    return {"defaultColor": perses_color(base), "steps": [{"value": v, "color": perses_color(c)} for v, c in rest]}


def perses_mappings(entries: Sequence[ValueText]) -> list[Json]:
    return [
        {"kind": "Value", "spec": {"value": str(v), "result": {"value": text, "color": perses_color(color)}}}
        for v, text, color in entries
    ]


def perses_query(query: Query) -> Json:
    spec: Json = {"query": query.expr}
    if query.legend:
        spec["seriesNameFormat"] = query.legend
    return {"kind": "TimeSeriesQuery", "spec": {"plugin": {"kind": "PrometheusTimeSeriesQuery", "spec": spec}}}


def perses_plugin(panel: Panel) -> Json:
    fmt = UNITS[panel.unit]
    if isinstance(panel, Stat):
        spec: Json = {"calculation": "last-number", "format": fmt, "thresholds": perses_thresholds(panel.steps)}
        if panel.mappings:
            spec["mappings"] = perses_mappings(panel.mappings)
        if panel.label_as_value:
            spec["metricLabel"] = panel.label_as_value
        return {"kind": "StatChart", "spec": spec}
    if isinstance(panel, TimeSeries):
        visual: Json = {
            "display": "bar" if panel.bars else "line",
            "lineWidth": 1,
            "areaOpacity": 0.6 if panel.bars else 0.1,
            "stack": "all" if panel.stack else "none",
            "connectNulls": False,
        }
        legend: Json = {"position": "bottom", "mode": "list"}
        if not panel.list_legend:
            legend = {"position": "bottom", "mode": "table", "values": ["last-number", "max"]}
        spec = {"legend": legend, "yAxis": {"show": True, "format": fmt, "min": 0}, "visual": visual}
        if panel.unit in PER_SECOND:
            spec["yAxis"]["label"] = PER_SECOND[panel.unit]
        colors = [
            {"queryIndex": i, "colorMode": "fixed", "colorValue": perses_color(q.color)}
            for i, q in enumerate(panel.queries)
            if q.color
        ]
        if colors:
            spec["querySettings"] = colors
        return {"kind": "TimeSeriesChart", "spec": spec}
    if isinstance(panel, StateTimeline):
        return {
            "kind": "StatusHistoryChart",
            "spec": {"legend": {"position": "bottom"}, "mappings": perses_mappings(panel.mappings)},
        }
    assert isinstance(panel, Table), panel
    return {"kind": "Table", "spec": perses_table(panel)}


def perses_table(panel: Table) -> Json:
    """Perses names a value column "value" (one query) or "value #N" (query N, from 1) and
    merges the series of all queries on their labels (MergeSeries, Grafana's merge)."""
    settings: list[Json] = []
    for key, header in panel.columns.items():
        if key.startswith("#"):
            index = ord(key[1]) - ord("A") + 1
            name = "value" if len(panel.queries) == 1 else f"value #{index}"
            settings.append({"name": name, "header": header, "format": {"unit": "decimal", "decimalPlaces": 0}})
        else:
            settings.append({"name": key, "header": header})
    if panel.sort_by:
        for s in settings:
            if s["header"] == panel.sort_by:
                s["sort"] = "desc" if panel.problems else "asc"
    settings.append({"name": "timestamp", "hide": True})
    spec: Json = {"density": "compact", "columnSettings": settings, "transforms": [{"kind": "MergeSeries", "spec": {}}]}
    if panel.problems:
        # Perses colours cells by value, whatever the column: only for tables of problem counts.
        spec["cellSettings"] = [
            {"condition": {"kind": "Value", "spec": {"value": "0"}}, "textColor": HEX[GREEN]},
            {"condition": {"kind": "Range", "spec": {"min": 1}}, "textColor": HEX[RED]},
        ]
    return spec


def perses_variable(variable: Variable) -> Json:
    spec: Json = {
        "name": variable.name,
        "display": {"name": variable.label, "hidden": variable.hidden},
        "allowAllValue": variable.multi,
        "allowMultiple": variable.multi,
        "sort": "alphabetical-asc",
        "plugin": {
            "kind": "PrometheusLabelValuesVariable",
            "spec": {"labelName": label_name(variable), "matchers": [variable.selector]},
        },
    }
    if variable.multi:
        spec["customAllValue"] = ".+" if variable.name in ("job", "instance") else ".*"
        spec["defaultValue"] = "$__all"
    return {"kind": "ListVariable", "spec": spec}


def perses(board: Board) -> Json:
    """A Perses Dashboard resource: one Grid layout per row (collapsed rows closed)."""
    panels: Json = {}
    layouts: list[Json] = []
    number = 0
    for open_row, (row_title, row_panels) in [(True, r) for r in board.rows] + [(False, r) for r in board.collapsed]:
        items = []
        for panel, x, y in rows_layout(row_panels):
            key = f"panel{number}"
            number += 1
            panels[key] = {
                "kind": "Panel",
                "spec": {
                    "display": {"name": panel.title, "description": panel.description},
                    "plugin": perses_plugin(panel),
                    "queries": [perses_query(q) for q in panel.queries],
                },
            }
            items.append(
                {
                    "x": x,
                    "y": y,
                    "width": panel.width,
                    "height": panel.height,
                    "content": {"$ref": f"#/spec/panels/{key}"},
                }
            )
        layouts.append(
            {"kind": "Grid", "spec": {"display": {"title": row_title, "collapse": {"open": open_row}}, "items": items}}
        )
    return {
        "kind": "Dashboard",
        "metadata": {"name": board.uid, "project": PERSES_PROJECT},
        "spec": {
            "display": {"name": board.title, "description": board.description},
            "duration": "6h",
            "refreshInterval": "30s",
            "variables": [perses_variable(v) for v in variables(multi_node=board.multi_node)],
            "panels": panels,
            "layouts": layouts,
        },
    }


def perses_dashboard_object(board: Board) -> Json:
    """perses-operator's PersesDashboard (perses.dev/v1alpha2); its namespace is the Perses project."""
    dashboard = perses(board)
    return {
        "apiVersion": "perses.dev/v1alpha2",
        "kind": "PersesDashboard",
        "metadata": {"name": board.uid, "labels": {"app.kubernetes.io/part-of": "ate-devplugin"}},
        "spec": {"config": dashboard["spec"]},
    }


# --- the fleet overview ----------------------------------------------------------------


def fleet() -> Board:
    node_link = {
        "title": "Open the node drill-down",
        "url": f"/d/{NODE_UID}/ate-devplugin-node?${{datasource:queryparam}}&${{cluster:queryparam}}"
        "&${job:queryparam}&var-node=${__value.raw}&${__url_time_range}",
    }
    status = [
        stat(
            "Daemons up",
            "Daemons whose last scrape succeeded (one per node the DaemonSet runs on).",
            [target(f"count(up{{{DAEMON}}} == 1) or vector(0)", "up")],
        ),
        stat(
            "Daemons down",
            "Daemons whose last scrape failed. Each one is a node where the kubelet gets no device "
            'updates; alert AteDevpluginDown fires after 5 minutes. The "Daemon up, by node" panel shows which.',
            [target(f"count(up{{{DAEMON}}} == 0) or vector(0)", "down")],
            steps=OK_IF_ZERO,
        ),
        stat(
            "Nodes with the device",
            "Nodes where at least one configured device node (e.g. /dev/kvm) exists under the device root.",
            [target(f"count(count by (node) (ate_devplugin_device_nodes_present{{{RES}}} > 0)) or vector(0)", "nodes")],
        ),
        stat(
            "Registered",
            "Resources (node and resource name pairs) registered with the kubelet with an open ListAndWatch "
            "stream, i.e. offered to the scheduler.",
            [target(f"count(ate_devplugin_registered{{{RES}}} == 1) or vector(0)", "registered")],
        ),
        stat(
            "Not registered",
            "Resources whose device is present on the node but that are not registered with the kubelet: "
            "pods needing the device cannot land there. Alert AteDevpluginNotRegistered fires after 10 minutes; "
            'the "Nodes" table and "Registered, by node" show which nodes and since when.',
            [
                target(
                    f"count((ate_devplugin_registered{{{RES}}} == 0) and on (job, instance, resource_name) "
                    f"(ate_devplugin_device_nodes_present{{{RES}}} > 0)) or vector(0)",
                    "not registered",
                )
            ],
            steps=OK_IF_ZERO,
        ),
        stat(
            "Healthy units",
            "Units advertised healthy to the kubelets, summed over the selected nodes and resources.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}}) or vector(0)', "healthy")],
            "short",
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Unhealthy units",
            "Units advertised unhealthy: the resource was present but its device node is now missing. "
            "Alert AteDevpluginDevicesUnhealthy fires after 5 minutes.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}}) or vector(0)', "unhealthy")],
            "short",
            steps=OK_IF_ZERO,
        ),
        stat(
            "Failed Allocate calls",
            "Allocate calls answered with an error over the dashboard's time range; each is a container the "
            'kubelet could not start. See "Failed Allocate, by node and code".',
            [
                target(
                    f'sum(increase(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__range])) or vector(0)',
                    "failed",
                )
            ],
            "short",
            steps=OK_IF_ZERO,
        ),
    ]
    nodes = [
        table(
            "Nodes",
            "One row per node and resource, now, each column a problem (0 is fine): device nodes absent, "
            "not registered, unhealthy units, and failures over the dashboard's time range. Sorted with "
            "nodes that are not registered first; the node name links to the node drill-down.",
            [
                target(
                    f"max by (node, resource_name) (ate_devplugin_device_nodes_present{{{RES}}} == bool 0)",
                    instant=True,
                ),
                target(f"max by (node, resource_name) (ate_devplugin_registered{{{RES}}} == bool 0)", instant=True),
                target(
                    f'max by (node, resource_name) (ate_devplugin_devices{{{RES}, health="unhealthy"}})', instant=True
                ),
                target(
                    f"sum by (node, resource_name) "
                    f'(increase(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__range]))',
                    instant=True,
                ),
                target(
                    f"sum by (node, resource_name) "
                    f'(increase(ate_devplugin_registrations_total{{{RES}, result!="success"}}[$__range]))',
                    instant=True,
                ),
            ],
            {
                "node": "Node",
                "resource_name": "Resource",
                "#A": "Device absent",
                "#B": "Not registered",
                "#C": "Unhealthy units",
                "#D": "Failed Allocate",
                "#E": "Failed registrations",
            },
            styles={
                "Node": ColumnStyle(link=node_link),
                "Device absent": ColumnStyle(mappings=YES_IS_BAD, steps=OK_IF_ZERO),
                "Not registered": ColumnStyle(mappings=YES_IS_BAD, steps=OK_IF_ZERO),
                **{
                    col: ColumnStyle(steps=OK_IF_ZERO)
                    for col in ("Unhealthy units", "Failed Allocate", "Failed registrations")
                },
            },
            sort_by="Not registered",
            problems=True,
        ),
        state_timeline(
            "Daemon up, by node",
            "Whether each node's daemon answered its scrapes, over time: when a daemon went down and came back.",
            [target(f"max by (node) (up{{{DAEMON}}})", "{{node}}")],
            UP,
        ),
        state_timeline(
            "Registered, by node",
            "Whether each node's resource was registered with the kubelet with an open ListAndWatch stream, "
            "over time: when a node stopped offering the device, and since when.",
            [target(f"max by (node, resource_name) (ate_devplugin_registered{{{RES}}})", "{{node}} {{resource_name}}")],
            REGISTERED,
        ),
        state_timeline(
            "Device present, by node",
            "Whether the device nodes of each resource were found under the device root, over time: when a "
            "node lost /dev/kvm (kernel module unloaded, host change) and since when.",
            [
                target(
                    f"max by (node, resource_name) (ate_devplugin_device_nodes_present{{{RES}}} > bool 0)",
                    "{{node}} {{resource_name}}",
                )
            ],
            PRESENT,
            width=24,
        ),
    ]
    units = [
        timeseries(
            "Advertised units, by health",
            "Units advertised to the kubelets, by health, summed over the selected nodes. Unhealthy units mean "
            "a device disappeared from a node after it was present.",
            # Unhealthy at the bottom of the stack: healthy (green) is the top line while all is well.
            [
                target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}})', "unhealthy", color=RED),
                target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}})', "healthy", color=GREEN),
            ],
            "short",
            stack=True,
        ),
        timeseries(
            "Unhealthy units, by node",
            "Unhealthy units per node and resource: which nodes lost their device.",
            [
                target(
                    f'sum by (node, resource_name) (ate_devplugin_devices{{{RES}, health="unhealthy"}})',
                    "{{node}} {{resource_name}}",
                    color=RED,
                )
            ],
            "short",
        ),
    ]
    allocate = [
        timeseries(
            "Allocate rate, by code",
            "Allocate calls from the kubelets per second, by gRPC status code (OK is success). One call per "
            "container start that asks for the device.",
            good_and_bad("ate_devplugin_allocate_requests_total", RES, "code", "OK", fn="rate"),
            "reqps",
        ),
        timeseries(
            "Failed Allocate, by node and code",
            "Allocate calls answered with an error, per node, resource and code. INVALID_ARGUMENT: the kubelet "
            "asked for unit IDs this daemon does not advertise (e.g. after a config change shrank units).",
            [
                target(
                    f"sum by (node, resource_name, code) "
                    f'(rate(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__rate_interval]))',
                    "{{node}} {{resource_name}} {{code}}",
                    color=RED,
                )
            ],
            "reqps",
        ),
        timeseries(
            "Allocate latency",
            "Median and 99th percentile time to answer Allocate, over the selected nodes. Normally about a "
            "millisecond; alert AteDevpluginAllocateSlow fires over 250ms. Exemplars link to traces.",
            quantiles(RES, "", 0.5, 0.99, exemplar_on=0.99),
            "s",
        ),
        timeseries(
            "Allocate p99, by node",
            "99th percentile Allocate latency per node: find the node whose daemon is slow.",
            quantiles(RES, "node", 0.99),
            "s",
        ),
    ]
    kubelet = [
        timeseries(
            "Kubelet restarts, by node",
            "Times the kubelet re-created its device plugin socket (a kubelet restart); the daemon registers "
            "again each time. Alert AteDevpluginKubeletRestartsFrequent fires above 3 an hour.",
            [
                target(
                    f"sum by (node) (increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{node}}",
                )
            ],
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
        ),
        timeseries(
            "Registration attempts, by result",
            "Register calls to the kubelets by result: success, or why it failed (unavailable, timeout, "
            "rejected, error).",
            good_and_bad("ate_devplugin_registrations_total", RES, "result", "success"),
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
            stack=True,
        ),
        timeseries(
            "Registration failures, by node",
            "Failed Register calls per node, resource and reason. Alert AteDevpluginRegistrationFailing fires "
            "when they keep coming for 10 minutes.",
            [
                target(
                    f"sum by (node, resource_name, result) "
                    f'(increase(ate_devplugin_registrations_total{{{RES}, result!="success"}}[$__rate_interval]))',
                    "{{node}} {{resource_name}} {{result}}",
                    color=RED,
                )
            ],
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
        ),
        timeseries(
            "Config reloads, by result",
            "Live reloads of the device configuration; a failure keeps the previous configuration running "
            "(alert AteDevpluginConfigReloadFailing).",
            good_and_bad("ate_devplugin_config_reloads_total", DAEMON, "result", "success"),
            "short",
            bars=True,
        ),
        table(
            "Versions",
            "Daemons per version and revision: the state of a rollout.",
            [
                target(
                    f"count by (version, revision, python_version) (ate_devplugin_build_info{{{DAEMON}}})", instant=True
                )
            ],
            {"#A": "Daemons", "version": "Version", "revision": "Revision", "python_version": "Python"},
            width=12,
        ),
    ]
    return Board(
        FLEET_UID,
        "ate-devplugin / Fleet",
        "Which nodes lost the device, are not registered with the kubelet, or fail Allocate, and since when.",
        [
            ("Fleet status", status),
            ("By node", nodes),
            ("Units", units),
            ("Allocate", allocate),
            ("Kubelet and registration", kubelet),
        ],
        # Off by default (--pod-resources, dra.mode): closed, so that a default install shows no empty rows.
        collapsed=[("Pods", fleet_pods()), ("DRA driver", fleet_dra())],
        multi_node=True,
    )


# --- the node drill-down ---------------------------------------------------------------


def node() -> Board:
    status = [
        stat(
            "Daemon",
            "Whether Prometheus can scrape this node's daemon right now.",
            [target(f"max(up{{{DAEMON}}})", "daemon")],
            steps=OK_IF_POSITIVE,
            mappings=UP,
        ),
        stat(
            "Registered",
            "Per resource: registered with the kubelet and the kubelet holds the ListAndWatch stream "
            "(what /readyz reports).",
            [target(f"max by (resource_name) (ate_devplugin_registered{{{RES}}})", "{{resource_name}}")],
            steps=OK_IF_POSITIVE,
            mappings=REGISTERED,
            width=4,
        ),
        stat(
            "Device nodes",
            "Device nodes found under the device root, per resource. 0 means the device is absent on this node.",
            [target(f"max by (resource_name) (ate_devplugin_device_nodes_present{{{RES}}})", "{{resource_name}}")],
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Healthy units",
            "Units advertised healthy to the kubelet; 0 (red): the scheduler places no pod needing the device here.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}})', "healthy")],
            "short",
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Unhealthy units",
            "Units advertised unhealthy: the device was present and is now missing.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}})', "unhealthy")],
            "short",
            steps=OK_IF_ZERO,
        ),
        stat(
            "Streams",
            "Open ListAndWatch streams; the kubelet holds one per registered resource.",
            [target(f"sum(ate_devplugin_list_and_watch_streams{{{RES}}})", "streams")],
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Uptime",
            "Time since the daemon process started; a small value after an incident means it restarted.",
            [target(f"time() - max(process_start_time_seconds{{{DAEMON}}})", "uptime")],
            "s",
        ),
        stat(
            "Version",
            "Version of the daemon running on this node.",
            [target(f"max by (version) (ate_devplugin_build_info{{{DAEMON}}})", "{{version}}")],
            label_as_value="version",
            width=2,
        ),
    ]
    registration = [
        state_timeline(
            "Registered",
            "Registration with the kubelet over time, per resource: when it was lost and when it came back.",
            [target(f"max by (resource_name) (ate_devplugin_registered{{{RES}}})", "{{resource_name}}")],
            REGISTERED,
            width=24,
        ),
        timeseries(
            "Registration attempts, by result",
            "Register calls to the kubelet by result. Repeated failures with a stable reason point at the "
            "kubelet (unavailable, timeout) or at the request (rejected).",
            good_and_bad("ate_devplugin_registrations_total", RES, "result", "success", by="resource_name"),
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
            bars=True,
        ),
        timeseries(
            "Kubelet restarts",
            "Times the kubelet re-created its socket; each is followed by a new registration.",
            [
                target(
                    f"sum(increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval]))",
                    "kubelet restarts",
                )
            ],
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
            bars=True,
        ),
        timeseries(
            "ListAndWatch streams",
            "Open ListAndWatch streams per resource. 0 while registered means the kubelet dropped the stream.",
            [target(f"sum by (resource_name) (ate_devplugin_list_and_watch_streams{{{RES}}})", "{{resource_name}}")],
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
        ),
    ]
    devices = [
        timeseries(
            "Advertised units, by health",
            "Units advertised to the kubelet per resource and health.",
            [
                target(
                    f'sum by (resource_name) (ate_devplugin_devices{{{RES}, health="{health}"}})',
                    f"{{{{resource_name}}}} {health}",
                    color=color,
                )
                for health, color in (("healthy", GREEN), ("unhealthy", RED))
            ],
            "short",
            width=8,
        ),
        timeseries(
            "Device health changes",
            "Changes of advertised health, by the new health: a device node disappearing or coming back.",
            [
                target(
                    f"sum by (resource_name) (increase(ate_devplugin_device_health_changes_total"
                    f'{{{RES}, health="{health}"}}[$__rate_interval]))',
                    f"{{{{resource_name}}}} became {health}",
                    color=color,
                )
                for health, color in (("healthy", GREEN), ("unhealthy", RED))
            ],
            "short",
            width=8,
            bars=True,
        ),
        timeseries(
            "Device list updates sent",
            "Device lists sent to the kubelet on ListAndWatch per second: one at registration, then one per "
            "health change.",
            [
                target(
                    f"sum by (resource_name) "
                    f"(rate(ate_devplugin_list_and_watch_updates_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}}",
                )
            ],
            "ops",
            width=8,
        ),
    ]
    allocate = [
        timeseries(
            "Allocate rate, by code",
            "Allocate calls per second, by resource and gRPC status code (OK is success).",
            good_and_bad("ate_devplugin_allocate_requests_total", RES, "code", "OK", by="resource_name", fn="rate"),
            "reqps",
            width=8,
        ),
        timeseries(
            "Allocate latency",
            "Median, 90th and 99th percentile time to answer Allocate. Exemplars on p99 link to the trace of a "
            "call when tracing is on.",
            quantiles(RES, "", 0.5, 0.9, 0.99, exemplar_on=0.99),
            "s",
            width=8,
        ),
        timeseries(
            "GetPreferredAllocation rate",
            "GetPreferredAllocation calls per second: the kubelet asks which units to pick before Allocate.",
            [
                target(
                    f"sum by (resource_name) "
                    f"(rate(ate_devplugin_preferred_allocation_requests_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}}",
                )
            ],
            "reqps",
            width=8,
        ),
    ]
    process = [
        timeseries(
            "CPU",
            "CPU used by the daemon, in cores. The daemon idles between events; sustained use means a busy loop.",
            [target(f"sum(rate(process_cpu_seconds_total{{{DAEMON}}}[$__rate_interval]))", "cpu")],
            "percentunit",
            width=6,
        ),
        timeseries(
            "Resident memory",
            "Resident memory of the daemon process; compare with the DaemonSet's memory limit.",
            [target(f"sum(process_resident_memory_bytes{{{DAEMON}}})", "rss")],
            "bytes",
            width=6,
        ),
        timeseries(
            "Open file descriptors",
            "Open file descriptors of the daemon (sockets, inotify watches).",
            [target(f"sum(process_open_fds{{{DAEMON}}})", "open fds")],
            "short",
            width=6,
        ),
        timeseries(
            "Python GC collections",
            "Garbage collections per second, by generation.",
            [
                target(
                    f"sum by (generation) (rate(python_gc_collections_total{{{DAEMON}}}[$__rate_interval]))",
                    "gen {{generation}}",
                )
            ],
            "ops",
            width=6,
        ),
    ]
    return Board(
        NODE_UID,
        "ate-devplugin / Node",
        "One node's daemon: registration, devices, Allocate and the process.",
        [
            ("Status", status),
            ("Registration", registration),
            ("Devices", devices),
            ("Allocate", allocate),
            ("Process", process),
        ],
        collapsed=[("Pods", node_pods()), ("DRA driver", node_dra())],
        multi_node=False,
        annotations=[
            Annotation(
                "Kubelet restarts",
                f"sum by (node) (increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval])) > 0",
                "The kubelet on {{node}} re-created its socket",
                "orange",
            ),
            Annotation(
                "Device health changes",
                f"sum by (node, resource_name, health) "
                f"(increase(ate_devplugin_device_health_changes_total{{{RES}}}[$__rate_interval])) > 0",
                "{{resource_name}} became {{health}} on {{node}}",
                "red",
            ),
        ],
    )


# --- pods holding units (the kubelet's PodResources API, podResources.enabled) ----------


def fleet_pods() -> list[Panel]:
    return [
        timeseries(
            "Pods on nodes whose device is gone",
            "Pods holding units of a resource whose device nodes are missing, per node: workloads given a "
            "device that is no longer there. Alert AteDevpluginPodsOnUnhealthyDevice fires after 2 minutes; "
            "the node drill-down lists the pods.",
            [
                target(
                    f"sum by (node, resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})",
                    "{{node}} {{resource_name}}",
                )
            ],
            "short",
            width=12,
        ),
        table(
            "Pods holding units, by node",
            "Per node and resource, now: pods holding units, and how many of them hold units of a lost device.",
            [
                target(f"max by (node, resource_name) (ate_devplugin_pods_holding_units{{{RES}}})", instant=True),
                target(f"max by (node, resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})", instant=True),
            ],
            {"#A": "Pods holding units", "#B": "On a lost device", "node": "Node", "resource_name": "Resource"},
            styles={"On a lost device": ColumnStyle(steps=OK_IF_ZERO)},
            sort_by="On a lost device",
            width=12,
        ),
    ]


def node_pods() -> list[Panel]:
    return [
        table(
            "Pods holding $resource",
            "Every container on this node holding units, with its namespace and pod, as the kubelet's "
            "PodResources API lists them (the daemon lists again on each allocation and device change, and "
            "every podResources.interval seconds, which bounds how long a deleted pod stays here).",
            [
                target(
                    f"max by (resource_name, namespace, pod, container) (ate_devplugin_pod_units{{{RES}}})",
                    instant=True,
                )
            ],
            {
                "#A": "Units",
                "resource_name": "Resource",
                "namespace": "Namespace",
                "pod": "Pod",
                "container": "Container",
            },
            sort_by="Pod",
        ),
        timeseries(
            "Pods holding units, and on a lost device",
            "Pods holding units of each resource, and those of them holding units while its device nodes are "
            "missing (alert AteDevpluginPodsOnUnhealthyDevice).",
            [
                target(
                    f"sum by (resource_name) (ate_devplugin_pods_holding_units{{{RES}}})", "{{resource_name}} holding"
                ),
                target(
                    f"sum by (resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})",
                    "{{resource_name}} on a lost device",
                ),
            ],
            "short",
            width=12,
        ),
        timeseries(
            "PodResources calls, by result",
            "List calls to the kubelet's PodResources API, by result; unavailable: no socket or no kubelet. "
            "Series beyond the bound are counted as dropped.",
            [
                target(
                    f"sum by (result) "
                    f"(increase(ate_devplugin_pod_resources_requests_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{result}}",
                ),
                target(f"sum(ate_devplugin_pod_units_series_dropped{{{DAEMON}}})", "series dropped"),
            ],
            "short",
            width=12,
            bars=True,
        ),
    ]


# --- the DRA driver (dra.mode dra or both) ---------------------------------------------

IN_SYNC = [(0, "out of sync", RED), (1, "in sync", GREEN)]


def fleet_dra() -> list[Panel]:
    return [
        state_timeline(
            "DRA slices in sync, by node",
            "Per node running the DRA driver: whether its ResourceSlices match its devices. Out of sync: a "
            "write to the API server is failing, so the scheduler sees stale devices; alert "
            "AteDevpluginDraSlicesOutOfSync fires after 10 minutes. Node / ResourceSlice writes, by op and "
            "result shows which write fails.",
            [target(f"min by (node) (ate_devplugin_dra_slices_in_sync{{{DAEMON}}})", "{{node}}")],
            IN_SYNC,
            width=24,
        ),
    ]


def node_dra() -> list[Panel]:
    return [
        stat(
            "DRA registered",
            "Whether the kubelet accepted the DRA driver's registration through its plugin registry.",
            [target(f"max(ate_devplugin_dra_registered{{{DAEMON}}})", "registered")],
            steps=OK_IF_POSITIVE,
            mappings=REGISTERED,
            width=6,
        ),
        stat(
            "Prepared claims",
            "ResourceClaims prepared on this node and not yet unprepared: pods holding a device through DRA.",
            [target(f"sum(ate_devplugin_dra_claims_prepared{{{DAEMON}}})", "prepared")],
            "short",
            width=6,
        ),
        stat(
            "Slice devices",
            "Devices this node publishes in its ResourceSlices, per resource (the slots of each resource).",
            [target(f"max by (resource_name) (ate_devplugin_dra_slice_devices{{{DAEMON}}})", "{{resource_name}}")],
            "short",
            width=6,
        ),
        stat(
            "Slices in sync",
            "Whether the published ResourceSlices match the node's devices; out of sync while a write fails "
            "(alert AteDevpluginDraSlicesOutOfSync).",
            [target(f"min(ate_devplugin_dra_slices_in_sync{{{DAEMON}}})", "in sync")],
            steps=OK_IF_POSITIVE,
            mappings=IN_SYNC,
            width=6,
        ),
        timeseries(
            "DRA claims, by method and result",
            "Claims handled in NodePrepareResources and NodeUnprepareResources calls, by result. Errors leave "
            "the pod waiting in ContainerCreating; the daemon's log names the claim.",
            [
                target(
                    f"sum by (method, result) (increase(ate_devplugin_dra_claims_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{method}} {{result}}",
                )
            ],
            "short",
            width=8,
            bars=True,
        ),
        timeseries(
            "DRA call latency",
            "99th percentile time to answer the kubelet's NodePrepareResources and NodeUnprepareResources calls.",
            [
                target(
                    "histogram_quantile(0.99, sum by (method, le) "
                    f"(rate(ate_devplugin_dra_call_duration_seconds_bucket{{{DAEMON}}}[$__rate_interval]))) >= 0",
                    "p99 {{method}}",
                )
            ],
            "s",
            width=8,
        ),
        timeseries(
            "ResourceSlice writes, by op and result",
            "Creates, updates and deletes of this node's ResourceSlices, by result. A write after start is "
            "expected on device changes and kubelet restarts; repeated failures keep the slices out of sync.",
            [
                target(
                    f"sum by (op, result) "
                    f"(increase(ate_devplugin_dra_slice_writes_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{op}} {{result}}",
                )
            ],
            "short",
            width=8,
            bars=True,
        ),
    ]


DASHBOARDS = {"ate-devplugin-fleet.json": fleet, "ate-devplugin-node.json": node}
PERSES_DIR = HERE / "perses"
PERSES_OBJECTS = "persesdashboards.yaml"


def render(build: Callable[[], Board]) -> str:
    """The Grafana dashboard's JSON text."""
    return JSONEncoder(indent=2).encode(grafana(build())) + "\n"


def render_perses(build: Callable[[], Board]) -> str:
    """The Perses dashboard's JSON text."""
    return json.dumps(perses(build()), indent=2) + "\n"


def render_perses_objects() -> str:
    """Every dashboard as a PersesDashboard object, one YAML document each."""
    docs = [perses_dashboard_object(build()) for build in DASHBOARDS.values()]
    header = "# Generated by dashboards/generate.py: kubectl apply -n <Perses project namespace> -f this file\n"
    return header + yaml.safe_dump_all(docs, sort_keys=False, width=120)


def generated() -> dict[Path, str]:
    """Every file this generator writes, with its text."""
    out = {HERE / name: render(build) for name, build in DASHBOARDS.items()}
    out |= {PERSES_DIR / name: render_perses(build) for name, build in DASHBOARDS.items()}
    out[PERSES_DIR / PERSES_OBJECTS] = render_perses_objects()
    return out


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in generated().items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(HERE)))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
