"""The report's sections for the scale benches: the kubelet's cost of our units, the API
server's cost of the DRA driver across a fleet, and the DRA path next to its Go peer."""

from __future__ import annotations

import math
from typing import Any

from bench.controlplane import keeps_shared_devices
from bench.dra_path import DEVICES, EXAMPLE, FLOOR, LABELS, OURS
from bench.fleet import PROJECT_TO


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return ""
    return f"{a / b:.2f}"


# --- the kubelet's cost of our units ----------------------------------------------------


def _slope(rows: list[dict[str, Any]], get: Any) -> float | None:
    """Least-squares slope of ``get(row)`` over total units (per 1,000 units)."""
    pts = [(r["total_units"], get(r)) for r in rows if "na" not in r]
    pts = [(x, y) for x, y in pts if y is not None]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return None if not var else sum((x - mx) * (y - my) for x, y in pts) / var * 1000


def kubelet_cost(data: dict[str, Any]) -> str:
    cost = data.get("kubelet_cost")
    if not cost:
        return ""
    out = [
        "## The kubelet's cost of our units",
        "",
        "The kubelet's real device manager (`tests/kubelet_bench`) next to our daemon serving N "
        "resources of U units each; a fresh namespace per row. *Over the floor*: minus the same "
        "bench with the manager started and no plugin. Go heap: live heap after a GC "
        "(`runtime.MemStats.HeapAlloc`, read inside the bench). CPU: the bench process's "
        "(getrusage) per admission of one unit (at most "
        f"{cost['sizes']['window']} pods active) and per full device list of one resource (its "
        "device node removed or restored). Checkpoint: `kubelet_internal_checkpoint` after the "
        "admissions, which the manager rewrites whole at every admission and every device list.",
        "",
    ]
    for release, rel in cost.get("releases", {}).items():
        floor = rel["floor"]
        out += [
            f"### Kubelet {release} (floor: RSS {_fmt(floor['rss_mib'])} MiB, "
            f"Go heap {_fmt(floor['heap_live_mib'])} MiB)",
            "",
            "| resources x units | units in all | kubelet RSS over the floor | Go heap over the floor "
            "| CPU per admission | CPU per device list | checkpoint, registered | checkpoint after the admissions "
            "| our daemon's RSS |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rel["rows"]:
            if "na" in r:
                out.append(f"| {r['resources']} x {r['units']} | | N/A: {r['na']} | | | | | | |")
                continue
            after = r["after_admissions"]
            out.append(
                f"| {r['resources']} x {r['units']:,} | {r['total_units']:,} "
                f"| {_fmt(after['rss_mib'] - floor['rss_mib'])} MiB "
                f"| {_fmt(after['heap_live_mib'] - floor['heap_live_mib'])} MiB "
                f"| {_fmt(r['admission_cpu_ms'])} ms | {_fmt(r['list_cpu_ms'])} ms "
                f"| {_fmt(r['checkpoint_bytes_registered'] / 1024)} KiB | {_fmt(r['checkpoint_bytes'] / 1024)} KiB "
                f"| {_fmt(r['ours_rss_mib'])} MiB |"
            )
        rows = rel["rows"]
        heap = _slope(rows, lambda r: r["after_admissions"]["heap_live_mib"] * 1024)
        rss = _slope(rows, lambda r: r["after_admissions"]["rss_mib"] * 1024)
        cpu = _slope(rows, lambda r: r["admission_cpu_ms"])
        ckpt = _slope(rows, lambda r: r["checkpoint_bytes"] / 1024)
        out += [
            "",
            f"Per 1,000 units (least squares over every row): kubelet Go heap +{_fmt(heap)} KiB, "
            f"RSS +{_fmt(rss)} KiB, CPU per admission +{_fmt(cpu)} ms, checkpoint +{_fmt(ckpt)} KiB.",
            "",
        ]
    if cost.get("skipped_releases"):
        out.append(f"Not built, so not measured: kubelet {', '.join(cost['skipped_releases'])}.")
        out.append("")
    return "\n".join(out)


# --- the API server's cost of the DRA driver --------------------------------------------


def fleet(data: dict[str, Any]) -> str:
    f = data.get("fleet")
    if not f:
        return ""
    out = ["## The API server's cost of the DRA driver, across a fleet", ""]
    if "na" in f:
        return "\n".join([*out, f"Not run: {f['na']}", ""])
    sizes = f.get("sizes", {})
    out += [
        f"N real daemons (`ate-devplugin run --mode dra`, one node each, own device root and API "
        f"identity, each publishing {f.get('devices_per_node', 32)} devices) against one kube-apiserver "
        f"{f.get('apiserver_version', '')} and etcd, in a private "
        "sandbox; requests counted from the API server's audit log (per node identity), watches "
        "from its `apiserver_longrunning_requests`. Nodes are added to the running fleet. Idle "
        f"window {sizes.get('idle_s')} s (the daemon renews its watch every 300 s); the API server "
        f"stopped for {sizes.get('down_s')} s; requests counted for {sizes.get('storm_s')} s after it "
        "is ready again.",
        "",
        "| nodes | start: requests per node | idle: requests per node per hour | watches per node "
        "| writes per device change | API server restart: requests per node | every node watching "
        "again | daemon retries while it was down, per node | spread of each retry across nodes "
        "| all slices deleted: every node back | writes per node | kube-apiserver RSS | daemon RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in f.get("steps", []):
        idle, change, restart, wipe = s["idle"], s["device_change"], s["restart"], s["wipe"]
        retries = restart["retries_per_node"]
        spread = restart["retry_spread_s"]
        spread_text = ", ".join(_fmt(x) for x in spread[:6]) + " s" if spread else "-"
        watching = restart["every_node_watching_s"]
        watch_text = f"{_fmt(watching)} s" if watching is not None else f"not all: {restart['nodes_watching_again']}"
        out.append(
            f"| {s['nodes']} | {_fmt(s['startup']['requests_per_node'])} "
            f"| {_fmt(idle['requests_per_node_per_hour'])} | {_fmt(idle['watches_per_node'])} "
            f"| {_fmt(change['writes_per_change'])} | {_fmt(restart['requests_per_node_first_window'])} "
            f"({restart.get('failed_requests_first_window', 0)} failed in all) "
            f"| {watch_text} "
            f"| {_fmt(retries['mean'])} ({retries['min']}-{retries['max']}) | {spread_text} "
            f"| {_fmt(wipe['every_node_back_s'])} s | {_fmt(wipe['writes_per_node'])} "
            f"| {_fmt(idle['apiserver_rss_mib'])} MiB | {_fmt(s['daemon_rss_mib']['mean'])} MiB |"
        )
    if f.get("notes", {}).get("capped"):
        out += ["", f"Fleet capped: {f['notes']['capped']}."]
    last = (f.get("steps") or [None])[-1]
    if last:
        out += ["", "Requests by verb and resource (largest fleet):", ""]
        start = last["startup"]
        started = start.get("nodes_started", last["nodes"])
        twice = start.get("nodes_creating_twice", 0)
        out.append(
            f"- start, per node started in that step ({started}): {_counts(start['by_verb_resource'], started)}"
            f"; nodes that created their slice twice: {twice}"
        )
        idle_counts = last["idle"]["by_verb_resource_per_node_per_hour"]
        idle_text = ", ".join(f"{k} {_fmt(v)}" for k, v in idle_counts.items()) or "none"
        out.append(f"- idle, per node per hour: {idle_text}")
        out.append(f"- API server restart, per node: {_counts(last['restart']['by_verb_resource'], last['nodes'])}")
        out.append(f"- all slices deleted, per node: {_counts(last['wipe']['by_verb_resource'], last['nodes'])}")
    p = f.get("projection") or {}
    if p:
        kub = f.get("kubelet") or {}
        kub_idle = kub.get("requests_per_node_per_hour")
        out += [
            "",
            f"### Projected to {PROJECT_TO:,} nodes (per-node figures of {p['from_nodes']} nodes x {PROJECT_TO:,})",
            "",
            "| figure | ate-devplugin (DRA) | the kubelet's own |",
            "|---|---|---|",
            f"| idle requests per second | {_fmt(p['idle_requests_per_s'])} | "
            f"{_fmt(kub_idle * PROJECT_TO / 3600) if kub_idle else '-'} |",
            f"| watches held | {_fmt(p['watches'])} | {_fmt(kub.get('watches', 0) * PROJECT_TO) if kub else '-'} |",
            f"| requests when every daemon starts | {_fmt(p['startup_requests'])} | |",
            f"| API server restart: requests in its first {_fmt(f['sizes']['storm_s'])} s "
            f"| {_fmt(p['restart_requests_first_window'])} ({_fmt(p['restart_requests_per_s_first_window'])}/s) | |",
            f"| all slices deleted: writes to restore them | {_fmt(p['wipe_writes'])} | |",
        ]
        if "apiserver_mib_per_node" in p:
            out.append(
                f"| kube-apiserver memory (linear in nodes) | {_fmt(p['apiserver_extra_mib'])} MiB "
                f"({_fmt(p['apiserver_mib_per_node'] * 1024)} KiB per node) | |"
            )
        out.append("")
        out.append(_kubelet_source(kub))
    out.append("")
    return "\n".join(out)


def _counts(counts: dict[str, int], nodes: int) -> str:
    return ", ".join(f"{k} {_fmt(v / nodes)}" for k, v in counts.items()) or "none"


def _kubelet_source(kub: dict[str, Any]) -> str:
    if not kub:
        return "The kubelet's own per-node load was not measured in this run."
    if "na" in kub:
        return f"The kubelet's own per-node load: not measured ({kub['na']})."
    by = ", ".join(f"{k} {_fmt(v)}" for k, v in kub.get("by_verb_resource_per_node_per_hour", {}).items())
    return (
        f"The kubelet's own: {kub.get('source')}: {_fmt(kub.get('requests_per_node_per_hour'))} requests "
        f"per hour ({by})."
    )


# --- the DRA path next to dra-example-driver --------------------------------------------

DRA_ROWS = (
    ("cold_start_registered", "median_ms", "cold start → registered with the kubelet, median", "ms"),
    ("cold_start_published", "median_ms", "cold start → slices published, median", "ms"),
    ("prepare", "p50_ms", "PrepareResources through the kubelet (1 claim), p50", "ms"),
    ("prepare", "p99_ms", "PrepareResources through the kubelet, p99", "ms"),
    ("prepare", "grpc_NodePrepareResources_mean_ms", "NodePrepareResources alone (kubelet's histogram), mean", "ms"),
    ("prepare", "cpu_ms_per_claim", "driver CPU per prepare + unprepare", "ms"),
    ("unprepare", "p50_ms", "UnprepareResources through the kubelet, p50", "ms"),
    ("unprepare", "p99_ms", "UnprepareResources through the kubelet, p99", "ms"),
    ("kubelet_restart_registered", "median_ms", "kubelet restart → registered again, median", "ms"),
    ("kubelet_restart_slices", "median_ms", "kubelet restart (slices wiped) → slices back, median", "ms"),
    ("idle", "rss_mib", "RSS idle, registered and published", "MiB"),
    ("idle", "cpu_s_per_min", "idle CPU", "CPU s/min"),
    ("idle", "switches_per_s", "idle context switches", "/s"),
    ("kubelet_side", "heap_kib_per_claim", "kubelet Go heap per prepared claim", "KiB"),
    ("kubelet_side", "state_bytes_per_claim", "kubelet DRA checkpoint per prepared claim", "bytes"),
)


def _published(apiserver_version: str) -> str:
    if keeps_shared_devices(apiserver_version):
        return (
            f"The example driver and the floor publish {DEVICES} devices; ours its {DEVICES} slots and its "
            "shareable device (the API server keeps it from 1.36 on)."
        )
    return f"Each publishes {DEVICES} devices (ours its slots alone: this API server drops the shareable device)."


def _dra_value(figs: dict[str, Any], figure: str, key: str, peer: str) -> float | None:
    v = figs.get(figure, {}).get(peer, {})
    x = v.get(key) if isinstance(v, dict) else None
    return float(x) if isinstance(x, int | float) else None


def dra(data: dict[str, Any]) -> str:
    d = data.get("dra_path")
    if not d:
        return ""
    out = ["## The DRA path next to kubernetes-sigs/dra-example-driver", ""]
    if "na" in d:
        return "\n".join([*out, f"Not run: {d['na']}", ""])
    figs = d.get("figures", {})
    example_na = next((v["na"] for v in figs.get("prepare", {}).values() if isinstance(v, dict) and "na" in v), None)
    out += [
        "Each driver on its own node with its own kubelet side: `kubelet-bench dra`, which links the "
        f"kubelet {d.get('kubelet_release')} DRA manager and plugin manager and registers the driver "
        f"through the kubelet's plugin watcher, against one kube-apiserver {d.get('apiserver_version', '')} "
        "holding both nodes' slices and claims (the bench writes each claim's allocation and "
        f"reservation, as the scheduler does). {_published(d.get('apiserver_version', ''))} The floor "
        "(`bench/bare_dra.py`) registers, creates its slice once and answers prepare from a claim GET, "
        "with no checks, metrics, logs or watch.",
        "",
        f"| figure | {LABELS[OURS]} | {LABELS[EXAMPLE]} | ours/peer | {LABELS[FLOOR]} | ours/floor |",
        "|---|---|---|---|---|---|",
    ]
    for figure, key, label, unit in DRA_ROWS:
        ours = _dra_value(figs, figure, key, OURS)
        peer = _dra_value(figs, figure, key, EXAMPLE)
        floor = _dra_value(figs, figure, key, FLOOR)
        if ours is None and peer is None:
            continue
        peer_text = f"{_fmt(peer)} {unit}" if peer is not None else ("N/A" if example_na else "-")
        floor_text = f"{_fmt(floor)} {unit}" if floor is not None else "-"
        out.append(
            f"| {label} | {_fmt(ours)} {unit} | {peer_text} | {_ratio(ours, peer)} | {floor_text} "
            f"| {_ratio(ours, floor)} |"
        )
    if example_na:
        out += ["", f"The example driver did not run: {example_na}."]
    out.append("")
    return "\n".join(out)
