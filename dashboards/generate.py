"""Writes the Grafana dashboards in this folder from this file, their one source.

    python dashboards/generate.py          # rewrite the JSON files
    python dashboards/generate.py --check  # exit 1 if the JSON files differ from this code

Built with Grafana's own SDK, grafana-foundation-sdk (pinned in pyproject.toml); this file
holds only the project's conventions (datasource variable, units, panel styles) and the
panels. A dashboard is a list of rows, each a list of panels that the SDK lays out left to
right, wrapping at Grafana's 24 columns (keep a row's widths adding up to lines of 24).

To add a panel: append a ``stat``, ``timeseries``, ``state_timeline`` or ``table`` call to
its row in ``fleet()`` or ``node()``, run this file and tools/sync-chart-files.py (the
chart ships a copy). The live test runs the new query against the fleet scenario of
tests/harness/monitoring.py, so the scenario must produce the series it reads; queries on
the DRA driver's series (ate_devplugin_dra_*, in the collapsed "DRA driver" rows) are run by
tests/e2e/test_dra.py instead, as the PodResources ones are by test_pods_holding_units.py.

tests/dashboards/test_dashboards.py fails when the committed JSON drifts from this code,
checks the conventions (datasource variable, units, $__rate_interval, stable uids, no
overlapping panels) and runs every query against a real Prometheus that scraped the daemon.

Label sets are those of the chart's ServiceMonitor: job, instance, namespace, pod, node,
plus resource_name on the daemon's own series.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

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

# Label matchers shared by every query; Grafana fills the variables.
DAEMON = 'job=~"$job", node=~"$node"'
RES = DAEMON + ', resource_name=~"$resource"'

GREEN, RED = "green", "red"

Panel = Builder[m.Panel]
AnyPanel = TypeVar("AnyPanel", stat_panel.Panel, timeseries_panel.Panel, statetimeline.Panel, table_panel.Panel)


# --- building blocks -----------------------------------------------------------------


def target(expr: str, legend: str = "", *, instant: bool = False, exemplar: bool = False) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery()
        .datasource(DS)
        .editor_mode(pm.QueryEditorMode.CODE)
        .expr(expr)
        .legend_format(legend or "__auto")
        .exemplar(exemplar)
    )
    return query.instant().format(pm.PromQueryFormat.TABLE) if instant else query.range()


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(m.ThresholdsMode.ABSOLUTE).steps([m.Threshold(v, color) for v, color in steps])


def value_map(*entries: tuple[int, str, str]) -> list[m.ValueMapping]:
    results = {
        str(v): m.ValueMappingResult(text=text, color=color, index=i) for i, (v, text, color) in enumerate(entries)
    }
    return [m.ValueMap(options=results)]


REGISTERED = value_map((0, "not registered", RED), (1, "registered", GREEN))
UP = value_map((0, "down", RED), (1, "up", GREEN))
PRESENT = value_map((0, "absent", RED), (1, "present", GREEN))
OK_IF_ZERO = thresholds((None, GREEN), (1, RED))
OK_IF_POSITIVE = thresholds((None, RED), (1, GREEN))
NEUTRAL = thresholds((None, GREEN))


def common(
    panel: AnyPanel,
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str,
    width: int,
    height: int,
) -> AnyPanel:
    """What every panel has: its queries (refIds A, B, ...) through the datasource variable, a unit, a size."""
    panel.title(title).description(description).datasource(DS).unit(unit).span(width).height(height)
    for i, t in enumerate(targets):
        panel.with_target(t.ref_id(chr(ord("A") + i)))
    return panel


def stat(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str = "none",
    *,
    steps: db.ThresholdsConfig = NEUTRAL,
    mappings: list[m.ValueMapping] | None = None,
    width: int = 3,
    text_mode: c.BigValueTextMode = c.BigValueTextMode.AUTO,
) -> Panel:
    return (
        common(stat_panel.Panel(), title, description, targets, unit, width, 4)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(c.BigValueColorMode.BACKGROUND)
        .graph_mode(c.BigValueGraphMode.NONE)
        .text_mode(text_mode)
        .justify_mode(c.BigValueJustifyMode.AUTO)
        .orientation(c.VizOrientation.AUTO)
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.THRESHOLDS))
        .thresholds(steps)
        .mappings(mappings or [])
    )


def timeseries(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str,
    *,
    width: int = 12,
    bars: bool = False,
    stack: bool = False,
) -> Panel:
    return (
        common(timeseries_panel.Panel(), title, description, targets, unit, width, 8)
        .legend(
            cb.VizLegendOptions()
            .display_mode(c.LegendDisplayMode.TABLE)
            .placement(c.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(cb.VizTooltipOptions().mode(c.TooltipDisplayMode.MULTI).sort(c.SortOrder.DESCENDING))
        .min(0)
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.PALETTE_CLASSIC))
        .draw_style(c.GraphDrawStyle.BARS if bars else c.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(60 if bars else 10)
        .show_points(c.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(cb.StackingConfig().mode(c.StackingMode.NORMAL if stack else c.StackingMode.NONE).group("A"))
    )


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    mappings: list[m.ValueMapping],
    *,
    width: int = 12,
) -> Panel:
    panel = (
        common(statetimeline.Panel(), title, description, targets, "none", width, 8)
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
        .thresholds(NEUTRAL)
        .mappings(mappings)
        .fill_opacity(80)
        .line_width(0)
    )
    options = panel.build().options
    assert isinstance(options, statetimeline_model.Options)
    options.per_page = None  # the SDK's default (20) would page the rows of a large fleet; show them all
    return panel


Override = tuple[str, list[m.DynamicConfigValue]]


def by_name(name: str, *properties: tuple[str, object]) -> Override:
    """Field overrides for the column ``name``; builder values (thresholds) are built."""
    return name, [m.DynamicConfigValue(k, v.build() if isinstance(v, Builder) else v) for k, v in properties]


def table(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    columns: dict[str, str],
    *,
    overrides: Sequence[Override] = (),
    sort_by: str = "",
    width: int = 24,
    height: int = 8,
) -> Panel:
    """Instant queries joined on their labels; ``columns`` names the columns ("#A" for query A's value)."""
    rename = {(f"Value {k}" if k.startswith("#") else k): v for k, v in columns.items()}
    if len(targets) == 1 and "#A" in columns:
        rename["Value"] = columns["#A"]  # Grafana omits the "#A" when there is one query
    panel = (
        common(table_panel.Panel(), title, description, targets, "none", width, height)
        .show_header(True)
        .cell_height(c.TableCellHeight.SM)
        .footer(cb.TableFooterOptions().show(False).reducer(["sum"]))
        .sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(False)] if sort_by else [])
        .align(c.FieldTextAlignment.AUTO)
        .cell_options(c.TableAutoCellOptions())
        .with_transformation(m.DataTransformerConfig("merge", options={}))
        .with_transformation(
            m.DataTransformerConfig(
                "organize", options={"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": rename}
            )
        )
    )
    for name, properties in overrides:
        panel.override_by_name(name, properties)
    return panel


def quantiles(selector: str, by: str, *qs: float, exemplar_on: float | None = None) -> list[prometheus.Dataquery]:
    group = f"{by}, le" if by else "le"
    out = []
    for q in qs:
        expr = (
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate(ate_devplugin_allocate_duration_seconds_bucket{{{selector}}}[$__rate_interval])))"
        )
        prefix = f"p{round(q * 100)}"
        legend = f"{prefix} {{{{{by}}}}}" if by else prefix
        out.append(target(expr, legend, exemplar=q == exemplar_on))
    return out


# --- variables and annotations --------------------------------------------------------------


def query_variable(name: str, label: str, query: str, *, multi: bool) -> db.QueryVariable:
    variable = (
        db.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"query": query, "refId": f"{name}-variable"})
        .multi(multi)
        .include_all(multi)
        .refresh(m.VariableRefresh.ON_TIME_RANGE_CHANGED)  # nodes come and go
        .sort(m.VariableSort.ALPHABETICAL_ASC)
    )
    return variable.all_value(".*") if multi else variable


def variables(*, multi_node: bool) -> list[Builder[m.VariableModel]]:
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query_variable("job", "Job", "label_values(ate_devplugin_build_info, job)", multi=False),
        query_variable("node", "Node", 'label_values(ate_devplugin_build_info{job=~"$job"}, node)', multi=multi_node),
        query_variable(
            "resource",
            "Resource",
            'label_values(ate_devplugin_devices{job=~"$job", node=~"$node"}, resource_name)',
            multi=True,
        ),
    ]


class PrometheusAnnotation(m.AnnotationQuery):
    """An annotation from a Prometheus query. The SDK's model lacks the fields the Prometheus
    data source reads to title and describe each event, so they are added here."""

    def __init__(self, name: str, expr: str, text: str, color: str) -> None:
        super().__init__(name=name, datasource=DS, icon_color=color, expr=expr, built_in=None)
        self.text_format = text

    def to_json(self) -> dict[str, object]:
        extra = {"step": "30s", "titleFormat": self.name, "textFormat": self.text_format, "useValueForTime": False}
        return super().to_json() | extra


class Annotation(Builder[m.AnnotationQuery]):
    def __init__(self, annotation: m.AnnotationQuery) -> None:
        self.annotation = annotation

    def build(self) -> m.AnnotationQuery:
        return self.annotation


def annotation(name: str, expr: str, text: str, color: str) -> Annotation:
    return Annotation(PrometheusAnnotation(name, expr, text, color))


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


# --- dashboards ------------------------------------------------------------------------


def dashboard(
    uid: str,
    title: str,
    description: str,
    rows: Sequence[tuple[str, Sequence[Panel]]],
    *,
    multi_node: bool,
    annotations: Sequence[Annotation] = (),
    collapsed: Sequence[tuple[str, Sequence[Panel]]] = (),
) -> m.Dashboard:
    """``rows`` open, then ``collapsed`` rows (closed until clicked: a mode many nodes do not run)."""
    board = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
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
        .annotations([BUILT_IN_ANNOTATIONS, *annotations])
        .variables(variables(multi_node=multi_node))
    )
    for row_title, panels in rows:
        board.with_row(db.Row(row_title).collapsed(False))
        for panel in panels:
            board.with_panel(panel)
    for row_title, panels in collapsed:
        row = db.Row(row_title).collapsed(True)
        for panel in panels:
            row.with_panel(panel)
        board.with_row(row)
    built = board.build()
    every = [p for top in built.panels or [] for p in [top, *(getattr(top, "panels", None) or [])]]
    for panel_id, panel_or_row in enumerate(every, start=1):
        panel_or_row.id_val = panel_id  # Grafana keeps ids unique; stable ones keep the JSON stable
    return built


# --- the fleet overview ----------------------------------------------------------------


def fleet() -> m.Dashboard:
    node_link = {
        "title": "Open the node drill-down",
        "url": f"/d/{NODE_UID}/ate-devplugin-node?${{datasource:queryparam}}&${{job:queryparam}}"
        "&var-node=${__value.raw}&${__url_time_range}",
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
            "Present, not registered",
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
            "One row per node and resource, now: device nodes found, registration, unhealthy units, and "
            "failures over the dashboard's time range. Sort by a column to find the nodes to look at; the "
            "node name links to the node drill-down.",
            [
                target(f"max by (node, resource_name) (ate_devplugin_device_nodes_present{{{RES}}})", instant=True),
                target(f"max by (node, resource_name) (ate_devplugin_registered{{{RES}}})", instant=True),
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
                "#A": "Device nodes",
                "#B": "Registered",
                "#C": "Unhealthy units",
                "#D": "Failed Allocate",
                "#E": "Failed registrations",
                "node": "Node",
                "resource_name": "Resource",
            },
            overrides=[
                by_name("Node", ("links", [node_link])),
                by_name(
                    "Registered",
                    ("mappings", REGISTERED),
                    ("custom.cellOptions", {"type": "color-text"}),
                ),
                *(
                    by_name(
                        col, ("thresholds", OK_IF_ZERO), ("custom.cellOptions", {"type": "color-text"}), ("decimals", 0)
                    )
                    for col in ("Unhealthy units", "Failed Allocate", "Failed registrations")
                ),
            ],
            sort_by="Registered",
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
            [target(f"sum by (health) (ate_devplugin_devices{{{RES}}})", "{{health}}")],
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
            [
                target(
                    f"sum by (code) (rate(ate_devplugin_allocate_requests_total{{{RES}}}[$__rate_interval]))",
                    "{{code}}",
                )
            ],
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
            bars=True,
        ),
        timeseries(
            "Registration attempts, by result",
            "Register calls to the kubelets by result: success, or why it failed (unavailable, timeout, "
            "rejected, error).",
            [
                target(
                    f"sum by (result) (increase(ate_devplugin_registrations_total{{{RES}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
            "short",
            width=8,
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
                )
            ],
            "short",
            width=8,
            bars=True,
        ),
        timeseries(
            "Config reloads, by result",
            "Live reloads of the device configuration; a failure keeps the previous configuration running "
            "(alert AteDevpluginConfigReloadFailing).",
            [
                target(
                    f"sum by (result) (increase(ate_devplugin_config_reloads_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
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
    return dashboard(
        FLEET_UID,
        "ate-devplugin / Fleet",
        "Which nodes lost the device, are not registered with the kubelet, or fail Allocate, and since when.",
        [
            ("Fleet status", status),
            ("By node", nodes),
            ("Units", units),
            ("Allocate", allocate),
            ("Kubelet and registration", kubelet),
            ("Pods", fleet_pods()),
        ],
        multi_node=True,
        collapsed=[("DRA driver", fleet_dra())],
    )


# --- the node drill-down ---------------------------------------------------------------


def node() -> m.Dashboard:
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
            "Units advertised healthy to the kubelet.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}})', "healthy")],
            "short",
        ),
        stat(
            "Unhealthy units",
            "Units advertised unhealthy: the device was present and is now missing.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}})', "unhealthy")],
            "short",
            steps=OK_IF_ZERO,
        ),
        stat(
            "ListAndWatch streams",
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
            text_mode=c.BigValueTextMode.NAME,
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
            [
                target(
                    f"sum by (resource_name, result) "
                    f"(increase(ate_devplugin_registrations_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}} {{result}}",
                )
            ],
            "short",
            width=8,
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
            bars=True,
        ),
        timeseries(
            "ListAndWatch streams",
            "Open ListAndWatch streams per resource. 0 while registered means the kubelet dropped the stream.",
            [target(f"sum by (resource_name) (ate_devplugin_list_and_watch_streams{{{RES}}})", "{{resource_name}}")],
            "short",
            width=8,
        ),
    ]
    devices = [
        timeseries(
            "Advertised units, by health",
            "Units advertised to the kubelet per resource and health.",
            [
                target(
                    f"sum by (resource_name, health) (ate_devplugin_devices{{{RES}}})", "{{resource_name}} {{health}}"
                )
            ],
            "short",
            width=8,
        ),
        timeseries(
            "Device health changes",
            "Changes of advertised health, by the new health: a device node disappearing or coming back.",
            [
                target(
                    f"sum by (resource_name, health) "
                    f"(increase(ate_devplugin_device_health_changes_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}} {{health}}",
                )
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
            [
                target(
                    f"sum by (resource_name, code) "
                    f"(rate(ate_devplugin_allocate_requests_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}} {{code}}",
                )
            ],
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
    return dashboard(
        NODE_UID,
        "ate-devplugin / Node",
        "One node's daemon: registration, devices, Allocate and the process.",
        [
            ("Status", status),
            ("Registration", registration),
            ("Devices", devices),
            ("Allocate", allocate),
            ("Process", process),
            ("Pods", node_pods()),
        ],
        multi_node=False,
        collapsed=[("DRA driver", node_dra())],
        annotations=[
            annotation(
                "Kubelet restarts",
                f"sum by (node) (increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval])) > 0",
                "The kubelet on {{node}} re-created its socket",
                "orange",
            ),
            annotation(
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
            overrides=[
                by_name(
                    "On a lost device",
                    ("thresholds", OK_IF_ZERO),
                    ("custom.cellOptions", {"type": "color-text"}),
                    ("decimals", 0),
                )
            ],
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

IN_SYNC = value_map((0, "out of sync", RED), (1, "in sync", GREEN))


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
                    f"(rate(ate_devplugin_dra_call_duration_seconds_bucket{{{DAEMON}}}[$__rate_interval])))",
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


def render(build: Callable[[], m.Dashboard]) -> str:
    return JSONEncoder(indent=2).encode(build()) + "\n"


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = render(build)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
