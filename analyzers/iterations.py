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

from ckptrace.core.trace import empty_frame

from .events import KindRows, kind_rows
from .spans import BOUNDARIES, CLOCK_COLUMNS, NA_INT, Groups, Ids, assign_iterations, kind_mask
from .sums import bound_table

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


def iteration_table(rows: KindRows | pd.DataFrame, spans: pd.DataFrame, checkpoints: pd.DataFrame,
                    columns: set[str] | None = None) -> pd.DataFrame:
    """One row per iteration (ITERATION_COLUMNS), sorted by start_ns, from iteration_spans(rows)
    and checkpoint_table(rows, spans). The spans' own columns are shared as Series, not copied (pandas 3
    copies them on write: copy-on-write). `columns`: only these of the summed clocks' columns
    (and every other) are made (export's: issue 39, 9 bytes an iteration each)."""
    rows = kind_rows(rows)
    table = ITERATION_COLUMNS if columns is None else \
        {c: t for c, t in ITERATION_COLUMNS.items() if c in columns or c not in NA_SUMS}
    if not len(spans):
        return empty_frame(table)
    n = len(spans)
    ids = Ids(spans["iter"].to_numpy())

    ck_iter = checkpoints["iter"].to_numpy()
    g = Groups(np.where(ck_iter != 0, ids.find(ck_iter), -1), n)  # every assigned id is one of the spans'
    out: dict[str, object] = {c: spans[c] for c in ("iter", "tid", "start_ns", "end_ns")}
    start, end = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    out["span_ns"] = end - start
    sums = {c: g.sum(checkpoints[c].to_numpy("int64"), f"the checkpoints' {c}")
            for c in ("fill_ns", "copy_ns", "bytes", "faults")}
    saved = g.any(~checkpoints["spec"].to_numpy())  # made a checkpoint not for a speculative round
    recorded, everywhere = spans["cpu_ns"].notna().to_numpy(), np.ones(n, bool)
    for c in [c for c in NA_SUMS if c in table]:
        # no checkpoint: no fault time; no fill or copy time on or off CPU where the span's was recorded
        out[c] = g.sum_na(checkpoints[c].array, everywhere if "fault" in c else recorded, f"the checkpoints' {c}")
    out["fill_ns"], out["copy_ns"] = sums["fill_ns"], sums["copy_ns"]
    out["other_ns"] = out["span_ns"] - sums["fill_ns"]
    out["other_ns"] -= sums["copy_ns"]  # in place: one fewer array of every iteration
    out["cpu_ns"], out["wait_ns"] = spans["cpu_ns"], spans["wait_ns"]
    out["checkpoints"], out["bytes"], out["faults"] = g.count, sums["bytes"], sums["faults"]
    # Syscalls anywhere in the iteration: both kinds placed at once, counted on the kind codes.
    memory = rows.of_group("memory")
    sys_rows = kind_mask(memory, "mmap", "munmap")
    sys = {c: memory[c].to_numpy() for c in ("tid", "start_ns", "end_ns", "iter")}
    if not sys_rows.all():  # (only syscalls, the usual case: no copy)
        sys = {c: v[sys_rows] for c, v in sys.items()}
    sys_iter = assign_iterations(sys, spans)
    at = np.where(sys_iter != 0, ids.find(sys_iter), -1)  # -1: in no iteration
    is_mmap = kind_mask(memory, "mmap")[sys_rows]
    for kind, mine in (("mmap", is_mmap), ("munmap", ~is_mmap)):
        out[f"{kind}s"] = np.bincount(at[mine & (at >= 0)], minlength=n).astype("int64", copy=False)
    for c in ("tokens", "prompt_tokens", "span_faults", "boundary"):
        out[c] = spans[c]
    decode = ~(saved | (spans["prompt_tokens"].to_numpy() > 0))
    out["kind"] = pd.Categorical.from_codes(decode.view("int8"), dtype=ITERATION_COLUMNS["kind"])  # prefill 0, decode 1
    t = pd.DataFrame({c: out[c] for c in table}, copy=False)
    bound_table(t, SUMMED, "iterations")
    return t


# The checkpoints' nullable figures summed per iteration.
NA_SUMS = ("fault_ns", "fill_fault_ns", "copy_fault_ns", "fill_cpu_ns", "copy_cpu_ns", "fill_wait_ns", "copy_wait_ns")

# The columns later sums read that are not sums of the checkpoints' (bounded above): sums.py.
# (other_ns = span_ns - fill_ns - copy_ns: span_ns <= 2^62 and those two sums <= 2^62 each, so it
# fits before it is bounded.) tokens need no check: INT32_MAX x ROWS_MAX < 2^63 (validate.py).
SUMMED = [("span_ns",), ("other_ns",), ("cpu_ns",), ("wait_ns",)]
