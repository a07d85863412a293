"""A real Prometheus inside the sandbox, finding the plugin pods through Kubernetes service
discovery as the Prometheus Operator does for the chart's ServiceMonitor.

The scrape config is made from the ServiceMonitor the chart renders: its selector, port,
path, jobLabel and relabelings (the ``node`` label), after the relabelings the operator
itself adds (``namespace``, ``service``, ``pod``, ``container``, ``endpoint``, ``job``).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from e2e.cluster import Cluster
from e2e.sandbox import Process
from e2e.userpath import CHART, NAMESPACE, RELEASE

from harness.prometheus import Prometheus, PrometheusConfig


def rendered_service_monitor(helm_binary: str) -> dict[str, Any]:
    out = subprocess.run(
        [helm_binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "serviceMonitor.enabled=true",
         "--set", "forceMonitoringApi=true", "--show-only", "templates/servicemonitor.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return doc


def _meta(label: str) -> str:
    return "__meta_kubernetes_service_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _snake(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor relabeling (camelCase) as a Prometheus relabel_config."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in relabeling.items()}


class ServiceMonitorConfig(PrometheusConfig):
    """What the operator generates for one ServiceMonitor endpoint, with the admin kubeconfig."""

    def __init__(self, monitor: dict[str, Any], kubeconfig: str, scrape_interval: str = "2s") -> None:
        super().__init__(scrape_interval=scrape_interval, evaluation_interval=scrape_interval, exemplars=False)
        self.monitor = monitor
        self.kubeconfig = kubeconfig

    def render(self) -> dict[str, Any]:
        spec = self.monitor["spec"]
        endpoint = spec["endpoints"][0]
        relabel: list[dict[str, Any]] = [
            {"action": "keep", "source_labels": [_meta(k)], "regex": v}
            for k, v in spec["selector"]["matchLabels"].items()
        ]
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": [_meta(spec["jobLabel"])], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *(_snake(r) for r in endpoint.get("relabelings", [])),
        ]
        meta = self.monitor["metadata"]
        return {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.evaluation_interval},
            "scrape_configs": [{
                "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
                "kubernetes_sd_configs": [{
                    "role": "endpoints", "kubeconfig_file": self.kubeconfig,
                    "namespaces": {"names": spec["namespaceSelector"]["matchNames"]},
                }],
                "relabel_configs": relabel,
            }],
        }  # fmt: skip


class SandboxPrometheus(Prometheus):
    """Debian's Prometheus, run in the cluster's sandbox; its API is called from inside it."""

    def __init__(self, cluster: Cluster, config: PrometheusConfig) -> None:
        super().__init__(config)
        self.cluster = cluster
        self.server: Process | None = None

    def _launch(self, exe: str) -> bool:
        storage = self.workdir / "data"
        self.server = self.cluster.sandbox.spawn("prometheus", [
            exe, f"--config.file={self.config_file}", f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
        ])  # fmt: skip
        self.log_file = self.server.log_path
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline and self.server.running():
            try:
                if self.cluster.sandbox.http_get(f"{self.url}/-/ready", timeout=5)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.3)
        self._terminate()
        return False

    def _terminate(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.cluster.sandbox.processes.remove(self.server)
            self.server = None

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running()

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.cluster.sandbox.in_netns(super().api, path, params)


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(where, PromQL, instant) of every panel target and Prometheus annotation."""
    for panel in dashboard["panels"]:
        for p in panel.get("panels", []) if panel["type"] == "row" else [panel]:
            for t in p["targets"]:
                yield f"panel {p['title']!r} target {t['refId']}", t["expr"], bool(t.get("instant"))
    for a in dashboard["annotations"]["list"]:
        if not a.get("builtIn"):
            yield f"annotation {a['name']!r}", a["expr"], False


def fill(expr: str, values: Mapping[str, str]) -> str:
    """Dashboard variables replaced as Grafana would (longest names first)."""
    for var in sorted(values, key=len, reverse=True):
        expr = expr.replace(var, values[var])
    assert "$" not in expr, f"unfilled variable in {expr}"
    return expr
