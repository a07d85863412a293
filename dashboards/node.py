"""The Node board: one node's daemon, its registration, devices, Allocate and process."""

from __future__ import annotations

from dashboards.dra import node_dra
from dashboards.kvm import node_kvm
from dashboards.model import Annotation, Board
from dashboards.pods import node_pods
from dashboards.vocabulary import (
    DAEMON,
    GREEN,
    NODE_UID,
    OK_IF_POSITIVE,
    OK_IF_ZERO,
    RED,
    REGISTERED,
    RES,
    UP,
    daemons,
    daemons_up,
    good_and_bad,
    quantiles,
    stat,
    state_timeline,
    target,
    timeseries,
    variables,
)


def node() -> Board:
    status = [
        stat(
            "Daemon",
            "Whether Prometheus can scrape this node's daemon right now.",
            [target(f"max{daemons_up()}", "daemon")],
            steps=OK_IF_POSITIVE,
            mappings=UP,
        ),
        stat(
            "Registered",
            "Per resource: registered with the kubelet and the kubelet holds the ListAndWatch stream "
            "(what /readyz reports).",
            [target(f"max by (resource_name) (ate_devplugin_registered{{{RES}}})", "{{resource_name}}")],
            steps=OK_IF_POSITIVE,
            mappings=REGISTERED,
            width=4,
        ),
        stat(
            "Device nodes",
            "Device nodes found under the device root, per resource. 0 means the device is absent on this node.",
            [target(f"max by (resource_name) (ate_devplugin_device_nodes_present{{{RES}}})", "{{resource_name}}")],
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Healthy units",
            "Units advertised healthy to the kubelet; 0 (red): the scheduler places no pod needing the device here.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="healthy"}})', "healthy")],
            "short",
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Unhealthy units",
            "Units advertised unhealthy: the device was present and is now missing.",
            [target(f'sum(ate_devplugin_devices{{{RES}, health="unhealthy"}})', "unhealthy")],
            "short",
            steps=OK_IF_ZERO,
        ),
        stat(
            "Streams",
            "Open ListAndWatch streams; the kubelet holds one per registered resource.",
            [target(f"sum(ate_devplugin_list_and_watch_streams{{{RES}}})", "streams")],
            steps=OK_IF_POSITIVE,
        ),
        stat(
            "Uptime",
            "Time since the daemon process started; a small value after an incident means it restarted.",
            [target(f"time() - max({daemons(f'process_start_time_seconds{{{DAEMON}}}')})", "uptime")],
            "s",
        ),
        stat(
            "Version",
            "Version of the daemon running on this node.",
            [target(f"max by (version) (ate_devplugin_build_info{{{DAEMON}}})", "{{version}}")],
            label_as_value="version",
            width=2,
        ),
    ]
    registration = [
        state_timeline(
            "Registered",
            "Registration with the kubelet over time, per resource: when it was lost and when it came back.",
            [target(f"max by (resource_name) (ate_devplugin_registered{{{RES}}})", "{{resource_name}}")],
            REGISTERED,
            width=24,
        ),
        timeseries(
            "Registration attempts, by result",
            "Register calls to the kubelet by result. Repeated failures with a stable reason point at the "
            "kubelet (unavailable, timeout) or at the request (rejected).",
            good_and_bad("ate_devplugin_registrations_total", RES, "result", "success", by="resource_name"),
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
            bars=True,
        ),
        timeseries(
            "Kubelet restarts",
            "Times the kubelet re-created its socket; each is followed by a new registration.",
            [
                target(
                    f"sum(increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval]))",
                    "kubelet restarts",
                )
            ],
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
            bars=True,
        ),
        timeseries(
            "ListAndWatch streams",
            "Open ListAndWatch streams per resource. 0 while registered means the kubelet dropped the stream.",
            [target(f"sum by (resource_name) (ate_devplugin_list_and_watch_streams{{{RES}}})", "{{resource_name}}")],
            "short",
            width=8,
            height=10,  # room for the legend of every resource and reason
        ),
    ]
    devices = [
        timeseries(
            "Advertised units, by health",
            "Units advertised to the kubelet per resource and health.",
            [
                target(
                    f'sum by (resource_name) (ate_devplugin_devices{{{RES}, health="{health}"}})',
                    f"{{{{resource_name}}}} {health}",
                    color=color,
                )
                for health, color in (("healthy", GREEN), ("unhealthy", RED))
            ],
            "short",
            width=8,
        ),
        timeseries(
            "Device health changes",
            "Changes of advertised health, by the new health: a device node disappearing or coming back.",
            [
                target(
                    f"sum by (resource_name) (increase(ate_devplugin_device_health_changes_total"
                    f'{{{RES}, health="{health}"}}[$__rate_interval]))',
                    f"{{{{resource_name}}}} became {health}",
                    color=color,
                )
                for health, color in (("healthy", GREEN), ("unhealthy", RED))
            ],
            "short",
            width=8,
            bars=True,
        ),
        timeseries(
            "Device list updates sent",
            "Device lists sent to the kubelet on ListAndWatch per second: one at registration, then one per "
            "health change.",
            [
                target(
                    f"sum by (resource_name) "
                    f"(rate(ate_devplugin_list_and_watch_updates_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}}",
                )
            ],
            "ops",
            width=8,
        ),
    ]
    allocate = [
        timeseries(
            "Allocate rate, by code",
            "Allocate calls per second, by resource and gRPC status code (OK is success).",
            good_and_bad("ate_devplugin_allocate_requests_total", RES, "code", "OK", by="resource_name", fn="rate"),
            "reqps",
            width=8,
        ),
        timeseries(
            "Allocate latency",
            "Median, 90th and 99th percentile time to answer Allocate. Exemplars on p99 link to the trace of a "
            "call when tracing is on.",
            quantiles(RES, "", 0.5, 0.9, 0.99, exemplar_on=0.99),
            "s",
            width=8,
        ),
        timeseries(
            "GetPreferredAllocation rate",
            "GetPreferredAllocation calls per second: the kubelet asks which units to pick before Allocate.",
            [
                target(
                    f"sum by (resource_name) "
                    f"(rate(ate_devplugin_preferred_allocation_requests_total{{{RES}}}[$__rate_interval]))",
                    "{{resource_name}}",
                )
            ],
            "reqps",
            width=8,
        ),
    ]
    process = [
        timeseries(
            "CPU",
            "CPU used by the daemon, in cores. The daemon idles between events; sustained use means a busy loop.",
            [target(f"sum({daemons(f'rate(process_cpu_seconds_total{{{DAEMON}}}[$__rate_interval])')})", "cpu")],
            "percentunit",
            width=6,
        ),
        timeseries(
            "Resident memory",
            "Resident memory of the daemon process; compare with the DaemonSet's memory limit.",
            [target(f"sum({daemons(f'process_resident_memory_bytes{{{DAEMON}}}')})", "rss")],
            "bytes",
            width=6,
        ),
        timeseries(
            "Open file descriptors",
            "Open file descriptors of the daemon (sockets, inotify watches).",
            [target(f"sum({daemons(f'process_open_fds{{{DAEMON}}}')})", "open fds")],
            "short",
            width=6,
        ),
        timeseries(
            "Python GC collections",
            "Garbage collections per second, by generation.",
            [
                target(
                    "sum by (generation) "
                    f"({daemons(f'rate(python_gc_collections_total{{{DAEMON}}}[$__rate_interval])')})",
                    "gen {{generation}}",
                )
            ],
            "ops",
            width=6,
        ),
    ]
    return Board(
        NODE_UID,
        "ate-devplugin / Node",
        "One node's daemon: registration, devices, Allocate and the process.",
        [
            ("Status", status),
            ("Registration", registration),
            ("Devices", devices),
            ("Allocate", allocate),
            ("Process", process),
        ],
        collapsed=[("Pods", node_pods()), ("DRA driver", node_dra()), ("KVM probe", node_kvm())],
        variables=variables(multi_node=False),
        annotations=[
            Annotation(
                "Kubelet restarts",
                f"sum by (node) (increase(ate_devplugin_kubelet_restarts_total{{{DAEMON}}}[$__rate_interval])) > 0",
                "The kubelet on {{node}} re-created its socket",
                "orange",
            ),
            Annotation(
                "Device health changes",
                f"sum by (node, resource_name, health) "
                f"(increase(ate_devplugin_device_health_changes_total{{{RES}}}[$__rate_interval])) > 0",
                "{{resource_name}} became {{health}} on {{node}}",
                "red",
            ),
        ],
    )
