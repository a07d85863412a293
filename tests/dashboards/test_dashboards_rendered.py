"""The Perses dashboards as a person sees them: rendered by the upstream Perses panels in
headless Chromium, against a real Prometheus fed by two daemons under the kubelet's real
device manager and by the real kube-state-metrics (tests/harness/incident.py), for each
picture of docs/dashboards.md.

A picture fails when a panel shows an error, when a query of an open row gave no data
(the scenario produces every series those rows read; the collapsed Pods and DRA rows are
left to tests/e2e), or when the stats do not show the state the scenario was in.
``python -m tools.render_dashboards`` draws the same pictures into docs/.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import kube_state_metrics
from tests.harness.devices import can_mknod
from tests.harness.incident import (
    GONE,
    MISSING_ALERT,
    PENDING_POD,
    PICTURES,
    IncidentScenario,
    Picture,
    incident_scenario,
)
from tests.harness.prometheus import INSTALL as PROMETHEUS_INSTALL
from tests.harness.require import require, require_kubelet_bench, require_tool
from tools import render_dashboards
from tools.render_dashboards import Renderer

REPO = Path(__file__).resolve().parents[2]
PERSES = REPO / "dashboards" / "perses"


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IncidentScenario]:
    require_tool("prometheus", PROMETHEUS_INSTALL)
    require(can_mknod(), "cannot mknod a device node (root?)")
    require_kubelet_bench()
    require(kube_state_metrics.missing() is None, str(kube_state_metrics.missing()))
    why = render_dashboards.missing()
    require(why is None, f"{why}; install: {render_dashboards.INSTALL}")
    with incident_scenario(tmp_path_factory.mktemp("incident")) as scenario:
        yield scenario


@pytest.fixture(scope="module")
def renderer(incident: IncidentScenario) -> Iterator[Renderer]:
    with Renderer(incident.prometheus.url) as r:
        yield r


def open_panels(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Title -> queries of every panel in an open row (Perses draws only those)."""
    out: dict[str, list[str]] = {}
    for layout in dashboard["spec"]["layouts"]:
        if not layout["spec"]["display"]["collapse"]["open"]:
            continue
        for item in layout["spec"]["items"]:
            panel = dashboard["spec"]["panels"][item["content"]["$ref"].split("/")[-1]]["spec"]
            out[panel["display"]["name"]] = [q["spec"]["plugin"]["spec"]["query"] for q in panel["queries"]]
    return out


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


# What each state must show: per panel, the last value each query gives (summed over its series).
UP_OF_EXPECTED = "Daemons up"
EXPECTED_STATS: dict[tuple[str, str], dict[str, tuple[float, ...]]] = {
    ("ate-devplugin-fleet.json", "healthy"): {
        "Unhealthy units": (0,), UP_OF_EXPECTED: (2, 2), "Daemons down": (0,), "Registered": (2,),
        "Plugin pods, by node": (0,),
    },
    ("ate-devplugin-fleet.json", "device-lost"): {"Unhealthy units": (4096,), UP_OF_EXPECTED: (2, 2)},
    # node-b's pod Pending, without a target: one down, one of two expected up, one pod not reporting.
    ("ate-devplugin-fleet.json", "pod-missing"): {
        UP_OF_EXPECTED: (1, 2), "Daemons down": (1,), "Plugin pods, by node": (1,), "Unhealthy units": (0,),
    },
    ("ate-devplugin-node.json", "healthy"): {"Unhealthy units": (0,), "Healthy units": (4096,), "Registered": (1,)},
    ("ate-devplugin-node.json", "device-lost"): {
        "Unhealthy units": (4096,), "Healthy units": (0,), "Device nodes": (0,),
    },
}  # fmt: skip


@pytest.mark.parametrize("picture", PICTURES, ids=[p.png.removesuffix(".png") for p in PICTURES])
def test_rendered_dashboard_shows_the_scenario(
    incident: IncidentScenario, renderer: Renderer, picture: Picture, tmp_path: Path
) -> None:
    window = incident.windows[picture.state]
    rendered = renderer.render(
        picture.dashboard, tmp_path / picture.png, start=window.start, end=window.end, variables=picture.variables
    )
    assert not rendered.panel_errors, f"panels showing an error: {rendered.panel_errors}"
    assert not rendered.console_errors, "errors in the page's console:\n" + "\n".join(rendered.console_errors)

    panels = open_panels(json.loads((PERSES / picture.dashboard).read_text()))
    results = {q.query: q for q in rendered.queries}
    problems = []
    for title, queries in panels.items():
        for query in queries:
            result = results.get(query)
            if result is None:
                problems.append(f"{title}: never ran {query}")
            elif result.status != "success" or result.error:
                problems.append(f"{title}: {result.status} {result.error}: {query}")
            elif result.values == 0:
                problems.append(f"{title}: no data ({result.series} series): {query}")
    assert not problems, f"{picture.png}:\n" + "\n".join(problems)

    for title, expected in EXPECTED_STATS[(picture.dashboard, picture.state)].items():
        shown = tuple(sum(v for v in results[query].last if not math.isnan(v)) for query in panels[title])
        assert shown == expected, f"{picture.png}: {title} shows {shown}, the scenario made {expected}"

    if picture.state == "pod-missing":
        firing = [a for a in incident.prometheus.alerts() if a["labels"]["alertname"] == MISSING_ALERT]
        assert [(a["state"], a["labels"]["node"], a["labels"]["pod"]) for a in firing] == [
            ("firing", GONE, PENDING_POD)
        ], firing

    width, height = png_size(rendered.png)
    assert width == render_dashboards.WIDTH
    assert 1000 < height < render_dashboards.LOAD_HEIGHT, f"{picture.png}: {height} px high"
