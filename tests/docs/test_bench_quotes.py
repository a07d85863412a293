"""Benchmark figures in the docs come from result files: the committed text is what
bench/quotes.py writes from bench/results, and the quoting itself reads what it says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import quotes

REPO = Path(__file__).resolve().parents[2]


def test_committed_figures_are_what_the_result_files_give() -> None:
    stale = [str(p.relative_to(REPO)) for p in quotes.stale(quotes.Runs.load())]
    assert not stale, f"figures differ from bench/results in {stale}: make bench-docs"


def test_no_figure_is_quoted_where_it_is_not_checked() -> None:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    checked = {*quotes.quoted_files(), quotes.BENCHMARKS_MD}
    quoting = [p for p in listed.stdout.split() if "<!-- bench:" in (REPO / p).read_text()]
    outside = [p for p in quoting if REPO / p not in checked]
    assert not outside, f"quotes in files bench/quotes.py does not rewrite: {outside}"


RUNS = quotes.Runs(
    latest={
        "started_utc": "20260101T000000Z",
        "sizes": {"window": 100},
        "loadavg": {"idle:before": [4.25, 3.0, 2.0]},
        "kubelet_cost": {"releases": {"1.37": {"rows": [{"admission_cpu_ms": 3.05}]}}},
        "figures": {
            "idle": {"ours": {"rss_mib": 48.93, "switches_per_s": 14.2}, "peer": {"rss_mib": 23.7}},
            "allocate_rpc_scaling": {"ours": {"callers": {"16": {"calls_per_s": 2005.4}}}},
            "cold_start": {"ours": {"p50_ms": 312.4}, "peer": {"na": "no binary"}},
        },
    },
    latest_path=Path("bench/results/20260101T000000Z-full.json"),
    previous={"figures": {"idle": {"ours": {"rss_mib": 50.0}}}},
    podresources_idle={"summary": {"list_cpu_ms": [2.4, 2.61], "rounds": 3}},
    library_choice={"candidates": {"click": {"import_ms": 33.81, "rss_mib": 13.7}}},
    kept={"20251201T000000Z": {"figures": {"idle": {"ours": {"rss_mib": 52.0}}}}},
    pod_attribution={
        "sizes": {"250": {"ratios": {"burst_on_over_off": 1.1084}}},
        "idle": {"on": {"cpu_ms_per_s": 0.59}},
    },
    attribution_kept={"20251201T000000Z": {"sizes": {"250": {"rewrites": {"on": {"cpu_ms_per_rewrite": 0.4438}}}}}},
)


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("idle.ours.rss_mib", "48.9 MiB"),
        ("idle.ours.switches_per_s", "14.2/s"),
        ("allocate_rpc_scaling.ours.callers.16.calls_per_s", "2,005 calls/s"),
        ("idle.ours.rss_mib/peer", "2.06"),
        ("sizes.window", "100"),
        ("started_utc", "20260101T000000Z"),
        ("loadavg.idle:before.0", "4.25"),
        ("kubelet_cost.releases.1.37.rows.0.admission_cpu_ms", "3.05 ms"),  # a key with a dot
        ("previous:idle.ours.rss_mib", "50.0 MiB"),
        ("full@20251201T000000Z:idle.ours.rss_mib", "52.0 MiB"),  # a kept run older than previous
        ("podresources-idle:summary.list_cpu_ms", "2.40 to 2.61 ms"),
        ("podresources-idle:summary.rounds", "3"),
        ("library-choice:candidates.click.import_ms", "33.8 ms"),
        ("library-choice:candidates.click.rss_mib", "13.7 MiB"),
        ("pod-attribution:sizes.250.ratios.burst_on_over_off", "1.11"),  # a size is a key, not an index
        ("pod-attribution:idle.on.cpu_ms_per_s", "0.590 ms/s"),
        ("pod-attribution@20251201T000000Z:sizes.250.rewrites.on.cpu_ms_per_rewrite", "0.444 ms"),
    ],
)
def test_a_quote_reads_its_value(path: str, text: str) -> None:
    assert quotes.value(RUNS, path) == text


def test_only_the_text_between_the_markers_is_rewritten() -> None:
    before = (
        "Idle: <!-- bench:idle.ours.rss_mib -->40 MiB<!-- /bench --> (was\n"
        "<!-- bench:previous:idle.ours.rss_mib -->?<!-- /bench -->).\n"
    )
    after = (
        "Idle: <!-- bench:idle.ours.rss_mib -->48.9 MiB<!-- /bench --> (was\n"
        "<!-- bench:previous:idle.ours.rss_mib -->50.0 MiB<!-- /bench -->).\n"
    )
    assert quotes.fill(before, RUNS) == after
    assert quotes.fill(after, RUNS) == after


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<!-- bench:idle.ours.rss -->1<!-- /bench -->", "idle.ours.rss: no 'rss' there"),
        ("<!-- bench:cold_start.peer.p50_ms -->1<!-- /bench -->", "not measured (no binary)"),
        ("<!-- bench:idle.ours -->1<!-- /bench -->", "is not a figure"),
        ("<!-- bench:idle.ours.rss_mib -->48.9 MiB", "has no '<!-- /bench -->'"),
        ("<!-- bench:podresources-idle:summary.x -->1<!-- /bench -->", "no 'x' there"),
    ],
)
def test_a_quote_that_names_no_figure_fails(text: str, error: str) -> None:
    with pytest.raises(quotes.QuoteError, match=error.replace("(", r"\(").replace(")", r"\)")):
        quotes.fill(text, RUNS)


def test_a_quote_of_a_missing_result_file_fails() -> None:
    runs = quotes.Runs(latest=RUNS.latest, latest_path=RUNS.latest_path)
    with pytest.raises(quotes.QuoteError, match="no result file for 'previous'"):
        quotes.value(runs, "previous:idle.ours.rss_mib")
    with pytest.raises(quotes.QuoteError, match="no result file for 'full@20240101T000000Z'"):
        quotes.value(RUNS, "full@20240101T000000Z:idle.ours.rss_mib")
    with pytest.raises(quotes.QuoteError, match="no result file for 'pod-attribution@20240101T000000Z'"):
        quotes.value(RUNS, "pod-attribution@20240101T000000Z:idle.on.cpu_ms_per_s")
