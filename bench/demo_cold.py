"""How long a newcomer waits for ``make demo`` on a fresh machine, step by step.

    python -m bench.demo_cold [--repo PATH]     as root

Runs ``make demo`` in ``--repo`` (default: this checkout) as it runs on a machine that never
built anything: ``python3`` is a new venv, and the Go module and build caches, pip's cache
and the kubelet bench directory are new empty directories (the machine's own are never
read or written). Each output line is time-stamped as it arrives; the steps run from one
line that setup.sh, tools/build-kubelet-bench.sh or the demo prints to the next. Once the
demo says it is running it gets SIGINT, as Ctrl-C in its terminal. Debian packages are
not removed first: util-linux, all the demo asks of apt, is Essential in Debian.

Writes ``bench/results/<UTC time>-demo-cold.json`` (README.md quotes it) and prints it.
The load average before and after is in it: other work on the machine slows every step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
RUNNING = "==> running;"
BUILDING = re.compile(r"build-kubelet-bench\.sh: building (\S+)")
BUILT = re.compile(r"build-kubelet-bench\.sh: built in")
DOWNLOADING = "go: downloading "
DEMO_FIRST = "==> device root"
TIMEOUT_S = 3600


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _commit(repo: Path) -> str:
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def steps(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """The steps between the marker lines of one run: apt and pip up to the first Go build,
    each release's build (its module downloads, then its compile and link), and the demo
    from its first line to running. Seconds of wall time, one decimal."""
    out: list[dict[str, Any]] = []
    mark, release, downloaded = 0.0, "", 0.0

    def close(step: str, at: float) -> None:
        nonlocal mark
        out.append({"step": step, "wall_s": round(at - mark, 1)})
        mark = at

    for t, line in lines:
        building = BUILDING.search(line)
        if building:
            close("apt and pip" if not out else "between builds", t)
            release, downloaded = building[1], t
        elif line.startswith(DOWNLOADING) and release:
            downloaded = t
        elif BUILT.search(line) and release:
            close(f"go modules {release}", downloaded)
            close(f"go compile and link {release}", t)
            release = ""
        elif line.startswith(DEMO_FIRST):
            close("up to the demo's first line", t)
        elif line.startswith(RUNNING):
            close("demo: kubelet, daemon, registration, one allocation", t)
    return [s for s in out if s["step"] != "between builds" or s["wall_s"] > 0]


def run(repo: Path, work: Path) -> dict[str, Any]:
    venv = work / "venv"
    python3 = shutil.which("python3") or sys.executable
    subprocess.run([python3, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GOFLAGS", "KUBELET_BENCH_DIR")}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        VIRTUAL_ENV=str(venv),
        GOMODCACHE=str(work / "gomodcache"),
        GOCACHE=str(work / "gocache"),
        PIP_CACHE_DIR=str(work / "pip-cache"),
        KUBELET_BENCH_DIR=str(work / "kubelet-bench"),
        PYTHONUNBUFFERED="1",
    )
    before_load, before_cpu = _loadavg(), _children_cpu()
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    proc = subprocess.Popen(
        ["make", "-C", str(repo), "--no-print-directory", "demo"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    running = False
    try:
        for raw in proc.stdout:
            line = re.sub(r"\x1b\[[0-9;]*m", "", raw.rstrip("\n"))
            t = time.monotonic() - start
            lines.append((t, line))
            print(f"{t:7.1f} {line}", flush=True)
            if line.startswith(RUNNING) and not running:
                running = True
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole process group
            if t > TIMEOUT_S:
                break
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if not running:
        raise SystemExit(f"demo_cold: make demo ended ({proc.returncode}) without saying it runs")
    go = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip()
    return {
        "repo_commit": _commit(repo),
        "command": "make demo",
        "total_s": round(next(t for t, line in lines if line.startswith(RUNNING)), 1),
        "cpu_s": round(_children_cpu() - before_cpu, 1),
        "steps": steps(lines),
        "machine": {
            "nproc": os.cpu_count(),
            "loadavg_before": before_load,
            "loadavg_after": _loadavg(),
            "python": platform.python_version(),
            "go": go.removeprefix("go version "),
        },
        "marker_lines": [[round(t, 1), line] for t, line in lines if not line.startswith(DOWNLOADING)],
        "go_downloads": sum(line.startswith(DOWNLOADING) for _, line in lines),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.demo_cold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to run make demo in")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("demo_cold: make demo needs root", file=sys.stderr)
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with tempfile.TemporaryDirectory(prefix="ate-demo-cold-") as tmp:
        data = {"started_utc": stamp, **run(args.repo.resolve(), Path(tmp))}
        # Go's module cache is read-only on disk; make it removable.
        subprocess.run(["chmod", "-R", "u+w", tmp], check=False)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{stamp}-demo-cold.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: data[k] for k in ("total_s", "cpu_s", "steps")}, indent=2))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
