"""The fuzz tests' hypothesis settings: repeatable (derandomized, no example database in the
repository), as many examples as ``ATE_FUZZ_EXAMPLES`` says (300 by default)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("ATE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
