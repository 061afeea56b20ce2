"""The answer at a glance: what the candidate removes, and what it costs, in one sentence.

First in `compare` (text, markdown, --json) and first in the dashboard. Every figure is one the
comparison already judged, taken from its rows, never computed apart:
- per checkpoint: the on-CPU time removed (baseline mean less candidate mean, warm checkpoints),
  with the 95% interval of that difference (`checkpoint_total_cpu_ns`); wall time
  (`checkpoint_total_ns`) when on-CPU time was not recorded;
- per prefill iteration: the host's work removed (the update_slots call's on-CPU time,
  `prefill_iteration_cpu_ns`; wall `prefill_iteration_ns` when not recorded);
- time to first token p90 (`ttft_p90_ms`), when the legs have request files: its change in ms,
  how much of it the traced checkpoint path explains and the rest (ttft.py), and its verdict only
  where ttft.py's rules let it stand (enough requests; the traced path explains it);
- the candidate's pool hit rate after warm-up (and with it): hits are reused, resident buffers
  (the `buffer` class, core/rules.py), never a fill that vanished because the copy now faults
  the pages in: that is said as such ("moved"), with the copy's fault time before and after, and
  every leg whose copies landed in pages not yet resident is named (`fresh_copies`);
- what it costs: checkpoint memory held at peak (and RSS, where recorded), arms' means.
"""
from __future__ import annotations

import math

import numpy as np

from ckptrace.core.terminal import shown_label
from ckptrace.core.units import ms_change

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


def _mean_ms(values) -> float | None:
    v = np.asarray(values, dtype="float64")
    v = v[~np.isnan(v)]
    return float(v.mean()) / 1e6 if len(v) else None


def _moved(analyses, arms, warm) -> dict | None:
    """The candidate's warm checkpoints that had no fill because their copy faulted the pages in
    (buffer "fresh" or "partial"): what they faulted in, and the copy's fault time per warm
    checkpoint in each arm (ms, where measured). None when it has none."""
    import pandas as pd

    def of(arm):
        cks = [a.checkpoints.loc[w.warm] for a, w, x in zip(analyses, warm, arms) if x == arm]
        return pd.concat(cks) if cks else None

    cand, base = of("candidate"), of("baseline")
    if cand is None or base is None:
        return None
    moved = cand["buffer"].isin(["fresh", "partial"]).to_numpy()
    if not moved.any():
        return None
    fresh = int(cand.loc[moved, "fresh_bytes"].sum())
    return {"checkpoints": int(moved.sum()), "warm_checkpoints": len(cand), "fresh_bytes": fresh,
            "fresh_mib_per_checkpoint": fresh / int(moved.sum()) / 2**20,
            "baseline_copy_fault_ms": _mean_ms(base["copy_fault_ns"].to_numpy("float64", na_value=np.nan)),
            "candidate_copy_fault_ms": _mean_ms(cand["copy_fault_ns"].to_numpy("float64", na_value=np.nan))}


def _fresh_copies(analyses, arms) -> list[dict]:
    """Each leg whose copies landed in pages not yet resident: how many and how much."""
    out = []
    for i, (a, arm) in enumerate(zip(analyses, arms), 1):
        s = a.summary
        if s["fresh_copy_checkpoints"]:
            out.append({"leg": i, "arm": arm, "label": a.trace.label, "checkpoints": s["checkpoints"],
                        "fresh_checkpoints": s["fresh_copy_checkpoints"], "fresh_bytes": s["fresh_copy_bytes"]})
    return out


def moved_said(m: dict) -> str:
    """A fill that vanished into the copy, in the words a reader repeats (llama.cpp PR #201's warning)."""
    out = (f"the fill was not pooled away but moved into the copy: fill removed, but the copy now faults in "
           f"{m['fresh_mib_per_checkpoint']:.1f} MiB of fresh pages per checkpoint ({m['checkpoints']} of its "
           f"{m['warm_checkpoints']} checkpoints after warm-up, {m['fresh_bytes'] / 2**20:.1f} MiB in all): not a "
           "pool hit")
    b, c = m["baseline_copy_fault_ms"], m["candidate_copy_fault_ms"]
    if b is not None and c is not None:
        out += f"; the copy's fault time {'rose' if c >= b else 'fell'} by {abs(c - b):.1f} ms per checkpoint " \
               f"({b:.1f} -> {c:.1f} ms)"
    return out + ("; on a CUDA context this is the slow pageable path (llama.cpp PR #201), a cost measured only "
                  "on a GPU")


def fresh_copies_said(items: list[dict], quote=str) -> str:
    """The GPU hazard a CPU trace can see, per leg (headline's fresh_copies): copies into pages not yet resident."""
    legs = "; ".join(f"leg {x['leg']} ({quote(shown_label(x['label']))}) {x['fresh_checkpoints']} of "
                     f"{x['checkpoints']} checkpoints, {x['fresh_bytes'] / 2**20:.1f} MiB" for x in items)
    return (f"copies into pages not yet resident (faulted in by the copy): {legs}. On a CUDA context such a copy "
            "is the slow pageable path (llama.cpp PR #201: about 140x slower than into resident memory); its cost "
            "there is measured only on a GPU.")


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


def _ttft(rows, split) -> dict | None:
    if "ttft_p90_ms" not in rows.index:
        return None
    r = rows.loc["ttft_p90_ms"]

    def num(v):
        return None if v is None or not math.isfinite(v) else float(v)

    out = {"baseline_ms": num(r["baseline_value"]), "candidate_ms": num(r["candidate_value"]),
           "change_pct": num(r["change_pct"]), "verdict": str(r["verdict"]), "why": str(r["why"])}
    s = split.set_index("metric") if split is not None and len(split) else None
    if s is not None and "ttft_p90_ms" in s.index:
        x = s.loc["ttft_p90_ms"]
        out.update(change_ms=num(x["change_ms"]), explained_ms=num(x["explained_ms"]), outside_ms=num(x["outside_ms"]),
                   requests_baseline=int(x["requests_baseline"]), requests_candidate=int(x["requests_candidate"]),
                   min_requests=int(x["min_requests"]))
    return out


def _ttft_said(t: dict) -> str:
    """'; time to first token p90 +2976 ms (+36%, 8367 -> 11343 ms; too few samples: ...), of which
    the checkpoint path explains -34 ms; the rest (+3010 ms) lies outside the traced path (...)'."""
    from .ttft import explained_said

    if t["change_pct"] is None:
        return "; time to first token p90 " + t["verdict"]
    verdict = t["verdict"] + (f": {t['why']}" if t["verdict"] == "too few samples" and t.get("why") else "")
    if t.get("change_ms") is None:
        return (f"; time to first token p90 {t['change_pct']:+.0f}% ({t['baseline_ms']:.0f} -> "
                f"{t['candidate_ms']:.0f} ms, {verdict})")
    return (f"; time to first token p90 {ms_change(t['change_ms'])} ({t['change_pct']:+.0f}%, {t['baseline_ms']:.0f} -> "
            f"{t['candidate_ms']:.0f} ms, {verdict}), " + explained_said(t))


def headline(c, analyses, arms, warm) -> dict:
    """{"sentence": ..., and each figure} for a Comparison (see the module docstring)."""
    rows = c.metrics.set_index("metric")
    h = {key: _removed(rows, metric, fallback) for key, metric, fallback, _, _ in FIGURES}
    h.update(ttft_p90=_ttft(rows, getattr(c, "ttft", None)), hit_rate=_hit_rate(c, analyses, arms, warm),
             memory=_memory(c), moved=_moved(analyses, arms, warm), fresh_copies=_fresh_copies(analyses, arms))
    return {"sentence": sentence(h, c.candidate, c.baseline), **h}


def sentence(h: dict, candidate: str, baseline: str, quote=str) -> str:
    """The headline's figures in one sentence; `quote` shows a label (made printable, code, ...),
    each cut to LABEL_MAX first (core/terminal.py)."""
    candidate, baseline = shown_label(candidate), shown_label(baseline)
    parts = [_time_said(h[key], what, per) for key, _, _, what, per in FIGURES if h.get(key) is not None]
    out = f"{quote(candidate)} " + (" and ".join(parts) if parts else "could not be measured")
    ttft = h.get("ttft_p90")
    if ttft is not None:
        out += _ttft_said(ttft)
    hit = h["hit_rate"]
    if h.get("moved"):
        out += f"; {moved_said(h['moved'])}"
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


# What a checkpoint's or an iteration's time is split into, bottom to top; the same everywhere.
PARTS = ("fill", "copy", "faults", "wait", "other")


def time_parts(frame, span: str = "span_ns"):
    """Each row's `span` (wall time) split into PARTS, adding up to it, and how many rows' fault
    time had to be cut to its phase's time.

    With on-CPU time recorded, fill and copy are their on-CPU time less their fault time, and
    the run-queue wait is its own part, within what those leave of the wall time (clocks read at
    slightly different instants can disagree by a little); without it, fill and copy are wall
    times less their fault time and there is no wait part. Fault time not recorded counts as 0
    (fill and copy keep it). `other` is the rest: blocked, and what is neither."""
    import pandas as pd

    def col(name):
        return frame[name].to_numpy(dtype="float64", na_value=np.nan)

    timed = ~np.isnan(col("fill_cpu_ns")) & ~np.isnan(col("copy_cpu_ns")) & ~np.isnan(col("wait_ns"))
    fill = np.where(timed, col("fill_cpu_ns"), col("fill_ns"))
    copy = np.where(timed, col("copy_cpu_ns"), col("copy_ns"))
    fill_fault, copy_fault = np.nan_to_num(col("fill_fault_ns")), np.nan_to_num(col("copy_fault_ns"))
    over = int(((fill_fault > fill) | (copy_fault > copy)).sum())
    fill_fault, copy_fault = np.minimum(fill_fault, fill), np.minimum(copy_fault, copy)
    parts = pd.DataFrame({"start_ns": frame["start_ns"].to_numpy(), "fill": fill - fill_fault,
                          "copy": copy - copy_fault, "faults": fill_fault + copy_fault})
    rest = np.maximum(col(span) - (parts["fill"] + parts["copy"] + parts["faults"]).to_numpy(), 0.0)
    parts["wait"] = np.minimum(np.where(timed, np.nan_to_num(col("wait_ns")), 0.0), rest)
    parts["other"] = rest - parts["wait"].to_numpy()
    return parts, over


def stacked_parts(checkpoints, warm_mask) -> dict[str, float]:
    """One arm's mean warm checkpoint split into PARTS (ms, adding up to its mean wall time)."""
    ck = checkpoints.loc[warm_mask]
    if not len(ck):
        return {}
    parts, _ = time_parts(ck, "total_ns")
    return {p: float(parts[p].mean()) / 1e6 for p in PARTS}
