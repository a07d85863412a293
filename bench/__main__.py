"""``python -m bench run [--quick]``: run the benchmark suite and write its reports.

    python -m bench run              full run (about 10 minutes on 2 cores):
                                     bench/results/<UTC time>-full.json,
                                     docs/benchmarks.md and docs/benchmarks-latency.png
    python -m bench run --quick      tiny sizes (under 2 minutes): bench/results/<time>-quick.json
                                     plus bench/results/<time>-quick.md and .png
    python -m bench report FILE.json [--markdown PATH]   rewrite the markdown from a result file

    --generic-device-plugin PATH (or ATE_BENCH_GENERIC_DEVICE_PLUGIN=PATH) adds
    squat/generic-device-plugin, from a binary built outside this repository;
    --dra-example-driver PATH (or ATE_BENCH_DRA_EXAMPLE_DRIVER=PATH) adds
    kubernetes-sigs/dra-example-driver's kubelet plugin, from a binary built outside this repository.
    --benches devices,kubelet-cost,fleet,dra selects benches (default: all of them).

Needs root (private mount namespaces), util-linux, and the kubelet bench binary
(tools/build-kubelet-bench.sh, or KUBELET_BENCH_DIR pointing at a built one); the fleet
and DRA benches also kube-apiserver (tools/build-k8s.sh) and etcd.
"""

from __future__ import annotations

import argparse
import compileall
import json
import logging
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine, quotes, report
from bench.dra_path import DRA_FULL, DRA_QUICK, EXAMPLE_ENV, example_binary, run_dra_path
from bench.fleet import FLEET_FULL, FLEET_QUICK, FleetBench
from bench.kubelet_cost import COST_FULL, COST_QUICK, run_kubelet_cost
from bench.peers import GDP_ENV, gdp_binary
from bench.suite import FULL, QUICK, run_suite
from tests.harness.kubelet import bench_binary, built_versions, missing_prerequisites

REPO = Path(__file__).resolve().parents[1]

log = logging.getLogger("bench")

BENCHES = ("devices", "kubelet-cost", "fleet", "dra")


def _benches(value: str) -> list[str]:
    chosen = [b.strip() for b in value.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown bench {unknown or value!r} (choose from {', '.join(BENCHES)})")
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the suite")
    run.add_argument("--quick", action="store_true", help="tiny sizes, for CI (no timing claims)")
    run.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    run.add_argument("--markdown", type=Path, help="where the report goes (default: see above)")
    run.add_argument("--kubelet", help="kubelet release of the bench (default: newest built)")
    run.add_argument(
        "--generic-device-plugin",
        type=Path,
        help=f"binary of squat/generic-device-plugin to run as a peer (default: ${GDP_ENV})",
    )
    run.add_argument(
        "--dra-example-driver",
        type=Path,
        help=f"binary of dra-example-kubeletplugin to run next to ours in the DRA bench (default: ${EXAMPLE_ENV})",
    )
    run.add_argument(
        "--benches",
        type=_benches,
        default=list(BENCHES),
        help=f"comma-separated, from {', '.join(BENCHES)} (default: all)",
    )
    rep = sub.add_parser("report", help="write the markdown report of a result file")
    rep.add_argument("result", type=Path)
    rep.add_argument("--markdown", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser


def compile_bytecode() -> bool:
    """Bytecode for the Python peers' own code (app/, bench/), written once up front.

    The image runs the daemon from bytecode compiled at build time; the bench runs it from
    the source tree, where an interpreter told not to write bytecode
    (PYTHONDONTWRITEBYTECODE) would compile every module again at every start, and count
    that in cold start and memory.
    """
    return all(compileall.compile_dir(REPO / d, quiet=1) for d in ("app", "bench"))


def image_malloc_arenas() -> str:
    """The image's MALLOC_ARENA_MAX (Dockerfile), which the bench gives every Python peer too."""
    found = re.search(r"\bMALLOC_ARENA_MAX=(\d+)", (REPO / "Dockerfile").read_text())
    if found is None:
        raise RuntimeError("no MALLOC_ARENA_MAX in the Dockerfile's ENV")
    return found.group(1)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.command == "report":
        saved = json.loads(args.result.read_text())
        report.write(saved, args.markdown, result_path=args.result)
        print(args.markdown)
        return 0
    why = missing_prerequisites()
    if why:
        print(f"bench: {why}", file=sys.stderr)
        return 2
    built = built_versions()
    version = args.kubelet or (built[-1] if built else None)
    if version is None or version not in built:
        print("bench: no kubelet bench built: run tools/build-kubelet-bench.sh", file=sys.stderr)
        return 2
    # The benches measure the kubelet's CPU: never through the demo's unoptimized build.
    quick = [v for v in built if machine.quick_build(bench_binary(v))]
    if quick:
        print(
            f"bench: kubelet bench {', '.join(quick)} is a --quick build: run tools/build-kubelet-bench.sh",
            file=sys.stderr,
        )
        return 2
    if args.generic_device_plugin is not None:
        os.environ[GDP_ENV] = str(args.generic_device_plugin.resolve())
    if args.dra_example_driver is not None:
        os.environ[EXAMPLE_ENV] = str(args.dra_example_driver.resolve())
    os.environ["MALLOC_ARENA_MAX"] = image_malloc_arenas()
    sizes = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    result_path = args.results_dir / f"{stamp}-{mode}.json"
    markdown = args.markdown or (
        args.results_dir / f"{stamp}-{mode}.md" if args.quick else REPO / "docs" / "benchmarks.md"
    )
    compiled = compile_bytecode()
    # SIGTERM unwinds like an exception, so every namespace and process gets cleaned up.
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    data: dict[str, Any] = {
        "mode": mode,
        "started_utc": stamp,
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "kubelet_release": version,
        "machine": machine.describe(bench_binary(version), gdp_binary(), example_binary()),
        "benches": args.benches,
    }
    data["machine"]["bytecode"] = "compiled up front" if compiled else "compiling failed: from source"
    if "devices" in args.benches:
        data.update(run_suite(version, sizes))
    load = data.setdefault("loadavg", {})
    timings = data.setdefault("phase_seconds", {})
    quick = args.quick
    later: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "kubelet-cost": ("kubelet_cost", lambda: run_kubelet_cost(COST_QUICK if quick else COST_FULL, version)),
        "fleet": ("fleet", lambda: FleetBench(FLEET_QUICK if quick else FLEET_FULL).run()),
        "dra": ("dra_path", lambda: run_dra_path(DRA_QUICK if quick else DRA_FULL, args.kubelet)),
    }
    for bench in args.benches:
        if bench not in later:
            continue
        key, run_one = later[bench]
        log.info("== %s", key)
        load[f"{key}:before"] = machine.loadavg()
        begin = time.monotonic()
        data[key] = run_one()
        timings[key] = round(time.monotonic() - begin, 1)
        load[f"{key}:after"] = machine.loadavg()
        if data[key].get("error") and not data.get("error"):
            data["error"] = f"{key}: {data[key]['error']}"
    data["duration_s"] = round(time.monotonic() - started, 1)
    data["machine"]["loadavg_at_end"] = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    # Daemons started later in the run read app/ from disk then: say if it moved meanwhile.
    data["machine"]["git_revision_at_end"] = machine.git_revision(REPO)
    result_path.write_text(json.dumps(data, indent=1) + "\n")
    report.write(data, markdown, result_path=result_path)
    print(result_path)
    print(markdown)
    if mode == "full" and args.results_dir == quotes.RESULTS and args.markdown is None:
        # The figures the docs quote follow the new run (and docs/benchmarks.md its findings).
        try:
            for path in quotes.write_all(quotes.Runs.load()):
                print(path)
        except quotes.QuoteError as exc:
            print(f"bench: quoted figures not rewritten: {exc}", file=sys.stderr)
    if data.get("error"):
        print(f"bench: the run ended early: {data['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
