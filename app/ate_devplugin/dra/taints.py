"""Device taints from the KVM probe's verdicts: a device that fails the probe is tainted,
and the scheduler allocates it to no new claim that does not tolerate the taint.

One taint per failing resource, on each of its published devices: key
``<driver>/kvm-unhealthy`` (``ate.dev/kvm-unhealthy``), value the probe's reason code
(``not-a-kvm-device``, ``timed-out``, ...: a valid label value), effect ``NoSchedule``
(claims already allocated keep running) or, opted in, ``NoExecute`` (the eviction
controller deletes the pods of claims that do not tolerate it). ``timeAdded`` is when the
resource started failing; it stays while the resource fails, whatever the reason becomes,
and the taint goes when a probe passes. It is written by us, to the second, as the API
server writes it back: otherwise the server fills it in and every comparison of what we
want with what it holds would differ.

DRADeviceTaints is GA in Kubernetes 1.37; an API server whose gate is off (1.35's
default) drops the field, which slices.py sees in what the server stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ate_devplugin.kvm.reasons import Reason

KEY_NAME = "kvm-unhealthy"
EFFECTS = ("NoSchedule", "NoExecute")
MAX_TAINTS = 16  # per device


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str
    time_added: str  # RFC 3339 in UTC, to the second

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect, "timeAdded": self.time_added}


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TaintBook:
    """Which resources fail the probe, and since when; what their devices carry."""

    def __init__(self, driver: str, effect: str = "NoSchedule", clock: Callable[[], float] = time.time) -> None:
        if effect not in EFFECTS:
            raise ValueError(f"taint effect {effect!r}: one of {', '.join(EFFECTS)}")
        self.key = f"{driver}/{KEY_NAME}"
        self.effect = effect
        self.clock = clock
        self._failing: dict[str, tuple[str, str]] = {}  # resource -> (reason, time added)

    def update(self, resource: str, verdict: Reason | None) -> bool:
        """The resource's latest verdict (None: none known, e.g. before the first probe);
        whether its taints changed."""
        before = self._failing.get(resource)
        if verdict is None or verdict is Reason.PASSED:
            self._failing.pop(resource, None)
        else:
            since = before[1] if before else rfc3339(self.clock())
            self._failing[resource] = (str(verdict), since)
        return self._failing.get(resource) != before

    def taints(self, resource: str) -> tuple[DeviceTaint, ...]:
        """What each published device of the resource carries."""
        failing = self._failing.get(resource)
        if failing is None:
            return ()
        reason, since = failing
        return (DeviceTaint(self.key, reason, self.effect, since),)
