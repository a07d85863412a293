"""The per-resource decision, one row per situation (issue 12; safety properties of issue 10)."""

from __future__ import annotations

import dataclasses

import pytest

from ate_devplugin.deviceplugin.reconciler import Action, Decision, Observed, decide

BASE = Observed(
    present=True,
    socket_intact=True,
    kubelet_up=True,
    registered=True,
    kubelet_stream=True,
    now=100.0,
    stream_grace=5.0,
)


def case(**changes: object) -> Observed:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


ROWS = [
    ("devices never present: nothing to serve", case(present=False, socket_intact=False), Action.WAIT, None),
    ("present, no socket yet: serve", case(socket_intact=False, registered=False), Action.SERVE, None),
    (
        "socket gone or renamed over while registered: serve again at once",
        case(socket_intact=False),
        Action.SERVE,
        None,
    ),
    ("serving failed, backoff pending", case(socket_intact=False, retry_at=101.0), Action.WAIT, 101.0),
    ("serving failed, backoff over", case(socket_intact=False, retry_at=99.0), Action.SERVE, None),
    ("no kubelet socket: wait to be woken, not polled", case(kubelet_up=False, registered=False), Action.WAIT, None),
    ("kubelet up, not registered: register", case(registered=False, kubelet_stream=False), Action.REGISTER, None),
    ("registration failed, backoff pending", case(registered=False, retry_at=130.0), Action.WAIT, 130.0),
    ("new kubelet socket reset the backoff (retry_at 0)", case(registered=False, retry_at=0.0), Action.REGISTER, None),
    # Once present a resource stays advertised (Unhealthy when its devices go): the agent
    # observes ``present`` as "ever present", so this row is also the one of devices gone.
    ("registered, the kubelet holds its own stream: idle", case(), Action.WAIT, None),
    (
        "registered, kubelet's stream not yet open: wait out the grace",
        case(kubelet_stream=False, no_stream_since=98.0),
        Action.WAIT,
        103.0,
    ),
    (
        "kubelet dropped its stream (a foreign stream does not count) past the grace: register again",
        case(kubelet_stream=False, no_stream_since=94.0),
        Action.FORGET_REGISTRATION,
        None,
    ),
    (
        "grace ends exactly now: register again",
        case(kubelet_stream=False, no_stream_since=95.0),
        Action.FORGET_REGISTRATION,
        None,
    ),
]


@pytest.mark.parametrize(("why", "observed", "action", "until"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(why: str, observed: Observed, action: Action, until: float | None) -> None:
    """The whole decision: what to do, and until when to wait."""
    assert decide(observed) == Decision(action, until), why
