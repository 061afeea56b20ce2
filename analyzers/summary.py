"""Per-trace summary figures (plain JSON-ready dict) from the checkpoint and iteration tables.

Distributions (`stats`): count, mean, median, p90, p99 over all checkpoints (pool hits included,
so a pool shows up as fill time 0) and over prefill iterations. `checkpoint_share_of_prefill` is
the checkpoint time of checkpoints inside prefill iterations over those iterations' time.
`faults_per_mib` and `ns_per_mib` are whole-checkpoint faults and time per MiB of state copied.
`reliable` is false, and `reliability` says why, when lost events or spans cut off at attach or
stop mean some figures miss events.

Values not recorded (NA) are never read as 0: a distribution with any has no figures, only
its counts. `wait_share` is the checkpoints' run-queue wait over their wall time
(`prefill_wait_share` the same for prefill iterations): above 10%, wall times mostly measure the
machine's load; read the on-CPU figures. `fault_sources` counts checkpoints by `fault_source`.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ckptrace.core.meta import TraceMeta
from ckptrace.core.units import MIB, mib_said

from .metrics import METRICS
from .spans import Ids
from .sums import checked_sum

# The distributions, from the metric table (metrics.py): metric -> (its frame, its column).
STAT_METRICS = {m.name: ("checkpoints" if m.sample == "checkpoint" else "prefill", m.columns[0])
                for m in METRICS.values() if m.summary}
WAIT_WARN_SHARE = 0.10


def describe(values) -> dict:
    """count, mean, median, p90, p99 of a 1-D sample; None for the figures of an empty one.

    `not_recorded` counts NA values. Figures over part of a sample would be biased (the values
    not recorded are rarely a random part), so any NA makes the figures None; `count` is the
    number recorded."""
    s = pd.Series(values)
    missing = int(s.isna().sum())
    v = s.dropna().to_numpy(dtype="float64")
    out = {"count": int(len(v)), "not_recorded": missing, "mean": None, "median": None, "p90": None, "p99": None}
    if not len(v) or missing:
        return out
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {**out, "mean": float(v.mean()), "median": float(p50), "p90": float(p90), "p99": float(p99)}


def _ratio(num: float, den: float) -> float | None:
    """num / den; None when den is 0. Both are exact sums (Python ints) or counts: finite."""
    return float(num) / float(den) if den else None


def wait_share(frame: pd.DataFrame, wall: str, what: str) -> float | None:
    """Run-queue wait over wall time, over the rows whose wait was recorded; None when none was."""
    ok = frame["wait_ns"].notna().to_numpy()
    if not ok.any():
        return None
    return _ratio(checked_sum(frame.loc[ok, "wait_ns"], f"the {what}' wait_ns"),
                  checked_sum(frame.loc[ok, wall], f"the {what}' {wall}"))


def _meta_field(meta: TraceMeta, name: str):
    """A metadata field a newer recorder writes, as plain JSON values (typed field or, before the
    schema knows it, extra)."""
    value = getattr(meta, name, None)
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value if value is not None else meta.extra.get(name)


def gpu_hazard(checkpoints: int, fresh_bytes: int, of: int) -> str:
    """The warning where copies landed in pages they faulted in: what a CPU trace can say of CUDA."""
    return (f"{checkpoints} of {of} checkpoints copied into pages not yet resident ({mib_said(fresh_bytes)} "
            "faulted in by the copy): on a CUDA context that copy is the slow pageable path (llama.cpp PR #201 "
            "measured about 140x slower than into resident memory); its cost there is measured only on a GPU")


def _problems(meta: TraceMeta) -> list[str]:
    """What makes a trace's figures miss events (`reliable` false): each said once."""
    lost, partial, open_ = meta.lost_events, meta.partial_spans, meta.open_at_stop.total
    problems = []
    if lost:
        problems.append(f"{lost} events were lost (ring buffer full): counts and times may be low "
                        "and some checkpoints or iterations may be missing")
    cut = 0 if meta.mode == "launch" else partial  # held before exec: nothing was entered before the probes
    if partial - cut:
        problems.append(f"{partial} partial spans (a return seen without its entry) were dropped")
    if cut or open_:
        problems.append(f"{cut + open_} spans were cut off at attach or stop and dropped "
                        f"({cut} partial, {open_} open at stop): the first or last iteration "
                        "may be incomplete")
    if getattr(meta, "map_full", 0):
        problems.append(f"{meta.map_full} thread events were not seen (the recorder's per-thread map was "
                        "full): some threads' checkpoints or iterations may be missing")
    if getattr(meta, "complete", True) is False:
        problems.append(f"cut short: {meta.cut_short or 'the recorder did not finish this trace'}")
    return problems


def _fault_notes(checkpoints: pd.DataFrame, fault_sources: dict[str, int]) -> list[str]:
    """How each checkpoint's fault time was had: not recorded, estimated (and past its span's time)."""
    notes = []
    if fault_sources["not recorded"]:
        notes.append(f"fault time not recorded for {fault_sources['not recorded']} checkpoints (no measured "
                     "span of their kind in this trace, e.g. trace format 1): their fault_ns is NA; fill "
                     "and copy times still include their faults")
    if fault_sources["estimated"]:
        notes.append(f"fault time estimated for {fault_sources['estimated']} checkpoints (faults x the median "
                     "ns per fault of measured spans of the same kind in this trace)")
        over = checkpoints["fault_source"].eq("estimated") & (
            checkpoints["fault_ns"] > checkpoints["cpu_ns"].fillna(checkpoints["total_ns"]))
        if over.any():
            notes.append(f"{int(over.sum())} estimated fault times exceed their checkpoint's time: the "
                         "estimate is not clamped; those spans faulted more cheaply than the median")
    return notes


def _time_notes(sched, cpu_recorded: bool, any_spans: bool, shares: dict[str, float | None]) -> list[str]:
    """On-CPU time not recorded, or spans that mostly waited for a CPU."""
    notes = []
    if not cpu_recorded and any_spans:
        why = sched.get("note") if isinstance(sched, dict) and sched.get("note") else \
            "trace format 1, or a recorder without scheduler counters"
        notes.append(f"on-CPU time and run-queue wait not recorded ({why}): wall times include waiting for a CPU")
    for what, share in shares.items():
        if share is not None and share > WAIT_WARN_SHARE:
            notes.append(f"{what} spent {share * 100:.0f}% of their wall time waiting for a CPU: the machine "
                         "was busy; read the on-CPU figures (*_cpu_ns)")
    return notes


def _placement_notes(checkpoints: pd.DataFrame, fresh: np.ndarray, unassigned: int) -> list[str]:
    """Copies into pages not yet resident (the CUDA hazard), checkpoints in no iteration."""
    notes = []
    if fresh.any():
        notes.append(gpu_hazard(int(fresh.sum()), checked_sum(checkpoints.loc[fresh, "fresh_bytes"],
                                                              "the checkpoints' fresh_bytes"), len(checkpoints)))
    if unassigned:
        notes.append(f"{unassigned} checkpoints fall in no iteration (no update_slots or llama_decode "
                     "boundary on their thread, or cut off)")
    return notes


def summarize(checkpoints: pd.DataFrame, iterations: pd.DataFrame, meta: TraceMeta) -> dict:
    # Only the columns read here: a whole-row copy of millions of iterations costs more than the rest.
    is_prefill = (iterations["kind"] == "prefill").to_numpy()
    prefill = iterations.loc[is_prefill, ["span_ns", "cpu_ns", "wait_ns"]]
    frames = {"checkpoints": checkpoints, "prefill": prefill}
    stats = {name: describe(frames[src][col].to_numpy()) for name, (src, col) in STAT_METRICS.items()}

    n = len(checkpoints)
    hits = int(checkpoints["pool_hit"].sum())
    classes = checkpoints["buffer"].value_counts().reindex(checkpoints["buffer"].cat.categories, fill_value=0)
    fresh = checkpoints["fresh_bytes"].to_numpy() > 0
    # Every sum of times or bytes is exact or refused (sums.py): never a wrapped int64 printed.
    total = {c: checked_sum(checkpoints[c], f"the checkpoints' {c}")
             for c in ("bytes", "faults", "total_ns", "fill_ns", "copy_ns")}
    mib = total["bytes"] / MIB
    # Each checkpoint's iteration is prefill (position -1, no iteration: the False appended).
    at = Ids(iterations["iter"].to_numpy()).find(checkpoints["iter"].to_numpy())
    in_prefill = np.append(is_prefill, False)[at]
    sources = checkpoints["fault_source"].value_counts().reindex(checkpoints["fault_source"].cat.categories,
                                                                  fill_value=0)
    fault_sources = {str(k): int(v) for k, v in sources.items()}

    lost, partial, open_ = meta.lost_events, meta.partial_spans, meta.open_at_stop.total
    problems = _problems(meta)
    reliability = "; ".join(problems) if problems else "no events lost and no spans cut off"
    sched = _meta_field(meta, "sched_counters")
    cpu_recorded = bool(checkpoints["cpu_ns"].notna().any() or prefill["cpu_ns"].notna().any())
    shares = {"checkpoints": wait_share(checkpoints, "total_ns", "checkpoints"),
              "prefill iterations": wait_share(prefill, "span_ns", "prefill iterations")}
    unassigned = int((checkpoints["iter"] == 0).sum())
    notes = (_fault_notes(checkpoints, fault_sources)
             + _time_notes(sched, cpu_recorded, bool(n or len(prefill)), shares)
             + _placement_notes(checkpoints, fresh, unassigned))

    return {
        "checkpoints": n,
        "pool_hits": hits,
        "pool_hit_rate": _ratio(hits, n),
        "buffers": {str(k): int(v) for k, v in classes.items()},
        "fresh_copy_checkpoints": int(fresh.sum()),
        "fresh_copy_bytes": checked_sum(checkpoints["fresh_bytes"], "the checkpoints' fresh_bytes"),
        "draft_checkpoints": int(checkpoints["draft"].sum()),
        "unassigned_checkpoints": unassigned,
        "checkpoint_bytes": total["bytes"],
        "iterations": int(len(iterations)),
        "prefill_iterations": int(len(prefill)),
        "decode_iterations": int(len(iterations) - len(prefill)),
        "stats": stats,
        "checkpoint_share_of_prefill": _ratio(
            checked_sum(checkpoints.loc[in_prefill, "total_ns"], "the prefill checkpoints' total_ns"),
            checked_sum(prefill["span_ns"], "the prefill iterations' span_ns")),
        "faults_per_mib": _ratio(total["faults"], mib),
        "ns_per_mib": _ratio(total["total_ns"], mib),
        "fill_ns_per_mib": _ratio(total["fill_ns"], mib),
        "copy_ns_per_mib": _ratio(total["copy_ns"], mib),
        "fault_sources": fault_sources,
        "fault_time": _meta_field(meta, "fault_time"),
        "sched_counters": sched,
        "cpu_time_recorded": cpu_recorded,
        "wait_share": shares["checkpoints"],
        "prefill_wait_share": shares["prefill iterations"],
        "lost_events": lost,
        "complete": getattr(meta, "complete", True) is not False,
        "map_full": getattr(meta, "map_full", 0),
        "partial_spans": partial,
        "open_at_stop": open_,
        "reliable": not problems,
        "reliability": reliability,
        "notes": notes,
    }
