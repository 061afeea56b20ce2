"""One row per server iteration (see spans.py for where iterations come from): what its checkpoints
cost, prefill or decode.

Kind rule: an iteration is `prefill` when it made at least one checkpoint that is not speculative
(`spec`: a speculative round saves state before decoding drafted tokens) or its batches carried
prompt tokens (`prompt_tokens > 0`, tokens that ask for no logits); otherwise `decode`.

Per iteration: `fill_ns`, `copy_ns`, `fault_ns` (= `fill_fault_ns` + `copy_fault_ns`, NA when a
checkpoint's is not recorded), `bytes`, `faults` (whole-checkpoint fault counts) are sums over its
checkpoints, and so are `fill_cpu_ns`, `copy_cpu_ns`, `fill_wait_ns`, `copy_wait_ns`; `cpu_ns` and
`wait_ns` are the update_slots call's on-CPU time and run-queue wait (NA
for llama_decode boundaries, whose clocks cover only the decode call, and when not recorded); `other_ns = span_ns -
fill_ns - copy_ns`; `mmaps` and `munmaps` count the syscalls made anywhere in it; `span_faults` is
the boundary span's own fault count (the whole update_slots call, or only the llama_decode call
for decode boundaries).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.trace import empty_frame

from .events import KindRows, kind_rows
from .spans import BOUNDARIES, CLOCK_COLUMNS, NA_INT, assign_iterations, sum_by

ITERATION_KINDS = ["prefill", "decode"]

ITERATION_COLUMNS: dict[str, object] = {
    "iter": np.dtype("int64"),
    "tid": np.dtype("int32"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "span_ns": np.dtype("int64"),
    "kind": pd.CategoricalDtype(ITERATION_KINDS),
    "fill_ns": np.dtype("int64"),
    "copy_ns": np.dtype("int64"),
    "fault_ns": NA_INT,
    "fill_fault_ns": NA_INT,
    "copy_fault_ns": NA_INT,
    "other_ns": np.dtype("int64"),
    **CLOCK_COLUMNS,
    "checkpoints": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "faults": np.dtype("int64"),
    "mmaps": np.dtype("int64"),
    "munmaps": np.dtype("int64"),
    "tokens": np.dtype("int64"),
    "prompt_tokens": np.dtype("int64"),
    "span_faults": np.dtype("int64"),
    "boundary": pd.CategoricalDtype(BOUNDARIES),
}


def iteration_table(rows: KindRows | pd.DataFrame, spans: pd.DataFrame, checkpoints: pd.DataFrame) -> pd.DataFrame:
    """One row per iteration (ITERATION_COLUMNS), sorted by start_ns, from iteration_spans(rows)
    and checkpoint_table(rows, spans)."""
    rows = kind_rows(rows)
    if not len(spans):
        return empty_frame(ITERATION_COLUMNS)
    ck = checkpoints.loc[checkpoints["iter"] != 0]
    ck = ck.assign(prompt_checkpoint=~ck["spec"])
    per = ck.groupby("iter").agg(fill_ns=("fill_ns", "sum"), copy_ns=("copy_ns", "sum"),
                                 checkpoints=("ckpt", "size"), bytes=("bytes", "sum"), faults=("faults", "sum"),
                                 prompt_checkpoints=("prompt_checkpoint", "sum"))
    summed = ("fault_ns", "fill_fault_ns", "copy_fault_ns", "fill_cpu_ns", "copy_cpu_ns", "fill_wait_ns", "copy_wait_ns")
    for c in summed:
        per[c] = sum_by(ck[c], ck["iter"])
    t = spans.join(per, on="iter")
    for kind in ("mmap", "munmap"):
        sys_iter = assign_iterations(rows.of(kind), spans)
        t[f"{kind}s"] = t["iter"].map(pd.Series(sys_iter[sys_iter != 0]).value_counts())
    for c in ["fill_ns", "copy_ns", "checkpoints", "bytes", "faults", "mmaps", "munmaps"]:
        t[c] = t[c].fillna(0).astype("int64")
    no_checkpoint = t["iter"].map(per["checkpoints"]).isna()
    for c in summed:  # no checkpoint: no fault time; no fill or copy time on or off CPU where recorded
        zero = no_checkpoint if "fault" in c else no_checkpoint & t["cpu_ns"].notna()
        t[c] = t[c].astype(NA_INT).mask(zero, 0)
    t["span_ns"] = t["end_ns"] - t["start_ns"]
    t["other_ns"] = t["span_ns"] - t["fill_ns"] - t["copy_ns"]
    prefill = (t["iter"].map(per["prompt_checkpoints"]).fillna(0) > 0) | (t["prompt_tokens"] > 0)
    t["kind"] = pd.Categorical.from_codes(np.where(prefill.to_numpy(), 0, 1), dtype=ITERATION_COLUMNS["kind"])
    return t[list(ITERATION_COLUMNS)].astype(ITERATION_COLUMNS).reset_index(drop=True)
