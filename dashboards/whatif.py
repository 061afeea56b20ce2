"""The dashboard's what-if panel: what a pool would save against what it would hold, per byte cap.

For each leg that recorded one process whose checkpoints all mapped fresh buffers (a pool-off leg:
no checkpoint above 32 MiB reused one, as a pool's hits do), its
buffers are replayed (analyzers/whatif.py) against llama.cpp PR #201's policy at a range of byte
caps (default_caps: 0, then multiples of the largest checkpoint up to where nothing changes), the
other rules as PR #201 has them. Left: fill time saved on CPU (wall where CPU time was not
recorded); right: the most the pool would hold. A dotted line marks PR #201's own cap (1/16 of the
host's memory) where the trace recorded the host's memory and it lies on the axis.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptrace.analyzers.whatif import POLICIES, default_caps, replay_input, sweep
from ckptrace.core.errors import AnalysisError
from ckptrace.core.units import MIB

from .legs import Leg
from .figure import Panel, layout


def whatif_panel(legs: list[Leg]) -> Panel:
    policy = POLICIES["pr201"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["fill time a pool would save (ms)", "the most it would hold (MiB)"])
    drawn, notes, wall = 0, [], []
    for leg in legs:
        if len(leg.analysis.processes) > 1:
            notes.append(f"{leg.name} holds several processes: `ckptrace whatif` replays each.")
            continue
        inp = replay_input(leg.analysis)
        if not len(inp.gets) or inp.reused:
            continue  # a pool-on leg (checkpoints reused buffers), or no buffer mapped
        caps = default_caps(inp, policy)
        try:
            curve = sweep(inp, policy, "cap-bytes", caps)
        except AnalysisError as e:  # a damaged trace: say so, draw the rest
            notes.append(f"{leg.name}: {e}")
            continue
        cpu = curve["fill_cpu_saved_ns"]
        saved = (cpu if cpu.notna().all() else curve["fill_saved_ns"]).astype("float64") / 1e6
        if not cpu.notna().all():
            wall.append(leg.name)
        x = curve["cap_bytes"] / MIB
        hover = [f"cap {c:.0f} MiB: {h} of {g} hits, {s:.1f} ms saved, pooled at most {p / MIB:.1f} MiB"
                 for c, h, g, s, p in zip(x, curve["hits"], curve["gets"], saved, curve["pooled_hwm_bytes"])]
        for col, y in ((1, saved), (2, curve["pooled_hwm_bytes"] / MIB)):
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", line=dict(shape="hv", color=leg.colour),
                                     name=leg.name, legendgroup=leg.name, showlegend=col == 1, text=hover,
                                     hovertemplate="%{text}<extra>" + leg.name + "</extra>"), row=1, col=col)
        if inp.host_memory is not None:
            pr201 = policy.cap_bytes(inp.host_memory) / MIB
            if pr201 <= float(x.max()):
                for col in (1, 2):
                    fig.add_vline(x=pr201, line=dict(color=leg.colour, dash="dot"), row=1, col=col)
        drawn += 1
    if not drawn:
        return Panel(None, "no leg recorded one process whose checkpoints all mapped fresh buffers (a pool-off leg)",
                     notes)
    fig.update_xaxes(title_text="byte cap (MiB)", rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    layout(fig, "What a pool would do (PR #201's rules at each byte cap, replayed on the pool-off legs; "
                 "dotted: PR #201's own cap)", 460)
    if wall:
        notes.append("On-CPU time not recorded in " + ", ".join(wall) + ": the saving shown is wall time.")
    return Panel(fig, notes=notes)
