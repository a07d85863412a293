"""The API server, through lightkube: the few calls the DRA driver makes.

Imported only when DRA is on, so device-plugin mode loads no Kubernetes client.
Objects cross this boundary as plain JSON dicts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.core.exceptions import ConfigError as ClientConfigError
from lightkube.operators import BinaryOperator, SequenceOperator
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from ate_devplugin.config import ConfigError
from ate_devplugin.dra.service import ClaimNotFoundError

NOT_FOUND = 404
WATCH_TIMEOUT_S = 300  # the server ends each watch after this long; lightkube resumes it


def connect() -> KubeApi:
    """A client for the API server; no credentials is a configuration error (the pod needs its token)."""
    try:
        return KubeApi(AsyncClient(field_manager="ate-devplugin"))
    except ClientConfigError as exc:
        raise ConfigError("mode", f"DRA needs the API server, but no credentials were found: {exc}") from exc


class KubeApi:
    """Credentials from the pod's service account, or KUBECONFIG outside a cluster."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def close(self) -> None:
        await self.client.close()

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            claim = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == NOT_FOUND:
                raise ClaimNotFoundError(f"{namespace}/{name}") from exc
            raise
        return claim.to_dict()

    async def node_uid(self, node: str) -> str:
        found = (await self.client.get(Node, node)).to_dict()
        return str(found["metadata"]["uid"])

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        listing = self.client.list(ResourceSlice, fields=_selector(driver, node))
        items = [item.to_dict() async for item in listing]
        return items, listing.resourceVersion

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        watch: Any = self.client.watch(
            ResourceSlice,
            fields=_selector(driver, node),
            resource_version=resource_version,
            server_timeout=WATCH_TIMEOUT_S,
        )
        try:
            async for kind, item in watch:
                yield kind, item.to_dict()
        finally:
            await watch.aclose()  # ends the HTTP stream now, not when the loop shuts down

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        created = await self.client.create(_slice(body))
        return created.to_dict()

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        replaced = await self.client.replace(_slice(body))
        return replaced.to_dict()

    async def delete_slice(self, name: str) -> None:
        try:
            await self.client.delete(ResourceSlice, name)
        except ApiError as exc:
            if exc.status.code != NOT_FOUND:
                raise


def _selector(driver: str, node: str) -> dict[str, str | BinaryOperator | SequenceOperator]:
    return {"spec.driver": driver, "spec.nodeName": node}


def _slice(body: dict[str, Any]) -> ResourceSlice:
    return cast(ResourceSlice, ResourceSlice.from_dict(body))
