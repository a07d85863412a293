"""Benchmarks of ate-devplugin against Go device plugins, through the kubelet's device manager.

Run with ``python -m bench run [--quick]``; see bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The suite drives the same harness as the tests (tests/harness), which lives with them.
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
