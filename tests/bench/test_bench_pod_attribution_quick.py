"""bench/pod_attribution.py keeps working: a tiny run end to end, through the kubelet's device
manager and its PodResources server, with ours on and off (and the peer when given).

Structure and what follows from what was done (every figure measured, Lists made when on,
pods seen in /metrics, a removed pod's series gone); timings are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.peers import GDP, GDP_ENV
from bench.pod_attribution import OFF, ON, QUICK
from tests.harness.require import require_kubelet_bench

pytestmark = pytest.mark.kubelet

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_kubelet_bench("1.35")
    out = tmp_path_factory.mktemp("pod-attribution")
    argv = [sys.executable, "-m", "bench.pod_attribution", "--quick", "--results-dir", str(out)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"bench run failed:\n{proc.stdout}\n{proc.stderr[-8000:]}"
    (written,) = out.glob("*-pod-attribution-quick.json")  # never a file the docs quote
    data: dict[str, Any] = json.loads(written.read_text())
    return data


def test_every_size_measures_every_peer(result: dict[str, Any]) -> None:
    peers = {ON, OFF} | ({GDP} if os.environ.get(GDP_ENV) else set())
    assert set(result["peers"]) == peers
    assert list(result["sizes"]) == [str(n) for n in QUICK.sizes]
    for at in result["sizes"].values():
        for kind, count in (("burst", QUICK.admissions), ("steady", QUICK.steady), ("paced", QUICK.paced)):
            assert set(at[kind]) == peers
            assert all(v["admissions"] == count and v["cpu_ms_per_admission"] > 0 for v in at[kind].values())
        assert all(v["rss_mib"] > 0 for v in at["burst"].values())
        assert set(at["rewrites"]) == set(at["rewrites_paced"]) == {ON, OFF}
        assert at["ratios"]["burst_on_over_off"] > 0
        assert set(at["breakdown"]) >= {"extra_cpu_ms_per_admission", "rewrite_lists_cpu_ms", "cold_list_cpu_ms"}


def test_on_lists_after_rewrites_and_reads_every_pod(result: dict[str, Any]) -> None:
    for size, at in result["sizes"].items():
        assert at["burst"][ON]["lists"] >= 1
        assert 0 < at["rewrites"][ON]["lists_per_rewrite"] <= 1
        assert at["rewrites_paced"][ON]["lists_per_rewrite"] > 0
        assert at["lists"]["containers"] >= int(size)  # the held pods, the admitted one maybe too
        assert at["lists"]["list_once_cpu_ms"] > 0
        # The quiet admissions and each burst's last pod were seen in /metrics.
        assert len(at["latency"]["quiet_ms"]) == QUICK.quiet_latencies
        assert len(at["latency"]["burst_last_ms"]) == QUICK.burst_latencies


def test_an_ended_pod_goes_and_idle_is_measured(result: dict[str, Any]) -> None:
    deletion = result["deletion"]
    assert (deletion["size"], deletion["interval_s"]) == (max(QUICK.sizes), QUICK.interval_s)
    assert deletion["gone_s"] > 0
    assert all(v["seconds"] > 0 and v["rss_mib"] > 0 for v in result["idle"].values())
