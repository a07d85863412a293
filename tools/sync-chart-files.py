#!/usr/bin/env python3
"""Copy the repository's dashboards (Grafana's, and Perses' in perses/) into the Helm chart.

`helm install ./chart` and `helm package` only see files inside chart/, and a
symlink out of the chart is not packaged reliably, so the chart carries a copy
of dashboards/*.json and dashboards/perses/*.json in chart/files/dashboards/. dashboards/ stays the one
source; this script makes the copy and, with --check, reports drift (a test
runs it that way).

    tools/sync-chart-files.py            copy, removing stale copies
    tools/sync-chart-files.py --check    exit 1 and list what differs
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mirror:
    """A folder of the repository mirrored into the chart."""

    source: Path
    target: Path
    pattern: str


MIRRORS = (
    Mirror(
        source=REPO_ROOT / "dashboards",
        target=REPO_ROOT / "chart" / "files" / "dashboards",
        pattern="*.json",
    ),
    Mirror(
        source=REPO_ROOT / "dashboards" / "perses",
        target=REPO_ROOT / "chart" / "files" / "dashboards" / "perses",
        pattern="*.json",
    ),
)


def _rel(path: Path) -> Path:
    return path.relative_to(REPO_ROOT)


def differences(mirror: Mirror) -> list[str]:
    """What differs between source and target, one line each; empty when in sync."""
    wanted = {p.name: p for p in sorted(mirror.source.glob(mirror.pattern)) if p.is_file()}
    present = {p.name: p for p in sorted(mirror.target.glob(mirror.pattern)) if p.is_file()}
    out: list[str] = []
    for name, src in wanted.items():
        dst = mirror.target / name
        if name not in present:
            out.append(f"missing: {_rel(dst)} (copy of {_rel(src)})")
        elif dst.read_bytes() != src.read_bytes():
            out.append(f"differs: {_rel(dst)} from {_rel(src)}")
    for name, dst in present.items():
        if name not in wanted:
            out.append(f"stale: {_rel(dst)} (no {_rel(mirror.source / name)})")
    return out


def sync(mirror: Mirror) -> list[str]:
    """Make the target match the source; returns what was changed."""
    changed = differences(mirror)
    if not changed:
        return []
    mirror.target.mkdir(parents=True, exist_ok=True)
    for dst in mirror.target.glob(mirror.pattern):
        if not (mirror.source / dst.name).is_file():
            dst.unlink()
    for src in mirror.source.glob(mirror.pattern):
        if src.is_file():
            shutil.copyfile(src, mirror.target / src.name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if args.check:
        drift = [line for m in MIRRORS for line in differences(m)]
        for line in drift:
            print(line)
        if drift:
            print("chart files are out of date: run tools/sync-chart-files.py", file=sys.stderr)
            return 1
        return 0
    for m in MIRRORS:
        for line in sync(m):
            print(f"synced {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
