"""Text reports for a terminal, 80 columns: `analyze` (one trace) and `compare` (A/B/A legs)."""
from __future__ import annotations

import math
import textwrap

import pandas as pd

from ckptrace.meta import TraceMeta
from ckptrace.terminal import printable
from ckptrace.trace import time_origin
from ckptrace.units import MIB

WIDTH = 80


def fmt_ms(ns) -> str:
    """ns as milliseconds, 2 decimals; "-" for none."""
    return "-" if ns is None or (isinstance(ns, float) and math.isnan(ns)) else f"{ns / 1e6:.2f}"


def wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _duration_s(meta: TraceMeta, events: pd.DataFrame) -> float | None:
    start, stop = meta.attach_ns, meta.stop_ns
    if start is not None and stop is not None and stop > start:
        return (stop - start) / 1e9
    if len(events):
        return (int(events["end_ns"].max()) - int(events["start_ns"].min())) / 1e9
    return None


def header_lines(analysis) -> list[str]:
    t, s = analysis.trace, analysis.summary
    meta, ev = t.meta, t.events
    dur = _duration_s(meta, ev)
    lines = [wrap(f"trace {printable(t.path or '-')}")]
    parts = [f"label {printable(t.label)}", f"pid {meta.pid if meta.pid is not None else '-'}",
             f"duration {dur:.2f} s" if dur is not None else "duration -",
             f"lost events {s['lost_events']}"]
    lines.append(wrap("   ".join(parts)))
    lines.append(wrap(f"{s['checkpoints']} checkpoints ({s['pool_hits']} pool hits, "
                      f"{s['draft_checkpoints']} draft, {s['unassigned_checkpoints']} in no iteration) "
                      f"on {analysis.checkpoints['tid'].nunique()} thread(s); {s['iterations']} iterations "
                      f"({s['prefill_iterations']} prefill, {s['decode_iterations']} decode)"))
    return lines


def checkpoint_lines(analysis, limit: int | None) -> list[str]:
    ck = analysis.checkpoints
    if not len(ck):
        return ["No checkpoints in this trace (was update_tgt probed and called?)."]
    t0 = time_origin(analysis.trace.meta, analysis.trace.events)
    shown = ck if limit is None else ck.head(limit)
    # Column formatting is vectorised; only the final join walks the (bounded) rows.
    cols = {
        "ckpt": shown["ckpt"].astype(str) + shown["draft"].map({True: "d", False: ""}),
        "iter": shown["iter"].astype(str).where(shown["iter"] != 0, "-"),
        "at s": ((shown["start_ns"] - t0) / 1e9).map("{:.3f}".format),
        "total": (shown["total_ns"] / 1e6).map("{:.2f}".format),
        "fill": (shown["fill_ns"] / 1e6).map("{:.2f}".format),
        "copy": (shown["copy_ns"] / 1e6).map("{:.2f}".format),
        "fault": (shown["fault_ns"] / 1e6).map("{:.2f}".format),
        "faults": shown["faults"].astype(str),
        "MiB": (shown["bytes"] / MIB).map("{:.1f}".format),
        "mm/un": shown["mmaps"].astype(str) + "/" + shown["munmaps"].astype(str),
        "hit": shown["pool_hit"].map({True: "yes", False: "no"}),
    }
    minimum = {"ckpt": 4, "iter": 5, "at s": 7, "faults": 7, "MiB": 6, "mm/un": 5}
    widths = {k: max(len(k), minimum.get(k, 8 if k != "hit" else 3), int(v.str.len().max()) if len(v) else 0)
              for k, v in cols.items()}
    head = " ".join(k.rjust(widths[k]) for k in cols)
    body = pd.Series([""] * len(shown), index=shown.index, dtype="str")
    for i, (k, v) in enumerate(cols.items()):
        if len(shown):
            body = body + (" " if i else "") + v.astype("str").str.rjust(widths[k])
    lines = ["Checkpoints (times in ms; d = draft; mm/un = mmaps/munmaps inside)", head, *body.tolist()]
    if len(shown) < len(ck):
        lines.append(f"... {len(ck) - len(shown)} more (--all shows every row)")
    return lines


def iteration_lines(analysis) -> list[str]:
    it = analysis.iterations
    if not len(it):
        return ["No iterations (no update_slots or llama_decode events): checkpoints are unassigned."]
    g = it.groupby("kind", observed=False).agg(
        n=("iter", "size"), med=("span_ns", "median"), total=("span_ns", "sum"), fill=("fill_ns", "sum"),
        copy=("copy_ns", "sum"), other=("other_ns", "sum"), ck=("checkpoints", "sum"))
    bounds = ", ".join(sorted(it["boundary"].astype(str).unique()))
    lines = [f"Iterations (times in ms; boundary: {bounds})",
             f"{'kind':8} {'count':>6} {'median':>9} {'total':>10} {'fill':>9} {'copy':>9} {'other':>10} {'ckpts':>6}"]
    for kind, r in g.iterrows():  # two rows at most: prefill, decode
        lines.append(f"{kind:8} {int(r['n']):>6} {fmt_ms(r['med'] if r['n'] else None):>9} {fmt_ms(r['total']):>10} "
                     f"{fmt_ms(r['fill']):>9} {fmt_ms(r['copy']):>9} {fmt_ms(r['other']):>10} {int(r['ck']):>6}")
    return lines


def summary_lines(s: dict) -> list[str]:
    names = {"checkpoint_fill_ns": "fill", "checkpoint_copy_ns": "copy", "checkpoint_fault_ns": "fault",
             "checkpoint_total_ns": "checkpoint total", "prefill_iteration_ns": "prefill iteration"}
    lines = ["Summary (ms)", f"{'':18} {'count':>6} {'mean':>9} {'median':>9} {'p90':>9} {'p99':>9}"]
    for key, name in names.items():
        d = s["stats"][key]
        lines.append(f"{name:18} {d['count']:>6} {fmt_ms(d['mean']):>9} {fmt_ms(d['median']):>9} "
                     f"{fmt_ms(d['p90']):>9} {fmt_ms(d['p99']):>9}")
    share = s["checkpoint_share_of_prefill"]
    rate = s["pool_hit_rate"]
    figures = [
        f"checkpoint share of prefill time: {share * 100:.1f}%" if share is not None
        else "checkpoint share of prefill time: - (no prefill iterations)",
        f"pool hit rate: {rate * 100:.0f}% ({s['pool_hits']} of {s['checkpoints']})" if rate is not None
        else "pool hit rate: -",
        f"state copied: {s['checkpoint_bytes'] / MIB:.1f} MiB",
    ]
    if s["faults_per_mib"] is not None:
        figures.append(f"per MiB of state: {s['faults_per_mib']:.1f} faults, {s['ns_per_mib'] / 1e6:.3f} ms "
                       f"(fill {s['fill_ns_per_mib'] / 1e6:.3f}, copy {s['copy_ns_per_mib'] / 1e6:.3f})")
    every = s.get("fault_sample_every")
    figures.append("fault time: " + ("measured" + (f" (in 1 of {every} 0.25 s slices)" if every and every != 1 else "")
                                     if s["fault_time_measured"] else "not measured"))
    lines += [wrap(f) for f in figures]
    lines.append(wrap(("reliability: ok, " if s["reliable"] else "reliability: WARNING: ") + s["reliability"]))
    lines += [wrap("note: " + n) for n in s["notes"]]
    return lines


def analysis_report(analysis, limit: int | None = 20) -> str:
    blocks = [header_lines(analysis), checkpoint_lines(analysis, limit), iteration_lines(analysis),
              summary_lines(analysis.summary)]
    return "\n\n".join("\n".join(b) for b in blocks)


# compare

NAMES = {"checkpoint_fill_ns": "ckpt fill ms", "checkpoint_copy_ns": "ckpt copy ms",
         "checkpoint_fault_ns": "ckpt fault ms", "checkpoint_total_ns": "ckpt total ms",
         "prefill_iteration_ns": "prefill iter ms", "checkpoint_faults": "ckpt faults"}


def _pct(x: float) -> str:
    if not math.isfinite(x):
        return "-" if math.isnan(x) else ("+inf%" if x > 0 else "-inf%")
    if abs(x) >= 10_000:
        return f"{x / 1000:+.0f}k%"
    return f"{x:+.1f}%" if abs(x) < 1000 else f"{x:+.0f}%"


def _value(x: float, unit: str) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}" if unit == "ns" else f"{x:.0f}"


def _arm_line(c, arm: str) -> str:
    legs = c.legs.loc[c.legs["arm"] == arm]
    nums = ", ".join(str(n) for n in legs["leg"].tolist())
    label = c.baseline if arm == "baseline" else c.candidate
    return (f"{arm} {printable(label)}: leg{'s' if len(legs) > 1 else ''} {nums} ({int(legs['checkpoints'].sum())} "
            f"checkpoints, {int(legs['prefill_iterations'].sum())} prefill iterations)")


def compare_report(c) -> str:
    lines = [wrap(_arm_line(c, "baseline")), wrap(_arm_line(c, "candidate")),
             wrap(f"samples: {c.samples}; 95% bootstrap intervals of the change of medians "
                  f"({c.n_boot} resamples, seed {c.seed})"), ""]
    lines.append(f"{'metric':15} {'baseline':>8} {'candidate':>9} {'change':>7} {'95% interval':>16} "
                 f"{'drift':>6} verdict")
    notes = []
    for m in c.metrics.to_dict("records"):  # six rows
        interval = (f"[{_pct(m['ci_low_pct'])[:-1]}, {_pct(m['ci_high_pct'])[:-1]}]"
                    if math.isfinite(m["ci_low_pct"]) or math.isinf(m["ci_low_pct"]) else "-")
        name = NAMES.get(m["metric"], m["metric"])
        lines.append(f"{name:15} {_value(m['baseline_median'], m['unit']):>8} "
                     f"{_value(m['candidate_median'], m['unit']):>9} {_pct(m['change_pct']):>7} {interval:>16} "
                     f"{_pct(m['drift_pct']).lstrip('+'):>6} {m['verdict']}")
        if math.isnan(m["change_pct"]) and not math.isnan(m["diff_median"]):
            u = "ms" if m["unit"] == "ns" else m["unit"]
            notes.append(f"{name}: the baseline median is 0, so no percentage; the candidate's is "
                         f"{_value(m['diff_median'], m['unit'])} {u} higher, interval "
                         f"[{_value(m['diff_ci_low'], m['unit'])}, {_value(m['diff_ci_high'], m['unit'])}] {u}")
    lines += [wrap(n) for n in notes]
    lines += ["", wrap(c.explanation)]
    if c.warnings:
        lines.append("")
        lines += [wrap("warning: " + w) for w in c.warnings]
    return "\n".join(lines)
