"""The dashboard's chart panels: each takes the legs (and the comparison) and returns one plotly figure.

A panel returns `Panel(None, reason)` when the data cannot support it, and adds a note when it
shows less than everything (sampled or binned). Panels only draw what the analyzers computed:
no medians, intervals or verdicts of their own. The table panels (the recordings, the summary,
the header) are tables.py's.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptrace.core.terminal import shown_label
from ckptrace.core.trace import time_origin
from ckptrace.core.units import MIB

from ckptrace.analyzers.checkpoints import BUFFER_SAID
from ckptrace.analyzers.headline import PARTS as TIME_PARTS, time_parts
from ckptrace.analyzers.metrics import label
from ckptrace.analyzers.warmup import AUTO, split

from .figure import ROW_PX, Panel, layout
from .legs import (MAX_BARS, MAX_POINTS, PHASE_COLOURS, VERDICT_COLOURS, Leg, bin_rows,
                   order_statistics, plain, to_ms)

# -- per prefill iteration, stacked over time ---------------------------------------------------

# What a prefill iteration's time is split into, bottom to top; every leg the same way.
PARTS = dict(zip(TIME_PARTS, ("fill (on CPU, excl. faults)", "copy (on CPU, excl. faults)", "page faults",
                              "waiting for a CPU", "other (incl. blocked)")))


def iteration_parts(it: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Each iteration's span split into PARTS (they add up to it), and how many had to be cut
    (analyzers/headline.py time_parts: the same split as the per-arm bars)."""
    return time_parts(it, "span_ns")


def iterations_panel(legs: list[Leg]) -> Panel:
    shown = [leg for leg in legs if len(leg.prefill)]
    if not shown:
        return Panel(None, "no prefill iterations (no update_slots or llama_decode boundary held prompt tokens or a checkpoint)")
    notes = []
    row_px, gap_px = 230, 70
    height = 150 + row_px * len(shown) + gap_px * (len(shown) - 1)
    fig = make_subplots(rows=len(shown), cols=1, vertical_spacing=gap_px / height,
                        subplot_titles=[leg.name for leg in shown])
    split_parts = [iteration_parts(leg.prefill) for leg in shown]
    used = [p for p in PARTS if any((parts[p] > 0).any() for parts, _ in split_parts)]  # legend: what is shown
    for row, (leg, (parts, over)) in enumerate(zip(shown, split_parts), start=1):
        if over:
            notes.append(f"{leg.name}: in {over} iterations the fault time (estimated, never clamped) exceeds its "
                         "phase's time; drawn as the whole phase")
        parts, k = bin_rows(parts, list(PARTS))
        if k > 1:
            notes.append(f"{leg.name} {len(leg.prefill):,} as {len(parts):,} bars of {k}")
        t0 = time_origin(leg.meta, leg.analysis.rows.start_ns)
        x = ((parts["start_ns"].to_numpy() - t0) / 1e9).astype("float32")
        # plotly.js aligns auto ticks to the bars (0.11, 0.246, ...); ask for round steps.
        fig.update_xaxes(tick0=0, dtick=_nice_step(float(x.max() - x.min()) if len(x) else 1.0), row=row, col=1)
        for phase in used:
            label = PARTS[phase]
            fig.add_trace(go.Bar(x=x, y=to_ms(parts[phase]), name=label, legendgroup=phase, showlegend=row == 1,
                                 marker=dict(color=PHASE_COLOURS[phase], line=dict(width=0)),
                                 hovertemplate="%{x:.3f} s: %{y:.2f} ms<extra>" + label + "</extra>"),
                          row=row, col=1)
        fig.update_yaxes(title_text="ms per iteration" if k == 1 else f"ms (mean of {k})", row=row, col=1)
    fig.update_xaxes(title_text="time since recording start (s)", row=len(shown), col=1)
    fig.update_yaxes(matches="y")  # one scale for every leg: a taller bar is a longer iteration
    fig.update_layout(barmode="stack", bargap=0)
    layout(fig, "Prefill iterations over time: where each one's time went (one scale for every leg)", height)
    binned = [n for n in notes if " bars of " in n]
    notes = [n for n in notes if " bars of " not in n]
    if binned:
        notes.append(f"Prefill iterations binned (over {MAX_BARS:,} per leg): each bar is the mean of k "
                     f"consecutive iterations; " + "; ".join(binned) + ".")
    return Panel(fig, notes=notes)


def _nice_step(span: float, ticks: int = 8) -> float:
    """1, 2 or 5 times a power of ten, giving about `ticks` ticks over `span`."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


# -- one iteration as a timeline -----------------------------------------------------------------

MAX_TIMELINE_ROWS = 120


# The state path's spans drawn beside the checkpoints (trace format 3): kind -> its row's name, and
# the kind of the copies inside it (a prompt save's are copy rows of no checkpoint)
STATE_SPANS = {"restore": ("restore", "restore_copy"), "spec_state": ("speculative state", None),
               "prompt_save": ("prompt save", "copy")}
COPY_NAMES = {"restore_copy": "restore copy", "copy": "copy"}


def _chosen_iteration(leg: Leg, warmup=AUTO) -> pd.Series | None:
    """The median prefill iteration with a checkpoint after the warm-up (the warm-up's, when
    there is no other: a longest would pick a warm-up miss); of those, one that also restored,
    else one that saved the prompt, when there is such (so those are drawn too). The median of
    an even count is the lower middle one: an iteration that happened."""
    it = leg.prefill
    w = split(leg.analysis, warmup)
    steady = it.loc[w.warm_iterations] if w.warm_iterations.any() else it
    with_ck = steady.loc[(steady["checkpoints"] > 0).to_numpy()]
    pick = with_ck if len(with_ck) else steady
    for table in (leg.restores, leg.prompt_saves):
        held = pick.loc[pick["iter"].isin(set(table["iter"])).to_numpy()]
        if len(held):
            pick = held
            break
    if not len(pick):
        return None
    order = pick.sort_values(["span_ns", "start_ns"], kind="stable")
    return order.iloc[(len(order) - 1) // 2]


def _state_rows(ev: pd.DataFrame, tid: int, t0: int, t1: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The restore, speculative-state and prompt-save spans of thread `tid` inside [t0, t1], each
    with its timeline row (`row`: "restore 1", ...), and the copies inside them with their span's row."""
    on = (ev["tid"] == tid).to_numpy() & (ev["start_ns"] >= t0).to_numpy() & (ev["end_ns"] <= t1).to_numpy()
    kind = ev["kind"].astype(object)  # names; astype(str) of an empty category fails in pandas 2.2 with numpy 2
    outer = ev.loc[on & kind.isin(list(STATE_SPANS)).to_numpy()].sort_values("start_ns", kind="stable")
    k = outer["kind"].astype(object)
    outer = outer.assign(row=[f"{STATE_SPANS[a][0]} {n + 1}" for a, n in zip(k, k.groupby(k).cumcount())])
    inner = ev.loc[on & ((kind == "restore_copy") | ((kind == "copy") & (ev["ckpt"] == 0))).to_numpy()]
    if not len(outer):
        return outer, inner.iloc[:0].assign(row="")
    pos = np.searchsorted(outer["start_ns"].to_numpy(), inner["start_ns"].to_numpy(), side="right") - 1
    ok = (pos >= 0) & (inner["end_ns"].to_numpy() <= outer["end_ns"].to_numpy()[np.maximum(pos, 0)])
    return outer, inner.loc[ok].assign(row=outer["row"].to_numpy()[pos[ok]])


def _state_count(leg: Leg, r: pd.Series) -> int:
    """Restores and prompt saves analyzed in the iteration (speculative states are not: a row or two
    more than the height holds, drawn all the same)."""
    return int((leg.restores["iter"] == r["iter"]).sum() + (leg.prompt_saves["iter"] == r["iter"]).sum())


def _chosen_per_arm(legs: list[Leg], warmup=AUTO) -> dict[str, tuple[Leg, pd.Series]]:
    """Per arm, its first leg's chosen iteration that holds a checkpoint (_chosen_iteration)."""
    chosen: dict[str, tuple[Leg, pd.Series]] = {}
    for leg in legs:
        if leg.label not in chosen:
            row = _chosen_iteration(leg, warmup)
            if row is not None and row["checkpoints"] > 0:
                chosen[leg.label] = (leg, row)
    return chosen


def _timeline_row(fig: go.Figure, row: int, leg: Leg, r: pd.Series, notes: list[str]) -> None:
    """One arm's iteration `r` drawn in subplot `row`: the iteration, its decode calls, each
    checkpoint with its fill and copy, the restores and state saves with their copies."""
    t0, t1, tid = int(r["start_ns"]), int(r["end_ns"]), int(r["tid"])
    ck = leg.checkpoints.loc[(leg.checkpoints["iter"] == r["iter"]).to_numpy()]
    if len(ck) > MAX_TIMELINE_ROWS:
        notes.append(f"{leg.name}: timeline shows the first {MAX_TIMELINE_ROWS} of {len(ck)} checkpoints.")
        ck = ck.iloc[:MAX_TIMELINE_ROWS]
    ev = leg.analysis.events_between(t0, t1)
    in_ck = ev["ckpt"].isin(ck["ckpt"]).to_numpy()
    spans = ev.loc[ev["kind"].isin(["fill", "copy"]).to_numpy() & in_ck]
    dec = ev.loc[(ev["kind"] == "decode").to_numpy() & (ev["tid"] == tid).to_numpy()
                 & (ev["start_ns"] >= t0).to_numpy() & (ev["end_ns"] <= t1).to_numpy()]
    ck_row = {int(c): f"ckpt {int(c)}" for c in ck["ckpt"]}
    state, state_copies = _state_rows(ev, tid, t0, t1)
    if len(ck) + len(state) > MAX_TIMELINE_ROWS:
        notes.append(f"{leg.name}: timeline shows the first {max(0, MAX_TIMELINE_ROWS - len(ck))} of "
                     f"{len(state)} restores and state saves.")
        state = state.iloc[:max(0, MAX_TIMELINE_ROWS - len(ck))]
        state_copies = state_copies.loc[state_copies["row"].isin(state["row"]).to_numpy()]
    y_order = (["iteration"] + (["llama_decode"] if len(dec) else []) + list(ck_row.values())
               + list(state["row"]))
    show = row == 1

    def bar(y, start, end, name, colour, width, hover):
        fig.add_trace(go.Bar(
            y=y, base=to_ms(np.asarray(start) - t0), x=to_ms(np.asarray(end) - np.asarray(start)), orientation="h",
            name=name, legendgroup=name, showlegend=show, width=width, marker=dict(color=colour),
            customdata=hover, hovertemplate="%{customdata}<extra>" + name + "</extra>"), row=row, col=1)

    bar(["iteration"], [t0], [t1], "iteration", PHASE_COLOURS["other"], 0.8,
        [f"{(t1 - t0) / 1e6:.2f} ms, thread {tid}"])
    if len(dec):
        bar(["llama_decode"] * len(dec), dec["start_ns"], dec["end_ns"], "llama_decode",
            PHASE_COLOURS["decode"], 0.8, [f"{d / 1e6:.2f} ms" for d in (dec["end_ns"] - dec["start_ns"])])
    bar([ck_row[int(c)] for c in ck["ckpt"]], ck["start_ns"], ck["end_ns"], "checkpoint",
        PHASE_COLOURS["checkpoint"], 0.8,
        [f"total {a / 1e6:.2f} ms, {b / MIB:.1f} MiB, faults {f}, {BUFFER_SAID[k]}"
         + (f"; {fb / MIB:.1f} MiB copied into fresh pages (on CUDA: the slow pageable path)" if fb else "")
         for a, b, f, k, fb in zip(ck["total_ns"], ck["bytes"], ck["faults"], ck["buffer"].astype(str),
                                   ck["fresh_bytes"])])
    for phase in ("fill", "copy"):
        s = spans.loc[(spans["kind"].astype(object) == phase).to_numpy()]
        if len(s):
            bar([ck_row[int(c)] for c in s["ckpt"]], s["start_ns"], s["end_ns"], phase, PHASE_COLOURS[phase],
                0.45, [f"{d / 1e6:.2f} ms, {n} faults, {b / MIB:.1f} MiB"
                       for d, n, b in zip(s["end_ns"] - s["start_ns"], s["faults"], s["bytes"])])
    for kind, (name, _) in STATE_SPANS.items():  # drawn like checkpoints: the span, its copies inside
        s = state.loc[(state["kind"].astype(object) == kind).to_numpy()]
        if len(s):
            bar(list(s["row"]), s["start_ns"], s["end_ns"], name, PHASE_COLOURS[kind], 0.8,
                [f"total {d / 1e6:.2f} ms, {b / MIB:.1f} MiB, faults {n}"
                 for d, n, b in zip(s["end_ns"] - s["start_ns"], s["faults"], s["bytes"])])
    for kind, name in COPY_NAMES.items():
        s = state_copies.loc[(state_copies["kind"].astype(object) == kind).to_numpy()]
        if len(s):
            bar(list(s["row"]), s["start_ns"], s["end_ns"], name, PHASE_COLOURS["copy"], 0.45,
                [f"{d / 1e6:.2f} ms, {n} faults, {b / MIB:.1f} MiB"
                 for d, n, b in zip(s["end_ns"] - s["start_ns"], s["faults"], s["bytes"])])
    fig.update_yaxes(categoryorder="array", categoryarray=y_order[::-1], row=row, col=1)
    fig.update_xaxes(title_text="ms since iteration start", row=row, col=1)


def timeline_panel(legs: list[Leg], warmup=AUTO) -> Panel:
    """Per arm, its median prefill iteration (first leg of the arm that has one)."""
    chosen = _chosen_per_arm(legs, warmup)
    if not chosen:
        return Panel(None, "no prefill iteration holds a checkpoint")
    notes = []
    items = list(chosen.values())
    titles = [f"{leg.name}: iteration {int(r['iter'])} ({r['span_ns'] / 1e6:.1f} ms, "
              f"{int(r['checkpoints'])} checkpoints)" for leg, r in items]
    rows_px = [max(4, 2 + min(int(r["checkpoints"]) + _state_count(leg, r), MAX_TIMELINE_ROWS)) * 26 + 40
               for leg, r in items]
    gap_px = 90
    height = 150 + sum(rows_px) + gap_px * (len(items) - 1)
    fig = make_subplots(rows=len(items), cols=1, subplot_titles=titles, vertical_spacing=gap_px / height,
                        row_heights=rows_px)
    for row, (leg, r) in enumerate(items, start=1):
        _timeline_row(fig, row, leg, r, notes)
    fig.update_layout(barmode="overlay")
    return Panel(layout(fig, "One prefill iteration per arm (the median after the warm-up): checkpoints, restores "
                              "and state saves, and their phases", height), notes=notes)


# -- distributions -------------------------------------------------------------------------------

DISTRIBUTIONS = [("checkpoints", "fill_ns", "fill (ms)"),
                 ("checkpoints", "copy_ns", "copy (ms)"),
                 ("checkpoints", "fault_ns", "faults (ms)"),
                 ("checkpoints", "total_ns", "checkpoint (ms)"),
                 ("checkpoints", "cpu_ns", "checkpoint on CPU (ms)"),
                 ("prefill", "span_ns", "prefill iteration (ms)"),
                 ("restores", "total_ns", "restore (ms)"),
                 ("restores", "copy_ns", "restore copy (ms)"),
                 ("prompt_saves", "total_ns", "prompt save (ms)")]


def distributions_panel(legs: list[Leg]) -> Panel:
    cols = [(src, col, title) for src, col, title in DISTRIBUTIONS
            if any(getattr(leg, src)[col].notna().any() for leg in legs)]
    if not cols:
        return Panel(None, "no checkpoints and no prefill iterations")
    notes = []
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=[t for _, _, t in cols], horizontal_spacing=0.05)
    for c, (src, col, title) in enumerate(cols, start=1):
        for leg in legs:
            values = getattr(leg, src)[col].dropna().to_numpy(dtype="float64")  # NA: not recorded
            if not len(values):
                continue
            shown, sampled = order_statistics(values)
            if sampled:
                notes.append(f"{leg.name} {src} ({len(values):,})")
            fig.add_trace(go.Box(y=to_ms(shown), name=leg.name, showlegend=False, marker=dict(color=leg.colour), line=dict(color=leg.colour),
                                 boxpoints=False if len(shown) > 2000 else "outliers"),
                          row=1, col=c)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=c)
    if notes:
        notes = [f"Distributions of more than {MAX_POINTS:,} values are drawn from {MAX_POINTS:,} evenly "
                 f"spaced order statistics (every quantile kept to 1/{MAX_POINTS:,}): "
                 + "; ".join(dict.fromkeys(notes)) + "."]
    layout(fig, "Distributions per leg (colour = arm)", 480)
    fig.update_layout(showlegend=False)
    return Panel(fig, notes=notes)


# -- the comparison ------------------------------------------------------------------------------

def _fmt_value(unit: str, v) -> str:
    """A compared figure in the unit a reader sees (metrics.py's shown_unit): times in ms."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "ns":
        return f"{v / 1e6:.3f} ms"
    number = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return f"{number} {unit}" if unit else number


def _metric_name(name: str) -> str:
    """A compared metric's one label (the metric table's), a pool row's class before it."""
    cls, _, metric = name.rpartition(": ")
    return f"{cls}: {label(metric)}" if cls else label(name)


def _fmt_pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.1f}%"


def comparison_panel(comparison) -> Panel:
    if comparison is None:
        return Panel(None, "no comparison")
    m = comparison.metrics
    if not len(m):
        return Panel(None, "the comparison has no metrics")
    pool = comparison.pool
    if pool is not None and len(pool):  # pool hits and misses apart, each against the baseline
        m = pd.concat([m, pool.assign(metric=pool["class"] + ": " + pool["metric"], unit="ns")], ignore_index=True)
    stat = plain(comparison.statistic)
    base, cand = plain(shown_label(comparison.baseline)), plain(shown_label(comparison.candidate))
    names = [plain(_metric_name(str(x))) for x in m["metric"]]
    change = m["change_pct"].astype("float64").to_numpy()
    lo = m["ci_low_pct"].astype("float64").to_numpy()
    hi = m["ci_high_pct"].astype("float64").to_numpy()
    drift = m["drift_pct"].astype("float64").to_numpy() if "drift_pct" in m else np.full(len(m), np.nan)
    verdicts = [str(v) for v in m["verdict"]]

    chart_px, table_px, gap_px = 60 + 44 * len(m), 24 + (ROW_PX + 1) * (len(m) + 1), 90
    height = 130 + chart_px + gap_px + table_px
    fig = make_subplots(rows=2, cols=1, row_heights=[chart_px, table_px], vertical_spacing=gap_px / height,
                        specs=[[{"type": "xy"}], [{"type": "table"}]],
                        subplot_titles=[f"change of the {stat} (hits/misses: of the median), % (95% interval); "
                                        "shaded: baseline drift",
                                        "per metric"])
    has_drift = np.isfinite(drift)
    if has_drift.any():
        d = np.abs(drift[has_drift])
        fig.add_trace(go.Bar(y=np.array(names)[has_drift], base=-d, x=2 * d, orientation="h", width=0.6,
                             name="baseline drift (±)", marker=dict(color="rgba(239,143,0,0.22)"),
                             customdata=drift[has_drift], hovertemplate="drift %{customdata:.1f}%<extra></extra>"),
                      row=1, col=1)
    ok = np.isfinite(change)
    fig.add_trace(go.Scatter(
        y=np.array(names)[ok], x=change[ok], mode="markers+text",
        text=[plain(v) for v, k in zip(verdicts, ok) if k], textposition="top center",
        marker=dict(size=11, color=[VERDICT_COLOURS.get(v, "#333") for v, k in zip(verdicts, ok) if k]),
        error_x=dict(type="data", symmetric=False, array=np.nan_to_num(hi - change)[ok],
                     arrayminus=np.nan_to_num(change - lo)[ok], thickness=1.5, width=6),
        name="change", customdata=np.stack([lo, hi], axis=1)[ok],
        hovertemplate="%{x:+.1f}% [%{customdata[0]:+.1f}%, %{customdata[1]:+.1f}%]<extra></extra>"),
        row=1, col=1)
    fig.add_vline(x=0, line=dict(color="#444", width=1), row=1, col=1)
    fig.update_xaxes(title_text=f"% change of {cand} against {base}", zeroline=False, row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)

    units = [str(u) for u in m["unit"]] if "unit" in m else ["ns" if str(x).endswith("_ns") else ""
                                                              for x in m["metric"]]
    cells = [names,
             [_fmt_value(u, v) for u, v in zip(units, m["baseline_value"])],
             [_fmt_value(u, v) for u, v in zip(units, m["candidate_value"])],
             [_fmt_pct(v) for v in change],
             [f"{_fmt_pct(a)} .. {_fmt_pct(b)}" for a, b in zip(lo, hi)],
             [_fmt_pct(v) if np.isfinite(v) else "-" for v in drift],
             [plain(v) for v in verdicts],
             [f"{plain(a)} / {plain(b)}" for a, b in zip(m.get("samples_baseline", [""] * len(m)),
                                                           m.get("samples_candidate", [""] * len(m)))]]
    fig.add_trace(go.Table(
        columnwidth=[2.2, 1.4, 1.4, 1, 1.6, 0.9, 1.1, 1],
        header=dict(values=["metric", f"{stat} {base}", f"{stat} {cand}", "change", "95% interval",
                            "drift", "verdict", "samples"], fill_color="#EEE", align="left"),
        cells=dict(values=cells, align="left", height=ROW_PX,
                   font=dict(color=[["#222"] * len(m)] * 6 + [[VERDICT_COLOURS.get(v, "#222") for v in verdicts]]
                             + [["#222"] * len(m)]))), row=2, col=1)
    layout(fig, f"Comparison: {cand} (candidate) against {base} (baseline)", height)
    fig.update_layout(showlegend=False)
    return Panel(fig)


# -- faults per MiB, mmap churn, pool hit rate -----------------------------------------------------

def _summary_number(summary: dict, *keys: str):
    for k in keys:
        v = summary.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


FAULTS_PER_MIB_KEYS = ("faults_per_mib",)
HIT_RATE = "pool hit rate after warm-up"  # the answer card's rate (analyzers/headline.py), per leg here


def warm_hits(leg: Leg, setting=AUTO) -> tuple[int, int]:
    """(hits, checkpoints) after the leg's warm-up, as the headline counts them (analyzers/headline.py)."""
    w = split(leg.analysis, setting)
    if setting == AUTO and w.short:  # as compare does: no steady state, no warm-up set apart
        w = split(leg.analysis, 0)
    return int(leg.checkpoints["pool_hit"].to_numpy()[w.warm].sum()), int(w.warm.sum())


def churn_panel(legs: list[Leg], setting=AUTO) -> Panel:
    legs = [leg for leg in legs if len(leg.checkpoints)]
    if not legs:
        return Panel(None, "no checkpoints")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=["page faults per MiB copied", "syscalls per checkpoint",
                                        f"{HIT_RATE} (% of checkpoints)"])
    names = [leg.name for leg in legs]
    colours = [leg.colour for leg in legs]
    fpm = [_summary_number(leg.summary, *FAULTS_PER_MIB_KEYS) for leg in legs]
    counts = [warm_hits(leg, setting) for leg in legs]
    hit = [h / n if n else None for h, n in counts]
    fig.add_trace(go.Bar(x=names, y=[np.nan if v is None else v for v in fpm], marker_color=colours,
                         hovertemplate="%{y:.1f} faults/MiB<extra></extra>"), row=1, col=1)
    n = np.array([len(leg.checkpoints) for leg in legs], dtype="float64")
    for col, colour, label in (("mmaps", "#4C78A8", "mmap"), ("munmaps", "#E45756", "munmap")):
        total = np.array([int(leg.checkpoints[col].sum()) for leg in legs], dtype="float64")
        fig.add_trace(go.Bar(x=names, y=total / n, name=label, marker_color=colour,
                             customdata=total, hovertemplate=label + ": %{y:.2f} per checkpoint "
                             "(%{customdata:.0f} in all)<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[np.nan if v is None else 100 * v for v in hit], marker_color=colours,
                         customdata=[f"{h} of {n} after warm-up; {int(leg.checkpoints['pool_hit'].sum())} of "
                                     f"{len(leg.checkpoints)} with it" for (h, n), leg in zip(counts, legs)],
                         hovertemplate="%{y:.1f}%: %{customdata}<extra></extra>"), row=1, col=3)
    fig.update_yaxes(title_text="faults / MiB", row=1, col=1)
    fig.update_yaxes(title_text="calls per checkpoint", row=1, col=2)
    fig.update_yaxes(title_text="%", range=[0, 100], row=1, col=3)
    layout(fig, "Page faults, mmap/munmap churn and pool hits per leg", 420)
    fig.update_layout(barmode="group", showlegend=False)
    for col, values, why in ((1, fpm, "not recorded"), (3, hit, "none after warm-up")):
        for name, v in zip(names, values):
            if v is None:  # an empty bar says why
                fig.add_annotation(x=name, y=0, text=why, showarrow=False, yshift=12, row=1, col=col)
    notes = []
    if any(v is None for v in fpm):
        notes.append("Faults per MiB not recorded in a leg's summary: its bar says so.")
    if any(v is None for v in hit):
        notes.append(f"A leg with no checkpoint after its warm-up has no {HIT_RATE}: its bar says so.")
    return Panel(fig, notes=notes)
