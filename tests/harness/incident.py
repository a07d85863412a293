"""The incident the dashboards are pictured in: two nodes, healthy, then one loses /dev/kvm,
then the other's plugin pod goes missing.

Each node is our daemon (as its own process, the CLI an operator runs) under its own
kubelet: the kubelet's real device manager (the Go bench) in a private mount namespace.
A real API server holds the chart's DaemonSet and its pods, which the real
kube-state-metrics reads (tests/harness/kube_state_metrics.py: the harness writes the
statuses the DaemonSet controller and the kubelets would). One real Prometheus scrapes the
daemons every second, with the chart's ServiceMonitor labels, and kube-state-metrics, and
evaluates the alert rules (AteDevpluginPodMissing's `for` cut to 5 s). The history, at
``pace`` seconds a step:

1. both daemons start on running kubelets and register; containers are admitted on both
   (Allocate, GetPreferredAllocation);
2. the kubelet on node-a restarts; the daemon registers again; more containers;
   end of the ``healthy`` window;
3. node-a's /dev/kvm disappears: its units turn unhealthy; end of the ``device-lost`` window;
4. the node comes back, the units are healthy again (``recovered``);
5. node-b's plugin pod is replaced by one that stays Pending (a host path the node lacks:
   no volume, no IP): its daemon stops and its scrape target goes, as service discovery
   drops it; the DaemonSet counts it unavailable; AteDevpluginPodMissing fires
   (``pod-missing``).

Prometheus keeps the whole history, so each picture is drawn afterwards for its window
(from the start to the window's end): what an on-call engineer would have seen then.
tools/render_dashboards.py draws docs/ from it, tests/dashboards/test_dashboards_rendered.py checks
the same pictures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.kube_state_metrics import PluginPods, cluster_state, scrape_config
from tests.harness.monitoring import (
    ALERTS_FILE,
    PREFERRED_CONFIG,
    BenchDriver,
    NodeDaemon,
    kubelet_driver,
    node_daemon,
)
from tests.harness.prometheus import Prometheus, PrometheusConfig
from tests.harness.wait import wait_until

NODES = ("node-a", "node-b")
LOST = "node-a"  # the node whose device goes
GONE = "node-b"  # the node whose plugin pod goes
PENDING_POD = "ate-devplugin-q8v4n"  # its replacement, which stays Pending
MISSING_ALERT = "AteDevpluginPodMissing"


@dataclass(frozen=True)
class Window:
    start: float
    end: float


@dataclass(frozen=True)
class Picture:
    """One PNG of docs/: a Perses dashboard (dashboards/perses/) at the end of a window."""

    dashboard: str
    state: str
    png: str
    variables: Mapping[str, str] = field(default_factory=dict)


PICTURES = (
    Picture("ate-devplugin-fleet.json", "healthy", "dashboard-fleet-healthy.png"),
    Picture("ate-devplugin-node.json", "healthy", "dashboard-node-healthy.png", {"node": LOST}),
    Picture("ate-devplugin-fleet.json", "device-lost", "dashboard-fleet-device-lost.png"),
    Picture("ate-devplugin-node.json", "device-lost", "dashboard-node-device-lost.png", {"node": LOST}),
    Picture("ate-devplugin-fleet.json", "pod-missing", "dashboard-fleet-pod-missing.png"),
)


@dataclass
class IncidentScenario:
    prometheus: Prometheus
    nodes: dict[str, NodeDaemon]
    windows: dict[str, Window]
    pods: PluginPods


def alert_rules(dest: Path, quick: str) -> Path:
    """The project's alert rules with ``quick``'s `for` cut to 5 s (as the chart's
    prometheusRule.alerts.<name>.for would), so that it fires within the scenario."""
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == quick:
                rule["for"] = "5s"
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


@contextlib.contextmanager
def incident_scenario(workdir: Path, pace: float = 3.0) -> Iterator[IncidentScenario]:
    with contextlib.ExitStack() as stack:
        pods, ksm = stack.enter_context(cluster_state(workdir / "cluster", NODES))
        drivers: dict[str, BenchDriver] = {}
        nodes: dict[str, NodeDaemon] = {}
        for name in NODES:
            # The kubelet first: the daemon registers as it starts, as on a running node.
            driver = drivers[name] = kubelet_driver(workdir / name / "kubelet")
            stack.callback(driver.close)
            driver.start()
            nodes[name] = node_daemon(
                workdir, name, ns=driver.ns, plugin_dir=driver.plugin_dir, config=PREFERRED_CONFIG
            )
            stack.callback(nodes[name].daemon.close)
            nodes[name].daemon.start()
        started = time.time()
        config = PrometheusConfig(
            targets=[n.target for n in nodes.values()],
            extra_scrape_configs=[scrape_config(ksm.address)],
            rule_files=[alert_rules(workdir / "alerts.yaml", MISSING_ALERT)],
        )
        prom = stack.enter_context(Prometheus(config))
        admitted = 0

        def admit_everywhere() -> None:
            nonlocal admitted
            for driver in drivers.values():
                driver.admit(f"pod-{admitted}")
                admitted += 1

        try:
            prom.wait_for_targets_up()
            for n in nodes.values():
                n.wait_ready()
            time.sleep(pace)
            for _ in range(3):
                admit_everywhere()
                time.sleep(pace)
            drivers[LOST].restart()
            nodes[LOST].wait_ready()
            time.sleep(pace)
            for _ in range(3):
                admit_everywhere()
                time.sleep(pace)
            prom.wait_for(f'ate_devplugin_kubelet_restarts_total{{node="{LOST}"}} >= 1')
            prom.wait_for(f'sum(ate_devplugin_allocate_requests_total{{code="OK"}}) >= {admitted}')
            prom.wait_for(f'kube_daemonset_status_number_ready{{daemonset="{pods.name}"}} == {len(NODES)}')
            healthy = time.time()

            remove_device_node(nodes[LOST].device_root, "kvm")
            prom.wait_for(f'ate_devplugin_devices{{node="{LOST}", health="unhealthy"}} > 0')
            time.sleep(2 * pace)
            lost = time.time()

            add_device_node(nodes[LOST].device_root, "kvm", "/dev/kvm")
            prom.wait_for(f'ate_devplugin_devices{{node="{LOST}", health="unhealthy"}} == 0')
            wait_until(nodes[LOST].daemon.ready, 60, f"{LOST}: ready again")
            time.sleep(pace)
            recovered = time.time()

            # A rollout to a host path node-b does not have: the old pod goes, the new one stays
            # Pending; with it the daemon and, as service discovery drops it, its target.
            assert nodes[GONE].daemon.stop() == 0
            prom.reload(dataclasses.replace(config, targets=[nodes[LOST].target]))
            pods.delete_pod(f"{pods.name}-{GONE}")
            pods.start_pod(PENDING_POD, GONE, running=False)
            pods.set_status(ready=len(NODES) - 1)
            prom.wait_for(f'kube_pod_status_phase{{pod="{PENDING_POD}", phase="Pending"}} == 1')
            prom.wait_for(f'ALERTS{{alertname="{MISSING_ALERT}", alertstate="firing", pod="{PENDING_POD}"}}')
            time.sleep(pace)
            missing = time.time()
        except BaseException:
            for n in nodes.values():
                print(f"----- daemon {n.node} -----\n{n.log_tail()}")
            for name, driver in drivers.items():
                print(f"----- kubelet {name} -----\n{driver.log_tail()}")
            print(f"----- kube-state-metrics -----\n{ksm.log_tail()}")
            print(f"----- prometheus -----\n{prom.log_tail()}")
            raise
        yield IncidentScenario(
            prometheus=prom,
            nodes=nodes,
            windows={
                "healthy": Window(started, healthy),
                "device-lost": Window(started, lost),
                "recovered": Window(started, recovered),
                "pod-missing": Window(started, missing),
            },
            pods=pods,
        )
