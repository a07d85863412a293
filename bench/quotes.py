"""Benchmark figures quoted in the docs, written from the result files, never by hand.

A quote is a marked region of a markdown file; only the text between the markers is
rewritten:

    <!-- bench:idle.ours.rss_mib -->48.9 MiB<!-- /bench -->

The path names a value of a result file in ``bench/results``:

- ``idle.ours.rss_mib``: ``figures.idle.ours.rss_mib`` of the newest full run; a path
  whose first part is a top-level key (``sizes.window``, ``started_utc``) is read from
  the top; a number picks from a list (``loadavg.cold_start:before.0``);
- ``previous:...``: the same in the full run before it;
- ``full@20261130T152330Z:...``: the same in the kept full run of that start time (a
  baseline older than ``previous``);
- ``podresources-idle:summary.list_cpu_ms``: the newest ``*-podresources-idle.json``
  (``python -m bench.podresources_idle``);
- ``library-choice:candidates.click.import_ms``: the newest ``*-library-choice.json``
  (``python -m bench.library_choice``);
- ``dra-faults:after.prepare_flood.peak_rss_mib``: the newest ``*-dra-faults.json``
  (``python -m bench.dra_faults``);
- ``kvm-probe:per_probe.reuse.cpu_ms_per_probe``: the newest ``*-kvm-probe.json``
  (``python -m bench.kvm_probe``);
- ``pod-attribution:sizes.250.ratios.burst_on_over_off``: the newest
  ``*-pod-attribution.json`` (``python -m bench.pod_attribution``);
  ``pod-attribution@20261205T005408Z:...``: the kept one of that start time (a baseline);
- ``demo-cold:total_s``: the newest ``*-demo-cold.json`` (``python -m bench.demo_cold``);
- ``PATH/PEER``: the value divided by the same value of another peer (``PATH`` is
  ``FIGURE.PEER.KEY...``), two decimals.

Numbers take the report's format and a unit from the key's name (``_ms``, ``_mib``,
``calls_per_s``, ...); a [low, high] pair reads "low to high". docs/benchmarks.md, which
includes bench/findings.md, is rewritten whole from the newest full run.

    python -m bench.quotes           rewrite every quote and docs/benchmarks.md (make bench-docs)
    python -m bench.quotes --check   exit 1 naming each file that differs (tests/docs runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BENCHMARKS_MD = REPO / "docs" / "benchmarks.md"
QUOTE = re.compile(r"<!-- bench:(?P<path>\S+) -->(?P<text>.*?)<!-- /bench -->", re.DOTALL)
OPENING = re.compile(r"<!-- bench:")
# Unit by the end of the key, first match wins.
UNITS = (
    ("calls_per_s", " calls/s"),
    ("switches_per_s", "/s"),
    ("switches_per_min", "/min"),
    ("cpu_s_per_min", " CPU s/min"),
    ("cpu_ms_per_admission", " ms"),
    ("cpu_ms_per_rewrite", " ms"),
    ("cpu_ms_per_s", " ms/s"),
    ("millicores", " millicores"),
    ("_ms", " ms"),
    ("_mib", " MiB"),
    ("bytes", " bytes"),
    ("_per_s", "/s"),
    ("_percent", " %"),
)


class QuoteError(Exception):
    """A quote that names no value, or markers that do not pair."""


def quoted_files() -> list[Path]:
    """Every markdown file that may quote a figure (docs/benchmarks.md is generated whole)."""
    files = [REPO / "README.md", REPO / "chart" / "README.md"]
    files += sorted(p for p in (REPO / "docs").glob("*.md") if p != BENCHMARKS_MD)
    files += sorted((REPO / "bench").glob("*.md"))
    return files


@dataclass(frozen=True)
class Runs:
    """The result files quotes read: the newest full run, the one before, PodResources
    idle, the library choice, DRA faults, the KVM probe, make demo from cold, pod
    attribution."""

    latest: dict[str, Any]
    latest_path: Path
    previous: dict[str, Any] | None = None
    podresources_idle: dict[str, Any] | None = None
    library_choice: dict[str, Any] | None = None
    dra_faults: dict[str, Any] | None = None
    kvm_probe: dict[str, Any] | None = None
    demo_cold: dict[str, Any] | None = None
    pod_attribution: dict[str, Any] | None = None
    attribution_kept: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # by start time
    kept: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # every full run, by start time

    @classmethod
    def load(cls, results: Path = RESULTS) -> Runs:
        full = sorted(results.glob("*-full.json"))  # named by UTC start time: sorted is oldest first
        if not full:
            raise QuoteError(f"no full run in {results}")
        idle = sorted(results.glob("*-podresources-idle.json"))
        libraries = sorted(results.glob("*-library-choice.json"))
        faults = sorted(results.glob("*-dra-faults.json"))
        probes = sorted(results.glob("*-kvm-probe.json"))
        demo = sorted(results.glob("*-demo-cold.json"))
        attribution = sorted(results.glob("*-pod-attribution.json"))
        kept = {p.name.removesuffix("-full.json"): _read(p) for p in full}
        return cls(
            latest=kept[full[-1].name.removesuffix("-full.json")],
            latest_path=full[-1],
            previous=_read(full[-2]) if len(full) > 1 else None,
            podresources_idle=_read(idle[-1]) if idle else None,
            library_choice=_read(libraries[-1]) if libraries else None,
            dra_faults=_read(faults[-1]) if faults else None,
            kvm_probe=_read(probes[-1]) if probes else None,
            demo_cold=_read(demo[-1]) if demo else None,
            pod_attribution=_read(attribution[-1]) if attribution else None,
            attribution_kept={p.name.removesuffix("-pod-attribution.json"): _read(p) for p in attribution},
            kept=kept,
        )


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _lookup(data: dict[str, Any], keys: list[str], path: str) -> Any:
    cur: Any = data if keys[0] in data else data.get("figures", {})
    i = 0
    while i < len(keys):
        if isinstance(cur, dict) and "na" in cur:
            break
        key = keys[i]
        if isinstance(cur, list) and key.isdigit() and int(key) < len(cur):
            cur, i = cur[int(key)], i + 1
            continue
        # A key may hold a dot (a release, 1.37): the longest run of parts that names one.
        n = next(
            (n for n in range(len(keys) - i, 0, -1) if isinstance(cur, dict) and ".".join(keys[i : i + n]) in cur), 0
        )
        if not n:
            raise QuoteError(f"{path}: no {key!r} there")
        cur, i = cur[".".join(keys[i : i + n])], i + n
    if isinstance(cur, dict) and "na" in cur:  # a peer that cannot do the figure says why
        raise QuoteError(f"{path}: not measured ({cur['na']})")
    return cur


def _unit(key: str) -> str:
    return next((unit for end, unit in UNITS if key.endswith(end)), "")


def _number(x: int | float) -> str:
    return f"{x:,}" if isinstance(x, int) else report._fmt(x)


def value(runs: Runs, path: str) -> str:
    """The text a quote of ``path`` reads."""
    sources = {
        "previous": runs.previous,
        "podresources-idle": runs.podresources_idle,
        "library-choice": runs.library_choice,
        "dra-faults": runs.dra_faults,
        "kvm-probe": runs.kvm_probe,
        "demo-cold": runs.demo_cold,
        "pod-attribution": runs.pod_attribution,
    }
    source, sep, rest = path.partition(":")
    if source.startswith("full@"):
        sources[source] = runs.kept.get(source.removeprefix("full@"))
    elif source.startswith("pod-attribution@"):
        sources[source] = runs.attribution_kept.get(source.removeprefix("pod-attribution@"))
    elif not sep or source not in sources:  # a key may hold a colon: loadavg.cold_start:before.0
        source, rest = "", path
    data = sources[source] if source else runs.latest
    if data is None:
        raise QuoteError(f"{path}: no result file for {source!r}")
    rest, _, peer = rest.partition("/")
    keys = rest.split(".")
    x = _lookup(data, keys, path)
    if peer:
        y = _lookup(data, [keys[0], peer, *keys[2:]], path)
        if not (isinstance(x, int | float) and isinstance(y, int | float)) or not y:
            raise QuoteError(f"{path}: no ratio of {x!r} and {y!r}")
        return f"{x / y:.2f}"
    unit = _unit(keys[-1])
    if isinstance(x, bool | str):
        return str(x)
    if isinstance(x, int | float):
        return _number(x) + unit
    if isinstance(x, list) and len(x) == 2 and all(isinstance(v, int | float) for v in x):
        return f"{_number(x[0])} to {_number(x[1])}{unit}"
    raise QuoteError(f"{path}: {x!r} is not a figure")


def fill(text: str, runs: Runs) -> str:
    """``text`` with every quote rewritten from ``runs``."""
    if len(OPENING.findall(text)) != len(QUOTE.findall(text)):
        raise QuoteError("a '<!-- bench:PATH -->' has no '<!-- /bench -->' (or a quote holds another)")
    return QUOTE.sub(lambda m: f"<!-- bench:{m['path']} -->{value(runs, m['path'])}<!-- /bench -->", text)


def benchmarks_md(runs: Runs, findings: str) -> str:
    """docs/benchmarks.md as the newest full run gives it, with these findings."""
    data = dict(runs.latest)
    data.setdefault("targets", report.targets(data))
    rel = os.path.relpath(runs.latest_path, BENCHMARKS_MD.parent)
    return report.markdown(data, BENCHMARKS_MD.stem + "-latency.png", rel, findings=findings)


def expected(runs: Runs) -> dict[Path, str]:
    """What every quoting file, and docs/benchmarks.md, should hold."""
    out: dict[Path, str] = {}
    for path in quoted_files():
        try:
            out[path] = fill(path.read_text(), runs)
        except QuoteError as exc:
            raise QuoteError(f"{path.relative_to(REPO)}: {exc}") from exc
    out[BENCHMARKS_MD] = benchmarks_md(runs, out.get(report.FINDINGS, ""))
    return out


def stale(runs: Runs) -> list[Path]:
    return [p for p, text in expected(runs).items() if not p.exists() or p.read_text() != text]


def write_all(runs: Runs) -> list[Path]:
    """Rewrites what differs; returns the files written."""
    changed = []
    for path, text in expected(runs).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which files differ")
    args = parser.parse_args(argv)
    try:
        runs = Runs.load()
        paths = stale(runs) if args.check else write_all(runs)
    except QuoteError as exc:
        print(f"bench.quotes: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"{'differs' if args.check else 'wrote'}: {path.relative_to(REPO)}")
    return 1 if args.check and paths else 0


if __name__ == "__main__":
    sys.exit(main())
