"""Per-trace summary figures (plain JSON-ready dict) from the checkpoint and iteration tables.

Distributions (`stats`): count, mean, median, p90, p99 over all checkpoints (pool hits included,
so a pool shows up as fill time 0) and over prefill iterations. `checkpoint_share_of_prefill` is
the checkpoint time of checkpoints inside prefill iterations over those iterations' time.
`faults_per_mib` and `ns_per_mib` are whole-checkpoint faults and time per MiB of state copied.
`reliable` is false, and `reliability` says why, when lost events or spans cut off at attach or
stop mean some figures miss events.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.meta import TraceMeta
from ckptrace.units import MIB

STAT_METRICS = {
    "checkpoint_fill_ns": ("checkpoints", "fill_ns"),
    "checkpoint_copy_ns": ("checkpoints", "copy_ns"),
    "checkpoint_fault_ns": ("checkpoints", "fault_ns"),
    "checkpoint_total_ns": ("checkpoints", "total_ns"),
    "prefill_iteration_ns": ("prefill", "span_ns"),
}


def describe(values) -> dict:
    """count, mean, median, p90, p99 of a 1-D sample; None for the figures of an empty one."""
    v = np.asarray(values, dtype="float64")
    if not len(v):
        return {"count": 0, "mean": None, "median": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"count": int(len(v)), "mean": float(v.mean()), "median": float(p50),
            "p90": float(p90), "p99": float(p99)}


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def summarize(checkpoints: pd.DataFrame, iterations: pd.DataFrame, meta: TraceMeta) -> dict:
    prefill = iterations.loc[iterations["kind"] == "prefill"]
    frames = {"checkpoints": checkpoints, "prefill": prefill}
    stats = {name: describe(frames[src][col].to_numpy()) for name, (src, col) in STAT_METRICS.items()}

    n = len(checkpoints)
    hits = int(checkpoints["pool_hit"].sum())
    mib = checkpoints["bytes"].sum() / MIB
    in_prefill = checkpoints["iter"].isin(prefill["iter"])
    fault_measured = bool(checkpoints["fault_timed"].sum() > 0)

    lost, partial, open_ = meta.lost_events, meta.partial_spans, meta.open_at_stop.total
    problems = []
    if lost:
        problems.append(f"{lost} events were lost (ring buffer full): counts and times may be low "
                        "and some checkpoints or iterations may be missing")
    if partial or open_:
        problems.append(f"{partial + open_} spans were cut off at attach or stop and dropped "
                        f"({partial} partial, {open_} open at stop): the first or last iteration "
                        "may be incomplete")
    reliability = "; ".join(problems) if problems else "no events lost and no spans cut off"
    notes = []
    if not fault_measured and n:
        notes.append("fault time was not measured (no timed faults): fault_ns is 0, fill and copy "
                     "times still include their faults")
    unassigned = int((checkpoints["iter"] == 0).sum())
    if unassigned:
        notes.append(f"{unassigned} checkpoints fall in no iteration (no update_slots or llama_decode "
                     "boundary on their thread, or cut off)")

    return {
        "checkpoints": n,
        "pool_hits": hits,
        "pool_hit_rate": _ratio(hits, n),
        "draft_checkpoints": int(checkpoints["draft"].sum()),
        "unassigned_checkpoints": unassigned,
        "checkpoint_bytes": int(checkpoints["bytes"].sum()),
        "iterations": int(len(iterations)),
        "prefill_iterations": int(len(prefill)),
        "decode_iterations": int(len(iterations) - len(prefill)),
        "stats": stats,
        "checkpoint_share_of_prefill": _ratio(checkpoints.loc[in_prefill, "total_ns"].sum(),
                                              prefill["span_ns"].sum()),
        "faults_per_mib": _ratio(checkpoints["faults"].sum(), mib),
        "ns_per_mib": _ratio(checkpoints["total_ns"].sum(), mib),
        "fill_ns_per_mib": _ratio(checkpoints["fill_ns"].sum(), mib),
        "copy_ns_per_mib": _ratio(checkpoints["copy_ns"].sum(), mib),
        "fault_time_measured": fault_measured,
        "fault_sample_every": meta.fault_sample_every,
        "lost_events": lost,
        "partial_spans": partial,
        "open_at_stop": open_,
        "reliable": not problems,
        "reliability": reliability,
        "notes": notes,
    }
