"""A board as a Perses dashboard: the ``Dashboard`` resource of Perses' API with the
upstream panel plugins (StatChart, TimeSeriesChart, StatusHistoryChart, Table), and as
perses-operator's PersesDashboard object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
    rows_layout,
)
from dashboards.vocabulary import GREEN, HEX, RED

PERSES_PROJECT = "ate-devplugin"

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
            style = panel.styles.get(header)
            fmt = UNITS[style.unit] if style and style.unit else {"unit": "decimal", "decimalPlaces": 0}
            settings.append({"name": name, "header": header, "format": fmt})
        else:
            settings.append({"name": key, "header": header})
    if panel.sort_by:
        for s in settings:
            if s["header"] == panel.sort_by:
                s["sort"] = "desc" if panel.problems else "asc"
    settings.append({"name": "timestamp", "hide": True})
    spec: Json = {"density": "compact", "columnSettings": settings, "transforms": [{"kind": "MergeSeries", "spec": {}}]}
    if panel.problems:
        # Perses colours cells by value, whatever the column: only for tables of problem counts,
        # which are whole numbers (a measure beside them, such as seconds since a change, is not).
        spec["cellSettings"] = [
            {"condition": {"kind": "Value", "spec": {"value": "0"}}, "textColor": HEX[GREEN]},
            {"condition": {"kind": "Regex", "spec": {"expr": "^[1-9][0-9]*$"}}, "textColor": HEX[RED]},
        ]
    return spec


def perses_variable(variable: Variable) -> Json:
    if variable.constant:
        display = {"name": variable.label, "hidden": True}
        return {
            "kind": "TextVariable",
            "spec": {"name": variable.name, "display": display, "value": variable.constant, "constant": True},
        }
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
            "variables": [perses_variable(v) for v in board.variables],
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
