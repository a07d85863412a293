"""The collapsed "KVM probe" rows: the functional probe of resources with ``health: kvm``
(the chart's prober, kvmProbe.enabled by default, or a daemon run with ``--kvm-probe local``;
with ``--kvm-probe off`` only the 10:232 check, unverified or failed)."""

from __future__ import annotations

from dashboards.model import Panel, ValueText
from dashboards.vocabulary import BLUE, GREEN, RED, RES, good_and_bad, stat, state_timeline, target, timeseries

# One of a resource's five state series is 1; as one number, for the value mappings.
STATES: list[ValueText] = [
    (1, "passed", GREEN),
    (2, "unverified", BLUE),
    (3, "cannot probe", "yellow"),
    (4, "prober gone", "orange"),
    (5, "failed", RED),
]
SERIES = {"passed": 1, "unverified": 2, "cannot-probe": 3, "prober-gone": 4, "failed": 5}


def probe_state(by: str) -> str:
    """The state of each ``by`` group as its number in STATES; the worst where two daemons
    overlap on a node (a rolling update)."""
    states = " or ".join(
        f'ate_devplugin_kvm_probe_state{{{RES}, state="{name}"}} * {value}' for name, value in SERIES.items()
    )
    return f"max by ({by}) ({states})"


def fleet_kvm() -> list[Panel]:
    return [
        state_timeline(
            "KVM probe state, by node",
            "Per node and resource with health kvm, the state of its KVM probe over time: passed; unverified "
            "(no verdict yet, or the device node absent); cannot probe (the prober was refused the device or "
            "its probe process failed: judged by existence, alert AteDevpluginKvmCannotProbe); prober gone (no "
            "prober for 3 periods, alert AteDevpluginKvmProberGone); failed (its units Unhealthy, alert "
            "AteDevpluginKvmProbeFailing).",
            [target(probe_state("node, resource_name"), "{{node}} {{resource_name}}")],
            STATES,
        ),
        timeseries(
            "KVM probe failures, by node and reason",
            "Failed KVM probe verdicts per node, resource and reason code (docs/kvm-health.md, Reason codes). "
            "A probe repeats every period; a node that is not KVM's 10:232 counts once, at its change.",
            [
                target(
                    "sum by (node, resource_name, reason) (increase(ate_devplugin_kvm_probes_total"
                    f'{{{RES}, reason!="passed"}}[$__rate_interval]))',
                    "{{node}} {{resource_name}} {{reason}}",
                    color=RED,
                )
            ],
            "short",
            bars=True,
        ),
    ]


def node_kvm() -> list[Panel]:
    return [
        stat(
            "KVM probe",
            "Per resource with health kvm, its KVM probe's state now: passed, unverified (no verdict yet, or the "
            "device node absent), cannot probe (the probe could not judge the device: judged by existence), "
            "prober gone (no prober for 3 periods: the units are judged by existence), failed (every unit "
            "Unhealthy; in DRA mode the devices are tainted).",
            [target(probe_state("resource_name"), "{{resource_name}}")],
            steps=[(None, GREEN)],
            mappings=STATES,
            width=6,
        ),
        state_timeline(
            "KVM probe state",
            "The KVM probe's state per resource over time: when it failed, when the prober went, when it "
            "passed again. Alerts AteDevpluginKvmProbeFailing, AteDevpluginKvmCannotProbe and "
            "AteDevpluginKvmProberGone.",
            [target(probe_state("resource_name"), "{{resource_name}}")],
            STATES,
            width=18,
        ),
        timeseries(
            "KVM probe verdicts, by reason",
            "KVM probe verdicts per resource: passed (green), or the reason code of each failure (red), e.g. "
            "not-a-kvm-device, no-permission, run-failed, timed-out (docs/kvm-health.md, Reason codes). The log "
            'line "KVM probe failed" has the message.',
            good_and_bad("ate_devplugin_kvm_probes_total", RES, "reason", "passed", by="resource_name"),
            "short",
            width=24,
            bars=True,
        ),
    ]
