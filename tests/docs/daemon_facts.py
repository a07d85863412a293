"""What the docs are checked against, from the daemon itself: its command line, its
defaults, its metrics. The one place the doc tests import the daemon's modules from."""

from __future__ import annotations

import argparse

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from ate_devplugin.cli import build_parser
from ate_devplugin.observability.metrics import DraMetrics, KvmMetrics, Metrics, PodResourcesMetrics
from ate_devplugin.settings import OPTIONS

__all__ = ["OPTIONS", "metric_labels", "run_flags"]


def run_flags() -> list[str]:
    """Every long option of ``ate-devplugin run`` but --help."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run: argparse.ArgumentParser = commands.choices["run"]
    return [s for a in run._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


def metric_labels() -> dict[str, set[str]]:
    """Every ``ate_devplugin_*`` series name the daemon can export (DRA and PodResources
    included), with its label names."""
    registry = CollectorRegistry()
    DraMetrics(registry, Metrics(registry).health_changed)
    PodResourcesMetrics(registry)
    KvmMetrics(registry)
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        if not family.name.startswith("ate_devplugin_"):
            continue
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        out[family.name + suffix] = {k for s in family.samples for k in s.labels if k != "le"}
    # Labelled series not created yet have no samples: their label names come from the collector.
    for collector in registry._collector_to_names:
        if isinstance(collector, MetricWrapperBase):
            name = collector._name + ("_total" if collector._type == "counter" else "")
            if name in out:
                out[name] |= set(collector._labelnames)
    return out
