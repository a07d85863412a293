"""Writes the Grafana dashboards in this folder from this file, their one source.

    python dashboards/generate.py          # rewrite the JSON files
    python dashboards/generate.py --check  # exit 1 if the JSON files differ from this code

tests/dashboards/test_dashboards.py fails when the committed JSON drifts from this code,
checks the conventions (datasource variable, units, $__rate_interval, stable uids) and
runs every query against a real Prometheus that scraped the daemon.

Label sets are those of the chart's ServiceMonitor: job, instance, namespace, pod, node,
plus resource_name on the daemon's own series.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["ate-devplugin", "kubernetes", "device-plugin"]
FLEET_UID = "ate-devplugin-fleet"
NODE_UID = "ate-devplugin-node"

Json = dict[str, Any]

# Label matchers shared by every query; Grafana fills the variables.
DAEMON = 'job=~"$job", node=~"$node"'
RES = DAEMON + ', resource_name=~"$resource"'

GREEN, RED, ORANGE = "green", "red", "orange"


# --- building blocks -----------------------------------------------------------------


def target(expr: str, legend: str = "", *, instant: bool = False, exemplar: bool = False) -> Json:
    t: Json = {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "exemplar": exemplar,
    }
    if instant:
        t["format"] = "table"
    return t


def thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def value_map(*entries: tuple[int, str, str]) -> list[Json]:
    return [
        {
            "type": "value",
            "options": {
                str(v): {"text": text, "color": color, "index": i} for i, (v, text, color) in enumerate(entries)
            },
        }
    ]


REGISTERED = value_map((0, "not registered", RED), (1, "registered", GREEN))
UP = value_map((0, "down", RED), (1, "up", GREEN))
PRESENT = value_map((0, "absent", RED), (1, "present", GREEN))
OK_IF_ZERO = thresholds((None, GREEN), (1, RED))
OK_IF_POSITIVE = thresholds((None, RED), (1, GREEN))
NEUTRAL = thresholds((None, GREEN))


@dataclass
class Panel:
    kind: str
    title: str
    description: str
    targets: list[Json]
    unit: str
    width: int = 12
    height: int = 8
    options: Json = field(default_factory=dict)
    defaults: Json = field(default_factory=dict)
    overrides: list[Json] = field(default_factory=list)
    transformations: list[Json] = field(default_factory=list)

    def render(self, panel_id: int, x: int, y: int) -> Json:
        for i, t in enumerate(self.targets):
            t["refId"] = chr(ord("A") + i)
        out: Json = {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": self.width, "h": self.height},
            "targets": self.targets,
            "fieldConfig": {"defaults": {"unit": self.unit, **self.defaults}, "overrides": self.overrides},
            "options": self.options,
        }
        if self.transformations:
            out["transformations"] = self.transformations
        return out


def stat(
    title: str,
    description: str,
    targets: list[Json],
    unit: str = "none",
    *,
    steps: Json = NEUTRAL,
    mappings: list[Json] | None = None,
    width: int = 3,
    text_mode: str = "auto",
) -> Panel:
    return Panel(
        "stat",
        title,
        description,
        targets,
        unit,
        width=width,
        height=4,
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": text_mode,
            "justifyMode": "auto",
            "orientation": "auto",
        },
        defaults={"color": {"mode": "thresholds"}, "thresholds": steps, "mappings": mappings or []},
    )


def timeseries(
    title: str,
    description: str,
    targets: list[Json],
    unit: str,
    *,
    width: int = 12,
    bars: bool = False,
    stack: bool = False,
) -> Panel:
    return Panel(
        "timeseries",
        title,
        description,
        targets,
        unit,
        width=width,
        options={
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        defaults={
            "min": 0,
            "color": {"mode": "palette-classic"},
            "custom": {
                "drawStyle": "bars" if bars else "line",
                "lineWidth": 1,
                "fillOpacity": 60 if bars else 10,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            },
        },
    )


def state_timeline(
    title: str, description: str, targets: list[Json], mappings: list[Json], *, width: int = 12
) -> Panel:
    return Panel(
        "state-timeline",
        title,
        description,
        targets,
        "none",
        width=width,
        options={
            "mergeValues": True,
            "showValue": "never",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
            "tooltip": {"mode": "single", "sort": "none"},
        },
        defaults={
            "color": {"mode": "thresholds"},
            "thresholds": NEUTRAL,
            "mappings": mappings,
            "custom": {"fillOpacity": 80, "lineWidth": 0},
        },
    )


def by_name(name: str, *properties: tuple[str, Any]) -> Json:
    return {"matcher": {"id": "byName", "options": name}, "properties": [{"id": k, "value": v} for k, v in properties]}


def table(
    title: str,
    description: str,
    targets: list[Json],
    columns: dict[str, str],
    *,
    overrides: list[Json] | None = None,
    sort_by: str = "",
    width: int = 24,
    height: int = 8,
) -> Panel:
    """Instant queries joined on their labels; ``columns`` names the columns ("#A" for query A's value)."""
    rename = {(f"Value {k}" if k.startswith("#") else k): v for k, v in columns.items()}
    if len(targets) == 1 and "#A" in columns:
        rename["Value"] = columns["#A"]  # Grafana omits the "#A" when there is one query
    return Panel(
        "table",
        title,
        description,
        targets,
        "none",
        width=width,
        height=height,
        options={
            "showHeader": True,
            "cellHeight": "sm",
            "footer": {"show": False, "reducer": ["sum"], "fields": ""},
            "sortBy": [{"displayName": sort_by, "desc": False}] if sort_by else [],
        },
        defaults={"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
        overrides=overrides or [],
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": rename}},
        ],
    )


def quantiles(selector: str, by: str, *qs: float, exemplar_on: float | None = None) -> list[Json]:
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


# --- variables -----------------------------------------------------------------------


def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(name: str, label: str, query: str, *, multi: bool, hide: int = 0) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "current": {},
        "hide": hide,
        "includeAll": multi,
        "allValue": ".*" if multi else None,
        "multi": multi,
        "options": [],
        "refresh": 2,  # on time range change: nodes come and go
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
    }


def variables(*, multi_node: bool) -> list[Json]:
    return [
        datasource_variable(),
        query_variable("job", "Job", "label_values(ate_devplugin_build_info, job)", multi=False),
        query_variable("node", "Node", 'label_values(ate_devplugin_build_info{job=~"$job"}, node)', multi=multi_node),
        query_variable(
            "resource",
            "Resource",
            'label_values(ate_devplugin_devices{job=~"$job", node=~"$node"}, resource_name)',
            multi=True,
        ),
    ]


# --- layout --------------------------------------------------------------------------


def layout(sections: Sequence[tuple[str, Sequence[Panel]]]) -> list[Json]:
    """Rows of panels, flowed left to right and wrapped at Grafana's 24 columns."""
    panels: list[Json] = []
    next_id, y = 1, 0
    for title, section in sections:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        next_id, y = next_id + 1, y + 1
        x, row_height = 0, 0
        for panel in section:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            panels.append(panel.render(next_id, x, y))
            next_id += 1
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height
    return panels


def dashboard(
    uid: str,
    title: str,
    description: str,
    sections: Sequence[tuple[str, Sequence[Panel]]],
    *,
    multi_node: bool,
    annotations: Iterable[Json] = (),
) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": TAGS,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "schemaVersion": 39,
        "version": 1,
        "links": [
            {
                "type": "dashboards",
                "title": "ate-devplugin",
                "tags": ["ate-devplugin"],
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            },
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                *annotations,
            ]
        },
        "templating": {"list": variables(multi_node=multi_node)},
        "panels": layout(sections),
    }


def annotation(name: str, expr: str, text: str, color: str) -> Json:
    return {
        "name": name,
        "datasource": DS,
        "enable": True,
        "hide": False,
        "iconColor": color,
        "expr": expr,
        "step": "30s",
        "titleFormat": name,
        "textFormat": text,
        "useValueForTime": False,
    }


# --- the fleet overview ----------------------------------------------------------------


def fleet() -> Json:
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
        ],
        multi_node=True,
    )


# --- the node drill-down ---------------------------------------------------------------


def node() -> Json:
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
            text_mode="name",
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
        ],
        multi_node=False,
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


DASHBOARDS = {"ate-devplugin-fleet.json": fleet, "ate-devplugin-node.json": node}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


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
