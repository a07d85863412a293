"""The scale benches keep working: the kubelet's cost of our units, the fleet against a real
API server, and the DRA path through the kubelet's DRA manager, in quick mode.

Structure and sanity only (every row measured, counts that follow from what was done,
sizes that grow with what grows); timings are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import controlplane
from bench.dra_path import DRA_QUICK, EXAMPLE_ENV
from bench.fleet import FLEET_QUICK
from bench.kubelet_cost import COST_QUICK
from tests.harness.kubelet import built_versions
from tests.harness.require import missing, require_kubelet_bench

pytestmark = pytest.mark.kubelet

REPO = Path(__file__).resolve().parents[2]
WITH_EXAMPLE = bool(os.environ.get(EXAMPLE_ENV))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    require_kubelet_bench()
    if not [v for v in built_versions() if v != "1.29"]:
        missing("no kubelet bench of 1.35 or newer built: run tools/build-kubelet-bench.sh")
    why = controlplane.missing()
    if why:
        missing(why)
    out = tmp_path_factory.mktemp("bench-scale")
    markdown = out / "benchmarks.md"
    argv = [sys.executable, "-m", "bench", "run", "--quick", "--benches", "kubelet-cost,fleet,dra"]
    argv += ["--results-dir", str(out), "--markdown", str(markdown)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, f"bench run failed:\n{proc.stdout}\n{proc.stderr[-8000:]}"
    (result,) = sorted(out.glob("*-quick.json"))
    return json.loads(result.read_text()), markdown.read_text()


def test_kubelet_cost(run: tuple[dict[str, Any], str]) -> None:
    data, text = run
    cost = data["kubelet_cost"]
    (release,) = cost["releases"]  # quick: the run's kubelet release only
    assert release == data["kubelet_release"]
    rel = cost["releases"][release]
    assert rel["floor"]["rss_mib"] > 0
    rows = rel["rows"]
    assert [(r["resources"], r["units"]) for r in rows] == [
        (n, u) for n in COST_QUICK.resources for u in COST_QUICK.units
    ]
    for r in rows:
        assert "na" not in r, r
        assert r["total_units"] == r["resources"] * r["units"]
        assert r["admission_cpu_ms"] > 0
        assert r["registered"]["heap_live_mib"] > 0
        # The pods still active hold allocations the registered checkpoint did not have.
        assert r["checkpoint_bytes"] > r["checkpoint_bytes_registered"] > 0
    # The checkpoint lists every registered unit: it grows with them.
    by_total = sorted(rows, key=lambda r: r["total_units"])
    sizes = [r["checkpoint_bytes_registered"] for r in by_total]
    assert sizes == sorted(sizes)
    assert sizes[-1] > 2 * sizes[0]
    assert "## The kubelet's cost of our units" in text


def test_fleet(run: tuple[dict[str, Any], str]) -> None:
    data, text = run
    fleet = data["fleet"]
    assert "error" not in fleet, fleet.get("error")
    (step,) = fleet["steps"]
    n = step["nodes"]
    assert n == FLEET_QUICK.nodes[0]
    # Every daemon lists, watches, reads its Node and creates its slice at least.
    assert step["startup"]["requests_per_node"] >= 4
    assert step["startup"]["by_verb_resource"].get("create resourceslices") == n
    idle = step["idle"]
    assert idle["slices"] == n
    assert 1 <= idle["watches_per_node"] <= 2
    assert idle["watches_open_audit_per_node"] >= 1
    change = step["device_change"]
    assert change["changes"] == 2 * FLEET_QUICK.changes * FLEET_QUICK.change_nodes
    assert change["writes_per_change"] >= 1
    restart = step["restart"]
    assert restart["down_s"] >= FLEET_QUICK.down_s
    assert 0 <= restart["nodes_watching_again"] <= n
    assert restart["retries_per_node"]["max"] >= 1  # the watches broke while it was down
    wipe = step["wipe"]
    assert wipe["writes_per_node"] >= 1  # each node wrote its slice again
    assert wipe["by_verb_resource"].get("create resourceslices", 0) >= n
    projection = fleet["projection"]
    assert projection["nodes"] == 5000
    assert projection["watches"] == pytest.approx(idle["watches_per_node"] * 5000)
    kubelet = fleet["kubelet"]
    if "na" not in kubelet:
        assert kubelet["requests_per_node_per_hour"] > 0
        assert kubelet["by_verb_resource_per_node_per_hour"]
    assert "## The API server's cost of the DRA driver" in text


def test_dra_path(run: tuple[dict[str, Any], str]) -> None:
    data, text = run
    dra = data["dra_path"]
    assert "error" not in dra, dra.get("error")
    figures = dra["figures"]
    ours = {name: figures[name]["ours"] for name in figures}
    assert ours["prepare"]["n"] == DRA_QUICK.claims
    assert ours["unprepare"]["n"] == DRA_QUICK.claims
    assert ours["prepare"]["cdi_devices"] == ["ate.dev/kvm=kvm"]
    assert ours["cold_start_registered"]["n"] == DRA_QUICK.cold_starts
    # Published after registered: the slices need the API server, registration only the socket.
    assert ours["cold_start_published"]["n"] == DRA_QUICK.cold_starts
    assert ours["kubelet_restart_slices"]["n"] == DRA_QUICK.restarts
    assert ours["idle"]["rss_mib"] > 0
    side = ours["kubelet_side"]
    assert side["held"] == DRA_QUICK.held
    assert side["state_bytes_held"] > side["state_bytes_empty"]
    example = {name: figures[name].get("dra-example-driver", {}) for name in figures}
    if WITH_EXAMPLE:
        assert example["prepare"]["n"] == DRA_QUICK.claims
        assert example["kubelet_restart_slices"]["n"] == DRA_QUICK.restarts
    else:
        assert all(v["na"] for v in example.values())
    assert "## The DRA path next to kubernetes-sigs/dra-example-driver" in text
