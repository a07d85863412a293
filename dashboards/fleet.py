"""The Fleet board: which nodes lost the device, are not registered with the kubelet, or
fail Allocate, and since when; the node name links to the Node board."""

from __future__ import annotations

from dashboards.dra import fleet_dra
from dashboards.kvm import fleet_kvm
from dashboards.model import Board, ColumnStyle
from dashboards.pods import fleet_pods
from dashboards.vocabulary import (
    DAEMON,
    DAEMONSET,
    FLEET_UID,
    GREEN,
    NODE_UID,
    OK_IF_POSITIVE,
    OK_IF_ZERO,
    PLUGIN_PODS,
    PODS_WITHOUT_TARGET,
    PRESENT,
    RED,
    REGISTERED,
    RES,
    UP,
    YES_IS_BAD,
    daemons_up,
    good_and_bad,
    pod_reporting,
    quantiles,
    stat,
    state_timeline,
    table,
    target,
    timeseries,
    variables,
)

# The plugin pods on a node (an unscheduled one has no node to show in a timeline).
BOUND_PLUGIN_PODS = PLUGIN_PODS + ', node!=""'


def fleet() -> Board:
    node_link = {
        "title": "Open the node drill-down",
        "url": f"/d/{NODE_UID}/ate-devplugin-node?${{datasource:queryparam}}&${{cluster:queryparam}}"
        "&${job:queryparam}&var-node=${__value.raw}&${__url_time_range}",
    }
    status = [
        stat(
            "Daemons up",
            "Daemons whose last scrape succeeded, and the nodes the DaemonSet should run on (its desired "
            "number, from kube-state-metrics; not shown without it). Fewer up than expected: see Daemons down.",
            [
                target(f"count({daemons_up()} == 1) or vector(0)", "up"),
                target(
                    'sum(kube_daemonset_status_desired_number_scheduled{cluster="$cluster", daemonset=~"$daemonset"})',
                    "expected",
                ),
            ],
        ),
        stat(
            "Daemons down",
            "Daemons whose last scrape failed, and (with kube-state-metrics) plugin pods without a scrape "
            "target: Pending, failed or evicted. Each is a node where the kubelet gets no device updates; alerts "
            'AteDevpluginDown and AteDevpluginPodMissing fire after 5 minutes. "Daemon up, by node" and '
            '"Plugin pods, by node" show which.',
            [
                target(
                    f"(count({daemons_up()} == 0) or vector(0)) + (count({PODS_WITHOUT_TARGET}) or vector(0))",
                    "down",
                )
            ],
            steps=OK_IF_ZERO,
        ),
        stat(
            "Nodes with the device",
            "Nodes where at least one configured device node (e.g. /dev/kvm) exists under the device root.",
            [target(f"count(count by (node) (ate_devplugin_device_nodes_present{{{RES}}} > 0)) or vector(0)", "nodes")],
        ),
        stat(
            "Registered",
            "Resources (node and resource name pairs) registered with the kubelet with an open ListAndWatch "
            "stream, i.e. offered to the scheduler.",
            [target(f"count(ate_devplugin_registered{{{RES}}} == 1) or vector(0)", "registered")],
        ),
        stat(
            "Not registered",
            "Resources whose device is present on the node but that are not registered with the kubelet: "
            "pods needing the device cannot land there. Alert AteDevpluginNotRegistered fires after 10 minutes; "
            'the "Nodes" table and "Registered, by node" show which nodes and since when.',
            [
                target(
                    f"count((ate_devplugin_registered{{{RES}}} == 0) and on (job, instance, resource_name) "
                    f"(ate_devplugin_device_nodes_present{{{RES}}} > 0)) or vector(0)",
                    "not registered",
                )
            ],
            steps=OK_IF_ZERO,
        ),
        stat(
            "Healthy units",
            "Units advertised healthy to the kubelets, summed over the selected nodes and resources.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}}) or vector(0)', "healthy")],
            "short",
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Unhealthy units",
            "Units advertised unhealthy: the resource was present but its device node is now missing. "
            "Alert AteDevpluginDevicesUnhealthy fires after 5 minutes.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}}) or vector(0)', "unhealthy")],
            "short",
            steps=OK_IF_ZERO,
        ),
        stat(
            "Failed Allocate calls",
            "Allocate calls answered with an error over the dashboard's time range; each is a container the "
            'kubelet could not start. See "Failed Allocate, by node and code".',
            [
                target(
                    f'sum(increase(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__range])) or vector(0)',
                    "failed",
                )
            ],
            "short",
            steps=OK_IF_ZERO,
        ),
    ]
    nodes = [
        table(
            "Nodes",
            "One row per node and resource, now, each column a problem (0 is fine): device nodes absent, "
            "not registered, unhealthy units, and failures over the dashboard's time range (rounded: "
            "increase() extrapolates); then Since: how long the devices have had the health they have now "
            "(absent or present), from their last change. Sorted with nodes that are not registered first; "
            "the node name links to the node drill-down.",
            [
                target(
                    f"max by (node, resource_name) (ate_devplugin_device_nodes_present{{{RES}}} == bool 0)",
                    instant=True,
                ),
                target(f"max by (node, resource_name) (ate_devplugin_registered{{{RES}}} == bool 0)", instant=True),
                target(
                    f'max by (node, resource_name) (ate_devplugin_devices{{{RES}, health="unhealthy"}})', instant=True
                ),
                target(
                    f"round(sum by (node, resource_name) "
                    f'(increase(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__range])))',
                    instant=True,
                ),
                target(
                    f"round(sum by (node, resource_name) "
                    f'(increase(ate_devplugin_registrations_total{{{RES}, result!="success"}}[$__range])))',
                    instant=True,
                ),
                target(
                    "max by (node, resource_name) "
                    f"(time() - (ate_devplugin_device_health_last_change_timestamp_seconds{{{RES}}} > 0))",
                    instant=True,
                ),
            ],
            {
                "node": "Node",
                "resource_name": "Resource",
                "#A": "Device absent",
                "#B": "Not registered",
                "#C": "Unhealthy units",
                "#D": "Failed Allocate",
                "#E": "Failed registrations",
                "#F": "Since",
            },
            styles={
                "Node": ColumnStyle(link=node_link),
                "Since": ColumnStyle(unit="s"),
                "Device absent": ColumnStyle(mappings=YES_IS_BAD, steps=OK_IF_ZERO),
                "Not registered": ColumnStyle(mappings=YES_IS_BAD, steps=OK_IF_ZERO),
                **{
                    col: ColumnStyle(steps=OK_IF_ZERO)
                    for col in ("Unhealthy units", "Failed Allocate", "Failed registrations")
                },
            },
            sort_by="Not registered",
            problems=True,
        ),
        state_timeline(
            "Daemon up, by node",
            "Whether each node's daemon answered its scrapes, over time: when a daemon went down and came back. "
            "With kube-state-metrics a node whose plugin pod has no scrape target (Pending, failed, evicted) "
            "is down too, where otherwise it would drop out of this view.",
            [
                target(
                    f"max by (node) {daemons_up()} or max by (node) ({pod_reporting(BOUND_PLUGIN_PODS)})",
                    "{{node}}",
                )
            ],
            UP,
        ),
        state_timeline(
            "Registered, by node",
            "Whether each node's resource was registered with the kubelet with an open ListAndWatch stream, "
            "over time: when a node stopped offering the device, and since when.",
            [target(f"max by (node, resource_name) (ate_devplugin_registered{{{RES}}})", "{{node}} {{resource_name}}")],
            REGISTERED,
        ),
        state_timeline(
            "Device present, by node",
            "Whether the device nodes of each resource were found under the device root, over time: when a "
            "node lost /dev/kvm (kernel module unloaded, host change) and since when.",
            [
                target(
                    f"max by (node, resource_name) (ate_devplugin_device_nodes_present{{{RES}}} > bool 0)",
                    "{{node}} {{resource_name}}",
                )
            ],
            PRESENT,
        ),
        table(
            "Plugin pods, by node",
            "Every pod of the release's DaemonSets (kube-state-metrics; empty without it) with its phase, and "
            "whether it is not reporting: no scrape target (Pending, failed, evicted) or a failing scrape. "
            "Alert AteDevpluginPodMissing fires for a pod without a target after 5 minutes.",
            [
                target(
                    f"max by (node, pod, phase) ((1 - ({pod_reporting()})) * on (namespace, pod) group_left (phase) "
                    '(kube_pod_status_phase{cluster="$cluster"} == 1))',
                    instant=True,
                )
            ],
            {"node": "Node", "pod": "Pod", "phase": "Phase", "#A": "Not reporting"},
            styles={"Not reporting": ColumnStyle(mappings=YES_IS_BAD, steps=OK_IF_ZERO)},
            sort_by="Not reporting",
            problems=True,
            width=12,
        ),
    ]
    units = [
        timeseries(
            "Advertised units, by health",
            "Units advertised to the kubelets, by health, summed over the selected nodes. Unhealthy units mean "
            "a device disappeared from a node after it was present.",
            # Unhealthy at the bottom of the stack: healthy (green) is the top line while all is well.
            [
                target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}})', "unhealthy", color=RED),
                target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}})', "healthy", color=GREEN),
            ],
            "short",
            stack=True,
        ),
        timeseries(
            "Unhealthy units, by node",
            "Unhealthy units per node and resource: which nodes lost their device.",
            [
                target(
                    f'sum by (node, resource_name) (ate_devplugin_devices{{{RES}, health="unhealthy"}})',
                    "{{node}} {{resource_name}}",
                    color=RED,
                )
            ],
            "short",
        ),
    ]
    allocate = [
        timeseries(
            "Allocate rate, by code",
            "Allocate calls from the kubelets per second, by gRPC status code (OK is success). One call per "
            "container start that asks for the device.",
            good_and_bad("ate_devplugin_allocate_requests_total", RES, "code", "OK", fn="rate"),
            "reqps",
        ),
        timeseries(
            "Failed Allocate, by node and code",
            "Allocate calls answered with an error, per node, resource and code. INVALID_ARGUMENT: the kubelet "
            "asked for unit IDs this daemon does not advertise (e.g. after a config change shrank units).",
            [
                target(
                    f"sum by (node, resource_name, code) "
                    f'(rate(ate_devplugin_allocate_requests_total{{{RES}, code!="OK"}}[$__rate_interval]))',
                    "{{node}} {{resource_name}} {{code}}",
                    color=RED,
                )
            ],
            "reqps",
        ),
        timeseries(
            "Allocate latency",
            "Median and 99th percentile time the daemons take to answer Allocate, over the selected nodes. "
            "Normally tens of microseconds; alert AteDevpluginAllocateSlow fires over 250ms. Exemplars link "
            "to traces.",
            quantiles(RES, "", 0.5, 0.99, exemplar_on=0.99),
            "s",
        ),
        timeseries(
            "Allocate p99, by node",
            "99th percentile Allocate latency per node: find the node whose daemon is slow.",
            quantiles(RES, "node", 0.99),
            "s",
        ),
    ]
    kubelet = [
        timeseries(
            "Kubelet restarts, by node",
            "Times the kubelet re-created its device plugin socket (a kubelet restart); the daemon registers "
            "again each time. Alert AteDevpluginKubeletRestartsFrequent fires above 3 an hour.",
            [
                target(
                    f"sum by (node) (increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval]))",
                    "{{node}}",
                )
            ],
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
        ),
        timeseries(
            "Registration attempts, by result",
            "Register calls to the kubelets by result: success, or why it failed (unavailable, timeout, "
            "rejected, error).",
            good_and_bad("ate_devplugin_registrations_total", RES, "result", "success"),
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
            stack=True,
        ),
        timeseries(
            "Registration failures, by node",
            "Failed Register calls per node, resource and reason. Alert AteDevpluginRegistrationFailing fires "
            "when they keep coming for 10 minutes.",
            [
                target(
                    f"sum by (node, resource_name, result) "
                    f'(increase(ate_devplugin_registrations_total{{{RES}, result!="success"}}[$__rate_interval]))',
                    "{{node}} {{resource_name}} {{result}}",
                    color=RED,
                )
            ],
            "short",
            width=8,
            height=10,  # room for a legend of every node and reason
            bars=True,
        ),
        timeseries(
            "Config reloads, by result",
            "Live reloads of the device configuration; a failure keeps the previous configuration running "
            "(alert AteDevpluginConfigReloadFailing).",
            good_and_bad("ate_devplugin_config_reloads_total", DAEMON, "result", "success"),
            "short",
            bars=True,
        ),
        table(
            "Versions",
            "Daemons per version and revision: the state of a rollout.",
            [
                target(
                    f"count by (version, revision, python_version) (ate_devplugin_build_info{{{DAEMON}}})", instant=True
                )
            ],
            {"#A": "Daemons", "version": "Version", "revision": "Revision", "python_version": "Python"},
            width=12,
        ),
    ]
    return Board(
        FLEET_UID,
        "ate-devplugin / Fleet",
        "Which nodes lost the device, are not registered with the kubelet, or fail Allocate, and since when.",
        [
            ("Fleet status", status),
            ("By node", nodes),
            ("Units", units),
            ("Allocate", allocate),
            ("Kubelet and registration", kubelet),
        ],
        # Closed: the DRA driver is off by default (dra.mode), so a default install shows no empty row. The Pods
        # rows (--pod-resources, now on by default) are closed too: the pictures' bench serves no PodResources.
        collapsed=[("Pods", fleet_pods()), ("DRA driver", fleet_dra()), ("KVM probe", fleet_kvm())],
        variables=[*variables(multi_node=True), DAEMONSET],
    )
