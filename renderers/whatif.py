"""What `whatif` prints: each process's replay against a pool policy, as text or as JSON."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ckptrace.analyzers.whatif import Replay, SWEEP_COLUMNS, mib_text, ttft_summary
from ckptrace.core.terminal import printable
from ckptrace.core.units import mib, ms, pct_of

from .json import records
from .text import wrap


@dataclass
class ProcessResult:
    """One process of one trace: its replay, and optionally a sweep and its requests' TTFT."""
    trace: str
    t0: int  # the trace's time origin (ns)
    replay: Replay | None  # None: the process mapped no checkpoint buffer
    pid: int
    label: str
    sweep: pd.DataFrame | None = None
    sweep_param: str | None = None
    warnings: list[str] = field(default_factory=list)


def _pct(part, whole) -> str:
    return f" ({pct_of(part, whole)})" if whole else ""


def process_lines(p: ProcessResult, rows: int | None) -> list[str]:
    head = f"{printable(p.trace)}: pid {p.pid} ({printable(p.label)})"
    r = p.replay
    if r is None:
        return [head, "  no checkpoint mapped a buffer while recording: nothing for a pool to reuse"]
    s = r.summary
    lines = [head, wrap(f"policy {r.policy.name}: {s['policy_text']}", "  ")]
    if s["reused_buffers"]:
        lines.append(wrap(f"note: {s['reused_buffers']} checkpoints above 32 MiB mapped no buffer: they reused one "
                          "(a pool was on while recording?); the replay adds a pool to what was recorded", "  "))
    lines.append(wrap(f"checkpoint buffers: {s['gets']} asked the pool: {s['hits']} hits, {s['misses']} misses"
                      + (f" ({s['hit_rate'] * 100:.0f}% hits)" if s["hit_rate"] is not None else "")
                      + (f"; {s['not_gets']} checkpoints mapped no buffer (their own, or the heap's), not asked"
                         if s["not_gets"] else ""), "  "))
    declined = s["declined_floor"] + s["declined_cap"] + s["declined_full"]
    lines.append(wrap(f"pool: {s['puts']} buffers offered, {s['accepted']} kept, {declined} declined "
                      f"(below the floor {s['declined_floor']}, above the cap {s['declined_cap']}, "
                      f"full {s['declined_full']}), {s['evictions']} displaced ({mib_text(s['evicted_bytes'])}), "
                      f"{s['trims']} idle trims ({mib_text(s['trimmed_bytes'])})"
                      + (f", {mib_text(s['released_at_exit_bytes'])} released at exit"
                         if s["released_at_exit_bytes"] else ""), "  "))
    at = f" at {(s['pooled_hwm_ns'] - p.t0) / 1e9:.3f} s" if s["pooled_hwm_ns"] is not None else ""
    lines.append(wrap(f"pooled at most {mib_text(s['pooled_hwm_bytes'])} in {s['pooled_hwm_buffers']} buffers"
                      f" ({mib_text(s['pooled_hwm_mapped_bytes'])} mapped){at}; at the end "
                      f"{mib_text(s['pooled_end_bytes'])}", "  "))
    if s["held_hwm_bytes"] is not None:
        lines.append(wrap(f"checkpoint memory held at peak: {mib_text(s['recorded_held_hwm_bytes'])} recorded, "
                          f"{mib_text(s['held_hwm_bytes'])} with the pool", "  "))
    cpu = (f"fill on CPU {ms(s['fill_cpu_saved_ns'])} of {ms(s['fill_cpu_recorded_ns'])} ms"
           f"{_pct(s['fill_cpu_saved_ns'], s['fill_cpu_recorded_ns'])}" if s["fill_cpu_saved_ns"] is not None
           else "fill on CPU - (not recorded)")
    lines.append(wrap(f"saved: {s['faults_avoided']} of {s['fill_faults_recorded']} fill page faults; {cpu}; "
                      f"fill wall {ms(s['fill_saved_ns'])} of {ms(s['fill_recorded_ns'])} ms", "  "))
    cost = s["hit_cost"]
    lines.append(wrap(f"a hit costs {ms(cost['cpu_ns'])} ms on CPU, {cost['faults']} faults: "
                      f"{s['hit_cost_source']}", "  "))
    lim = r.limit
    if lim is not None:
        lines.append(wrap(f"cgroup memory limit {mib_text(lim['limit_bytes'])} ({printable(lim['limit_from'])}): "
                          f"pooled bytes plus RSS at most {mib_text(lim['predicted_peak_bytes'])} "
                          f"({lim['share'] * 100:.0f}%; RSS at peak {mib_text(lim['rss_peak_bytes'])})"
                          + ("; the byte cap is more than the room left under it"
                             if lim["cap_exceeds_headroom"] else ""), "  "))
    if r.requests is not None:
        t = ttft_summary(r.requests)
        if t["with_breakdown"]:
            lines.append(wrap(f"requests ({t['with_breakdown']} of {t['requests']} wholly recorded; an ESTIMATE "
                              f"that assumes nothing else moves): TTFT p50 {ms(t['ttft_p50_ns'])} -> "
                              f"{ms(t['predicted_ttft_p50_ns'])} ms, p90 {ms(t['ttft_p90_ns'])} -> "
                              f"{ms(t['predicted_ttft_p90_ns'])} ms, p99 {ms(t['ttft_p99_ns'])} -> "
                              f"{ms(t['predicted_ttft_p99_ns'])} ms; {ms(t['mean_saved_ns'])} ms saved "
                              "per request on average", "  "))
        else:
            lines.append("  requests: none wholly inside the recording")
    lines += [wrap("warning: " + w, "  ") for w in p.warnings]
    if p.sweep is not None:
        lines += sweep_lines(p)
    elif len(r.pooled):
        lines += pool_lines(r, p.t0, rows)
    return lines


def pool_lines(r: Replay, t0: int, rows: int | None) -> list[str]:
    shown = r.pooled if rows is None else r.pooled.head(rows)
    lines = ["  pool over time (s from the recording's start; MiB as the pool counts them)",
             f"  {'at s':>10} {'event':16} {'MiB':>9} {'pooled MiB':>11} {'buffers':>8}"]
    for e in shown.itertuples():
        lines.append(f"  {(e.t_ns - t0) / 1e9:>10.3f} {e.event:16} {e.bytes / (1 << 20):>9.1f} "
                     f"{e.pooled_bytes / (1 << 20):>11.1f} {e.pooled_buffers:>8}")
    if len(shown) < len(r.pooled):
        lines.append(f"  ... {len(r.pooled) - len(shown)} more changes (--all shows every one)")
    return lines


def sweep_lines(p: ProcessResult) -> list[str]:
    lines = [f"  sweep of {p.sweep_param} (the other rules as above)",
             f"  {p.sweep_param:>12} {'hits':>6} {'displaced':>9} {'trims':>5} {'pooled MiB':>10} "
             f"{'held MiB':>9} {'faults saved':>12} {'fill CPU ms':>11}"]
    for row in p.sweep.to_dict("records"):
        lines.append(f"  {_value(p.sweep_param, row['value']):>12} {row['hits']:>6} {row['evictions']:>9} "
                     f"{row['trims']:>5} {row['pooled_hwm_bytes'] / (1 << 20):>10.1f} "
                     f"{mib(row['held_hwm_bytes']):>9} {row['faults_avoided']:>12} "
                     f"{ms(row['fill_cpu_saved_ns']):>11}")
    return lines


def _value(param: str, v) -> str:
    if param == "cap-bytes":
        return f"{v:g} host" if isinstance(v, float) else mib_text(v)
    if param == "floor":
        return mib_text(v)
    if param == "trim-idle":
        return "never" if v is None or v != v else f"{v / 1e9:g} s"  # the frame holds never as NaN
    return str(v)


def whatif_report(results: list[ProcessResult], rows: int | None = 20) -> str:
    return "\n\n".join("\n".join(process_lines(p, rows)) for p in results)


def whatif_json(results: list[ProcessResult]) -> dict:
    out = []
    for p in results:
        r = p.replay
        doc = {"trace": p.trace, "pid": p.pid, "label": p.label, "warnings": p.warnings}
        if r is not None:
            doc.update({"summary": r.summary, "memory_limit": r.limit, "outcomes": records(r.outcomes),
                        "pooled": records(r.pooled), "held": records(r.held)})
            if r.requests is not None:
                doc["requests"] = {"summary": ttft_summary(r.requests), "rows": records(r.requests)}
        if p.sweep is not None:
            rows = p.sweep.astype({"value": "object"})[list(SWEEP_COLUMNS)]
            # trim-idle's `never` is no number (NaN in the frame): null in JSON, which has no NaN
            rows["value"] = rows["value"].where(rows["value"].notna(), None)
            doc["sweep"] = {"param": p.sweep_param, "rows": records(rows)}
        out.append(doc)
    return {"processes": out, "warnings": [w for p in out for w in p["warnings"]]}
