"""kube.py through lightkube against an in-memory HTTP API server (httpx's mock transport)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest
from lightkube.config.client_adapter import AsyncClient, ConnectionParams
from lightkube.config.kubeconfig import KubeConfig

from ate_devplugin.config import ConfigError
from ate_devplugin.dra.kube import IN_FLIGHT, LIST_PAGE, ApiError, KubeApi, connect
from ate_devplugin.dra.names import InvalidNameError
from ate_devplugin.dra.service import ClaimNotFoundError
from tests.unit.fakes import until

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body: Any = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, dict(request.url.params), body))
        path, method = request.url.path, request.method
        if path == "/api/v1/nodes/n1":
            return httpx2.Response(
                200, json={"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1", "uid": "u-n1"}}
            )
        if path == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1":
            claim = {"kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1",
                     "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"}, "spec": {"devices": {}}}  # fmt: skip
            return httpx2.Response(200, json=claim)
        if path == SLICES and method == "GET" and request.url.params.get("watch"):
            event = {"type": "DELETED", "object": _slice("s1", "7")}
            return httpx2.Response(200, content=json.dumps(event).encode() + b"\n")
        if path == SLICES and method == "GET":
            listing = {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                       "metadata": {"resourceVersion": "42"}, "items": [_slice("s1", "5")]}  # fmt: skip
            return httpx2.Response(200, json=listing)
        if path == SLICES and method == "POST":
            return httpx2.Response(201, json={**body, "metadata": {**body["metadata"], "name": "s2"}})
        if path == f"{SLICES}/s1" and method == "PUT":
            return httpx2.Response(200, json=body)
        if path == f"{SLICES}/s1" and method == "DELETE":
            return httpx2.Response(200, json={"kind": "Status", "apiVersion": "v1", "status": "Success"})
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound",
                  "message": f"{path} not found"}  # fmt: skip
        return httpx2.Response(404, json=status)


def _slice(name: str, version: str) -> dict[str, Any]:
    return {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1",
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"driver": "ate.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": 1,
                                                                      "resourceSliceCount": 1}}}  # fmt: skip


def _client(handler: Any) -> httpx2.AsyncClient:
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://api.test"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }).get()  # fmt: skip
    assert config is not None
    return AsyncClient(config, ConnectionParams(transport=httpx2.MockTransport(handler)))


@pytest.fixture
def server() -> Server:
    return Server()


@pytest.fixture
async def api(server: Server) -> Any:
    client = _client(server)
    api = KubeApi(client)
    yield api
    await api.close()


async def test_reads_claims_and_nodes(api: KubeApi, server: Server) -> None:
    claim = await api.get_claim("ns", "c1")
    assert claim["metadata"]["uid"] == "u1"
    with pytest.raises(ClaimNotFoundError):
        await api.get_claim("ns", "gone")
    assert await api.node_uid("n1") == "u-n1"


async def test_lists_watches_and_writes_this_nodes_slices(api: KubeApi, server: Server) -> None:
    [(items, version)] = [page async for page in api.list_slices("ate.dev", "n1")]
    assert ([i["metadata"]["name"] for i in items], version) == (["s1"], "42")
    selector = {"fieldSelector": "spec.driver=ate.dev,spec.nodeName=n1"}
    assert server.requests[-1][2] == {**selector, "limit": "100"}
    events = [event async for event in api.watch_slices("ate.dev", "n1", "42")]
    assert events == [("DELETED", _slice("s1", "7"))]  # one request: the caller watches again
    assert server.requests[-1][2] == {
        **selector, "watch": "true", "resourceVersion": "42", "timeoutSeconds": "300", "allowWatchBookmarks": "true"
    }  # fmt: skip
    new = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"generateName": "n1-ate.dev-"}, "spec": items[0]["spec"]}  # fmt: skip
    created = await api.create_slice(new)
    assert created["metadata"]["name"] == "s2"
    assert server.requests[-1][3]["metadata"] == {"generateName": "n1-ate.dev-"}
    replaced = await api.replace_slice(items[0])
    assert replaced["metadata"]["resourceVersion"] == "5"
    await api.delete_slice("s1")
    await api.delete_slice("gone")  # already deleted: no error
    assert [(m, p) for m, p, _, _ in server.requests[-2:]] == [("DELETE", f"{SLICES}/s1"), ("DELETE", f"{SLICES}/gone")]


async def test_an_api_error_other_than_not_found_is_raised(server: Server) -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(403, json={"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                                          "reason": "Forbidden", "message": "no"})  # fmt: skip

    api = KubeApi(_client(refuse))
    with pytest.raises(Exception, match="no"):
        await api.get_claim("ns", "c1")
    with pytest.raises(Exception, match="no"):
        await api.delete_slice("s1")
    await api.close()


def test_no_credentials_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="mode: DRA needs the API server, but no credentials were found"):
        connect()


# --- bounds: deadlines, reasons, names, concurrency, pages ---------------------------


async def test_a_call_that_gets_no_answer_fails_at_its_deadline_saying_so() -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    api = KubeApi(_client(hang), call_timeout_s=0.05)
    with pytest.raises(ApiError, match=r"GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1: "
                                       r"no answer from the API server within 0.05s") as caught:  # fmt: skip
        await api.get_claim("ns", "c1")
    assert caught.value.code == 0
    with pytest.raises(ApiError, match="no answer"):
        [_ async for _ in api.watch_slices("ate.dev", "n1", "1")]
    await api.close()


@pytest.mark.parametrize("error", [httpx2.ReadError(""), httpx2.PoolTimeout(""), httpx2.ConnectError("")])
async def test_an_error_without_a_message_is_named_by_its_type(error: Exception) -> None:
    def fail(request: httpx2.Request) -> httpx2.Response:
        raise error

    api = KubeApi(_client(fail))
    with pytest.raises(ApiError) as caught:
        await api.node_uid("n1")
    message = str(caught.value)
    assert message.startswith("GET /api/v1/nodes/n1: ")
    assert type(error).__name__ in message or "no answer" in message
    await api.close()


@pytest.mark.parametrize(
    ("namespace", "name"), [("ns", "../../api/v1/secrets"), ("a/b", "c"), ("..", "c"), ("ns", "a/b")]
)
async def test_a_bad_name_never_reaches_a_url(server: Server, api: KubeApi, namespace: str, name: str) -> None:
    with pytest.raises(InvalidNameError):
        await api.get_claim(namespace, name)
    with pytest.raises(InvalidNameError):
        await api.delete_slice(name if "/" in name else "../x")
    assert server.requests == []


async def test_at_most_a_few_calls_are_on_the_wire_at_once() -> None:
    on_wire, most = 0, 0
    release = asyncio.Event()

    async def slow(request: httpx2.Request) -> httpx2.Response:
        nonlocal on_wire, most
        on_wire += 1
        most = max(most, on_wire)
        await release.wait()
        on_wire -= 1
        return httpx2.Response(200, json={"metadata": {"uid": "u"}})

    api = KubeApi(_client(slow))
    calls = [asyncio.ensure_future(api.get_claim("ns", f"c{i}")) for i in range(50)]
    await until(lambda: on_wire == IN_FLIGHT, "the first calls on the wire")
    release.set()
    await asyncio.gather(*calls)
    assert most == IN_FLIGHT
    await api.close()


async def test_a_refusal_says_the_status_and_a_clipped_message() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(500, json={"kind": "Status", "code": 500, "message": "m" * (1 << 20)})

    api = KubeApi(_client(refuse))
    with pytest.raises(ApiError) as caught:
        await api.get_claim("ns", "c1")
    assert caught.value.code == 500
    assert str(caught.value).startswith("GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1: 500 mmm")
    assert len(str(caught.value)) < 700
    await api.close()


async def test_a_long_list_is_read_a_page_at_a_time() -> None:
    asked: list[dict[str, str]] = []

    def pages(request: httpx2.Request) -> httpx2.Response:
        asked.append(dict(request.url.params))
        n = int(request.url.params.get("continue", "0"))
        meta = {"resourceVersion": "9", **({"continue": str(n + 1)} if n < 2 else {})}
        return httpx2.Response(200, json={"metadata": meta, "items": [_slice(f"s{n}", "1")]})

    api = KubeApi(_client(pages))
    got = [(len(items), version) async for items, version in api.list_slices("ate.dev", "n1")]
    assert got == [(1, "9")] * 3
    assert [a.get("continue") for a in asked] == [None, "1", "2"]
    assert {a["limit"] for a in asked} == {str(LIST_PAGE)}
    await api.close()


async def test_a_watch_error_event_raises_with_its_code() -> None:
    def gone(request: httpx2.Request) -> httpx2.Response:
        event = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
        return httpx2.Response(200, content=json.dumps(event).encode() + b"\n")

    api = KubeApi(_client(gone))
    with pytest.raises(ApiError, match="too old resource version") as caught:
        [_ async for _ in api.watch_slices("ate.dev", "n1", "1")]
    assert caught.value.code == 410
    await api.close()
