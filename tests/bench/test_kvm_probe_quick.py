"""bench/kvm_probe.py keeps working: a tiny run end to end on this machine's /dev/kvm.

Behaviour only (every part measured, the file written); timings are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.harness.kubelet import bench_binary, missing_prerequisites
from tests.harness.require import require

REPO = Path(__file__).resolve().parents[2]


def test_a_tiny_run_measures_every_part(tmp_path: Path) -> None:
    require(os.path.exists("/dev/kvm"), "no /dev/kvm on this machine")
    require(os.access("/dev/kvm", os.R_OK | os.W_OK), "the KVM probe bench needs /dev/kvm (root here)")
    require(os.access(bench_binary("1.37"), os.X_OK), "the kubelet bench of 1.37 (tools/build-kubelet-bench.sh)")
    require(missing_prerequisites() is None, missing_prerequisites() or "")
    args = ["--probes", "5", "--period", "1", "--seconds", "3", "--results-dir", str(tmp_path)]
    subprocess.run([sys.executable, "-m", "bench.kvm_probe", *args], cwd=REPO, check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    [written] = tmp_path.glob("*-kvm-probe.json")
    result = json.loads(written.read_text())
    for way in ("reuse", "worker_per_probe"):
        assert result["per_probe"][way]["probes"] == 5
        assert result["per_probe"][way]["cpu_ms_per_probe"] > 0
    assert result["at_period"]["probing"]["processes"] == 2  # the host and its worker
    assert result["at_period"]["no-prober"]["processes"] == 1
    assert result["at_period"]["daemon-probing"]["processes"] == 2  # our daemon and its probe worker
    assert result["at_period"]["daemon-no-probe"]["processes"] == 1
    # What the chart runs: the daemon in socket mode, and its prober with its probe worker.
    assert result["at_period"]["daemon-socket"]["processes"] == 1
    assert result["at_period"]["prober"]["processes"] == 2
    # The Go peer in the same window, registered with a kubelet bench, and ours beside it.
    assert result["at_period"]["go-stub"]["processes"] == 1
    assert result["at_period"]["ours-probing"]["processes"] == 2
    assert set(result["at_period"]["registered_ratio"]) == {"millicores", "switches_per_min", "rss_mib"}
    assert result["budget"]["limit_percent"] == 1.0
