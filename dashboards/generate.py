"""Writes the dashboards in this folder, Grafana's and Perses', from the modules next to it,
their one source.

    python dashboards/generate.py          # rewrite the generated files
    python dashboards/generate.py --check  # exit 1 if a generated file differs from the code

The panels are defined once, as the project's own small model (model.py: ``Stat``,
``TimeSeries``, ``StateTimeline``, ``Table``, grouped in rows of a ``Board``), in the words
of vocabulary.py (label matchers, colours, panel constructors, query shapes). Each board
has its module: fleet.py, node.py, and the collapsed rows they share, pods.py
(PodResources), dra.py (the DRA driver) and kvm.py (the KVM probe). Two writers turn a board into a Grafana
dashboard (grafana.py, with Grafana's own SDK, grafana-foundation-sdk, pinned in
pyproject.toml) and into a Perses dashboard (perses.py: the ``Dashboard`` resource of
Perses' API, with the upstream panel plugins: StatChart, TimeSeriesChart,
StatusHistoryChart, Table); writer.py writes the files (listed there) or checks them.

A row's panels are laid out left to right, wrapping at 24 columns (keep a row's widths
adding up to lines of 24). To add a panel: append a ``stat``, ``timeseries``,
``state_timeline`` or ``table`` call to its row in fleet.py or node.py, run this file
and tools/sync-chart-files.py (the chart ships a copy). The live test runs the new query
against the fleet scenario of tests/harness/monitoring.py, so the scenario must produce
the series it reads; queries on the DRA driver's series (ate_devplugin_dra_*, in the
collapsed "DRA driver" rows) are run by tests/e2e/test_dra.py instead, as the PodResources
ones (collapsed "Pods" rows) are by test_pods_holding_units.py, and kube-state-metrics' (kube_*)
by the rendered test (tests/harness/incident.py) and tests/e2e/test_user_path.py. The KVM
probe's (collapsed "KVM probe" rows) are in the fleet scenario: its daemons probe their
/dev/kvm themselves (--kvm-probe local).

tests/dashboards/ fails when a generated file drifts from this code, checks the conventions
and grafana/dashboard-linter's rules, runs every query against a real Prometheus that
scraped the daemon, and renders the Perses dashboards in Chromium (docs/dashboards.md).

Label sets are those of the chart's ServiceMonitor: job, instance, namespace, pod, node,
plus resource_name on the daemon's own series, and cluster where the Prometheus adds one
(a hidden variable, as the kubernetes-mixin dashboards have it: empty matches no label).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a file, this folder is on the path, not the repository: the package needs it.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from dashboards.writer import main

    sys.exit(main(sys.argv[1:]))
