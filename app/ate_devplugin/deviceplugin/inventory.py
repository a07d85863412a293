"""The single source of truth for one resource's device state, with a change feed.

The loop owns every instance: discovery updates, the kubelet's streams and readiness all
read and write it from the event loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentelemetry import context

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import Discovery

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class ResourceState:
    def __init__(self, config: ResourceConfig) -> None:
        self.config = config
        self.known_ids = frozenset(config.unit_ids())
        self.discovery = Discovery(nodes=(), complete=False)
        # Why the device fails a health check beyond existence (the KVM probe's reason), or None.
        self.failing: str | None = None
        self.ever_present = False
        # Streams are told apart by a token. The kubelet's own is the first one opened
        # after our latest Register request was sent; any other client's never counts.
        self.kubelet_stream: int | None = None
        self._awaiting_kubelet = False
        self._tokens = 0
        self.closed = False
        self.version = 0
        # The trace context of the latest change, so the update that carries it to the
        # kubelet shows up in the same trace.
        self.change_context: context.Context | None = None
        self._changed = asyncio.Event()
        self.on_streams_changed: Callable[[], None] = lambda: None

    @property
    def health(self) -> str:
        return HEALTHY if self.discovery.complete and self.failing is None else UNHEALTHY

    def update(self, discovery: Discovery, failing: str | None = None) -> None:
        """Record a discovery, and why the present devices are not healthy (None: nothing but
        existence counts); streams hear of it when the advertised health changed."""
        before = self.health
        self.discovery, self.failing = discovery, failing
        self.ever_present = self.ever_present or discovery.complete
        self._changed_from(before)

    def _changed_from(self, before: str) -> None:
        if self.health != before:
            self.change_context = context.get_current()
            self._bump()

    def registering(self) -> None:
        """A Register request is about to be sent: the kubelet's next stream is its own."""
        self.kubelet_stream = None
        self._awaiting_kubelet = True
        self.on_streams_changed()

    def stream_opened(self) -> int:
        """Counts a new stream; returns its token for :meth:`stream_closed`."""
        self._tokens += 1
        if self._awaiting_kubelet:
            self.kubelet_stream, self._awaiting_kubelet = self._tokens, False
        self.on_streams_changed()
        return self._tokens

    def stream_closed(self, token: int) -> None:
        if token == self.kubelet_stream:
            self.kubelet_stream = None
        self.on_streams_changed()

    def close(self) -> None:
        """Ends every ListAndWatch stream of this resource."""
        self.closed = True
        self._bump()

    async def wait_for_change(self, seen: int) -> None:
        """Returns once ``version`` differs from ``seen`` (at once if it already does)."""
        while self.version == seen:
            await self._changed.wait()

    def _bump(self) -> None:
        self.version += 1
        # Wake every current waiter, then start a fresh event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
