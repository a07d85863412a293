"""The markdown report and the latency chart, from one result file."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import machine, report_scale
from bench.peers import BARE_PLUGIN, BARE_SYNC_PLUGIN, GDP, PEER_LABELS

REPO = Path(__file__).resolve().parents[1]
NOT_MEASURED = "-"
# Where ours should stand next to the Python floor (the bare grpc.aio plugin): CPU per
# admission, idle RSS, cold start.
FLOOR_TARGET = 1.1
COLUMNS = (
    "ours",
    "ours-tracing",
    "ours-restarted",
    GDP,
    f"{GDP}-restarted",
    "go-stub",
    "go-stub-pref",
    BARE_PLUGIN,
    BARE_SYNC_PLUGIN,
    "bare-grpc-aio",
    "bare-grpc-aio-stream",
)


@dataclass(frozen=True)
class Row:
    figure: str
    label: str
    get: Callable[[dict[str, Any]], float | None]
    unit: str
    higher_is_better: bool = False


def _f(key: str) -> Callable[[dict[str, Any]], float | None]:
    def get(v: dict[str, Any]) -> float | None:
        x = v.get(key)
        return float(x) if isinstance(x, int | float) else None

    return get


def _nested(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    def get(v: dict[str, Any]) -> float | None:
        cur: Any = v
        for k in keys:
            if not isinstance(cur, dict) or k not in cur:
                return None
            cur = cur[k]
        return float(cur) if isinstance(cur, int | float) else None

    return get


def rows(data: dict[str, Any]) -> list[Row]:
    sizes = data.get("sizes", {})
    conc = sizes.get("concurrency", 16)
    growth = sizes.get("growth", [1, 10, 64])
    pods = sizes.get("window", 100)
    out = [
        Row(
            "allocate_kubelet_seq",
            f"Allocate via kubelet, {sizes.get('seq_pods')} sequential pods: p50",
            _f("p50_ms"),
            "ms",
        ),
        Row("allocate_kubelet_seq", "Allocate via kubelet, sequential: p99", _f("p99_ms"), "ms"),
        Row(
            "allocate_kubelet_seq",
            "Allocate RPC alone, kubelet's own histogram: mean",
            _f("kubelet_alloc_rpc_mean_ms"),
            "ms",
        ),
        Row("allocate_rpc_seq", "Allocate at the socket (kubelet's gRPC client), 1 caller: p50", _f("p50_ms"), "ms"),
        Row("allocate_rpc_seq", "Allocate at the socket, 1 caller: p99", _f("p99_ms"), "ms"),
        Row("allocate_rpc_conc", f"Allocate at the socket, {conc} concurrent callers: p50", _f("p50_ms"), "ms"),
        Row("allocate_rpc_conc", f"Allocate at the socket, {conc} concurrent callers: p99", _f("p99_ms"), "ms"),
        Row(
            "allocate_rpc_conc",
            f"Allocate at the socket, {conc} concurrent callers: throughput",
            _f("calls_per_s"),
            "calls/s",
            True,
        ),
        Row("admission_cpu", "CPU per admission through the kubelet", _f("cpu_ms_per_admission"), "ms"),
    ]
    out += [
        Row(
            "allocate_rpc_scaling",
            f"Allocate at the socket, {n} caller(s): throughput",
            _nested("callers", str(n), "calls_per_s"),
            "calls/s",
            True,
        )
        for n in sizes.get("concurrency_levels", [])
    ]
    for suffix, where in (("_empty", "empty node"), ("", f"{pods} pods holding a unit")):
        for stat, key in (("median", "median_ms"), ("max", "max_ms")):
            out += [
                Row(f"kubelet_restart{suffix}", f"Kubelet restart → full allocatable, {where}: {stat}", _f(key), "ms"),
                Row(f"device_loss{suffix}", f"Device node removed → allocatable 0, {where}: {stat}", _f(key), "ms"),
                Row(f"device_return{suffix}", f"Device node restored → full, {where}: {stat}", _f(key), "ms"),
                Row(f"update_floor{suffix}", f"(reference) pushed update → kubelet, {where}: {stat}", _f(key), "ms"),
            ]
    out += [
        Row("cold_start", "Cold start → registered (full allocatable): median", _f("median_ms"), "ms"),
        Row("cold_start", "Cold start → registered: max", _f("max_ms"), "ms"),
        Row("memory", "RSS after registration", _f("rss_registered_mib"), "MiB"),
        Row("memory", f"RSS after {sizes.get('mem_allocs')} allocations", _f("rss_after_allocs_mib"), "MiB"),
        Row("memory", "RSS peak, second half of the allocations minus first half", _f("peak_growth_mib"), "MiB"),
    ]
    out += [
        Row("memory_growth", f"RSS with {n} resource(s)", _nested("resources", str(n), "rss_mib"), "MiB")
        for n in growth
    ]
    out += [
        Row("memory_growth", "RSS per extra resource", _f("per_extra_resource_mib"), "MiB"),
        Row("idle", "RSS idle, registered", _f("rss_mib"), "MiB"),
        Row("idle", "Idle CPU", _f("cpu_s_per_min"), "CPU s/min"),
        Row("idle", "Idle context switches (median window)", _f("switches_per_min"), "per min"),
        Row("idle", "Idle context switches (median window)", _f("switches_per_s"), "per s"),
        Row("idle", "Idle context switches of our own threads (Python)", _f("own_switches_per_min"), "per min"),
        Row("metrics_scrape", "/metrics scrape (OpenMetrics + gzip, as Prometheus asks): p50", _f("p50_ms"), "ms"),
        Row("metrics_scrape", "/metrics scrape (OpenMetrics + gzip): p99", _f("p99_ms"), "ms"),
        Row("metrics_scrape", "/metrics scrape, plain text: p50", _nested("plain", "p50_ms"), "ms"),
        Row("metrics_scrape", "/metrics body, plain text", _nested("plain", "bytes"), "bytes"),
    ]
    return out


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _cell(row: Row, fig: dict[str, Any], peer: str, ours: float | None, notes: dict[str, int]) -> str:
    v = fig.get(peer)
    if v is None:
        return NOT_MEASURED
    if "na" in v:
        why = str(v["na"])
        n = notes.setdefault(why, len(notes) + 1)
        return f"N/A[^na{n}]"
    x = row.get(v)
    if x is None:
        return NOT_MEASURED
    text = f"{_fmt(x)} {row.unit}"
    if peer != "ours" and ours is not None and x > 0 and not math.isnan(x):
        text += f" (ours/peer {ours / x:.2f})"
    return text


def table(data: dict[str, Any]) -> tuple[str, dict[str, int]]:
    figures = data["figures"]
    notes: dict[str, int] = {}
    present = [c for c in COLUMNS if any(c in f for f in figures.values())]
    head = "| figure | " + " | ".join(PEER_LABELS.get(c, c) for c in present) + " |"
    lines = [head, "|---" * (len(present) + 1) + "|"]
    for row in rows(data):
        fig = figures.get(row.figure, {})
        if not fig:
            continue
        ov = fig.get("ours")
        ours = row.get(ov) if isinstance(ov, dict) and "na" not in ov else None
        cells = [_cell(row, fig, c, ours, notes) for c in present]
        if all(c == NOT_MEASURED for c in cells):
            continue
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines), notes


# -- targets -------------------------------------------------------------------------


def _get(data: dict[str, Any], figure: str, peer: str, *keys: str) -> float | None:
    cur: Any = data["figures"].get(figure, {}).get(peer)
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return float(cur) if isinstance(cur, int | float) else None


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the suite with what was measured and whether it holds."""
    out: list[dict[str, Any]] = []

    def add(name: str, measured: str, met: bool | None) -> None:
        out.append({"target": name, "measured": measured, "met": met})

    peers_alloc = [p for p in ("go-stub", "go-stub-pref") if _get(data, "allocate_kubelet_seq", p, "p50_ms")]
    ours_p50 = _get(data, "allocate_kubelet_seq", "ours", "p50_ms")
    if ours_p50 is not None and peers_alloc:
        best = min(peers_alloc, key=lambda p: _get(data, "allocate_kubelet_seq", p, "p50_ms") or math.inf)
        bp = _get(data, "allocate_kubelet_seq", best, "p50_ms") or math.nan
        stub = _get(data, "allocate_kubelet_seq", "go-stub", "p50_ms") or math.nan
        add(
            "Allocate p50 (via kubelet) at most 1.3 times the Go stub's",
            f"{_fmt(ours_p50)} ms vs {_fmt(stub)} ms (ratio {ours_p50 / stub:.2f}); "
            f"best peer {best}: ratio {ours_p50 / bp:.2f}",
            ours_p50 <= 1.3 * stub,
        )
    p99 = _get(data, "allocate_kubelet_seq", "ours", "p99_ms")
    c99 = _get(data, "allocate_rpc_conc", "ours", "p99_ms")
    if p99 is not None:
        extra = f"; {int(data['sizes']['concurrency'])} concurrent at the socket: {_fmt(c99)} ms" if c99 else ""
        add(
            "Allocate p99 < 10 ms",
            f"{_fmt(p99)} ms sequential via kubelet{extra}",
            p99 < 10 and (c99 is None or c99 < 10),
        )
    pods = data.get("sizes", {}).get("window", 100)
    restart_peers = [p for p in data["figures"].get("kubelet_restart", {}) if p != "ours"]
    peer_medians = {p: _get(data, "kubelet_restart", p, "median_ms") for p in restart_peers}
    shown = ", ".join(f"{p} {_fmt(v)} ms" for p, v in peer_medians.items() if v is not None)
    for suffix, where in (("_empty", "empty node"), ("", f"{pods} pods holding a unit")):
        floor = _get(data, "update_floor" + suffix, "go-stub", "median_ms")
        floor_text = f"kubelet-side floor of one update {_fmt(floor)} ms" if floor is not None else "no floor measured"
        rm = _get(data, "kubelet_restart" + suffix, "ours", "median_ms")
        if rm is not None:
            faster = all(v is None or rm < v for v in peer_medians.values())
            add(
                f"Kubelet restart → full ({where}): median < 50 ms, faster than every peer",
                f"{_fmt(rm)} ms ({shown}; {floor_text})",
                rm < 50 and faster,
            )
        dl = _get(data, "device_loss" + suffix, "ours", "median_ms")
        dr = _get(data, "device_return" + suffix, "ours", "median_ms")
        if dl is not None and dr is not None:
            add(
                f"Device loss and return at the kubelet ({where}): median < 100 ms",
                f"loss {_fmt(dl)} ms, return {_fmt(dr)} ms ({floor_text})",
                max(dl, dr) < 100,
            )
    cs = _get(data, "cold_start", "ours", "median_ms")
    cmax = _get(data, "cold_start", "ours", "max_ms")
    if cs is not None:
        add(
            "Cold start → registered < 1.5 s",
            f"median {_fmt(cs)} ms, max {_fmt(cmax or math.nan)} ms",
            (cmax or cs) < 1500,
        )
    reg = _get(data, "memory", "ours", "rss_registered_mib")
    after = _get(data, "memory", "ours", "rss_after_allocs_mib")
    if reg is not None and after is not None:
        add(
            "RSS < 60 MiB with tracing on",
            f"{_fmt(reg)} MiB registered, {_fmt(after)} MiB after allocations",
            max(reg, after) < 60,
        )
    per = _get(data, "memory_growth", "ours", "per_extra_resource_mib")
    if per is not None:
        add("< 0.5 MiB per extra resource", f"{_fmt(per)} MiB per resource", per < 0.5)
    growth = _get(data, "memory", "ours", "peak_growth_mib")
    if growth is not None:
        add(
            "Memory flat over the allocations (peak of the 2nd half ≤ peak of the 1st half + 1 MiB)",
            f"{_fmt(growth)} MiB",
            growth <= 1.0,
        )
    ours_sw = _get(data, "idle", "ours", "switches_per_s")
    bare_sw = _get(data, "idle", "bare-grpc-aio", "switches_per_s")
    held_sw = _get(data, "idle", "bare-grpc-aio-stream", "switches_per_s")
    own = _get(data, "idle", "ours", "own_switches_per_min")
    if ours_sw is not None and bare_sw is not None:
        held = f"; bare with a stream held open {_fmt(held_sw)}/s" if held_sw is not None else ""
        add(
            "Idle: within 2 context switches/s of a bare grpc.aio server",
            f"{_fmt(ours_sw)}/s vs bare {_fmt(bare_sw)}/s (+{_fmt(ours_sw - bare_sw)}/s){held}",
            ours_sw <= bare_sw + 2,
        )
    if own is not None:
        add("Idle: no wake-ups of our own (the daemon's Python threads)", f"{_fmt(own)} per min", own == 0)
    return out


def peer_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours next to squat/generic-device-plugin, each ratio against its target."""
    out: list[dict[str, Any]] = []
    pods = data.get("sizes", {}).get("window", 100)
    nproc = int(data.get("machine", {}).get("nproc") or 1)

    def row(
        label: str,
        ours: float | None,
        peer: float | None,
        unit: str,
        target: str,
        met: Callable[[float], bool],
        floor: float | None = None,
        near_floor: bool = False,
    ) -> None:
        """``near_floor``: a figure where ours should stay within FLOOR_TARGET of the floor."""
        ratio = ours / peer if ours is not None and peer else None
        floor_ratio = floor / peer if floor is not None and peer else None
        ours_floor = ours / floor if ours is not None and floor else None
        missed = ratio is not None and not met(ratio)
        why = ""
        if missed and floor_ratio is not None:
            # Whether any Python plugin on grpc.aio could meet it: the bare one is the least.
            why = (
                f"the Python floor misses it too ({floor_ratio:.2f})"
                if not met(floor_ratio)
                else f"ours is above the Python floor ({floor_ratio:.2f})"
            )
        out.append(
            {
                "figure": label,
                "ours": None if ours is None else f"{_fmt(ours)} {unit}",
                "peer": None if peer is None else f"{_fmt(peer)} {unit}",
                "floor": None if floor is None else f"{_fmt(floor)} {unit}",
                "floor_ratio": floor_ratio,
                "ours_floor": ours_floor,
                "floor_target": f"≤ {FLOOR_TARGET}" if near_floor else "",
                "floor_met": None if ours_floor is None or not near_floor else ours_floor <= FLOOR_TARGET,
                "ratio": ratio,
                "target": target,
                "met": None if ratio is None else met(ratio),
                "why": why,
            }
        )

    def pair(figure: str, *keys: str, ours: str = "ours", peer: str = GDP) -> tuple[float | None, float | None]:
        return _get(data, figure, ours, *keys), _get(data, figure, peer, *keys)

    def floor(figure: str, *keys: str) -> float | None:
        return _get(data, figure, BARE_PLUGIN, *keys)

    faster = "< 1 (keep the win)"
    o, g = pair("kubelet_restart", "median_ms")
    row(f"kubelet restart → full, {pods} pods (median)", o, g, "ms", faster, lambda r: r < 1)
    o, g = pair("device_loss", "median_ms")
    row(f"device removed → kubelet, {pods} pods (median)", o, g, "ms", faster, lambda r: r < 1)
    o, g = pair("device_return", "median_ms")
    row(f"device restored → kubelet, {pods} pods (median)", o, g, "ms", faster, lambda r: r < 1)
    rc = data["figures"].get("restarts_then_changes", {})
    ours_rc, peer_rc = rc.get("ours", {}), rc.get(GDP, {})
    if "seen" in ours_rc:
        out.append(
            {
                "figure": f"device changes seen after {ours_rc.get('restarts')} kubelet restarts",
                "ours": f"{ours_rc['seen']}/{ours_rc['changes']}",
                "peer": f"{peer_rc['seen']}/{peer_rc['changes']}" if "seen" in peer_rc else None,
                "ratio": None,
                "target": "all seen",
                "met": ours_rc["seen"] == ours_rc["changes"],
            }
        )
    o, g = pair("idle", "switches_per_s")
    row(
        "idle wake-ups per second (context switches, fresh)",
        o,
        g,
        "/s",
        "≤ 1 (zero polling)",
        lambda r: r <= 1,
        floor("idle", "switches_per_s"),
    )
    o, g = pair("idle", "switches_per_s", ours="ours-restarted", peer=f"{GDP}-restarted")
    row("idle wake-ups per second, after those restarts", o, g, "/s", "≤ 1", lambda r: r <= 1)
    o, g = pair("admission_cpu", "cpu_ms_per_admission")
    row(
        "CPU per admission through the kubelet (one Allocate each; GetPreferredAllocation not advertised)",
        o,
        g,
        "ms",
        "≤ 2",
        lambda r: r <= 2,
        floor("admission_cpu", "cpu_ms_per_admission"),
        near_floor=True,
    )
    o, g = pair("idle", "rss_mib")
    rss_floor = floor("idle", "rss_mib")
    row("RSS idle, registered (tracing off)", o, g, "MiB", "≤ 1.6", lambda r: r <= 1.6, rss_floor, near_floor=True)
    o, g = pair("cold_start", "p50_ms")
    cold_floor = floor("cold_start", "p50_ms")
    row("cold start → registered, p50", o, g, "ms", "≤ 2.5", lambda r: r <= 2.5, cold_floor, near_floor=True)
    scaling = data["figures"].get("allocate_rpc_scaling", {})
    levels = [int(n) for n in data.get("sizes", {}).get("concurrency_levels", [])]
    for n in levels:
        o, g = pair("allocate_rpc_scaling", "callers", str(n), "calls_per_s")
        top = n == max(levels)
        row(
            f"Allocate throughput at the socket, {n} caller(s)",
            o,
            g,
            "calls/s",
            "≥ 0.2" if top else "",
            (lambda r: r >= 0.2) if top else (lambda r: True),
            floor("allocate_rpc_scaling", "callers", str(n), "calls_per_s"),
        )
        if not top:
            out[-1]["met"] = None
        sync = _get(data, "allocate_rpc_scaling", BARE_SYNC_PLUGIN, "callers", str(n), "calls_per_s")
        if top and out[-1]["met"] is False and sync is not None and g:
            out[-1]["why"] += f"; on gRPC's sync server the floor is {sync / g:.2f}"
    ours_tp = {int(k): v.get("calls_per_s") for k, v in scaling.get("ours", {}).get("callers", {}).items()}
    if ours_tp and 1 in ours_tp:
        cores = max(n for n in ours_tp if n <= max(nproc, 1))
        grows = cores > 1 and ours_tp[cores] >= 1.1 * ours_tp[1]
        shown = ", ".join(f"{n}: {_fmt(v)}" for n, v in sorted(ours_tp.items()))
        out.append(
            {
                "figure": f"ours: throughput grows with callers up to the cores ({nproc})",
                "ours": shown + " calls/s",
                "peer": None,
                "ratio": None,
                "target": f"{cores} callers ≥ 1.1 times 1 caller",
                "met": grows,
            }
        )
    return out


def _peer_table(data: dict[str, Any]) -> str:
    rows_ = peer_targets(data)
    if not rows_:
        return "(not measured in this run)"
    met = {True: "met", False: "**missed**", None: ""}
    lines = [
        f"| figure | ours | {PEER_LABELS[GDP]} | ours/peer | target (ours/peer) | | Python floor "
        "(bare grpc.aio plugin) | ours/floor | target (ours/floor) | | floor/peer | why missed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        fr = "" if r.get("floor_ratio") is None else f"{r['floor_ratio']:.2f}"
        of = "" if r.get("ours_floor") is None else f"{r['ours_floor']:.2f}"
        lines.append(
            f"| {r['figure']} | {r['ours'] or NOT_MEASURED} | {r['peer'] or NOT_MEASURED} | {ratio} "
            f"| {r['target']} | {met[r['met']]} | {r.get('floor') or ''} | {of} | {r.get('floor_target') or ''} "
            f"| {met[r.get('floor_met')]} | {fr} | {r.get('why') or ''} |"
        )
    peer = data["figures"].get("cold_start", {}).get(GDP, {})
    if "na" in peer:
        lines.append("")
        lines.append(f"The generic-device-plugin did not run: {peer['na']}")
    return "\n".join(lines)


# -- chart -----------------------------------------------------------------------------


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    figures = data["figures"]
    pods = data.get("sizes", {}).get("window", 100)
    colors = {"ours": "#1f77b4", "go-stub": "#d62728", "go-stub-pref": "#ff7f0e", "ours-tracing": "#2ca02c"}
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    ecdfs = [
        ("allocate_kubelet_seq", "Allocate via the kubelet (sequential)"),
        ("allocate_rpc_seq", "Allocate at the socket, 1 caller"),
        ("allocate_rpc_conc", f"Allocate at the socket, {data['sizes'].get('concurrency')} callers"),
    ]
    for ax, (key, title) in zip(axes[0], ecdfs, strict=True):
        for peer, v in figures.get(key, {}).items():
            samples = sorted(v.get("samples_ms", []))
            if not samples:
                continue
            ys = [(i + 1) / len(samples) for i in range(len(samples))]
            ax.step(samples, ys, where="post", label=PEER_LABELS.get(peer, peer), color=colors.get(peer))
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of calls ≤ x")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    strips: Sequence[tuple[str, Sequence[tuple[str, str]]]] = (
        (
            "Kubelet restart → full allocatable",
            [("kubelet_restart_empty", "ours"), ("kubelet_restart", "ours"), ("kubelet_restart", "go-stub")],
        ),
        (
            "Device change → kubelet",
            [
                ("device_loss_empty", "ours"),
                ("update_floor_empty", "go-stub"),
                ("device_loss", "ours"),
                ("device_return", "ours"),
                ("update_floor", "go-stub"),
            ],
        ),
        ("Cold start → registered", [("cold_start", "ours"), ("cold_start", "go-stub")]),
    )
    for ax, (title, series) in zip(axes[1], strips, strict=True):
        labels = []
        for i, (key, peer) in enumerate(series):
            v = figures.get(key, {}).get(peer, {})
            samples = v.get("samples_ms", [])
            name = CHART_NAMES.get(key, PEER_LABELS.get(peer, peer))
            if key.endswith("_empty"):
                name += "\n(empty node)"
            elif key != "cold_start":
                name += f"\n({pods} pods)"
            labels.append(name if samples else f"{name}\n(N/A)")
            if samples:
                ax.boxplot([samples], positions=[i], widths=0.5, showfliers=False)
                jitter = [i + ((j % 7) - 3) * 0.04 for j in range(len(samples))]
                ax.scatter(jitter, samples, s=8, alpha=0.6, color=colors.get(peer, "#555"))
        ax.set_xticks(range(len(series)), labels, fontsize=8)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("ms (log)")
        ax.set_title(title)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    m = data.get("machine", {})
    fig.suptitle(
        f"ate-devplugin vs Go device plugins through the kubelet {data.get('kubelet_release')} device manager "
        f"({data.get('mode')} run, {m.get('nproc')} cores, {m.get('cpu_model')})",
        fontsize=11,
    )
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(
        list(handles.values()), list(handles), loc="upper center", ncol=len(handles), bbox_to_anchor=(0.5, 0.955)
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- markdown ---------------------------------------------------------------------------


def _machine(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    kb = m.get("kubelet_bench", {})
    return "\n".join(
        [
            f"- CPU: {m.get('cpu_model')}, `nproc` = {m.get('nproc')}; memory {m.get('memory_gib')} GiB",
            f"- Kernel: {m.get('kernel')}",
            f"- Python {m.get('python')} ({m.get('python_impl')}), grpcio {m.get('grpcio')}, "
            f"protobuf {m.get('protobuf')}, ate-devplugin {m.get('ate_devplugin')}",
            f"- Python peers' own code (app/, bench/): bytecode {m.get('bytecode', 'not recorded')}, "
            "as the image ships it (compiled at build time)",
            f"- ate-devplugin source: git {m.get('git_revision')}" + _revision_change(m),
            f"- Go: {m.get('go')}; kubelet bench built with {kb.get('go_version')} against k8s.io/kubernetes "
            f"{kb.get('k8s_version')}",
            f"- generic-device-plugin binary: {_go_build(m.get('generic_device_plugin') or {})}",
            f"- dra-example-driver binary: {_go_build(m.get('dra_example_driver') or {})}",
            f"- Load average (1/5/15 min) at start {m.get('loadavg_at_start')}, at end {m.get('loadavg_at_end')}: "
            "absolute numbers move with the machine's load; ratios within one run are what this "
            "report compares.",
            f"- Load average (1 min) before and after each phase: {_phase_load(data)}",
        ]
    )


def _revision_change(m: dict[str, Any]) -> str:
    start, end = m.get("git_revision"), m.get("git_revision_at_end")
    if end is None or start is None or end == start:
        return ""
    if machine.app_differs(REPO, start, end):
        return f" at the start, {end} at the end: app/ changed during the run"
    return f" at the start, {end} at the end (commits outside app/ only)"


def _phase_load(data: dict[str, Any]) -> str:
    load = data.get("loadavg", {})
    phases = [k.split(":")[0] for k in load if k.endswith(":before")]
    parts = [
        f"{name} {load[f'{name}:before'][0]:.1f} → {load.get(f'{name}:after', [math.nan])[0]:.1f}" for name in phases
    ]
    return "; ".join(parts) or "not recorded"


def _go_build(info: dict[str, Any]) -> str:
    if not info:
        return "not given"
    deps = ", ".join(f"{k} {v}" for k, v in info.items() if "/" in k and k != "path")
    main = f"`{info['main']}`, " if "main" in info else ""
    return f"{main}{info.get('go_version')}, {deps}, sha256 {str(info.get('sha256', ''))[:16]}…"


def _idle_threads(data: dict[str, Any]) -> str:
    idle = data["figures"].get("idle", {})
    lines = []
    for peer, v in idle.items():
        if "switches_by_thread" not in v:
            continue
        top = ", ".join(f"`{k}` {n}" for k, n in list(v["switches_by_thread"].items())[:6]) or "none"
        windows = ", ".join(_fmt(r) for r in v.get("switches_per_s_windows", []))
        lines.append(f"- {PEER_LABELS.get(peer, peer)} ({v.get('threads')} threads): {top}; per window: {windows} /s")
    return "\n".join(lines)


CHART_NAMES = {
    "device_loss": "ours: removed",
    "device_loss_empty": "ours: removed",
    "device_return": "ours: restored",
    "update_floor": "stub: pushed",
    "update_floor_empty": "stub: pushed",
}

FINDINGS = Path(__file__).with_name("findings.md")


def _findings(text: str | None = None) -> str:
    """The hand-written analysis (bench/findings.md, or ``text``), if any, shown under the numbers."""
    if text is None:
        text = FINDINGS.read_text() if FINDINGS.exists() else ""
    if not text:
        return ""
    return "\n## Findings (hand-written, from profiling; not regenerated)\n\n" + text.strip() + "\n"


def _ended_early(data: dict[str, Any]) -> str:
    error = data.get("error")
    return f"**The run ended early** ({error}): figures of later phases are missing." if error else ""


def markdown(data: dict[str, Any], chart_name: str, result_rel: str, findings: str | None = None) -> str:
    devices = _devices_part(data, chart_name) if data.get("figures") else ""
    scale = "\n".join(
        part for part in (report_scale.kubelet_cost(data), report_scale.fleet(data), report_scale.dra(data)) if part
    )
    return f"""# Benchmarks: ate-devplugin next to Go device plugins and DRA drivers, through the kubelet

Generated by `{data.get("command")}` ({data.get("mode")} run, {data.get("started_utc")},
{data.get("duration_s")} s; benches: {", ".join(data.get("benches", ["devices"]))}); raw numbers
and every sample in `{result_rel}`.
{_ended_early(data)}
Rerun, as root: `python -m bench run` (full, every bench, about 50 minutes on 2 cores),
`python -m bench run --benches kubelet-cost,fleet,dra` (one or more of devices, kubelet-cost,
fleet, dra) or `python -m bench run --quick` (tiny sizes, what CI runs; its numbers mean nothing).

## Machine

{_machine(data)}
{devices}
{scale}
{_findings(findings)}"""


def _devices_part(data: dict[str, Any], chart_name: str) -> str:
    tbl, notes = table(data)
    tg = targets(data)
    met = {True: "met", False: "**missed**", None: "n/a"}
    target_lines = ["| target | measured (ours) | |", "|---|---|---|"]
    target_lines += [f"| {t['target']} | {t['measured']} | {met[t['met']]} |" for t in tg]
    footnotes = "\n".join(f"[^na{n}]: {why}" for why, n in notes.items())
    notes_text = "\n".join(f"- **{k}**: {v}" for k, v in data.get("notes", {}).items())
    sizes = data.get("sizes", {})
    return f"""
## Peers

Every peer runs in its own private mount namespace next to its own instance of the same
kubelet device manager (our bench `tests/kubelet_bench`, which links
`k8s.io/kubernetes/pkg/kubelet/cm/devicemanager` of release {data.get("kubelet_release")}),
with {sizes.get("window", 100)} or fewer pods active at a time and 4096 devices (units)
per resource for every peer.

- **{PEER_LABELS["ours"]}**: `python -m ate_devplugin run`, log level info, tracing off
  unless the column says otherwise.
- **{PEER_LABELS["go-stub"]}**: `plugin/v1beta1.Stub` from `k8s.io/kubernetes`, one process per
  resource; it logs every Allocate request (klog, to a file) as upstream wrote it.
- **{PEER_LABELS["go-stub-pref"]}**: the same stub advertising GetPreferredAllocation, so the
  kubelet makes two RPCs per admission (ours does so only for a resource configured with
  `preferred_allocation: true`; by default, as here, it does not advertise it).
- **{PEER_LABELS[BARE_PLUGIN]}**: `bench/bare_grpc.py plugin`, the least a Python device
  plugin on grpc.aio does (Register, the unit list once, answers with no checks, metrics,
  tracing or logs; GetPreferredAllocation not advertised): the Python floor of each figure.
  **{PEER_LABELS[BARE_SYNC_PLUGIN]}**: the same answers on gRPC's synchronous server with a
  thread pool (`plugin-sync`), for allocation only: what serving the calls on another
  gRPC server would change.
- **{PEER_LABELS["bare-grpc-aio"]}**: the idle baseline (`bench/bare_grpc.py`); and
  **{PEER_LABELS["bare-grpc-aio-stream"]}**: the same while a client holds one stream
  open, as the kubelet holds ListAndWatch.
- **{PEER_LABELS[GDP]}**: `github.com/squat/generic-device-plugin`, the plugin people run
  for this job, given as a binary (`--generic-device-plugin PATH` or
  `ATE_BENCH_GENERIC_DEVICE_PLUGIN`; built outside this repository, which holds none of
  it; build info under Machine). Same job:
  `ate.dev/kvm`, one device node shared 4096 times (`count: 4096`), mounted at `/dev/kvm`,
  its `--plugin-directory` the namespace's kubelet directory. It polls its devices every
  5 s, its socket every 1 s, and serves again 5 s after its socket goes; it does not
  advertise GetPreferredAllocation. `-restarted` columns: the same processes after the
  kubelet restarts of `restarts_then_changes`.

## Next to squat/generic-device-plugin

Same run, same job, each through its own instance of the kubelet's device manager.
Ratios are ours divided by the peer's; "why missed" says whether the Python floor (the
bare grpc.aio plugin, next column) misses the target as well; the findings below say more.

{_peer_table(data)}

## Results

Each cell: the figure, and for a peer, ours divided by the peer (0.50 = ours takes half as long;
for throughput, higher is better). "-": not measured for that peer; N/A: the peer cannot.

{tbl}

{footnotes}

![Latency distributions]({chart_name})

## Targets

{chr(10).join(target_lines)}

## Who wakes up while idle (context switches per thread over the window)

{_idle_threads(data)}

## How each figure is taken

{notes_text}
- **allocate**: `allocate_kubelet_seq` is the bench's `allocate_s`: the manager's
  `Allocate` (UpdateAllocatedDevices, device choice including GetPreferredAllocation when
  advertised, the Allocate RPC, the checkpoint write), for sequential pods asking 1 unit,
  {sizes.get("block")} pods per peer in turn so that the machine's noise hits every peer alike.
  The kubelet admits pods one at a time and its manager cannot be called concurrently
  (`Allocate` writes maps it does not lock), so concurrency is measured at the plugin's
  socket by the bench's `rpc_load`: the kubelet's gRPC client options and request shapes
  (GetPreferredAllocation over all 4096 IDs when advertised, then Allocate), one shared
  connection, {sizes.get("concurrency")} goroutines.
- **device change**: a `wait` is sent to the bench first (it polls GetCapacity every 1 ms),
  then the node is unlinked (or made again with mknod) under the daemon's device root;
  the figure ends when GetCapacity shows it.
"""


def write(data: dict[str, Any], markdown_path: Path, result_path: Path | None = None) -> None:
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    chart_path = markdown_path.with_name(markdown_path.stem + "-latency.png")
    if data.get("figures"):
        chart(data, chart_path)
        data.setdefault("targets", targets(data))
    rel = os.path.relpath(result_path, markdown_path.parent) if result_path else "(not saved)"
    markdown_path.write_text(markdown(data, chart_path.name, rel))
