"""kube.py through lightkube against an in-memory HTTP API server (httpx's mock transport)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from ate_devplugin.config import ConfigError
from ate_devplugin.dra.kube import KubeApi, connect
from ate_devplugin.dra.service import ClaimNotFoundError

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


def _client(handler: Any) -> AsyncClient:
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://api.test"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    })  # fmt: skip
    return AsyncClient(config, transport=httpx2.MockTransport(handler))


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
    items, version = await api.list_slices("ate.dev", "n1")
    assert ([i["metadata"]["name"] for i in items], version) == (["s1"], "42")
    selector = {"fieldSelector": "spec.driver=ate.dev,spec.nodeName=n1"}
    assert server.requests[-1][2] == selector
    watch = api.watch_slices("ate.dev", "n1", "42")  # lightkube resumes an ended watch: take one event
    assert await anext(watch) == ("DELETED", _slice("s1", "7"))
    await watch.aclose()
    assert server.requests[-1][2] == {**selector, "watch": "true", "resourceVersion": "42", "timeoutSeconds": "300"}
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
