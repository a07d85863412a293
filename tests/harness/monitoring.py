"""The daemon as a process, driven by a kubelet, scraped by a real Prometheus.

Used by the dashboard and alert tests to put real series into a real Prometheus. The
daemon runs as its own process (:mod:`tests.harness.daemon`, the CLI an operator runs) with a
``kvm`` character device node under a temporary device root, one daemon per "node" (the
``node`` label Prometheus gives its target). The kubelet side is the kubelet's real
device manager (:mod:`tests.harness.kubelet`, the Go bench) in a private mount namespace.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import make_device_root, remove_device_node
from tests.harness.kubelet import PLUGIN_DIR, KubeletBench, Namespace, built_versions, missing_prerequisites
from tests.harness.otlp import OtlpReceiver
from tests.harness.prometheus import DEFAULT_JOB, Prometheus, PrometheusConfig, ScrapeTarget
from tests.harness.wait import wait_until

RESOURCE = "ate.dev/kvm"
SOCKET_NAME = "ate-ate-dev-kvm.sock"
REPO = Path(__file__).resolve().parents[2]
ALERTS_FILE = REPO / "chart" / "files" / "alerts.yaml"
KVM_CONFIG = f"resources:\n  - name: {RESOURCE}\n    devices: [/dev/kvm]\n"
# The kubelet calls GetPreferredAllocation only where a resource asks for it.
PREFERRED_CONFIG = KVM_CONFIG + "    preferred_allocation: true\n"


# Series of a daemon reading the kubelet's PodResources API: off by default, and the
# kubelet bench embeds the device manager alone. The queries that read them are run against
# the real one-node cluster, with it on and a pod holding the device, by
# tests/e2e/test_pods_holding_units.py.
POD_RESOURCES_SERIES = (
    "ate_devplugin_pod_units",
    "ate_devplugin_pods_holding_units",
    "ate_devplugin_pods_on_unhealthy_device",
    "ate_devplugin_pod_units_series_dropped",
    "ate_devplugin_pod_resources_requests_total",
    "ate_devplugin_pod_resources_duration_seconds",
)


def reads_pod_resources(expr: str) -> bool:
    return any(re.search(rf"\b{name}\b", expr) for name in POD_RESOURCES_SERIES)


# Series of the DRA driver, all named ate_devplugin_dra_*: made only in dra.mode dra or
# both, and the kubelet bench drives device-plugin mode. tests/e2e/test_dra.py runs the
# queries that read them on the containerd 2 cluster while pods hold claims.
DRA_SERIES = re.compile(r"\bate_devplugin_dra_\w+")


def reads_dra(expr: str) -> bool:
    return DRA_SERIES.search(expr) is not None


# Series of kube-state-metrics (kube_*), which reads the API server: the fleet scenario has
# none; the incident scenario (tests/harness/incident.py) and the e2e clusters do.
KSM_SERIES = re.compile(r"\bkube_\w+")


def reads_kube_state_metrics(expr: str) -> bool:
    return KSM_SERIES.search(expr) is not None


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, as a ConfigMap update does."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


class DevicePluginClient:
    """Calls a plugin's socket directly, as the kubelet would (or a confused client)."""

    def __init__(self, socket_path: Path | str) -> None:
        self.socket_path = str(socket_path)

    @contextlib.contextmanager
    def _stub(self) -> Iterator[Any]:
        with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]

    def allocate(self, device_ids: Sequence[str]) -> Any:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))])
        with self._stub() as stub:
            return stub.Allocate(request, timeout=30)


class BenchDriver:
    kind = "kubelet-bench"
    plugin_dir = PLUGIN_DIR

    def __init__(self, workdir: Path) -> None:
        self.ns: Namespace | None = Namespace().open()
        try:
            self.bench = KubeletBench(self.ns, log_dir=workdir / "bench-logs")
        except Exception:
            self.ns.close()
            raise

    def start(self) -> None:
        self.bench.start()

    def admit(self, pod: str) -> None:
        self.bench.allocate(pod, "main", {RESOURCE: 1})

    def restart(self) -> None:
        self.bench.restart()

    def close(self) -> None:
        try:
            self.bench.close()
        finally:
            if self.ns is not None:
                self.ns.close()

    def log_tail(self) -> str:
        return "\n".join(self.bench.log_text().splitlines()[-40:])


def kubelet_driver(workdir: Path) -> BenchDriver:
    """The kubelet's real device manager; raises when it cannot run here."""
    why = missing_prerequisites() or (None if built_versions() else "no kubelet bench built")
    if why:
        raise RuntimeError(f"the kubelet bench cannot run: {why}")
    return BenchDriver(workdir)


# --- daemons as Prometheus sees them -----------------------------------------------------


@dataclass
class NodeDaemon:
    """Our daemon standing for the DaemonSet pod on one node."""

    node: str
    daemon: DevicePluginDaemon

    @property
    def target(self) -> ScrapeTarget:
        return ScrapeTarget(f"127.0.0.1:{self.daemon.port}", self.node)

    @property
    def device_root(self) -> Path:
        return self.daemon.device_root

    @property
    def config_file(self) -> Path:
        assert self.daemon.config_path is not None, "started without a config file"
        return self.daemon.config_path

    def socket(self) -> Path:
        return self.daemon.socket_path(SOCKET_NAME)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /readyz says 200: registered with the kubelet, which holds the stream."""
        wait_until(self.daemon.ready, timeout, f"{self.node}: daemon /readyz")

    def log_tail(self) -> str:
        return "\n".join(self.daemon.log_text().splitlines()[-40:])


def node_daemon(
    workdir: Path,
    node: str,
    *,
    ns: Namespace | None = None,
    plugin_dir: str = "",
    config: str | None = None,
    env: Mapping[str, str] | None = None,
) -> NodeDaemon:
    """A daemon (not started) with /dev/kvm under its own device root."""
    root = make_device_root(workdir / node / "dev", {"kvm": "/dev/kvm"})
    if not plugin_dir:
        plugin_dir = str(workdir / node / "device-plugins")
        Path(plugin_dir).mkdir(parents=True, exist_ok=True)
    daemon = DevicePluginDaemon(root, workdir / node / "logs", ns=ns, config=config, plugin_dir=plugin_dir, env=env)
    return NodeDaemon(node, daemon)


# --- the scenario the dashboards are checked against ---------------------------------


@dataclass
class FleetScenario:
    """Two nodes scraped by one Prometheus, after a short incident-like history.

    node-a: /dev/kvm present, registered with the kubelet, containers admitted (Allocate
    and GetPreferredAllocation), one Allocate refused, one kubelet restart, then /dev/kvm
    removed (its units turn unhealthy). node-b: /dev/kvm present but no kubelet (never
    registered), a config reload rejected.
    """

    prometheus: Prometheus
    nodes: dict[str, NodeDaemon]
    driver_kind: str
    started: float
    trace_ids: Callable[[], set[str]]


@contextlib.contextmanager
def fleet_scenario(workdir: Path, rule_files: Sequence[Path] = (ALERTS_FILE,)) -> Iterator[FleetScenario]:
    with contextlib.ExitStack() as stack:
        otlp = stack.enter_context(OtlpReceiver())
        tracing = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        driver = kubelet_driver(workdir / "kubelet")
        stack.callback(driver.close)
        node_a = node_daemon(
            workdir, "node-a", ns=driver.ns, plugin_dir=driver.plugin_dir, config=PREFERRED_CONFIG, env=tracing
        )
        node_b = node_daemon(workdir, "node-b", config=KVM_CONFIG, env=tracing)
        nodes = {n.node: n for n in (node_a, node_b)}
        for n in nodes.values():
            stack.callback(n.daemon.close)
            n.daemon.start()
        started = time.time()
        prom = stack.enter_context(
            Prometheus(PrometheusConfig(targets=[n.target for n in nodes.values()], rule_files=rule_files))
        )
        try:
            prom.wait_for_targets_up()
            driver.start()
            node_a.wait_ready()
            prom.wait_for('ate_devplugin_registered{node="node-a"} == 1')
            # A few containers admitted, one bogus request, then a kubelet restart and more.
            for i in range(3):
                driver.admit(f"pod-{i}")
            with contextlib.suppress(grpc.RpcError):
                DevicePluginClient(node_a.socket()).allocate(["kvm-999999"])
            driver.restart()
            node_a.wait_ready()
            for i in range(3, 6):
                driver.admit(f"pod-{i}")
            write_atomically(node_b.config_file, "resources: []\n")
            prom.wait_for('ate_devplugin_kubelet_restarts_total{node="node-a"} >= 1')
            prom.wait_for('ate_devplugin_allocate_requests_total{node="node-a", code="OK"} >= 6')
            prom.wait_for('ate_devplugin_allocate_requests_total{node="node-a", code="INVALID_ARGUMENT"} >= 1')
            prom.wait_for('ate_devplugin_config_reloads_total{node="node-b", result="failure"} >= 1')
            remove_device_node(node_a.device_root, "kvm")
            prom.wait_for('ate_devplugin_device_health_changes_total{node="node-a", health="unhealthy"} >= 1')
            prom.wait_for('ate_devplugin_devices{node="node-a", health="unhealthy"} > 0')
        except BaseException:
            for n in nodes.values():
                print(f"----- daemon {n.node} -----\n{n.log_tail()}")
            print(f"----- kubelet ({driver.kind}) -----\n{driver.log_tail()}")
            print(f"----- prometheus -----\n{prom.log_tail()}")
            raise
        yield FleetScenario(
            prometheus=prom,
            nodes=nodes,
            driver_kind=driver.kind,
            started=started,
            trace_ids=lambda: {span.trace_id for span in otlp.spans},
        )


# --- the scenario the alert rules are checked against ---------------------------------


@dataclass
class RulesScenario:
    """One daemon with /dev/kvm but no kubelet, after one refused Allocate and one rejected
    config reload; its Prometheus loads the alert rules and evaluates them every second."""

    prometheus: Prometheus
    node: NodeDaemon


@contextlib.contextmanager
def rules_scenario(
    workdir: Path,
    rule_files: Sequence[Path] = (ALERTS_FILE,),
    job: str = DEFAULT_JOB,
    env: Mapping[str, str] | None = None,
) -> Iterator[RulesScenario]:
    """``job``: the job label the scrape gives, as a release's jobLabel would (nameOverride);
    ``env``: the daemon's settings (e.g. its KVM probe)."""
    node = node_daemon(workdir, "node-a", config=KVM_CONFIG, env=env)
    with contextlib.ExitStack() as stack:
        stack.callback(node.daemon.close)
        node.daemon.start()
        config = PrometheusConfig(targets=[node.target], rule_files=rule_files, job=job)
        prom = stack.enter_context(Prometheus(config))
        try:
            prom.wait_for_targets_up()
            # The daemon serves its socket before any kubelet exists; a bogus request is refused.
            with contextlib.suppress(grpc.RpcError):
                DevicePluginClient(node.socket()).allocate(["kvm-999999"])
            write_atomically(node.config_file, "resources: []\n")
            prom.wait_for('ate_devplugin_allocate_requests_total{code="INVALID_ARGUMENT"} >= 1')
            prom.wait_for('ate_devplugin_config_reloads_total{result="failure"} >= 1')
        except BaseException:
            print(f"----- daemon -----\n{node.log_tail()}\n----- prometheus -----\n{prom.log_tail()}")
            raise
        yield RulesScenario(prom, node)
