"""The dashboard's first two panels: the answer (one sentence and one card of figures) and one
stacked bar per arm of where a checkpoint's and a prefill iteration's time goes.

Both only draw what the analyzers computed: the card is the comparison's headline
(analyzers/headline.py), the bars its stacked_parts over each arm's warm checkpoints and the
iteration parts (panels.iteration_parts) over its warm prefill iterations (analyzers/warmup.py).
"""
from __future__ import annotations

import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptrace.analyzers.headline import sentence, stacked_parts
from ckptrace.analyzers.warmup import AUTO, prefill_rows, split
from ckptrace.core.terminal import shown_label

from .legs import PHASE_COLOURS, VERDICT_COLOURS, Leg, plain
from .figure import Panel, layout
from .panels import PARTS, iteration_parts


CARD = "#EEF2F7"  # the answer's background: a card, apart from the panels below


def _card(title: str, value: float | None, suffix: str, detail: str, colour: str = "#222") -> dict:
    return {"title": title, "value": value, "suffix": suffix, "detail": detail, "colour": colour}


def _cards(h: dict) -> list[dict]:
    cards = []
    for key, what in (("checkpoint", "removed per checkpoint"), ("prefill", "host work removed per prefill iteration")):
        x = h.get(key)
        if x is None:
            cards.append(_card(what, None, "", "not recorded"))
            continue
        on = "on CPU" if x["measure"] == "on CPU" else "wall time"
        cards.append(_card(f"{what} ({on})", x["removed_ms"], " ms",
                           f"95% interval {x['ci_low_ms']:.1f} to {x['ci_high_ms']:.1f} ms; {x['verdict']}",
                           VERDICT_COLOURS.get(x["verdict"], "#222")))
    t = h.get("ttft_p90")
    if t is not None and t.get("change_ms") is not None:  # in ms, as the headline: with what the path explains
        cards.append(_card("time to first token p90, change", t["change_ms"], " ms",
                           f"{t['baseline_ms']:.0f} -> {t['candidate_ms']:.0f} ms; the checkpoint path explains "
                           f"{t['explained_ms']:+.1f} ms; {t['verdict']}", VERDICT_COLOURS.get(t["verdict"], "#222")))
    elif t is not None:
        cards.append(_card("time to first token p90, change", t["change_pct"], "%",
                           (f"{t['baseline_ms']:.0f} -> {t['candidate_ms']:.0f} ms; " if t["change_pct"] is not None
                            else "") + t["verdict"], VERDICT_COLOURS.get(t["verdict"], "#222")))
    hit = h["hit_rate"]
    cards.append(_card("pool hit rate after warm-up", None if hit["rate"] is None else 100 * hit["rate"], "%",
                       f"{hit['warm_hits']} of {hit['warm_checkpoints']} ({hit['hits']} of {hit['checkpoints']} with it)"
                       if hit["warm_checkpoints"] else "no checkpoint after the warm-up"))
    m = (h.get("memory") or {}).get("held_peak_mib")
    cards.append(_card("checkpoint memory held at peak, cost", None if m is None else m["change_mib"], " MiB",
                       f"{m['baseline_mib']:.1f} -> {m['candidate_mib']:.1f} MiB" if m else "not recorded"))
    return cards


def answer_panel(comparison, title: str) -> Panel:
    """The headline sentence over one card of its figures (plotly indicators)."""
    if comparison is None or not comparison.headline:
        return Panel(None, "one label only: nothing to compare")
    h = comparison.headline
    cards = _cards(h)
    fig = make_subplots(rows=1, cols=len(cards), specs=[[{"type": "domain"}] * len(cards)], horizontal_spacing=0.03)
    for i, c in enumerate(cards, start=1):
        fig.add_trace(go.Indicator(
            mode="number", value=c["value"] if c["value"] is not None else None,
            number=dict(suffix=c["suffix"], valueformat="+.1f" if "cost" in c["title"] or "change" in c["title"] else ".1f",
                        font=dict(size=40, color=c["colour"])),
            title=dict(text=f"{plain(c['title'])}<br><span style='font-size:12px;color:#555'>{plain(c['detail'])}</span>",
                       font=dict(size=14))), row=1, col=i)
        if c["value"] is None:  # plotly draws nothing for no value: say why instead
            fig.add_annotation(text=plain(c["detail"]), x=(i - 0.5) / len(cards), y=0.3, xref="paper", yref="paper",
                               showarrow=False, font=dict(size=16, color="#777"))
    said = sentence(h, comparison.candidate, comparison.baseline, plain)
    lines = textwrap.wrap(said, 150, break_long_words=False, break_on_hyphens=False)
    layout(fig, plain(title) + "<br><span style='font-size:14px'>" + "<br>".join(lines) + "</span>",
            300 + 18 * len(lines))
    fig.update_layout(margin=dict(t=110 + 18 * len(lines), b=20), paper_bgcolor=CARD)
    return Panel(fig)


def _arm_legs(legs: list[Leg]) -> list[tuple[str, str, list[Leg]]]:
    """(label, colour, legs) per arm, the baseline first."""
    order = list(dict.fromkeys(leg.label for leg in legs))
    return [(label, next(x.colour for x in legs if x.label == label), [x for x in legs if x.label == label])
            for label in order]


def _mean_parts(frames: list) -> dict[str, float]:
    """Per-part means (ms) over the rows of several legs' part tables."""
    import pandas as pd

    rows = pd.concat(frames) if frames else None
    if rows is None or not len(rows):
        return {}
    return {p: float(rows[p].mean()) / 1e6 for p in PARTS}


def breakdown_panel(legs: list[Leg], comparison=None) -> Panel:
    """One stacked bar per arm (fill, copy, faults, wait, other) on one axis: the mean warm
    checkpoint, and the mean warm prefill iteration."""
    setting = comparison.warmup_setting if comparison is not None else AUTO
    arms = _arm_legs(legs)
    per = {"checkpoint": {}, "prefill iteration": {}}
    for label, _, mine in arms:
        ck, it = [], []
        for leg in mine:
            w = split(leg.analysis, setting)
            if setting == AUTO and w.short:
                w = split(leg.analysis, 0)
            parts = stacked_parts(leg.checkpoints, w.warm)
            if parts:
                ck.append((parts, int(w.warm.sum())))
            pre = prefill_rows(leg.iterations)
            if len(pre):
                it.append(iteration_parts(pre.loc[w.warm_iterations])[0])
        n = sum(k for _, k in ck)
        if n:
            per["checkpoint"][label] = {p: sum(parts[p] * k for parts, k in ck) / n for p in PARTS}
        means = _mean_parts(it)
        if means:
            per["prefill iteration"][label] = means
    shown = [k for k, v in per.items() if v]
    if not shown:
        return Panel(None, "no checkpoints and no prefill iterations after the warm-up")
    fig = make_subplots(rows=1, cols=len(shown), horizontal_spacing=0.12,
                        subplot_titles=[f"mean {k} after the warm-up (ms)" for k in shown])
    used = [p for p in PARTS if any(v[p] > 0 for k in shown for v in per[k].values())]
    for col, key in enumerate(shown, start=1):
        labels = [label for label, _, _ in arms if label in per[key]]
        names = [plain(shown_label(x)) for x in labels]  # cut as every shown label is
        for p in used:
            fig.add_trace(go.Bar(y=names, x=[per[key][x][p] for x in labels], orientation="h", name=PARTS[p],
                                 legendgroup=p, showlegend=col == 1, marker=dict(color=PHASE_COLOURS[p]),
                                 hovertemplate="%{x:.2f} ms<extra>" + PARTS[p] + "</extra>"), row=1, col=col)
        totals = [sum(per[key][x].values()) for x in labels]
        fig.add_trace(go.Scatter(y=names, x=totals, mode="text", text=[f"{t:.1f} ms" for t in totals],
                                 textposition="middle right", showlegend=False, hoverinfo="skip"), row=1, col=col)
        fig.update_xaxes(title_text="ms", range=[0, 1.25 * max(totals) if max(totals) > 0 else 1], row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_layout(barmode="stack")
    missing = [p for p in PARTS if p not in used]
    notes = []
    if "wait" in missing:
        notes.append("Breakdown: no waiting for a CPU part (none recorded, or none waited).")
    height = 240 + 60 * len(arms)
    layout(fig, "Where the time goes, per arm (the same parts as the prefill iterations below)", max(360, height))
    fig.update_layout(legend=dict(orientation="h", x=0, y=-0.25, yanchor="top"), margin=dict(b=110))
    return Panel(fig, notes=notes)
