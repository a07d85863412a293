"""/healthz and /readyz as the kubelet's probes see them."""

from __future__ import annotations

import asyncio
import threading
import time

from prometheus_client import CollectorRegistry

from ate_devplugin.observability.http import LOOP_DEADLINE_S, HttpServer
from tests.harness.daemon import MakeDaemon
from tests.harness.kubelet import KubeletBench
from tests.harness.net import http_get
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"


def test_readyz_follows_registration_and_the_kubelet(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    kubelet.stop()  # no kubelet yet
    d = daemon()
    status, body = d.get("/readyz")
    assert status == 503
    assert b"ate.dev/kvm" in body
    kubelet.start()
    wait_until(d.ready, 30, "ready after registration")
    kubelet.stop()
    wait_until(lambda: not d.ready(), 30, "unready after the kubelet stopped")
    assert d.metric("ate_devplugin_registered", resource_name=KVM) == 0
    kubelet.start()
    wait_until(d.ready, 30, "ready again")
    assert d.get("/healthz")[0] == 200
    assert d.get("/nope")[0] == 404


def get(port: int, path: str) -> int:
    return http_get(f"http://127.0.0.1:{port}{path}")[0]


def test_healthz_fails_while_the_event_loop_is_wedged() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = HttpServer("127.0.0.1", 0, CollectorRegistry(), loop, lambda: (True, "ok"))
    server.start()
    try:
        assert get(server.port, "/healthz") == 200
        wedged = threading.Event()

        def wedge() -> None:
            wedged.set()
            time.sleep(LOOP_DEADLINE_S + 2)

        loop.call_soon_threadsafe(wedge)
        assert wedged.wait(30), "the loop never ran the wedge"
        assert get(server.port, "/healthz") == 503
        assert get(server.port, "/metrics") == 200  # metrics do not need the loop
        wait_until(lambda: get(server.port, "/healthz") == 200, 30, "healthz after the loop recovered")
    finally:
        server.close()
        loop.call_soon_threadsafe(loop.stop)
