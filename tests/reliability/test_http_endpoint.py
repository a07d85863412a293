"""The HTTP endpoint (/metrics, /healthz, /readyz) under a scrape burst, a slow-client flood
and clients that reset their connection (issue 10).

Our daemon runs on the host with a plugin directory of its own and no kubelet: /readyz then
answers 503 ("not registered"), which is an answer. What the kubelet needs is that every
probe answers within the chart's probe timeout, whatever other clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ate_devplugin.observability.http import REQUEST_DEADLINE_S, WORKERS
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import make_device_root
from tests.harness.faults import Footprint, SpawnDaemon
from tests.harness.wait import wait_until

CHART_VALUES = Path(__file__).resolve().parents[2] / "chart" / "values.yaml"
SCRAPE_HEADERS = {"Accept-Encoding": "gzip", "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}


def probe_timeout_s() -> float:
    """The shorter of the chart's liveness and readiness probe timeouts."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    return float(min(values["livenessProbe"]["timeoutSeconds"], values["readinessProbe"]["timeoutSeconds"]))


@dataclass(frozen=True)
class Answer:
    path: str
    status: int | None  # None: no answer (the error is in ``error``)
    seconds: float
    error: str = ""


def timed_get(port: int, path: str, timeout: float, headers: dict[str, str] | None = None) -> Answer:
    """One GET on a fresh connection, as the kubelet's probe and Prometheus make it."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return Answer(path, response.status, time.monotonic() - start)
    except OSError as exc:
        return Answer(path, None, time.monotonic() - start, repr(exc))
    finally:
        conn.close()


def late_or_failed(answers: list[Answer], timeout: float) -> list[Answer]:
    """Probe answers the kubelet would count as failures: none, too late, or /healthz not 200."""
    return [a for a in answers if a.status is None or a.seconds > timeout or (a.path == "/healthz" and a.status != 200)]


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


class Prober:
    """Asks /healthz and /readyz, alternately and back to back, until stopped."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port, self.timeout = port, timeout
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in ("/healthz", "/readyz"):
                # The client gives up a little after the probe's timeout, so lateness is measured.
                self.answers.append(timed_get(self.port, path, self.timeout + 2))
            self._stop.wait(0.05)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def http_daemon(tmp_path: Path, spawn_daemon: SpawnDaemon) -> DevicePluginDaemon:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    return spawn_daemon(make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"}), plugin_dir=str(plugins))


def test_probes_answer_in_time_during_scrape_bursts(http_daemon: DevicePluginDaemon) -> None:
    """Ten bursts of 50 concurrent scrapes, each with 50 probes sent at the same moment (each
    one standing for a kubelet probe that lands somewhere in the burst): every scrape gets its
    metrics, every probe answers within the chart's probe timeout."""
    timeout = probe_timeout_s()
    port = http_daemon.port

    def ask(path: str) -> Answer:
        if path == "/metrics":
            return timed_get(port, path, 30, SCRAPE_HEADERS)
        return timed_get(port, path, timeout + 2)  # gives up a little after the probe would

    burst = ["/metrics", "/healthz", "/metrics", "/readyz"] * 25
    answers: list[Answer] = []
    with ThreadPoolExecutor(len(burst)) as pool:
        for _ in range(10):
            answers += pool.map(ask, burst)
    scrapes = [a for a in answers if a.path == "/metrics"]
    seconds = [a.seconds for a in scrapes]
    p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
    print(f"\n{len(scrapes)} scrapes in bursts of 50: p50 {p50:.3f}s p99 {p99:.3f}s")
    assert [a for a in scrapes if a.status != 200] == []
    assert late_or_failed([a for a in answers if a.path != "/metrics"], timeout) == []


async def _slow_client(port: int, dropped: list[float], stop: asyncio.Event) -> None:
    """Connects, then sends a request head one byte every half second, never finishing it;
    records when the server closes the connection."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    start = time.monotonic()
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
    try:
        for byte in head:
            writer.write(bytes([byte]))
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.5) == b"":
                    break  # closed by the server
            if stop.is_set():
                return
        dropped.append(time.monotonic() - start)
    except ConnectionError:
        dropped.append(time.monotonic() - start)
    finally:
        writer.transport.abort()


async def _slow_flood(port: int, clients: int, hold_s: float) -> tuple[list[float], int]:
    dropped: list[float] = []
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_slow_client(port, dropped, stop)) for _ in range(clients)]
    await asyncio.wait(tasks, timeout=hold_s)
    stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return dropped, sum(isinstance(r, BaseException) for r in results)


def sample_threads(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], Footprint.of(pid).threads)
        stop.wait(0.05)


def test_slow_clients_are_dropped_without_threads_and_probes_still_answer(http_daemon: DevicePluginDaemon) -> None:
    """1,000 clients that trickle a request head and never finish it: each is dropped at the
    request deadline, the daemon's thread count stays within the endpoint's worker bound, and
    every probe answers in time meanwhile."""
    timeout = probe_timeout_s()
    assert http_daemon.proc is not None
    pid = http_daemon.proc.pid
    assert timed_get(http_daemon.port, "/metrics", 10).status == 200
    idle = Footprint.of(pid).threads
    peak = [idle]
    stop = threading.Event()
    sampler = threading.Thread(target=sample_threads, args=(pid, stop, peak), daemon=True)
    sampler.start()
    hold_s = REQUEST_DEADLINE_S + 20  # generous: every client must be dropped well before this
    try:
        with Prober(http_daemon.port, timeout) as prober:
            dropped, failed = asyncio.run(_slow_flood(http_daemon.port, 1000, hold_s))
    finally:
        stop.set()
        sampler.join(10)
    print(f"\nthreads: {idle} idle, {peak[0]} at most with 1000 slow clients; {len(dropped)} dropped")
    assert failed == 0, f"{failed} slow clients could not even connect"
    assert len(dropped) == 1000, f"only {len(dropped)} of 1000 slow clients dropped within {hold_s}s"
    # Besides the endpoint's workers, allow a few threads the daemon may start meanwhile
    # on its own (the asyncio default executor); a thread per client would be ~1000.
    assert peak[0] - idle <= WORKERS + 4, f"threads grew from {idle} to {peak[0]}"
    assert prober.answers, "no probe was made"
    assert late_or_failed(prober.answers, timeout) == []


def _reset_after(port: int, data: bytes) -> int:
    """Connects, sends ``data``, then resets the connection (RST, not FIN); returns the
    client's local port, which names it in the daemon's log."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    local_port: int = sock.getsockname()[1]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if data:
        sock.sendall(data)
    sock.close()
    return local_port


def _client_lines(d: DevicePluginDaemon, port: int) -> Callable[[], list[dict[str, object]]]:
    return lambda: [line for line in d.log_lines() if str(line.get("client", "")).endswith(f":{port}")]


@pytest.mark.parametrize("sent", [b"GET /metrics HTTP/1.1\r\nHost: x\r\n", b""], ids=["mid-request", "at-once"])
def test_a_client_reset_gives_one_log_line(http_daemon: DevicePluginDaemon, sent: bytes) -> None:
    reset = _client_lines(http_daemon, _reset_after(http_daemon.port, sent))
    wait_until(lambda: bool(reset()), 30, "the reset client's log line")
    # A second client's line, logged after the first one's: everything the first one caused is in.
    marker = _client_lines(http_daemon, _reset_after(http_daemon.port, b"GET /healthz HTTP/1.1\r\n"))
    wait_until(lambda: bool(marker()), 30, "the second client's log line")
    (line,) = reset()
    assert line["level"] in ("info", "warning")
    assert line["msg"] == "http client dropped"
    assert "reset" in str(line["reason"])
    assert "exc" not in line
    text = http_daemon.log_text()
    assert "Traceback" not in text, text[-3000:]
    assert timed_get(http_daemon.port, "/healthz", 10).status == 200


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"POST /healthz HTTP/1.1\r\n\r\n", 405),
    ],
    ids=["request-line", "header-line", "head-too-large", "not-get"],
)
def test_a_bad_request_is_answered_and_the_endpoint_keeps_serving(
    http_daemon: DevicePluginDaemon, sent: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", http_daemon.port), timeout=10) as sock:
        sock.sendall(sent)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] == str(status).encode(), answer[:200]
    assert timed_get(http_daemon.port, "/healthz", 10).status == 200
    assert "Traceback" not in http_daemon.log_text()
