"""`compare --format markdown`: the comparison as a GitHub-flavoured Markdown table for a pull-request comment.

Labels, paths and anything else read from a trace are user text. They are made printable, then
shown only inside code: a label as an inline code span, the explanation and warnings (which quote
labels) in a fenced block, each fence longer than any run of backticks in the text. Inside code,
Markdown and HTML mean nothing, and GitHub neither links URLs nor mentions (notifies) `@names`,
so a label shows as exactly its characters and does nothing else.
"""
from __future__ import annotations

import math
import re
import textwrap

import pandas as pd

from ckptrace.core.terminal import printable, shown_label
from ckptrace.core.units import ms, pct_change

from .text import NAMES, POOL_NAMES, value_text, unjudged_said

def _fence(text: str, least: int) -> str:
    return "`" * max(least, max((len(r) for r in re.findall("`+", text)), default=0) + 1)


def code(text) -> str:
    """User text as an inline code span showing exactly that text (see the module docstring)."""
    s = printable(str(text))
    fence = _fence(s, 1)
    pad = " " if s[:1] == "`" or s[-1:] == "`" or not s.strip(" ") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def code_block(lines: list[str]) -> list[str]:
    """Lines of text (user text inside) as a fenced block."""
    shown = [w for x in lines for w in textwrap.wrap(printable(x), 100, subsequent_indent="  ")]
    fence = _fence("\n".join(shown), 3)
    return [fence + "text", *shown, fence]


def _interval(m: dict) -> str:
    lo, hi = m["ci_low_pct"], m["ci_high_pct"]
    if math.isnan(lo):
        return "-"
    return f"[{pct_change(lo)}, {pct_change(hi)}]"


def _table(rows: list[dict], name_of, flagged: set) -> list[str]:
    lines = ["| metric | baseline | candidate | change | 95% interval | drift | verdict |",
             "|---|---:|---:|---:|---|---:|---|"]
    for m in rows:
        verdict = m["verdict"]
        if verdict in ("faster", "slower"):
            verdict = f"**{verdict}**"
        if name_of(m) in flagged:
            verdict += " :x:"
        lines.append(f"| {name_of(m)} | {value_text(m['baseline_value'], m['unit'])} | "
                     f"{value_text(m['candidate_value'], m['unit'])} | {pct_change(m['change_pct'])} | {_interval(m)} | "
                     f"{pct_change(m['drift_pct']).lstrip('+')} | {verdict} |")
    return lines


def comparison_markdown(c, fail_on: str | None = None, tripped: pd.DataFrame | None = None,
                        unjudged: pd.DataFrame | None = None, judged: pd.DataFrame | None = None) -> str:
    """The verdict table, pool rows, legs, explanation and warnings; with a gate, its outcome first."""
    legs = c.legs.to_dict("records")
    out = [f"### ckptrace compare: {code(shown_label(c.candidate))} against {code(shown_label(c.baseline))}", ""]
    if c.headline:
        from ckptrace.analyzers.headline import sentence

        out += [f"**{sentence(c.headline, c.candidate, c.baseline, code)}**", ""]
        if c.headline.get("fresh_copies"):
            from ckptrace.analyzers.headline import fresh_copies_said

            out += [fresh_copies_said(c.headline["fresh_copies"], code), ""]
    flagged = set()
    if fail_on:
        gate = f"Gate `--fail-on {fail_on}`"
        missed = ("" if unjudged is None or not len(unjudged)
                  else f" It did not judge {unjudged_said(unjudged, lambda x: f'`{x}`')}.")
        if tripped is not None and len(tripped):
            flagged = {NAMES.get(x, x) for x in tripped["metric"]}
            out += [f"**{gate} tripped** by {', '.join(f'`{x}`' for x in tripped['metric'])}.{missed}", ""]
        elif missed and judged is not None and not len(judged):
            out += [f"**{gate} judged nothing**: not passed.{missed}", ""]
        elif missed:
            judged_names = ", ".join(f"`{x}`" for x in judged["metric"]) if judged is not None else "the rest"
            out += [f"{gate} passed on {judged_names} only.{missed}", ""]
        else:
            out += [f"{gate} passed.", ""]
    out += _table(c.metrics.to_dict("records"), lambda m: NAMES.get(m["metric"], m["metric"]), flagged)
    if c.pool is not None and len(c.pool):
        out += ["", "Pool hits and misses apart, warm and cold (in the warm-up) apart, each against the baseline's "
                    "of the same class (medians):", ""]
        out += _table([{**m, "unit": "ns"} for m in c.pool.to_dict("records")],
                      lambda m: f"{m['class']} {POOL_NAMES[m['metric']]}", set())
    memory = getattr(c, "memory", None)
    if memory is not None and len(memory):
        names = {"held_peak_mib": "held checkpoint MiB at peak", "rss_peak_mib": "RSS MiB at peak"}
        out += ["", "Memory (one figure per leg, arms' mean; drift: spread of the baseline legs):", "",
                "| metric | baseline | candidate | change | drift | per leg |", "|---|---:|---:|---:|---:|---|"]
        for r in memory.to_dict("records"):
            f = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"  # noqa: E731
            change = "-" if math.isnan(r["change_mib"]) else f"{r['change_mib']:+.1f}"
            out.append(f"| {names.get(r['metric'], r['metric'])} | {f(r['baseline_value'])} | "
                       f"{f(r['candidate_value'])} | {change} | {f(r['drift_mib'])} | "
                       f"{' '.join(f(v) for v in r['legs_mib'])} |")
    warm = getattr(c, "warmup", None)
    if warm is not None and len(warm) and (warm["warmup_iterations"].sum() or warm["cold_checkpoints"].sum()):
        from ckptrace.analyzers.warmup import described

        out += ["", f"Warm-up ({described(c.warmup_setting)}), left out of the metrics above (means, ms):", "",
                "| arm | iterations | wall | on CPU | cold checkpoints | hits | wall | on CPU |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['arm']} | {r['warmup_iterations']} | {ms(r['warmup_iteration_ns'])} | "
                f"{ms(r['warmup_iteration_cpu_ns'])} | {r['cold_checkpoints']} | {r['cold_hits']} | "
                f"{ms(r['cold_total_ns'])} | {ms(r['cold_total_cpu_ns'])} |" for r in warm.to_dict("records")]
    out += ["", f"Each arm summarised by its {c.statistic}, after each thread's warm-up; 95% bootstrap intervals "
                f"of the change ({c.n_boot} resamples, seed {c.seed}); times in ms.", ""]
    for leg in legs:
        req = "" if leg.get("requests") is None else f", {leg['requests']} requests"
        out.append(f"- leg {leg['leg']} ({leg['arm']}): {code(shown_label(leg['label']))}, {leg['checkpoints']} checkpoints, "
                   f"{leg['prefill_iterations']} prefill iterations{req}")
    machine = [c.machine["said"]] if getattr(c, "machine", None) else []
    out += [""] + code_block(machine + [c.explanation] + [f"warning: {w}" for w in c.warnings])
    return "\n".join(out)
