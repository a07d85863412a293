"""The collapsed "DRA driver" rows (dra.mode dra or both)."""

from __future__ import annotations

from dashboards.model import Panel
from dashboards.vocabulary import (
    DAEMON,
    GREEN,
    OK_IF_POSITIVE,
    RED,
    REGISTERED,
    stat,
    state_timeline,
    target,
    timeseries,
)

IN_SYNC = [(0, "out of sync", RED), (1, "in sync", GREEN)]


def fleet_dra() -> list[Panel]:
    return [
        state_timeline(
            "DRA slices in sync, by node",
            "Per node running the DRA driver: whether its ResourceSlices match its devices. Out of sync: a "
            "write to the API server is failing, so the scheduler sees stale devices; alert "
            "AteDevpluginDraSlicesOutOfSync fires after 10 minutes. Node / ResourceSlice writes, by op and "
            "result shows which write fails.",
            [target(f"min by (node) (ate_devplugin_dra_slices_in_sync{{{DAEMON}}})", "{{node}}")],
            IN_SYNC,
            width=24,
        ),
    ]


def node_dra() -> list[Panel]:
    return [
        stat(
            "DRA registered",
            "Whether the kubelet accepted the DRA driver's registration through its plugin registry.",
            [target(f"max(ate_devplugin_dra_registered{{{DAEMON}}})", "registered")],
            steps=OK_IF_POSITIVE,
            mappings=REGISTERED,
            width=6,
        ),
        stat(
            "Prepared claims",
            "ResourceClaims prepared on this node and not yet unprepared: pods holding a device through DRA.",
            [target(f"sum(ate_devplugin_dra_claims_prepared{{{DAEMON}}})", "prepared")],
            "short",
            width=6,
        ),
        stat(
            "Slice devices",
            "Devices this node publishes in its ResourceSlices, per resource (the slots of each resource).",
            [target(f"max by (resource_name) (ate_devplugin_dra_slice_devices{{{DAEMON}}})", "{{resource_name}}")],
            "short",
            width=6,
        ),
        stat(
            "Slices in sync",
            "Whether the published ResourceSlices match the node's devices; out of sync while a write fails "
            "(alert AteDevpluginDraSlicesOutOfSync).",
            [target(f"min(ate_devplugin_dra_slices_in_sync{{{DAEMON}}})", "in sync")],
            steps=OK_IF_POSITIVE,
            mappings=IN_SYNC,
            width=6,
        ),
        timeseries(
            "DRA claims, by method and result",
            "Claims handled in NodePrepareResources and NodeUnprepareResources calls, by result. Errors leave "
            "the pod waiting in ContainerCreating; the daemon's log names the claim.",
            [
                target(
                    f"sum by (method, result) (increase(ate_devplugin_dra_claims_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{method}} {{result}}",
                )
            ],
            "short",
            width=8,
            bars=True,
        ),
        timeseries(
            "DRA call latency",
            "99th percentile time to answer the kubelet's NodePrepareResources and NodeUnprepareResources calls.",
            [
                target(
                    "histogram_quantile(0.99, sum by (method, le) "
                    f"(rate(ate_devplugin_dra_call_duration_seconds_bucket{{{DAEMON}}}[$__rate_interval]))) >= 0",
                    "p99 {{method}}",
                )
            ],
            "s",
            width=8,
        ),
        timeseries(
            "ResourceSlice writes, by op and result",
            "Creates, updates and deletes of this node's ResourceSlices, by result. A write after start is "
            "expected on device changes and kubelet restarts; repeated failures keep the slices out of sync.",
            [
                target(
                    f"sum by (op, result) "
                    f"(increase(ate_devplugin_dra_slice_writes_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{op}} {{result}}",
                )
            ],
            "short",
            width=8,
            bars=True,
        ),
    ]
