"""The collapsed "Pods" rows: pods holding units, from the kubelet's PodResources API
(``--pod-resources on``, the chart's podResources.enabled)."""

from __future__ import annotations

from dashboards.model import ColumnStyle, Panel
from dashboards.vocabulary import DAEMON, OK_IF_ZERO, RES, table, target, timeseries


def fleet_pods() -> list[Panel]:
    return [
        timeseries(
            "Pods on nodes whose device is gone",
            "Pods holding units of a resource whose device nodes are missing, per node: workloads given a "
            "device that is no longer there. Alert AteDevpluginPodsOnUnhealthyDevice fires after 2 minutes; "
            "the node drill-down lists the pods.",
            [
                target(
                    f"sum by (node, resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})",
                    "{{node}} {{resource_name}}",
                )
            ],
            "short",
            width=12,
        ),
        table(
            "Pods holding units, by node",
            "Per node and resource, now: pods holding units, and how many of them hold units of a lost device.",
            [
                target(f"max by (node, resource_name) (ate_devplugin_pods_holding_units{{{RES}}})", instant=True),
                target(f"max by (node, resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})", instant=True),
            ],
            {"#A": "Pods holding units", "#B": "On a lost device", "node": "Node", "resource_name": "Resource"},
            styles={"On a lost device": ColumnStyle(steps=OK_IF_ZERO)},
            sort_by="On a lost device",
            width=12,
        ),
    ]


def node_pods() -> list[Panel]:
    return [
        table(
            "Pods holding $resource",
            "Every container on this node holding units, with its namespace and pod, as the kubelet's "
            "PodResources API lists them (the daemon lists again on each allocation and device change, and "
            "every podResources.interval seconds, which bounds how long a deleted pod stays here).",
            [
                target(
                    f"max by (resource_name, namespace, pod, container) (ate_devplugin_pod_units{{{RES}}})",
                    instant=True,
                )
            ],
            {
                "#A": "Units",
                "resource_name": "Resource",
                "namespace": "Namespace",
                "pod": "Pod",
                "container": "Container",
            },
            sort_by="Pod",
        ),
        timeseries(
            "Pods holding units, and on a lost device",
            "Pods holding units of each resource, and those of them holding units while its device nodes are "
            "missing (alert AteDevpluginPodsOnUnhealthyDevice).",
            [
                target(
                    f"sum by (resource_name) (ate_devplugin_pods_holding_units{{{RES}}})", "{{resource_name}} holding"
                ),
                target(
                    f"sum by (resource_name) (ate_devplugin_pods_on_unhealthy_device{{{RES}}})",
                    "{{resource_name}} on a lost device",
                ),
            ],
            "short",
            width=12,
        ),
        timeseries(
            "PodResources calls, by result",
            "List calls to the kubelet's PodResources API, by result; unavailable: no socket or no kubelet. "
            "Series beyond the bound are counted as dropped.",
            [
                target(
                    f"sum by (result) "
                    f"(increase(ate_devplugin_pod_resources_requests_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{result}}",
                ),
                target(f"sum(ate_devplugin_pod_units_series_dropped{{{DAEMON}}})", "series dropped"),
            ],
            "short",
            width=12,
            bars=True,
        ),
    ]
