"""The words every board is written in: the label matchers the dashboards' variables fill,
the colours, value mappings and thresholds, one constructor per panel kind with the
project's defaults, the query shapes used more than once, and the variables."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.model import ColumnStyle, Query, Stat, StateTimeline, Step, Table, TimeSeries, ValueText, Variable

FLEET_UID = "ate-devplugin-fleet"
NODE_UID = "ate-devplugin-node"

# Label matchers shared by every query; Grafana and Perses fill the variables.
DAEMON = 'cluster="$cluster", job=~"$job", instance=~"$instance", node=~"$node"'
RES = DAEMON + ', resource_name=~"$resource"'

# "All" jobs and instances is .+ (dashboard-linter's rule), which on its own matches every
# target of the Prometheus: series any target has (up, process_*, python_*) are kept to the
# daemons' jobs and instances by their build_info (up to the jobs alone: a daemon that is down
# has none).
JOBS = 'ate_devplugin_build_info{cluster="$cluster", job=~"$job"}'


def daemons(series: str) -> str:
    """``series`` (a selector, or a call over one) of the daemons' targets only."""
    return f"{series} and on (job, instance) ate_devplugin_build_info{{{DAEMON}}}"


def daemons_up() -> str:
    """Every daemon's up: 1, or 0 while its scrape fails."""
    return f"(up{{{DAEMON}}} and on (job) {JOBS})"


# kube-state-metrics, where it is there: the plugin pods of the release's DaemonSets, which a
# hidden constant names (the chart sets it to every pool's DaemonSet; "ate-devplugin" is the
# default release's). Its series carry the objects' namespace, pod and node (honor_labels).
DAEMONSET = Variable("daemonset", "DaemonSet", "", multi=False, constant="ate-devplugin")
PLUGIN_PODS = 'cluster="$cluster", created_by_kind="DaemonSet", created_by_name=~"$daemonset", node=~"$node"'


def pod_reporting(pods: str = PLUGIN_PODS) -> str:
    """Per plugin pod: the up of its scrape target (1 or 0), 0 where it has none (Pending,
    failed: what the daemons' own series cannot show)."""
    return (
        f"(kube_pod_info{{{pods}}} * 0 + on (namespace, pod) group_left () "
        f"max by (namespace, pod) {daemons_up()}) or kube_pod_info{{{pods}}} * 0"
    )


# Plugin pods without a scrape target (a daemon that is down has one: up is 0).
PODS_WITHOUT_TARGET = f"kube_pod_info{{{PLUGIN_PODS}}} unless on (namespace, pod) {daemons_up()}"

# Grafana's named colours and the same ones as hex for Perses.
GREEN, RED, BLUE = "green", "red", "blue"
HEX = {GREEN: "#73BF69", RED: "#F2495C", "orange": "#FF9830", "yellow": "#FADE2A", BLUE: "#5794F2"}


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


def variables(*, multi_node: bool) -> list[Variable]:
    daemons = "ate_devplugin_build_info"
    return [
        Variable("cluster", "Cluster", daemons, multi=False, hidden=True),
        Variable("job", "Job", f'{daemons}{{cluster="$cluster"}}', multi=True),
        Variable("node", "Node", f'{daemons}{{cluster="$cluster", job=~"$job"}}', multi=multi_node),
        Variable("instance", "Instance", f'{daemons}{{cluster="$cluster", job=~"$job", node=~"$node"}}', multi=True),
        Variable("resource", "Resource", f"ate_devplugin_devices{{{DAEMON}}}", multi=True),
    ]
