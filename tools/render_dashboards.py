"""Renders the Perses dashboards in headless Chromium, against a real Prometheus.

The page is tools/render-dashboards/page.jsx (the upstream Perses panels, bundled by
esbuild from the npm packages pinned in its package-lock.json); this module builds it when
it is out of date, serves it and the dashboard files on loopback, and drives Debian's
``chromium`` over the DevTools protocol on a pipe: open the dashboard for a time range and
variables, wait until the page says every query settled, take a PNG of the whole
dashboard and return what each query gave.

    python -m tools.render_dashboards          # as root: the docs/ PNGs (make dashboards-png)

The docs run drives the scenario of tests/harness/incident.py: two nodes under the
kubelet's real device manager, healthy, then one node's /dev/kvm gone.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import http.server
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAGE_SOURCE = REPO / "tools" / "render-dashboards"
BUNDLE_DIR = REPO / "build" / "render-dashboards"
PERSES_DASHBOARDS = REPO / "dashboards" / "perses"
DOCS = REPO / "docs"
CHROMIUM = "chromium"
INSTALL = "apt-get install -y --no-install-recommends chromium fonts-dejavu-core; tools/setup.sh test (npm ci)"
WIDTH = 1600
# Tall enough that every open row is in the viewport: Perses only queries visible panels.
LOAD_HEIGHT = 6000
INDEX_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>ate-devplugin dashboards</title>
<link rel="stylesheet" href="/page.css"></head>
<body><div id="root"></div><script src="/page.js"></script></body></html>
"""


class RenderError(RuntimeError):
    """The page did not load, did not settle in time, or Chromium failed."""


@dataclass(frozen=True)
class QueryResult:
    query: str  # the PromQL as written in the dashboard, variables not filled
    status: str  # react-query's: success, error, loading
    error: str | None
    series: int
    values: int  # finite points over all series
    last: list[float]  # the last finite value of each series (NaN: none)


@dataclass(frozen=True)
class Rendered:
    png: Path
    queries: list[QueryResult]
    panel_errors: dict[str, str]  # panel title -> the error it shows
    console_errors: list[str]


def missing() -> str | None:
    """Why rendering cannot run here, or None."""
    if shutil.which(CHROMIUM) is None:
        return f"{CHROMIUM} not found"
    if shutil.which("npm") is None:
        return "npm not found"
    if not (PAGE_SOURCE / "node_modules" / ".bin" / "esbuild").exists():
        return f"{PAGE_SOURCE / 'node_modules'} missing: run npm ci there"
    return None


def build_page() -> Path:
    """The bundle (page.js, page.css, fonts), rebuilt when a source is newer."""
    bundle = BUNDLE_DIR / "page.js"
    sources = [PAGE_SOURCE / "page.jsx", PAGE_SOURCE / "package-lock.json"]
    if not bundle.exists() or bundle.stat().st_mtime < max(s.stat().st_mtime for s in sources):
        BUNDLE_DIR.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["npm", "run", "--silent", "build", "--", f"--outdir={BUNDLE_DIR}"],
            cwd=PAGE_SOURCE, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RenderError(f"esbuild failed:\n{out.stdout}{out.stderr}")
    (BUNDLE_DIR / "index.html").write_text(INDEX_HTML)
    return BUNDLE_DIR


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The bundle at /, the Perses dashboards at /dashboards/."""

    def translate_path(self, path: str) -> str:
        name = urllib.parse.urlsplit(path).path
        if name.startswith("/dashboards/"):
            return str(PERSES_DASHBOARDS / Path(name).name)
        if name in ("/", "/index.html"):
            return str(BUNDLE_DIR / "index.html")
        return super().translate_path(path)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


class _Cdp:
    """The DevTools protocol over Chromium's --remote-debugging-pipe (fds 3 and 4): JSON
    messages ended by NUL, commands answered by id, events kept for the caller."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = os.fdopen(from_browser, "rb", buffering=0)
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RenderError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def _receive(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RenderError(f"{method}: no answer from chromium")
            chunk = self._in.read(1 << 16)
            if not chunk:
                raise RenderError(f"{method}: chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        reply: dict[str, Any] = json.loads(message)
        return reply

    def close(self) -> None:
        self._out.close()
        self._in.close()


class Renderer:
    """One page server and one Chromium for any number of renders; a context manager."""

    def __init__(self, prometheus_url: str) -> None:
        self.prometheus_url = prometheus_url
        self._stack = contextlib.ExitStack()
        self._cdp: _Cdp | None = None
        self._base = ""

    def __enter__(self) -> Renderer:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        root = build_page()
        handler = functools.partial(_Handler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._stack.callback(server.server_close)
        self._stack.callback(server.shutdown)
        self._base = f"http://127.0.0.1:{server.server_address[1]}"
        profile = Path(tempfile.mkdtemp(prefix="ate-chromium-"))
        self._stack.callback(shutil.rmtree, profile, ignore_errors=True)
        # Chromium reads commands from its fd 3 and writes answers to its fd 4; bash moves
        # the pipes there (preexec_fn is not safe in a process with threads), from fds of 10
        # and up so that the moves cannot overwrite each other.
        cmd_read, cmd_write = os.pipe()
        ans_read, ans_write = os.pipe()
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_read, ans_write))
        os.close(cmd_read)
        os.close(ans_write)
        redirect = f'exec "$0" "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-'
        argv = [
            "/bin/bash", "-c", redirect,
            CHROMIUM, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
            "--disable-background-networking", "--disable-extensions", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", f"--window-size={WIDTH},{LOAD_HEIGHT}", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=(profile / "stderr").open("wb"),
            pass_fds=(child_in, child_out),
        )  # fmt: skip
        os.close(child_in)
        os.close(child_out)
        self._stack.callback(_stop, proc)
        self._cdp = _Cdp(cmd_write, ans_read)
        self._stack.callback(self._cdp.close)

    def render(
        self, dashboard: str, out: Path, *, start: float, end: float, variables: Mapping[str, str] = {}
    ) -> Rendered:
        """``dashboard``: a file name in dashboards/perses; ``start``/``end``: Unix seconds."""
        cdp = self._cdp
        assert cdp is not None, "use Renderer as a context manager"
        query = {
            "dashboard": f"/dashboards/{dashboard}",
            "prometheus": self.prometheus_url,
            "start": str(int(start * 1000)),
            "end": str(int(end * 1000)),
            # A fixed window: no auto-refresh (each would start every query again, and on a
            # loaded machine the page might never settle).
            "refresh": "0s",
            **{f"var-{k}": v for k, v in variables.items()},
        }
        target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
        session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        try:
            cdp.call("Runtime.enable", session)
            cdp.call("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=LOAD_HEIGHT,
                     deviceScaleFactor=1, mobile=False)  # fmt: skip
            cdp.call("Page.navigate", session, url=f"{self._base}/index.html?{urllib.parse.urlencode(query)}")
            report = self._wait_ready(cdp, session, dashboard)
            height = self._evaluate(cdp, session, _CONTENT_HEIGHT)
            shot = cdp.call(
                "Page.captureScreenshot", session, format="png", captureBeyondViewport=False,
                clip={"x": 0, "y": 0, "width": WIDTH, "height": min(int(height), LOAD_HEIGHT), "scale": 1},
            )  # fmt: skip
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
            console = [_console_text(e) for e in cdp.events if _is_console_error(e, session)]
        finally:
            cdp.call("Target.closeTarget", targetId=target)
            cdp.events.clear()
        return Rendered(
            png=out,
            queries=[
                QueryResult(
                    q["query"],
                    q["status"],
                    q["error"],
                    q["series"],
                    q["values"],
                    [math.nan if v is None else float(v) for v in q["last"]],
                )
                for q in report["queries"]
            ],
            panel_errors={p["title"]: p["error"] for p in report["panels"] if p["error"]},
            console_errors=console,
        )

    @staticmethod
    def _evaluate(cdp: _Cdp, session: str, expression: str) -> Any:
        answer = cdp.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        return answer["result"].get("value")

    def _wait_ready(self, cdp: _Cdp, session: str, dashboard: str, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self._evaluate(cdp, session, "window.renderState")
            if state == "ready":
                report: dict[str, Any] = self._evaluate(cdp, session, "window.renderReport")
                return report
            if isinstance(state, str) and state.startswith("failed"):
                raise RenderError(f"{dashboard}: {state}")
            time.sleep(0.25)
        last = self._evaluate(cdp, session, "JSON.stringify(window.renderReport)")
        raise RenderError(f"{dashboard}: not settled within {timeout:.0f} s; last report: {last}")


# The bottom of the lowest panel or row header, plus a margin.
_CONTENT_HEIGHT = """
Math.ceil(Math.max(0, ...Array.from(document.querySelectorAll(
  '[data-testid="panel"], .react-grid-layout, header, h2, h3')).map(e => e.getBoundingClientRect().bottom)) + 16)
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _is_console_error(event: Mapping[str, Any], session: str) -> bool:
    if event.get("sessionId") != session:
        return False
    if event.get("method") == "Runtime.exceptionThrown":
        return True
    return event.get("method") == "Runtime.consoleAPICalled" and event["params"].get("type") == "error"


def _console_text(event: Mapping[str, Any]) -> str:
    params = event["params"]
    if "exceptionDetails" in params:
        details = params["exceptionDetails"]
        return str(details.get("exception", {}).get("description") or details.get("text"))
    return " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))


# --- the docs/ pictures -------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go (default: docs/)")
    parser.add_argument("--pace", type=float, default=10.0, help="seconds between the scenario's steps")
    args = parser.parse_args(argv)
    from tests.harness.incident import PICTURES, incident_scenario

    why = missing()
    if why:
        print(f"render-dashboards: {why}; {INSTALL}", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ate-render-"))
        scenario = stack.enter_context(incident_scenario(Path(tmp), args.pace))
        renderer = stack.enter_context(Renderer(scenario.prometheus.url))
        for picture in PICTURES:
            window = scenario.windows[picture.state]
            rendered = renderer.render(
                picture.dashboard, args.out / picture.png,
                start=window.start, end=window.end, variables=picture.variables,
            )  # fmt: skip
            print(f"{rendered.png}: {len(rendered.queries)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
