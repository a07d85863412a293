"""A real Prometheus server (Debian's ``prometheus`` binary) for tests.

The harness writes its own config into a temporary directory, starts the binary on a free
loopback port with a throw-away TSDB, and talks to it only through the HTTP API, as
Grafana and an operator would. Scrape targets get the labels the chart's ServiceMonitor
gives them in a cluster: ``job`` from the jobLabel, and ``node``, ``namespace`` and
``pod`` relabelled from Kubernetes service-discovery labels (here set statically), so
that dashboard queries and alert rules see the same label sets as in production.

Install: ``apt-get install -y --no-install-recommends prometheus`` (server and promtool).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness.net import LOOPBACK, free_port, http_get
from tests.harness.process import stop_process
from tests.harness.wait import wait_until

DEFAULT_JOB = "ate-devplugin"
_PR_SET_PDEATHSIG = 1
INSTALL = "apt-get install -y --no-install-recommends prometheus"


class PrometheusError(Exception):
    """Prometheus did not start, or its API answered with an error."""


@dataclass(frozen=True)
class ScrapeTarget:
    """One daemon to scrape, as the ServiceMonitor would see its pod."""

    address: str  # host:port of /metrics
    node: str
    namespace: str = "ate-system"
    pod: str = ""

    def static_labels(self) -> dict[str, str]:
        # Kubernetes service-discovery labels; the relabelling below turns them into
        # target labels exactly as the chart's ServiceMonitor does.
        return {
            "__meta_kubernetes_pod_node_name": self.node,
            "__meta_kubernetes_namespace": self.namespace,
            "__meta_kubernetes_pod_name": self.pod or f"ate-devplugin-{self.node}",
        }


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    values: list[tuple[float, float]]


@dataclass(frozen=True)
class Exemplar:
    series: dict[str, str]
    labels: dict[str, str]
    value: float
    timestamp: float


@dataclass
class PrometheusConfig:
    targets: Sequence[ScrapeTarget] = ()
    rule_files: Sequence[Path] = ()
    job: str = DEFAULT_JOB
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    exemplars: bool = True
    extra_flags: Sequence[str] = field(default_factory=tuple)
    # Other jobs, as Prometheus' scrape_configs take them (kube-state-metrics).
    extra_scrape_configs: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    def render(self) -> dict[str, Any]:
        relabel = [
            {"source_labels": [f"__meta_kubernetes_{src}"], "target_label": dst}
            for src, dst in (("pod_node_name", "node"), ("namespace", "namespace"), ("pod_name", "pod"))
        ]
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "static_configs": [{"targets": [t.address], "labels": t.static_labels()} for t in self.targets],
                    "relabel_configs": relabel,
                },
                *self.extra_scrape_configs,
            ],
        }


def die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the test process dies without cleaning up.

    The signal follows the thread that started the child: start servers from the main
    thread (pytest fixtures do), not from a short-lived worker thread.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _number(text: str) -> float:
    # Prometheus renders NaN and infinities as strings; float() reads all of them.
    return float(text)


class Prometheus:
    """A running Prometheus server; use as a context manager, or call start() and stop()."""

    START_TIMEOUT_S = 60.0

    def __init__(self, config: PrometheusConfig, binary: str = "prometheus") -> None:
        self.config = config
        self.binary = binary
        self.workdir = Path(tempfile.mkdtemp(prefix="ate-prometheus-"))
        self.config_file = self.workdir / "prometheus.yml"
        self.log_file = self.workdir / "prometheus.log"
        self.port = 0
        self.url = ""
        self.started_at = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    # --- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        exe = shutil.which(self.binary)
        if exe is None:
            raise PrometheusError(f"{self.binary} not found on PATH; {INSTALL}")
        # YAML is a superset of JSON, so the rendered dict is written as JSON.
        self.config_file.write_text(json.dumps(self.config.render(), indent=2))
        last = ""
        for _ in range(3):  # another process may take the free port between probe and bind
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            if self._launch(exe):
                self.started_at = time.time()
                return
            last = self.log_tail()
        self.stop()
        raise PrometheusError(f"prometheus did not become ready; log tail:\n{last}")

    def _launch(self, exe: str) -> bool:
        storage = self.workdir / "data"
        shutil.rmtree(storage, ignore_errors=True)
        args = [
            exe,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
            *(["--enable-feature=exemplar-storage"] if self.config.exemplars else []),
            *self.config.extra_flags,
        ]
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=die_with_parent,  # only prctl, no locks taken
            )

        def ready() -> bool:
            if self._process is None or self._process.poll() is not None:
                raise PrometheusError("exited")
            with contextlib.suppress(OSError):
                return http_get(f"{self.url}/-/ready", timeout=5)[0] == 200
            return False

        try:
            wait_until(ready, self.START_TIMEOUT_S, "prometheus /-/ready", interval=0.2)
        except (PrometheusError, TimeoutError):
            self._terminate()
            return False
        return True

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _terminate(self) -> None:
        proc, self._process = self._process, None
        if proc is not None:
            stop_process(proc, timeout=30)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def reload(self, config: PrometheusConfig | None = None) -> None:
        """Write a new config (or the same one) and ask the server to load it."""
        if config is not None:
            self.config = config
        self.config_file.write_text(json.dumps(self.config.render(), indent=2))
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with LOOPBACK.open(req, timeout=30) as resp:
            if resp.status != 200:
                raise PrometheusError(f"reload answered {resp.status}")

    # --- HTTP API ----------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET /api/v1/<path>; returns the ``data`` member or raises PrometheusError."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with LOOPBACK.open(url, timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"GET {path}: HTTP {exc.code}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"GET {path} {dict(params or {})}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant query; a scalar or string result comes back as one unlabelled sample."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params)
        kind, result = data["resultType"], data["result"]
        if kind in ("scalar", "string"):
            return [Sample({}, _number(result[1]), float(result[0]))]
        if kind != "vector":
            raise PrometheusError(f"instant query {promql!r} gave a {kind}")
        return [Sample(r["metric"], _number(r["value"][1]), float(r["value"][0])) for r in result]

    def query_range(self, promql: str, start: float, end: float, step: float = 1.0) -> list[Series]:
        data = self.api(
            "query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)}
        )
        return [Series(r["metric"], [(float(t), _number(v)) for t, v in r["values"]]) for r in data["result"]]

    def value(self, promql: str) -> float | None:
        """The value of a query that yields at most one sample; None when it yields none."""
        samples = self.query(promql)
        if len(samples) > 1:
            raise PrometheusError(f"{promql!r} gave {len(samples)} samples, expected at most one")
        return samples[0].value if samples else None

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Sample]], bool] = bool,
        timeout: float = 120.0,
        interval: float = 0.5,
    ) -> list[Sample]:
        """Polls an instant query until ``predicate(samples)`` holds; returns those samples.

        The default predicate waits for a non-empty result. Raises TimeoutError with the
        last result when the timeout passes.
        """

        def holds() -> tuple[list[Sample]] | None:  # a tuple: true even when the samples are []
            if not self.running:
                raise PrometheusError(f"prometheus exited; log tail:\n{self.log_tail()}")
            samples = self.query(promql)
            return (samples,) if predicate(samples) else None

        found = wait_until(holds, timeout, lambda: f"{promql!r} still gives {self.query(promql)}", interval)
        assert found is not None
        return found[0]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", {"state": "active"})["activeTargets"]
        return active

    def targets_up(self) -> bool:
        """True when there is at least one target and every target's last scrape succeeded."""
        targets = self.targets()
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def wait_for_targets_up(self, timeout: float = 120.0) -> None:
        def states() -> str:
            return f"targets {[(t['scrapeUrl'], t['health'], t.get('lastError')) for t in self.targets()]}"

        wait_until(self.targets_up, timeout, states, interval=0.5)

    def query_exemplars(self, promql: str, start: float | None = None, end: float | None = None) -> list[Exemplar]:
        now = time.time()
        data = self.api(
            "query_exemplars",
            {
                "query": promql,
                "start": f"{start if start is not None else self.started_at - 60:.3f}",
                "end": f"{end if end is not None else now + 60:.3f}",
            },
        )
        return [
            Exemplar(group["seriesLabels"], e["labels"], _number(e["value"]), float(e["timestamp"]))
            for group in data
            for e in group["exemplars"]
        ]

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.rule_groups() for rule in group["rules"]]

    def wait_for_rules_evaluated(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Waits until every loaded rule was evaluated at least once; returns the rules."""

        def evaluated() -> list[dict[str, Any]]:
            rules = self.rules()
            # A rule never evaluated reports Go's zero time, 0001-01-01T00:00:00Z.
            done = rules and not any(r.get("lastEvaluation", "0001").startswith("0001") for r in rules)
            return rules if done else []

        return wait_until(evaluated, timeout, lambda: f"rules {[r['name'] for r in self.rules()]} evaluated", 0.5)

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts
