"""One resource's agent: carries out what reconciler.decide says; the only writer of its state.

It serves the resource on its socket, registers with the kubelet and keeps both so, and
applies the device discoveries the daemon hands it. Nothing polls: between actions it
sleeps until woken or until the decision's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from opentelemetry import context
from opentelemetry.trace import SpanKind, Tracer

from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.inventory import HEALTHY, UNHEALTHY, ResourceState
from ate_devplugin.deviceplugin.ports import Ports
from ate_devplugin.deviceplugin.reconciler import Action, Observed, decide
from ate_devplugin.deviceplugin.registration import RegistrationError
from ate_devplugin.deviceplugin.servicer import plugin_options
from ate_devplugin.host.devices import Discovery
from ate_devplugin.host.sockets import ServeError
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.settings import DevicePluginSettings
from ate_devplugin.tasks import Backoff, Guard, cancel

log = logging.getLogger(__name__)


class ResourceAgent:
    def __init__(
        self,
        config: ResourceConfig,
        settings: DevicePluginSettings,
        ports: Ports,
        metrics: Metrics,
        tracer: Tracer,
        *,
        check_kubelet: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.kubelet_socket = settings.kubelet_socket
        self.ports = ports
        self.settings = settings
        self.metrics = metrics
        self.tracer = tracer
        self._check_kubelet = check_kubelet
        self.state = ResourceState(config)
        self.state.on_streams_changed = self._streams_changed
        self.server = ports.make_server(self.state)
        self._woken = asyncio.Event()
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_cap_s)
        self._retry_at = 0.0
        self._registered = False
        self._no_stream_since = 0.0
        self._had_stream = False
        self._attempt: asyncio.Future[None] | None = None  # the Register call in flight
        self._cause: context.Context | None = None  # trace context of why we register next
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def socket_path(self) -> str:
        return self.server.socket_path

    def socket_intact(self) -> bool:
        return self.server.socket_intact()

    @property
    def serving(self) -> bool:
        """Registered, and the kubelet holds its own ListAndWatch stream."""
        return self._registered and self.state.kubelet_stream is not None

    # --- told by the daemon -----------------------------------------------------------

    def wake(self) -> None:
        self._woken.set()

    def retry_now(self) -> None:
        """Something changed that may let a failed attempt succeed: no more backoff."""
        self._retry_at = 0.0
        self.wake()

    def kubelet_changed(self, restarted: bool) -> None:
        """A new kubelet socket: register at once, whatever the backoff said."""
        self._backoff.reset()
        self._retry_at = 0.0
        if restarted:
            self._registered = False
            self._cause = context.get_current()
        if self._attempt is not None:
            self._attempt.cancel()  # an attempt at the old kubelet is moot
        self.wake()

    def apply(self, found: Discovery, failing: str | None = None) -> None:
        """The resource's devices as found, and why they fail a health check beyond existence
        (the KVM probe's reason; None: existence alone counts), as one change of health."""
        state = self.state
        was_present = state.ever_present
        appeared = found.complete != state.discovery.complete

        def change() -> None:
            state.update(found, failing)
            if appeared:
                log.info(
                    "devices %s",
                    "present" if found.complete else "absent",
                    extra={"resource": self.name, "nodes": [n.host_path for n in found.nodes]},
                )

        self._apply(change, found.complete and failing is None)
        self.metrics.device_nodes_present.labels(self.name).set(len(found.nodes))
        if state.ever_present and not was_present:
            self.wake()

    def _apply(self, change: Callable[[], None], healthy: bool) -> None:
        """Makes ``change``, after which the resource is ``healthy``: in a span and counted if
        that flips the advertised health."""
        if (self.state.health == HEALTHY) == healthy:
            change()
        else:
            self._health_change(change, healthy)
        self._count_units()

    def _count_units(self) -> None:
        units = self.config.units
        healthy = units if self.state.health == HEALTHY else 0
        # Units are advertised once the resource was present; before that, none.
        advertised = units if self.state.ever_present else 0
        self.metrics.devices.labels(self.name, "healthy").set(healthy)
        self.metrics.devices.labels(self.name, "unhealthy").set(advertised - healthy)

    def _health_change(self, change: Callable[[], None], healthy: bool) -> None:
        """Applies a change that flips the health, inside the span the kubelet update joins."""
        health = HEALTHY if healthy else UNHEALTHY
        with self.tracer.start_as_current_span(
            "device change",
            kind=SpanKind.INTERNAL,
            attributes={
                "ate_devplugin.resource_name": self.name,
                "ate_devplugin.health": health,
                "ate_devplugin.device_nodes": len(self.state.discovery.nodes),
            },
        ):
            change()
            self.metrics.health_changes.labels(self.name, health.lower()).inc()
            self.metrics.health_changed.labels(self.name).set_to_current_time()

    def _streams_changed(self) -> None:
        has_stream = self.state.kubelet_stream is not None
        if self._had_stream and not has_stream:
            self._no_stream_since = self.ports.clock.monotonic()
        self._had_stream = has_stream
        self.wake()

    # --- running and stopping -----------------------------------------------------------

    def start(self, guard: Guard) -> None:
        self.task = guard.spawn("agent", self._run(), f"agent {self.name}")

    async def stop(self) -> bool:
        """Stops within ``agent_stop_s``, safe to call again; False if the task was stuck.

        The cleanup runs here, not in the cancelled task.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.agent_stop_s
        stuck = not await cancel(self.task, self.settings.agent_stop_s)
        if stuck:
            log.error("agent for %s did not stop within %.1fs", self.name, self.settings.agent_stop_s)
        self.state.close()
        self._registered = False
        self._publish()
        grace = min(self.settings.server_stop_grace_s, max(0.0, deadline - loop.time()))
        await self.server.stop(grace)
        log.info("stopped serving", extra={"resource": self.name})
        return not stuck

    def observe(self) -> Observed:
        return Observed(
            present=self.state.ever_present,
            socket_intact=self.server.socket_intact(),
            kubelet_up=self.ports.fs.exists(self.kubelet_socket),
            registered=self._registered,
            kubelet_stream=self.state.kubelet_stream is not None,
            now=self.ports.clock.monotonic(),
            retry_at=self._retry_at,
            no_stream_since=self._no_stream_since,
            stream_grace=self.settings.stream_grace_s,
        )

    async def _run(self) -> None:
        while True:
            self._publish()
            self._woken.clear()
            decision = decide(self.observe())
            if decision.action is Action.WAIT:
                await self._sleep(decision.until)
            elif decision.action is Action.SERVE:
                await self._serve()
            elif decision.action is Action.REGISTER:
                await self._register()
            else:
                log.warning("kubelet holds no ListAndWatch stream; registering again", extra={"resource": self.name})
                self._registered = False

    async def _sleep(self, until: float | None) -> None:
        """Until woken, or until ``until`` (monotonic) if given."""
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self._woken.wait())}
        if until is not None:
            waits.add(asyncio.ensure_future(self.ports.clock.sleep(until - self.ports.clock.monotonic())))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _publish(self) -> None:
        self.metrics.registered.labels(self.name).set(1 if self.serving else 0)

    async def _serve(self) -> None:
        if self._registered:
            log.info("our socket is gone; serving again", extra={"resource": self.name})
        self._registered = False
        await self.server.stop(0)
        try:
            await self.server.start()
        except ServeError as exc:
            log.error("%s", exc, extra={"resource": self.name})
            self._retry_at = self.ports.clock.monotonic() + self._backoff.next()
            return
        self._retry_at = 0.0
        log.info("serving", extra={"resource": self.name, "socket": self.server.socket_path})

    async def _register(self) -> None:
        # A new kubelet may be up before its socket's creation event reaches us; noticing
        # it here registers once, with the restart as the cause, instead of twice.
        self._check_kubelet()
        self.state.registering()
        attempt = asyncio.ensure_future(
            self.ports.kubelet.register(
                self.kubelet_socket,
                os.path.basename(self.socket_path),
                self.name,
                plugin_options(self.config),
                self._cause,
            )
        )
        self._attempt = attempt
        try:
            await asyncio.wait({attempt})
        finally:
            self._attempt = None
            attempt.cancel()  # if we were cancelled while it ran
        if attempt.cancelled():
            return  # a new kubelet came: decide again, at once
        exc = attempt.exception()
        if isinstance(exc, RegistrationError):
            self.metrics.registrations.labels(self.name, exc.reason).inc()
            delay = self._backoff.next()
            self._retry_at = self.ports.clock.monotonic() + delay
            log.warning(
                "registration failed, retrying in %.3fs: %s",
                delay,
                exc,
                extra={"resource": self.name, "reason": exc.reason},
            )
            return
        if exc is not None:
            raise exc
        self.metrics.registrations.labels(self.name, "success").inc()
        self._backoff.reset()
        self._retry_at = 0.0
        self._cause = None
        self._registered = True
        self._no_stream_since = self.ports.clock.monotonic()
        log.info("registered with the kubelet", extra={"resource": self.name})
