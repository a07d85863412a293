"""Per resource, the next step from what is observed: a pure function, table-tested.

The agent (agent.py) observes, asks :func:`decide`, carries the action out and asks
again; it sleeps only when told to, until woken or until the decision's deadline.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    WAIT = "wait"  # nothing to do until woken, or until ``Decision.until``
    SERVE = "serve"  # (re)create our socket and serve on it
    REGISTER = "register"  # send Register to the kubelet
    FORGET_REGISTRATION = "forget registration"  # the kubelet holds no stream of ours: register again


@dataclass(frozen=True)
class Observed:
    present: bool  # the resource's devices were found (once present, it stays advertised)
    socket_intact: bool  # our socket file is the one our server made
    kubelet_up: bool  # kubelet.sock exists
    registered: bool  # our latest Register succeeded (and nothing since voided it)
    kubelet_stream: bool  # the kubelet's own ListAndWatch stream is open
    now: float  # monotonic seconds
    retry_at: float = 0.0  # backoff after a failure: no attempt before this
    no_stream_since: float = 0.0  # registered, or the kubelet's stream ended, at this time
    stream_grace: float = 5.0  # how long a registration may go without the kubelet's stream


@dataclass(frozen=True)
class Decision:
    action: Action
    until: float | None = None  # for WAIT: wake by this time at the latest (None: only when woken)


def decide(o: Observed) -> Decision:
    if not o.present:
        return Decision(Action.WAIT)  # devices never present
    if not o.socket_intact:
        if o.now < o.retry_at:
            return Decision(Action.WAIT, o.retry_at)  # backing off before serving again
        return Decision(Action.SERVE)  # our socket is not there
    if not o.kubelet_up:
        return Decision(Action.WAIT)  # waiting for the kubelet socket
    if not o.registered:
        if o.now < o.retry_at:
            return Decision(Action.WAIT, o.retry_at)  # backing off before registering again
        return Decision(Action.REGISTER)
    if o.kubelet_stream:
        return Decision(Action.WAIT)  # registered, the kubelet holds its stream
    deadline = o.no_stream_since + o.stream_grace
    if o.now < deadline:
        return Decision(Action.WAIT, deadline)  # registered, waiting for the kubelet's stream
    return Decision(Action.FORGET_REGISTRATION)  # the kubelet holds no stream of ours
