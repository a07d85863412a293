"""The benchmark suite (bench/) keeps working: its quick mode runs end to end.

Behaviour only: every figure is produced for every peer that can produce it, the peers
that cannot say why, and the report files are written. Timings are never asserted: the
machine is shared and a test must not fail on a noisy clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kubelet import built_versions
from tests.harness.require import require_kubelet_bench

pytestmark = pytest.mark.kubelet

REPO = Path(__file__).resolve().parents[2]
GDP = "generic-device-plugin"
# squat/generic-device-plugin runs only from a binary built outside the repository; without
# one, each of its figures must say so.
WITH_GDP = bool(os.environ.get("ATE_BENCH_GENERIC_DEVICE_PLUGIN"))
GDP_RUN, GDP_NA = ((GDP,), ()) if WITH_GDP else ((), (GDP,))
ALLOCATING = ("ours", "go-stub", "go-stub-pref", "bare-grpc-aio-plugin", "bare-grpc-sync-plugin", *GDP_RUN)

# figure -> peers that must have numbers / peers that must say N/A
EXPECTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "allocate_kubelet_seq": (ALLOCATING, GDP_NA),
    "admission_cpu": (ALLOCATING, GDP_NA),
    "allocate_rpc_seq": (ALLOCATING, GDP_NA),
    "allocate_rpc_conc": (ALLOCATING, GDP_NA),
    "allocate_rpc_scaling": (ALLOCATING, GDP_NA),
    "kubelet_restart": (("ours", "go-stub", *GDP_RUN), GDP_NA),
    "restarts_then_changes": (("ours", *GDP_RUN), GDP_NA),
    "kubelet_restart_empty": (("ours",), ()),
    "device_loss": (("ours", *GDP_RUN), ("go-stub", *GDP_NA)),
    "device_return": (("ours", *GDP_RUN), ("go-stub", *GDP_NA)),
    "update_floor": (("go-stub",), ()),
    "device_loss_empty": (("ours",), ("go-stub",)),
    "device_return_empty": (("ours",), ("go-stub",)),
    "update_floor_empty": (("go-stub",), ()),
    "cold_start": (("ours", "go-stub", "bare-grpc-aio-plugin", *GDP_RUN), GDP_NA),
    "memory": (("ours", "go-stub"), ()),
    "memory_growth": (("ours", "go-stub"), ()),
    "idle": (
        (
            "ours",
            "ours-tracing",
            "ours-restarted",
            "go-stub",
            "bare-grpc-aio",
            "bare-grpc-aio-stream",
            "bare-grpc-aio-plugin",
            *GDP_RUN,
        ),
        GDP_NA,
    ),
    "metrics_scrape": (("ours",), ("go-stub",)),
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    require_kubelet_bench()
    out = tmp_path_factory.mktemp("bench")
    markdown = out / "benchmarks.md"
    argv = [sys.executable, "-m", "bench", "run", "--quick", "--benches", "devices"]
    proc = subprocess.run(
        [*argv, "--results-dir", str(out), "--markdown", str(markdown)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, f"bench run --quick failed:\n{proc.stdout}\n{proc.stderr[-8000:]}"
    results = sorted(out.glob("*-quick.json"))
    assert len(results) == 1, proc.stdout
    return json.loads(results[0].read_text()), markdown


def _sample_count(value: dict[str, Any]) -> int:
    return int(value.get("n", 0))


def test_every_figure_for_every_capable_peer(quick_run: tuple[dict[str, Any], Path]) -> None:
    data, _ = quick_run
    figures = data["figures"]
    sizes = data["sizes"]
    assert set(EXPECTED) <= set(figures)
    for figure, (capable, incapable) in EXPECTED.items():
        for peer in capable:
            value = figures[figure].get(peer)
            assert value is not None, f"{figure}: no entry for {peer}"
            assert "na" not in value, f"{figure}: {peer} says N/A: {value['na']}"
        for peer in incapable:
            assert figures[figure][peer]["na"], f"{figure}: {peer} should explain why it cannot"
    # Every sample that was asked for is there.
    for peer in EXPECTED["allocate_kubelet_seq"][0]:
        assert _sample_count(figures["allocate_kubelet_seq"][peer]) == sizes["seq_pods"]
        for figure in ("allocate_rpc_seq", "allocate_rpc_conc"):
            value = figures[figure][peer]
            assert _sample_count(value) == sizes["rpc_calls"]
            assert value["errors"] == 0, value["first_error"]
    assert figures["allocate_rpc_conc"]["ours"]["concurrency"] == sizes["concurrency"]
    for peer in ALLOCATING:
        assert figures["admission_cpu"][peer]["admissions"] == sizes["seq_pods"]
        assert figures["admission_cpu"][peer]["cpu_ms_per_admission"] > 0
        callers = figures["allocate_rpc_scaling"][peer]["callers"]
        assert sorted(int(n) for n in callers) == sorted(sizes["concurrency_levels"])
        assert all(c["errors"] == 0 and c["calls_per_s"] > 0 for c in callers.values())
    for peer in ("ours", *GDP_RUN):
        changes = figures["restarts_then_changes"][peer]
        assert (changes["restarts"], changes["changes"]) == (sizes["leak_restarts"], sizes["leak_changes"])
    # Ours sees every device change after kubelet restarts.
    assert figures["restarts_then_changes"]["ours"]["seen"] == sizes["leak_changes"]
    assert _sample_count(figures["kubelet_restart"]["ours"]) == sizes["restarts"]
    assert _sample_count(figures["kubelet_restart_empty"]["ours"]) == sizes["restarts"]
    assert _sample_count(figures["kubelet_restart"]["go-stub"]) == sizes["stub_restarts"]
    for figure in ("device_loss", "device_return", "device_loss_empty", "device_return_empty"):
        assert _sample_count(figures[figure]["ours"]) == sizes["device_rounds"]
    for peer in ("ours", "go-stub"):
        assert _sample_count(figures["cold_start"][peer]) == sizes["cold_starts"]
        memory = figures["memory"][peer]
        assert memory["rss_registered_mib"] > 0
        assert memory["rss_after_allocs_mib"] > 0
        assert memory["allocations"] == sizes["mem_allocs"]
        assert "peak_growth_mib" in memory
        growth = figures["memory_growth"][peer]["resources"]
        assert sorted(int(n) for n in growth) == sorted(sizes["growth"])
    # The headline memory figure of ours is taken with tracing on, and spans did arrive.
    assert figures["memory"]["ours"]["tracing"] is True
    assert figures["memory"]["ours"]["spans_received"] > 0
    for peer, value in figures["idle"].items():
        if peer in GDP_NA:
            continue
        assert value["seconds"] > 0, peer
        assert value["switches_per_s"] >= 0, peer
    scrape = figures["metrics_scrape"]["ours"]
    assert scrape["resources"] == max(sizes["growth"])
    assert scrape["plain"]["bytes"] > 0
    assert _sample_count(scrape["prometheus"]) == sizes["scrapes"]


def test_report_files(quick_run: tuple[dict[str, Any], Path]) -> None:
    data, markdown = quick_run
    text = markdown.read_text()
    chart = markdown.with_name(markdown.stem + "-latency.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({chart.name})" in text
    machine = data["machine"]
    for fact in (str(machine["nproc"]), machine["cpu_model"], machine["kernel"], machine["python"]):
        assert fact in text
    assert machine["kubelet_bench"]["k8s_version"] in text
    for heading in ("## Machine", "## Peers", "## Next to squat/generic-device-plugin", "## Results", "## Targets"):
        assert heading in text
    assert "generic-device-plugin" in text  # why that peer is absent is said
    # CPU per admission, idle RSS and cold start are judged against the Python floor too.
    judged = [line for line in text.splitlines() if "| ≤ 1.1 |" in line]
    assert [line.split(" | ")[0] for line in judged] == [
        "| CPU per admission through the kubelet (one Allocate each; GetPreferredAllocation not advertised)",
        "| RSS idle, registered (tracing off)",
        "| cold start → registered, p50",
    ]
    assert all(line.split("| ≤ 1.1 | ")[1].split(" |")[0] in ("met", "**missed**") for line in judged)
    assert data["kubelet_release"] in built_versions()
