"""The dashboard's requests panel (`dashboard --requests`): what the checkpoints cost each request.

Per leg with a request file: each request's stall inside its time-to-first-token window as
stacked bars (fill, copy, the rest of the checkpoint, restore; analyzers/requests.py computes
them), its TTFT as a marker on a second axis, and a table of p50/p90/p99 per leg. Requests with
no breakdown (failed, or not wholly inside the recording) are left out and counted in a note.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptrace.core.units import ms

from .legs import PHASE_COLOURS, Leg, plain, to_ms
from .figure import ROW_PX, Panel, layout

PARTS = {"ckpt_fill_ns": ("checkpoint fill", PHASE_COLOURS["fill"]),
         "ckpt_copy_ns": ("checkpoint copy", PHASE_COLOURS["copy"]),
         "ckpt_other_ns": ("checkpoint other", PHASE_COLOURS["other"]),
         "restore_ns": ("restore", PHASE_COLOURS["decode"])}
FIGURES = {"ttft_ns": "TTFT", "stall_ns": "stall in TTFT", "est_ttft_without_fill_ns": "TTFT without fill (est.)"}


def _pcts(values: pd.Series) -> list[str]:
    v = values.dropna().to_numpy("float64")
    if not len(v):
        return ["-"] * 3
    return [ms(x, 1) for x in np.percentile(v, [50, 90, 99])]


def requests_panel(legs: list[Leg], tables: list[pd.DataFrame | None]) -> Panel:
    """`tables`: per leg, analyzers.requests.request_table() or None (no request file)."""
    shown = [(leg, t.loc[t["in_recording"].to_numpy()]) for leg, t in zip(legs, tables) if t is not None]
    if not shown:
        return Panel(None, "no request files (NAME.requests.json beside the traces, or --requests)")
    notes = []
    lacking = [leg.name for leg, t in zip(legs, tables) if t is None]
    if lacking:
        notes.append("Requests panel: no request file for " + ", ".join(lacking) + ".")
    for (leg, rows), t in zip(shown, [t for t in tables if t is not None]):
        if len(rows) < len(t):
            notes.append(f"Requests panel: {leg.name}: {len(t) - len(rows)} of {len(t)} requests have no breakdown "
                         "(failed, or not wholly inside the recording) and are left out.")
    row_px, gap_px = 230, 70
    table_px = 24 + (ROW_PX + 1) * (len(shown) * len(FIGURES) + 1)
    height = 150 + row_px * len(shown) + gap_px * len(shown) + table_px
    fig = make_subplots(rows=len(shown) + 1, cols=1, vertical_spacing=gap_px / height,
                        row_heights=[row_px] * len(shown) + [table_px],
                        specs=[[{"secondary_y": True}]] * len(shown) + [[{"type": "table"}]],
                        subplot_titles=[leg.name for leg, _ in shown] + ["per leg, over requests with a breakdown (ms)"])
    for row, (leg, rows) in enumerate(shown, start=1):
        x = [f"#{r}" for r in rows["request"]]
        for col, (label, colour) in PARTS.items():
            fig.add_trace(go.Bar(x=x, y=to_ms(rows[col].astype("Float64").fillna(0)), name=label, legendgroup=col,
                                 showlegend=row == 1, marker=dict(color=colour, line=dict(width=0)),
                                 hovertemplate="request %{x}: %{y:.2f} ms<extra>" + label + "</extra>"),
                          row=row, col=1, secondary_y=False)
        fig.add_trace(go.Scatter(x=x, y=to_ms(rows["ttft_ns"]), mode="markers", name="time to first token",
                                 legendgroup="ttft", showlegend=row == 1, marker=dict(color="#222", symbol="diamond"),
                                 hovertemplate="request %{x}: TTFT %{y:.1f} ms<extra></extra>"),
                      row=row, col=1, secondary_y=True)
        fig.update_yaxes(title_text="stall ms", row=row, col=1, secondary_y=False)
        fig.update_yaxes(title_text="TTFT ms", row=row, col=1, secondary_y=True, rangemode="tozero")
    cells = [[], [], [], [], []]
    for leg, rows in shown:
        for col, name in FIGURES.items():
            for i, v in enumerate([leg.name, plain(name), *_pcts(rows[col])]):
                cells[i].append(v)
    fig.add_trace(go.Table(columnwidth=[1.4, 1.8, 1, 1, 1],
                           header=dict(values=["leg", "figure", "p50", "p90", "p99"], fill_color="#EEE", align="left"),
                           cells=dict(values=cells, align="left", height=ROW_PX)), row=len(shown) + 1, col=1)
    fig.update_layout(barmode="stack", bargap=0.15)
    layout(fig, "Requests: checkpoint and restore time inside each request's time to first token "
                 "(bars, left axis) and the TTFT (diamonds, right axis)", height)
    notes.append("Requests panel: a span counts only for its part inside a request's window; 'TTFT without fill' "
                 "is an estimate (TTFT minus the fill inside it).")
    return Panel(fig, notes=notes)
