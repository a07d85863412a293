"""The node's KVM facts as node labels: the NFD feature file, rendered from the KVM state.

With ``--nfd-features-dir`` (nfd-worker's ``features.d``), every view (view.py) whose KVM
state changed rewrites kvm/nfd.py's file when its text changes: the node's facts, what the last passing probe
learned of the device (API version, CPUID digest, capabilities, notable CPU features; of the
first probed resource, by name, whose probe passed once) and whether the node can restore
each restore profile (``ate.dev/restore_<name>=true|false``). A failing probe keeps the last
pass's facts: the labels say what the node is, the device plugin's health says whether it
works now.

The labels expire (``+expiry-time``) ``ttl_s`` after the daemon last renewed them, every
third of it: a daemon restarted or rolled renews them in time, one that is gone (the chart
uninstalled) leaves nothing on the Node once nfd-worker reads the file past that time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from ate_devplugin.components import Resources
from ate_devplugin.kvm import nfd
from ate_devplugin.kvmstate import KvmState
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.tasks import Guard, cancel
from ate_devplugin.view import View

log = logging.getLogger(__name__)


class FeatureFile:
    name = "NFD feature file"

    def __init__(self, directory: str, domain: str, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.domain = domain
        self.ttl_s = ttl_s
        self._clock = clock
        self._labels: dict[str, str] | None = None  # as last rendered; None: nothing probed yet
        self._expires = clock() + ttl_s
        self._renewing: asyncio.Task[None] | None = None
        self._failures = SaidOnce()  # the write's error, said once while it lasts

    def on_view(self, view: View) -> None:
        states = {name: v.kvm for name, v in view.items() if v.kvm is not None}
        if not states:
            return  # nothing probed (any more): the file says what it last said, until it expires
        labels = _labels(states, self.domain)
        if labels != self._labels:
            self._labels = labels
            self._write()

    def _write(self) -> None:
        if self._labels is None:
            return
        labels = self._labels
        text = nfd.render(labels, datetime.fromtimestamp(self._expires, UTC))
        try:
            # A few KiB to a local directory: written on the loop, as the CDI specs are.
            if nfd.write(self.directory, text):
                log.debug("NFD feature file written", extra={"path": f"{self.directory}/{nfd.FILE_NAME}"})
            self._failures.over()
        except OSError as exc:
            if self._failures.new(str(exc)):
                log.warning("cannot write the NFD feature file: %s", exc, extra={"directory": self.directory})

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            self._expires = self._clock() + self.ttl_s
            self._write()

    # --- the component: it renders what it is told, and renews its labels ---------------

    async def start(self, resources: Resources, guard: Guard) -> None:
        self._renewing = guard.spawn("nfd_renew", self._renew(), "NFD label renewal")

    async def stop(self, deadline_s: float) -> list[str]:
        return [] if await cancel(self._renewing, deadline_s) else ["NFD label renewal"]

    async def on_resources(self, resources: Resources) -> None:
        pass


def _labels(states: dict[str, KvmState], domain: str) -> dict[str, str]:
    """The node's facts and the first learned device's (by resource name), and every restore answer."""
    first = states[min(states)]
    learned = next((states[n] for n in sorted(states) if states[n].device_facts is not None), first)
    features = learned.device_facts.cpu_features if learned.device_facts else ()
    restore = {name: value for state in states.values() for name, value in state.restore_attributes().items()}
    return nfd.labels({**learned.attributes(), **restore}, features, domain)
