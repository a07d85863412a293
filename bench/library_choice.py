"""Should a library replace a hand-written part? Import time and memory, measured.

    python -m bench.library_choice [--runs 5]

Builds fresh venvs (one per candidate, from the package index through pip) and, in each,
runs the same kind of start: the config model (today ``ate_devplugin.config``: PyYAML and
dataclasses; against it pydantic, a model of the same fields with its JSON Schema) and
the command line (today argparse; against it click, the same options). For each it
records the import time (``python -X importtime``: the cumulative time of the modules the
snippet imports, interpreter start aside), the snippet's wall time (imports, building the
model or parser, using it once) and the resident memory after it (VmRSS, and the peak
VmHWM), each the minimum of ``--runs`` runs. Writes
``bench/results/<UTC time>-library-choice.json`` (docs/development.md quotes it) and
prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# What each venv installs, and the snippet each candidate runs there.
VENVS = {"floor": ["PyYAML"], "pydantic": ["PyYAML", "pydantic"], "click": ["click"]}
OPTIONS = [
    "config", "device-root", "plugin-dir", "metrics-address", "log-format", "log-level", "cdi-dir", "mode",
    "node-name", "registry-dir", "dra-dir", "dra-slots", "pod-resources", "pod-resources-socket",
    "pod-resources-interval",
]  # fmt: skip
PYDANTIC_MODEL = """
from typing import Literal
from pydantic import BaseModel, ConfigDict, Field
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
class Mount(Strict):
    container_path: str = Field(pattern=r"^/.*$", max_length=1024)
    host_path: str = Field(pattern=r"^/.*$", max_length=1024)
    read_only: bool = True
class Cdi(Strict):
    file_mode: str | None = Field(None, pattern=r"^0?[0-7]{3}$")
    uid: int | None = Field(None, ge=0, le=2**32 - 1)
    gid: int | None = Field(None, ge=0, le=2**32 - 1)
class Resource(Strict):
    name: str = Field(pattern=r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$", max_length=317)
    devices: list[str] = Field(min_length=1, max_length=64)
    units: int = Field(4096, ge=1)
    permissions: str = Field("rw", pattern=r"^[rwm]{1,3}$")
    mounts: list[Mount] = Field(default_factory=list, max_length=64)
    env: dict[str, str | int | float] = Field(default_factory=dict, max_length=64)
    allocate: Literal["devices", "cdi", "both"] = "devices"
    cdi: Cdi | None = None
    preferred_allocation: bool = False
class Document(Strict):
    version: int = 1
    resources: list[Resource] = Field(min_length=1, max_length=64)
Document.model_validate({"resources": [{"name": "ate.dev/kvm", "devices": ["/dev/kvm"]}]})
Document.model_json_schema()
"""
ARGPARSE_CLI = (
    "import argparse\n"
    "p = argparse.ArgumentParser(prog='ate-devplugin')\n"
    "run = p.add_subparsers(dest='command').add_parser('run')\n"
    + "".join(f"run.add_argument('--{o}', metavar='X', help='h [env ATE_DEVPLUGIN_X; default: d]')\n" for o in OPTIONS)
    + "p.parse_args(['run', '--mode', 'dra'])\n"
)
CLICK_CLI = (
    "import click\n"
    "@click.group()\ndef cli(): pass\n"
    + "".join(
        f"@click.option('--{o}', envvar='ATE_DEVPLUGIN_X', show_envvar=True, show_default=True)\n" for o in OPTIONS
    )
    + "@cli.command()\ndef run(**kw): pass\n"
    "cli(['run', '--mode', 'dra'], standalone_mode=False)\n"
)
# Each candidate: its venv and its snippet (with the repository's app/ on the path).
CANDIDATES = {
    "bare": ("floor", "pass"),
    "model": (
        "floor",
        "import ate_devplugin.config as c\n"
        "c.parse_resources('resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]')\nc.DOCUMENT.schema()\n",
    ),
    "pydantic": ("pydantic", "import yaml\n" + PYDANTIC_MODEL),
    "argparse": ("floor", ARGPARSE_CLI),
    "click": ("click", CLICK_CLI),
}
# Around each snippet: its wall time (imports, and building the model or parser and using
# it once), then the memory.
BEFORE = "import time\n_start = time.perf_counter()\n"
AFTER = (
    "\nprint('Vmsnippet:', (time.perf_counter() - _start) * 1000)\n"
    "for l in open('/proc/self/status'):\n    l.startswith(('VmRSS', 'VmHWM')) and print(l.strip())\n"
)


def make_venv(root: Path, name: str, packages: list[str]) -> Path:
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages], check=True)
    return python


def versions(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {p["name"]: p["version"] for p in json.loads(out) if p["name"] not in ("pip", "setuptools")}


def top_level_imports_us(stderr: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level import in ``-X importtime`` output."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # nested imports are indented further
            out[name.strip()] = out.get(name.strip(), 0) + int(cumulative)
    return out


def run_once(python: Path, snippet: str, startup: set[str]) -> dict[str, float]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO / "app")}
    proc = subprocess.run(
        [str(python), "-X", "importtime", "-c", BEFORE + snippet + AFTER],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    imports = top_level_imports_us(proc.stderr)
    memory = dict(line.split(":") for line in proc.stdout.splitlines() if line.startswith("Vm"))
    return {
        "import_ms": sum(us for name, us in imports.items() if name not in startup) / 1000,
        "snippet_ms": float(memory["Vmsnippet"]),
        "rss_mib": int(memory["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(memory["VmHWM"].split()[0]) / 1024,
    }


def measure(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="library-choice-") as tmp:
        pythons = {name: make_venv(Path(tmp), name, packages) for name, packages in VENVS.items()}
        bare = subprocess.run(
            [str(pythons["floor"]), "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True
        )
        startup = set(top_level_imports_us(bare.stderr))
        figures: dict[str, dict[str, float]] = {}
        for _ in range(runs):  # interleaved, so a busy moment of the machine spreads over all
            for name, (venv, snippet) in CANDIDATES.items():
                once = run_once(pythons[venv], snippet, startup)
                best = figures.setdefault(name, once)
                for key, value in once.items():
                    best[key] = round(min(best[key], value), 1)
        return {
            "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "python": platform.python_version(),
            "runs": runs,
            "loadavg": list(os.getloadavg()),
            "versions": {name: versions(python) for name, python in pythons.items()},
            "candidates": figures,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    result = measure(args.runs)
    stamp = result["started_utc"].replace("-", "").replace(":", "")
    path = args.results_dir / f"{stamp}-library-choice.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
