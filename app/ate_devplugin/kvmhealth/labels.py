"""The node's KVM facts as node labels: the NFD feature file, written from the probe's verdicts.

With ``--nfd-features-dir`` (nfd-worker's ``features.d``), every verdict rewrites
kvm/nfd.py's file when its text changes: the node's facts (read once) and what the last
passing probe learned of the device (API version, CPUID digest, capabilities, notable CPU
features). A failing probe keeps the last pass's facts: the labels say what the node is,
the device plugin's health says whether it works now. The file stays when the daemon
stops (a restarted daemon writes it again; nfd-worker drops it once it is deleted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ate_devplugin.kvm import nfd
from ate_devplugin.kvm.attributes import attributes
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts, read_node_facts
from ate_devplugin.kvm.probe import ProbeResult

log = logging.getLogger(__name__)


class FeatureFile:
    def __init__(self, directory: str, domain: str, node_facts: Callable[[], NodeFacts] = read_node_facts) -> None:
        self.directory = directory
        self.domain = domain
        self._node = node_facts()
        self._device: DeviceFacts | None = None
        self._failed: str | None = None  # the last write's error, said once while it lasts

    def on_kvm_verdict(self, resource: str, verdict: ProbeResult | None) -> None:
        if verdict is not None and verdict.passed and verdict.device_facts is not None:
            self._device = verdict.device_facts
        features = self._device.cpu_features if self._device else ()
        text = nfd.render(nfd.labels(attributes(self._node, self._device), features, self.domain))
        try:
            # A few KiB to a local directory: written on the loop, as the CDI specs are.
            if nfd.write(self.directory, text):
                log.info("NFD feature file written", extra={"path": f"{self.directory}/{nfd.FILE_NAME}"})
            self._failed = None
        except OSError as exc:
            if str(exc) != self._failed:
                log.warning("cannot write the NFD feature file: %s", exc, extra={"directory": self.directory})
            self._failed = str(exc)
