"""A real Prometheus inside the sandbox, finding the plugin pods through Kubernetes service
discovery as the Prometheus Operator sets it up for the chart's ServiceMonitor.

The scrape config is made from the ServiceMonitor the chart renders: its selector, port,
path, jobLabel and relabelings (the ``node`` label), after the relabelings the operator
itself adds (``namespace``, ``service``, ``pod``, ``container``, ``endpoint``, ``job``).

Debian's Prometheus (2.42) is built without ``kubernetes_sd_configs``. So the targets come
through ``http_sd_configs`` from :class:`EndpointsDiscovery`, which reads the Services,
EndpointSlices and Pods from the API server on every refresh and labels each endpoint with
the ``__meta_kubernetes_*`` labels Prometheus' own discovery (role ``endpoints``) gives it.
Prometheus applies the relabelling itself, as it would with its own discovery.

With ``kube_state_metrics``, the real kube-state-metrics (tools/build-kube-state-metrics.sh)
runs in the sandbox too, reading the cluster's API server, and is scraped as
kube-prometheus-stack scrapes it (honor_labels): the plugin pods and the DaemonSet as the
cluster's controllers and kubelets report them.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import Cluster, Node
from tests.e2e.sandbox import Process
from tests.e2e.userpath import CHART, NAMESPACE, RELEASE
from tests.harness import kube_state_metrics
from tests.harness.net import free_port
from tests.harness.prometheus import Prometheus, PrometheusConfig


def rendered_service_monitor(helm_binary: str) -> dict[str, Any]:
    out = subprocess.run(
        [helm_binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "serviceMonitor.enabled=true",
         "--set", "forceMonitoringApi=true", "--show-only", "templates/servicemonitor.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return doc


def rendered_rules(helm_binary: str, dest: Path, *sets: str) -> Path:
    """The release's alert rules as the chart renders them (``sets`` added), as a rule file."""
    out = subprocess.run(
        [helm_binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "prometheusRule.enabled=true",
         "--set", "forceMonitoringApi=true", *(a for s in sets for a in ("--set", s)),
         "--show-only", "templates/prometheusrule.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    dest.write_text(yaml.safe_dump({"groups": yaml.safe_load(out.stdout)["spec"]["groups"]}))
    return dest


def _label_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _meta(label: str) -> str:
    return "__meta_kubernetes_service_label_" + _label_name(label)


class EndpointsDiscovery:
    """An HTTP service-discovery endpoint, inside the sandbox, serving the endpoints of the
    Services of one namespace with the labels of Prometheus' Kubernetes discovery."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.url = ""
        self._server: HTTPServer | None = None

    def target_groups(self) -> list[dict[str, Any]]:
        items = self.cluster.get_json("services,endpointslices,pods", "-n", self.namespace)["items"]
        services = {i["metadata"]["name"]: i for i in items if i["kind"] == "Service"}
        pods = {i["metadata"]["name"]: i for i in items if i["kind"] == "Pod"}
        groups = []
        for eps in (i for i in items if i["kind"] == "EndpointSlice"):
            service = services.get(eps["metadata"].get("labels", {}).get("kubernetes.io/service-name", ""))
            if service is None:
                continue
            common = {
                "__meta_kubernetes_namespace": self.namespace,
                "__meta_kubernetes_service_name": service["metadata"]["name"],
                **{_meta(k): v for k, v in service["metadata"].get("labels", {}).items()},
            }
            targets = []
            for endpoint in eps.get("endpoints") or []:
                pod = pods.get(endpoint.get("targetRef", {}).get("name", ""), {})
                for port in eps.get("ports") or []:
                    containers = [
                        c["name"]
                        for c in pod.get("spec", {}).get("containers", [])
                        if any(p.get("containerPort") == port["port"] for p in c.get("ports", []))
                    ]
                    labels = {
                        **common,
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_ready": str(endpoint["conditions"].get("ready", False)).lower(),
                        "__meta_kubernetes_pod_name": pod.get("metadata", {}).get("name", ""),
                        "__meta_kubernetes_pod_node_name": pod.get("spec", {}).get("nodeName", ""),
                        "__meta_kubernetes_pod_container_name": containers[0] if containers else "",
                    }
                    targets += [(f"{address}:{port['port']}", labels) for address in endpoint["addresses"]]
            groups += [{"targets": [address], "labels": labels} for address, labels in targets]
        return groups

    def start(self) -> None:
        discovery = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(discovery.target_groups()).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # Prometheus stopped
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
                pass

        # A socket made on the sandbox's network thread lives in the sandbox's network.
        sock = self.cluster.sandbox.in_netns(lambda: socket.create_server(("127.0.0.1", 0)))
        server = HTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        self._server = server
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        threading.Thread(target=server.serve_forever, name="endpoints-discovery", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _snake(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor relabeling (camelCase) as a Prometheus relabel_config."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in relabeling.items()}


class ServiceMonitorConfig(PrometheusConfig):
    """What the operator generates for one ServiceMonitor endpoint (discovery: see above)."""

    def __init__(
        self,
        monitor: dict[str, Any],
        discovery_url: str,
        scrape_interval: str = "2s",
        rule_files: Sequence[Path] = (),
        extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(
            scrape_interval=scrape_interval, evaluation_interval=scrape_interval, exemplars=False,
            rule_files=rule_files, extra_scrape_configs=extra_scrape_configs,
        )  # fmt: skip
        self.monitor = monitor
        self.discovery_url = discovery_url

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
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{
                "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
                "http_sd_configs": [{"url": self.discovery_url, "refresh_interval": "2s"}],
                "relabel_configs": relabel,
            }, *self.extra_scrape_configs],
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


@contextlib.contextmanager
def scraping(
    cluster: Cluster, helm_binary: str, rule_files: Sequence[Path] = (), *, with_kube_state_metrics: bool = False
) -> Iterator[SandboxPrometheus]:
    """A Prometheus in ``cluster``'s sandbox scraping what the chart's ServiceMonitor selects
    (on every node), and kube-state-metrics if asked, with ``rule_files`` loaded, until the
    block ends. Started after the chart is installed: the discovery serves the release's
    namespace."""
    monitor = rendered_service_monitor(helm_binary)
    discovery = EndpointsDiscovery(cluster, monitor["spec"]["namespaceSelector"]["matchNames"][0])
    extra: list[dict[str, Any]] = []
    ksm: Process | None = None
    if with_kube_state_metrics:
        ksm, address = start_kube_state_metrics(cluster)
        extra.append(kube_state_metrics.scrape_config(address))
    discovery.start()
    prom = SandboxPrometheus(
        cluster, ServiceMonitorConfig(monitor, discovery.url, rule_files=rule_files, extra_scrape_configs=extra)
    )
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        discovery.stop()
        if ksm is not None:
            ksm.stop()
            cluster.sandbox.processes.remove(ksm)


def start_kube_state_metrics(cluster: Cluster) -> tuple[Process, str]:
    """kube-state-metrics in the sandbox, with the cluster's admin kubeconfig; its address."""
    binary = kube_state_metrics.binary()
    assert binary is not None, f"kube-state-metrics not built: run {kube_state_metrics.INSTALL}"
    port, telemetry = cluster.sandbox.in_netns(free_port), cluster.sandbox.in_netns(free_port)
    process = cluster.sandbox.spawn("kube-state-metrics", [
        str(binary), f"--kubeconfig={cluster.kubeconfig}", f"--resources={kube_state_metrics.RESOURCES}",
        "--host=127.0.0.1", f"--port={port}", "--telemetry-host=127.0.0.1", f"--telemetry-port={telemetry}",
    ])  # fmt: skip
    return process, f"127.0.0.1:{port}"


def dashboard_values(node: Node, resource: str = "ate.dev/kvm") -> dict[str, str]:
    """The dashboards' variables, as Grafana fills them for ``node`` and ``resource``."""
    # $daemonset: the release's DaemonSet, as the chart sets that constant.
    return {"$__rate_interval": "1m", "$__range": "1h", "$cluster": "", "$job": "ate-devplugin", "$node": node.name,
            "$instance": ".+", "$resource": resource.replace(".", "\\\\."), "$daemonset": RELEASE}  # fmt: skip


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
