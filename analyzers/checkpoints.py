"""One row per checkpoint: its fill, copy and fault time, fault counts and syscalls, from trace events.

- `fill_ns`/`copy_ns`: the whole time in the resize (`_M_default_append`) and in the state copy
  (`llama_state_seq_get_data_ext`) rows carrying the checkpoint's id, faults included; several
  rows of a kind add up. `other_ns = total_ns - fill_ns - copy_ns`.
- `pool_hit`: the checkpoint has no fill row (the buffer did not need to grow).
- An update_tgt/update_dft call that made no state copy (update_dft without a draft model
  returns at once) saved nothing and is not a checkpoint: it is left out.
- Fault time, per fill/copy span: `faults * fault_timed_ns / fault_timed` (the recorder times
  faults in sampled time slices, see the trace's `fault_time_definition`). A span with no timed fault uses the
  trace-wide mean ns per timed fault of its kind, else of fill and copy together, else 0 (then
  nothing was timed: `fault_timed` is 0 everywhere). An estimate never exceeds its span.
- `faults`: the whole checkpoint's fault count; `fill_faults`/`copy_faults` those of its spans.
- `mmaps`/`munmaps`: syscalls made while the checkpoint was open on its thread.
- `iter`: the iteration it falls in (see spans.py), 0 when none.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.errors import AnalysisError
from ckptrace.trace import empty_frame

from .spans import assign_iterations, kind_mask

CHECKPOINT_COLUMNS: dict[str, object] = {
    "ckpt": np.dtype("int64"),
    "tid": np.dtype("int32"),
    "iter": np.dtype("int64"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "total_ns": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "draft": np.dtype("bool"),
    "fill_ns": np.dtype("int64"),
    "copy_ns": np.dtype("int64"),
    "other_ns": np.dtype("int64"),
    "fill_fault_ns": np.dtype("int64"),
    "copy_fault_ns": np.dtype("int64"),
    "fault_ns": np.dtype("int64"),
    "fill_faults": np.dtype("int64"),
    "copy_faults": np.dtype("int64"),
    "faults": np.dtype("int64"),
    "fault_timed": np.dtype("int64"),  # faults of fill+copy whose time was measured
    "mmaps": np.dtype("int64"),
    "munmaps": np.dtype("int64"),
    "pool_hit": np.dtype("bool"),
}

_SPAN_COLS = ["ckpt", "start_ns", "end_ns", "faults", "fault_timed", "fault_timed_ns"]


def _mean_ns_per_timed_fault(*spans: pd.DataFrame) -> float:
    timed = sum(int(s["fault_timed"].sum()) for s in spans)
    return sum(int(s["fault_timed_ns"].sum()) for s in spans) / timed if timed else 0.0


def _per_checkpoint(spans: pd.DataFrame, fallback_ns: float) -> pd.DataFrame:
    """Sum a kind's spans per checkpoint id: ns, fault_ns (estimated), faults, timed."""
    span_ns = (spans["end_ns"] - spans["start_ns"]).to_numpy()
    faults = spans["faults"].to_numpy()
    timed = spans["fault_timed"].to_numpy()
    timed_ns = spans["fault_timed_ns"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        per_fault = np.where(timed > 0, timed_ns / np.maximum(timed, 1), fallback_ns)
    est = np.minimum(np.rint(faults * per_fault), span_ns).astype("int64")
    return pd.DataFrame({"ckpt": spans["ckpt"].to_numpy(), "ns": span_ns, "fault_ns": est,
                         "faults": faults, "timed": timed, "n": 1}).groupby("ckpt").sum()


def checkpoint_table(events: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpoint (CHECKPOINT_COLUMNS), sorted by start_ns; `spans` from iteration_spans(events)."""
    ck = events.loc[kind_mask(events, "checkpoint"),
                    ["ckpt", "tid", "iter", "start_ns", "end_ns", "bytes", "draft", "faults"]]
    if not len(ck):
        return empty_frame(CHECKPOINT_COLUMNS)
    dup = ck["ckpt"].duplicated()
    if dup.any():
        raise AnalysisError(
            f"checkpoint id {int(ck['ckpt'][dup].iloc[0])} appears on {int(dup.sum()) + 1} checkpoint rows: "
            "ids must be unique within a trace; analyze each recording separately")

    fills = events.loc[kind_mask(events, "fill"), _SPAN_COLS]
    copies = events.loc[kind_mask(events, "copy"), _SPAN_COLS]
    # An update that copied no state saved nothing: llama-server calls update_dft on every
    # checkpoint, and without a draft model it returns at once. Not a checkpoint.
    ck = ck[ck["ckpt"].isin(copies["ckpt"]).to_numpy()]
    if not len(ck):
        return empty_frame(CHECKPOINT_COLUMNS)
    both = _mean_ns_per_timed_fault(fills, copies)
    fill = _per_checkpoint(fills, _mean_ns_per_timed_fault(fills) or both)
    copy = _per_checkpoint(copies, _mean_ns_per_timed_fault(copies) or both)

    t = ck.reset_index(drop=True)
    t["total_ns"] = t["end_ns"] - t["start_ns"]
    ids = t["ckpt"]
    for name, agg in (("fill", fill), ("copy", copy)):
        t[f"{name}_ns"] = ids.map(agg["ns"]).fillna(0).astype("int64")
        t[f"{name}_fault_ns"] = ids.map(agg["fault_ns"]).fillna(0).astype("int64")
        t[f"{name}_faults"] = ids.map(agg["faults"]).fillna(0).astype("int64")
        t[f"{name}_timed"] = ids.map(agg["timed"]).fillna(0).astype("int64")
    t["pool_hit"] = ~ids.isin(fill.index)
    t["other_ns"] = t["total_ns"] - t["fill_ns"] - t["copy_ns"]
    t["fault_ns"] = t["fill_fault_ns"] + t["copy_fault_ns"]
    t["fault_timed"] = t["fill_timed"] + t["copy_timed"]

    sys = events.loc[kind_mask(events, "mmap", "munmap") & (events["ckpt"] != 0).to_numpy(), ["kind", "ckpt"]]
    is_mmap = (sys["kind"] == "mmap").to_numpy()
    t["mmaps"] = ids.map(sys["ckpt"][is_mmap].value_counts()).fillna(0).astype("int64")
    t["munmaps"] = ids.map(sys["ckpt"][~is_mmap].value_counts()).fillna(0).astype("int64")

    t["iter"] = assign_iterations(t, spans)
    t = t[list(CHECKPOINT_COLUMNS)].astype(CHECKPOINT_COLUMNS)
    return t.sort_values(["start_ns", "tid"], kind="stable").reset_index(drop=True)
