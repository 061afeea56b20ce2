"""The answer at a glance: what the candidate removes, and what it costs, in one sentence.

First in `compare` (text, markdown, --json) and first in the dashboard. Every figure is one the
comparison already judged, taken from its rows, never computed apart:
- per checkpoint: the on-CPU time removed (baseline mean less candidate mean, warm checkpoints),
  with the 95% interval of that difference (`checkpoint_total_cpu_ns`); wall time
  (`checkpoint_total_ns`) when on-CPU time was not recorded;
- per prefill iteration: the host's work removed (the update_slots call's on-CPU time,
  `prefill_iteration_cpu_ns`; wall `prefill_iteration_ns` when not recorded);
- time to first token p90 (`ttft_p90_ms`), when the legs have request files;
- the candidate's pool hit rate after warm-up (and with it);
- what it costs: checkpoint memory held at peak (and RSS, where recorded), arms' means.
"""
from __future__ import annotations

import math

import numpy as np

# Each headline figure: (key, the comparison's metric, its wall-time stand-in, what it is on CPU,
# per what). One table, so the names move together.
FIGURES = (("checkpoint", "checkpoint_total_cpu_ns", "checkpoint_total_ns", "on CPU", "per checkpoint"),
           ("prefill", "prefill_iteration_cpu_ns", "prefill_iteration_ns", "of host work (on CPU)",
            "per prefill iteration"))


def _ms(ns: float) -> float:
    return ns / 1e6


def _removed(rows, metric: str, fallback: str) -> dict | None:
    """The time removed (baseline less candidate, ms) of `metric`, else of `fallback`, with its
    interval, change and verdict; None when neither was measured in both arms."""
    for name, measure in ((metric, "on CPU"), (fallback, "wall")):
        if name not in rows.index:
            continue
        r = rows.loc[name]
        if not (math.isfinite(r["baseline_value"]) and math.isfinite(r["candidate_value"])):
            continue
        return {"metric": name, "measure": measure, "removed_ms": -_ms(r["diff"]),
                "ci_low_ms": -_ms(r["diff_ci_high"]), "ci_high_ms": -_ms(r["diff_ci_low"]),
                "baseline_ms": _ms(r["baseline_value"]), "candidate_ms": _ms(r["candidate_value"]),
                "change_pct": None if not math.isfinite(r["change_pct"]) else float(r["change_pct"]),
                "verdict": str(r["verdict"])}
    return None


def _time_said(x: dict, what: str, per: str) -> str:
    verb = "removes" if x["removed_ms"] >= 0 else "adds"
    v, lo, hi = (abs(x["removed_ms"]), x["ci_low_ms"], x["ci_high_ms"])
    if x["removed_ms"] < 0:
        lo, hi = -hi, -lo
    pct = f"{x['change_pct']:+.0f}%, " if x["change_pct"] is not None else ""
    return (f"{verb} {v:.1f} ms {what if x['measure'] == 'on CPU' else 'of wall time'} {per} "
            f"(95% interval {lo:.1f} to {hi:.1f} ms; {pct}{x['verdict']})")


def _hit_rate(c, analyses, arms, warm) -> dict:
    cand = [(a, w) for a, w, x in zip(analyses, warm, arms) if x == "candidate"]
    hits = sum(int(a.checkpoints["pool_hit"].to_numpy()[w.warm].sum()) for a, w in cand)
    n = sum(int(w.warm.sum()) for _, w in cand)
    all_hits = sum(int(a.checkpoints["pool_hit"].sum()) for a, _ in cand)
    all_n = sum(len(a.checkpoints) for a, _ in cand)
    base = [(a, w) for a, w, x in zip(analyses, warm, arms) if x == "baseline"]
    base_hits = sum(int(a.checkpoints["pool_hit"].to_numpy()[w.warm].sum()) for a, w in base)
    base_n = sum(int(w.warm.sum()) for _, w in base)
    return {"warm_hits": hits, "warm_checkpoints": n, "rate": hits / n if n else None,
            "hits": all_hits, "checkpoints": all_n, "baseline_warm_hits": base_hits, "baseline_warm_checkpoints": base_n}


def _memory(c) -> dict | None:
    if c.memory is None or not len(c.memory):
        return None
    m = c.memory.set_index("metric")
    out = {}
    for name in ("held_peak_mib", "rss_peak_mib"):
        if name in m.index and math.isfinite(m.loc[name, "change_mib"]):
            r = m.loc[name]
            out[name] = {"baseline_mib": float(r["baseline_value"]), "candidate_mib": float(r["candidate_value"]),
                         "change_mib": float(r["change_mib"])}
    return out or None


def _ttft(rows) -> dict | None:
    if "ttft_p90_ms" not in rows.index:
        return None
    r = rows.loc["ttft_p90_ms"]
    return {"baseline_ms": None if not math.isfinite(r["baseline_value"]) else float(r["baseline_value"]),
            "candidate_ms": None if not math.isfinite(r["candidate_value"]) else float(r["candidate_value"]),
            "change_pct": None if not math.isfinite(r["change_pct"]) else float(r["change_pct"]),
            "verdict": str(r["verdict"])}


def headline(c, analyses, arms, warm) -> dict:
    """{"sentence": ..., and each figure} for a Comparison (see the module docstring)."""
    rows = c.metrics.set_index("metric")
    h = {key: _removed(rows, metric, fallback) for key, metric, fallback, _, _ in FIGURES}
    h.update(ttft_p90=_ttft(rows), hit_rate=_hit_rate(c, analyses, arms, warm), memory=_memory(c))
    return {"sentence": sentence(h, c.candidate, c.baseline), **h}


def sentence(h: dict, candidate: str, baseline: str, quote=str) -> str:
    """The headline's figures in one sentence; `quote` shows a label (made printable, code, ...)."""
    parts = [_time_said(h[key], what, per) for key, _, _, what, per in FIGURES if h.get(key) is not None]
    out = f"{quote(candidate)} " + (" and ".join(parts) if parts else "could not be measured")
    ttft = h.get("ttft_p90")
    if ttft is not None:
        out += ("; time to first token p90 " + (f"{ttft['change_pct']:+.0f}% ({ttft['baseline_ms']:.0f} -> "
                                                 f"{ttft['candidate_ms']:.0f} ms, {ttft['verdict']})"
                                                 if ttft["change_pct"] is not None else ttft["verdict"]))
    hit = h["hit_rate"]
    if hit["warm_checkpoints"]:
        out += (f"; {100 * hit['rate']:.0f}% of its checkpoints after warm-up hit the pool "
                f"({hit['warm_hits']} of {hit['warm_checkpoints']}; {hit['hits']} of {hit['checkpoints']} "
                "with the warm-up)")
    memory = h.get("memory")
    if memory and "held_peak_mib" in memory:
        m = memory["held_peak_mib"]
        out += (f"; it holds {m['change_mib']:+.1f} MiB of checkpoint memory at peak "
                f"({m['baseline_mib']:.1f} -> {m['candidate_mib']:.1f} MiB)")
        if "rss_peak_mib" in memory:
            out += f", RSS {memory['rss_peak_mib']['change_mib']:+.1f} MiB at peak"
    else:
        out += "; its memory cost was not recorded"
    return out + f", against {quote(baseline)}."


def stacked_parts(checkpoints, warm_mask) -> dict[str, float]:
    """One arm's mean warm checkpoint split into fill, copy, faults, wait, other (ms, adding up to
    its mean wall time): fill and copy on CPU less their fault time (wall where on-CPU time was
    not recorded), fault time, run-queue wait, and the rest (blocked, and what is neither)."""
    ck = checkpoints.loc[warm_mask]
    if not len(ck):
        return {}

    def col(name):
        return ck[name].to_numpy(dtype="float64", na_value=np.nan)

    timed = ~np.isnan(col("fill_cpu_ns")) & ~np.isnan(col("copy_cpu_ns")) & ~np.isnan(col("wait_ns"))
    fill = np.where(timed, col("fill_cpu_ns"), col("fill_ns"))
    copy = np.where(timed, col("copy_cpu_ns"), col("copy_ns"))
    ff, cf = np.minimum(np.nan_to_num(col("fill_fault_ns")), fill), np.minimum(np.nan_to_num(col("copy_fault_ns")), copy)
    total = col("total_ns")
    parts = {"fill": fill - ff, "copy": copy - cf, "faults": ff + cf}
    rest = np.maximum(total - sum(parts.values()), 0.0)
    # the checkpoint's wait, within what fill, copy and faults leave of its wall time (clocks read
    # at slightly different instants can disagree by a little): the parts add up to the mean total
    parts["wait"] = np.minimum(np.where(timed, np.nan_to_num(col("wait_ns")), 0.0), rest)
    parts["other"] = rest - parts["wait"]
    return {k: float(np.mean(v)) / 1e6 for k, v in parts.items()}
