"""The API server: the few calls the DRA driver makes, as JSON over lightkube's HTTP client.

Imported only when DRA is on, so device-plugin mode loads no Kubernetes client. lightkube
finds the credentials (the service account's token, read again when it rotates, or
KUBECONFIG) and builds the HTTP client; the requests are made here, so that:

* every call has a deadline of its own (``CALL_TIMEOUT_S``, well under the kubelet's 45 s
  for a prepare) and fails with an ApiError that says which call and why, never empty;
* at most ``IN_FLIGHT`` calls are on the wire at once: a prepare of many claims queues
  here instead of exhausting the connection pool;
* names are checked as the API defines them before they become part of a URL path;
* objects stay plain JSON (no model objects built and converted back), and a list is read
  in pages, so a large answer costs a page at a time;
* a watch is one HTTP stream: when the server ends it, the caller decides when to watch again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx2
from lightkube.config.client_adapter import AsyncClient, ConnectionParams
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError as ClientConfigError

from ate_devplugin.config import ConfigError
from ate_devplugin.dra.names import check_name, check_namespace
from ate_devplugin.dra.service import ClaimNotFoundError
from ate_devplugin.observability.logs import clip, reason

NOT_FOUND = 404
GONE = 410
CALL_TIMEOUT_S = 5.0
IN_FLIGHT = 8
LIST_PAGE = 100  # slices per list request
WATCH_TIMEOUT_S = 300  # the server ends each watch after this long ...
WATCH_SILENCE_S = WATCH_TIMEOUT_S + 30  # ... so a stream silent this long is dead
FIELD_MANAGER = "ate-devplugin"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class ApiError(Exception):
    """A call that failed: its ``code`` (0 when there was no answer) and what was said."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def connect() -> KubeApi:
    """A client for the API server; no credentials is a configuration error (the pod needs its token)."""
    try:
        config = KubeConfig.from_env().get()
        if config is None:
            raise ClientConfigError("the kubeconfig names no context")
        http = AsyncClient(config, ConnectionParams(timeout=httpx2.Timeout(CALL_TIMEOUT_S)))
    except ClientConfigError as exc:
        raise ConfigError("mode", f"DRA needs the API server, but no credentials were found: {exc}") from exc
    return KubeApi(http)


class KubeApi:
    def __init__(self, http: httpx2.AsyncClient, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.http = http
        self.call_timeout_s = call_timeout_s
        self._slots = asyncio.Semaphore(IN_FLIGHT)

    async def close(self) -> None:
        await self.http.aclose()

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        path = f"/apis/resource.k8s.io/v1/namespaces/{check_namespace(namespace)}/resourceclaims/{check_name(name)}"
        try:
            return await self._call("GET", path)
        except ApiError as exc:
            if exc.code == NOT_FOUND:
                raise ClaimNotFoundError(f"{namespace}/{name}") from exc
            raise

    async def node_uid(self, node: str) -> str:
        found = await self._call("GET", f"/api/v1/nodes/{check_name(node, 'node')}")
        return str(found["metadata"]["uid"])

    async def list_slices(self, driver: str, node: str) -> AsyncGenerator[tuple[list[dict[str, Any]], str], None]:
        """Every slice of the driver on the node, a page at a time, with the list's resourceVersion."""
        params = {"fieldSelector": _selector(driver, node), "limit": str(LIST_PAGE)}
        while True:
            page = await self._call("GET", SLICES, params=params)
            meta = page.get("metadata") or {}
            yield page.get("items") or [], str(meta.get("resourceVersion", ""))
            if not meta.get("continue"):
                return
            params["continue"] = str(meta["continue"])

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """(type, object) of one watch request, until the server ends it (ERROR raises ApiError)."""
        params = {
            "fieldSelector": _selector(driver, node),
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
            "allowWatchBookmarks": "true",
        }
        timeout = httpx2.Timeout(self.call_timeout_s, read=WATCH_SILENCE_S)
        request = self.http.build_request("GET", SLICES, params=params, timeout=timeout)
        try:
            async with asyncio.timeout(self.call_timeout_s):  # the answer's head, like any call
                response = await self.http.send(request, stream=True)
        except (TimeoutError, httpx2.HTTPError) as exc:
            raise _unanswered("GET", SLICES, exc, self.call_timeout_s) from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                raise _refused("GET", SLICES, response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = str(event.get("type", "")), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 0), f"watch {SLICES}: {clip(str(obj.get('message')))}")
                yield kind, obj
        except httpx2.HTTPError as exc:
            raise ApiError(0, f"watch {SLICES}: {reason(exc)}") from exc
        finally:
            await response.aclose()  # ends the HTTP stream now, not when the loop shuts down

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", SLICES, body=body, params={"fieldManager": FIELD_MANAGER})

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        path = f"{SLICES}/{check_name(body['metadata']['name'], 'slice')}"
        return await self._call("PUT", path, body=body, params={"fieldManager": FIELD_MANAGER})

    async def delete_slice(self, name: str) -> None:
        try:
            await self._call("DELETE", f"{SLICES}/{check_name(name, 'slice')}")
        except ApiError as exc:
            if exc.code != NOT_FOUND:
                raise

    async def _call(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One request within its deadline (waiting for a free slot aside); the answer as JSON."""
        async with self._slots:
            try:
                async with asyncio.timeout(self.call_timeout_s):
                    response = await self.http.request(method, path, params=params, json=body)
            except (TimeoutError, httpx2.HTTPError) as exc:
                raise _unanswered(method, path, exc, self.call_timeout_s) from exc
        if response.status_code >= 400:
            raise _refused(method, path, response)
        try:
            answer = response.json()
        except ValueError as exc:
            raise ApiError(response.status_code, f"{method} {path}: not JSON: {reason(exc)}") from exc
        if not isinstance(answer, dict):
            raise ApiError(response.status_code, f"{method} {path}: not a JSON object")
        return answer


def _selector(driver: str, node: str) -> str:
    return f"spec.driver={driver},spec.nodeName={node}"


def _unanswered(method: str, path: str, exc: BaseException, timeout_s: float) -> ApiError:
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return ApiError(0, f"{method} {path}: no answer from the API server within {timeout_s:g}s")
    return ApiError(0, f"{method} {path}: {reason(exc)}")


def _refused(method: str, path: str, response: httpx2.Response) -> ApiError:
    """The API server's Status message, or the start of whatever it sent."""
    try:
        message = str(response.json().get("message") or "")
    except (ValueError, AttributeError):
        message = response.text
    return ApiError(
        response.status_code, f"{method} {path}: {response.status_code} {clip(message) or response.reason_phrase}"
    )
