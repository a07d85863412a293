"""A board as a Grafana dashboard, built with Grafana's own SDK (grafana-foundation-sdk,
pinned in pyproject.toml: the JSON carries its defaults)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as c
from grafana_foundation_sdk.models import dashboard as m
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import statetimeline as statetimeline_model

from dashboards.model import (
    Board,
    Panel,
    Query,
    Stat,
    StateTimeline,
    Step,
    Table,
    TimeSeries,
    ValueText,
    Variable,
    label_name,
)
from dashboards.vocabulary import NEUTRAL

DS = m.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["ate-devplugin", "kubernetes", "device-plugin"]

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
        if style.unit:
            properties.append(m.DynamicConfigValue("unit", style.unit))
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


def grafana_variable(variable: Variable) -> db.QueryVariable | db.ConstantVariable:
    if variable.constant:  # hidden by its kind
        return db.ConstantVariable(variable.name).label(variable.label).value(variable.constant)
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
                *(grafana_variable(v) for v in board.variables),
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
