"""The dashboard's memory and per-process panels: checkpoint buffers held and RSS over time, one
line per leg and process, and one table row per process of each leg.

Memory figures come from analyzers/memory.py (held_series, rss_series) on each leg's events; a
leg that recorded several processes draws each process as its own line, named `leg: label`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptrace.analyzers.memory import held_series, rss_series
from ckptrace.analyzers.processes import process_info, process_label
from ckptrace.core.terminal import shown_label
from ckptrace.core.trace import time_origin
from ckptrace.core.units import MIB

from .legs import Leg, plain
from ckptrace.analyzers.metrics import METRICS

from .figure import Panel, layout, table_figure

MAX_STEPS = 5_000  # points per line; past it, the highest value of each time bin (peaks stay)


def _steps(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """A step series thinned to MAX_STEPS bins keeping each bin's maximum."""
    if len(t) <= MAX_STEPS:
        return t, v, False
    bins = np.linspace(t[0], t[-1], MAX_STEPS + 1)
    idx = np.clip(np.searchsorted(bins, t, side="right") - 1, 0, MAX_STEPS - 1)
    s = pd.DataFrame({"b": idx, "t": t, "v": v}).groupby("b").agg(t=("t", "first"), v=("v", "max"))
    return s["t"].to_numpy(), s["v"].to_numpy(), True


def _shade(colour: str, k: int, n: int) -> str:
    """The leg's colour for its k-th of n processes: lighter towards white, the first unchanged."""
    if n <= 1 or not k:
        return colour
    f = 0.6 * k / (n - 1) if n > 1 else 0.0
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * f):02X}" for c in rgb)


def _names(leg: Leg) -> dict[int, str]:
    infos = process_info(leg.analysis.trace, leg.analysis.rows.per_pid.index)
    if len(infos) <= 1:
        return {p.pid: leg.name for p in infos}
    return {p.pid: f"{leg.name}: {plain(shown_label(process_label(p)))}" for p in infos}


def memory_panel(legs: list[Leg]) -> Panel:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=False, vertical_spacing=0.14,
                        subplot_titles=["checkpoint buffers held (mapped in a checkpoint, not yet unmapped)",
                                        "resident set size (kmem:rss_stat)"])
    drawn, thinned, no_rss, shown = 0, False, [], set()
    for leg in legs:
        ev = leg.analysis.rows.of_group("memory")  # the syscall and rss rows, all that memory.py reads
        t0 = time_origin(leg.meta, leg.analysis.rows.start_ns)
        names = _names(leg)
        for row, (series, col) in enumerate(((held_series(ev), "held_bytes"), (rss_series(ev), "rss_bytes")), 1):
            if row == 2 and not len(series):
                no_rss.append(leg.name)
            order = list(names)
            for pid, s in series.groupby("pid", sort=True):
                k = order.index(int(pid)) if int(pid) in order else 0
                t, v, cut = _steps((s["t_ns"].to_numpy() - t0) / 1e9, s[col].to_numpy() / MIB)
                thinned |= cut
                name = names.get(int(pid), f"{leg.name}: pid {int(pid)}")
                fig.add_trace(go.Scatter(x=t, y=v, mode="lines", line=dict(shape="hv", color=_shade(leg.colour, k, len(order)),
                                                                           dash="solid" if row == 1 else "dot"),
                                         name=name, legendgroup=name, showlegend=name not in shown,
                                         hovertemplate="%{y:.1f} MiB at %{x:.3f} s<extra>" + name + "</extra>"),
                              row=row, col=1)
                shown.add(name)
                drawn += 1
    if not drawn:
        return Panel(None, "no checkpoint buffer was mapped and no RSS was recorded")
    if len(no_rss) == len(legs):  # an empty chart says why
        fig.add_annotation(text="RSS not recorded (record --rss-step 0, or an older trace)", xref="x2 domain",
                           yref="y2 domain", x=0.5, y=0.5, showarrow=False, font=dict(size=14, color="#777"))
    fig.update_xaxes(title_text="seconds since the probes were in place")
    fig.update_yaxes(title_text="MiB", rangemode="tozero")
    layout(fig, "Memory over time: what checkpoints hold, and the process's RSS (per leg and process)", 620)
    notes = []
    if thinned:
        notes.append(f"Memory lines past {MAX_STEPS} steps show each time bin's highest value.")
    if no_rss:
        notes.append("RSS not recorded in " + ", ".join(no_rss) + " (record --rss-step 0, or an older trace).")
    return Panel(fig, notes=notes)


def processes_panel(legs: list[Leg]) -> Panel:
    """One column per process of each leg: its own checkpoints, times and memory peaks."""
    rows = [(leg, p) for leg in legs for p in leg.analysis.processes]
    if not any(len(leg.analysis.processes) > 1 for leg in legs):
        return Panel(None, "every leg recorded one process")
    mib = lambda b: "-" if b is None else f"{b / MIB:.1f}"  # noqa: E731
    ms = lambda s, k: "-" if s["stats"][k]["mean"] is None else f"{s['stats'][k]['mean'] / 1e6:.2f}"  # noqa: E731
    header = [f"{leg.name}: {plain(shown_label(p['label']))}" for leg, p in rows]
    fields = [
        ("pid", lambda p: str(p["pid"])),
        ("executable", lambda p: plain(p["executable"] or "-")),
        ("build-id", lambda p: plain((p["build_id"] or "-")[:16])),
        ("checkpoints", lambda p: str(p["summary"]["checkpoints"])),
        ("pool hits", lambda p: str(p["summary"]["pool_hits"])),
        *((f"mean {METRICS[k].heading}", lambda p, k=k: ms(p["summary"], k))
          for k in ("checkpoint_fill_ns", "checkpoint_copy_ns", "checkpoint_total_ns")),
        ("held at peak MiB", lambda p: mib(p["memory"]["peak_held_bytes"])),
        ("RSS at peak MiB", lambda p: mib(p["memory"]["peak_rss_bytes"])),
        ("exited early", lambda p: "yes" if p.get("exited_ns") else "no"),
    ]
    table = [(name, [fn(p) for _, p in rows]) for name, fn in fields]
    return Panel(table_figure("Per process (each leg's processes apart)", ["", *header], table))
