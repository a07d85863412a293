"""Our daemon as a child process, inside a kubelet bench namespace or on the host.

It runs the installed package exactly as the DaemonSet does (``python -m ate_devplugin
run``), with its own device root, config and metrics port, and reads back what an
operator would: the sockets, /metrics, /readyz and the JSON log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from tests.harness.kubelet import PLUGIN_DIR, Namespace
from tests.harness.net import free_port, http_get
from tests.harness.process import stop_process
from tests.harness.wait import wait_until


class DevicePluginDaemon:
    """``ate-devplugin run`` with the given device root and config.

    In ``ns`` it uses the namespace's kubelet directory; without, ``plugin_dir``.
    """

    def __init__(
        self,
        device_root: Path,
        log_dir: Path,
        *,
        ns: Namespace | None = None,
        config: str | None = None,
        plugin_dir: str = PLUGIN_DIR,
        env: Mapping[str, str | None] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.ns = ns
        self.device_root = device_root
        self.plugin_dir = plugin_dir
        self.port = free_port()
        # CDI specs go to the test's own directory, never the host's /var/run/cdi.
        self.cdi_dir = log_dir / "cdi"
        merged = {**os.environ, "ATE_DEVPLUGIN_CDI_DIR": str(self.cdi_dir), **(env or {})}
        self.env = {k: v for k, v in merged.items() if v is not None}  # None: left unset
        self.args = list(args)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = log_dir / "config.yaml"
            self.config_path.write_text(config)
        self.log_path = log_dir / "ate-devplugin.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "ate_devplugin",
            "run",
            "--device-root",
            str(self.device_root),
            "--plugin-dir",
            self.plugin_dir,
            "--metrics-address",
            f"127.0.0.1:{self.port}",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            *self.args,
        ]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        return argv

    def spawn(self) -> None:
        """Starts the process and returns at once (see :meth:`wait_healthy`)."""
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f'{{"msg": "=== test harness: start #{self.starts} ==="}}\n'.encode())
            log.flush()
            kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": log, "env": self.env}
            self.proc = self.ns.spawn(self.argv, **kwargs) if self.ns else subprocess.Popen(self.argv, **kwargs)

    def wait_healthy(self, timeout: float = 30) -> None:
        wait_until(self._answers, timeout, "daemon /healthz")

    def start(self) -> Self:
        self.spawn()
        self.wait_healthy()
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Sends ``sig`` and returns the exit code (SIGKILL after ``timeout``: then -9)."""
        assert self.proc is not None
        return stop_process(self.proc, sig, timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- what an operator reads -------------------------------------------------

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        return http_get(f"http://127.0.0.1:{self.port}{path}", headers)

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample, keyed by (name, sorted labels)."""
        text = self.get("/metrics")[1].decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), float("nan"))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(raw))
        return lines

    def socket_path(self, name: str) -> Path:
        """Host-visible path of one of our sockets."""
        path = f"{self.plugin_dir}/{name}"
        return self.ns.path(path) if self.ns else Path(path)


MakeDaemon = Callable[..., DevicePluginDaemon]
