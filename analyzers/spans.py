"""Spans shared by every table: rows of a kind, the server's iterations, and which iteration a row is in.

Where an iteration comes from (per thread):
- A thread with `iteration` rows (the `update_slots` probe) uses them; the kernel already gave
  every checkpoint and syscall inside one its `iter` id. Rows whose id names no recorded
  iteration, or that lie outside that iteration's span or on another thread, are unassigned.
- A thread without them uses its `decode` rows (`llama_decode`): an iteration runs from the end
  of the previous decode on that thread to the end of this one, so the host work before a decode
  (where the server makes its checkpoints) belongs to it. A thread's first iteration starts at
  its earliest event. Rows are assigned with `pd.merge_asof` by thread; such iterations get ids
  above every kernel id in the trace, in order of their end.
- Threads with neither have no iterations; their checkpoints are reported as unassigned.

Scheduler figures (`cpu_ns`, `wait_ns`, `fault_ns`, trace format 2) are nullable: NA means not
recorded (a v1 trace, a kernel without the field, a span the recorder did not measure), and a
sum over spans is NA when any of its parts is, never a partial sum presented as whole.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.trace import empty_frame

from .events import KindRows, kind_rows

BOUNDARIES = ["update_slots", "decode"]

SPAN_COLUMNS: dict[str, object] = {
    "iter": np.dtype("int64"),
    "tid": np.dtype("int32"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "tokens": np.dtype("int64"),
    "prompt_tokens": np.dtype("int64"),
    "span_faults": np.dtype("int64"),
    "cpu_ns": pd.Int64Dtype(),  # the boundary span's on-CPU time (update_slots only)
    "wait_ns": pd.Int64Dtype(),  # its run-queue wait
    "boundary": pd.CategoricalDtype(BOUNDARIES),
}
NA_INT = pd.Int64Dtype()
NULLABLE = ("cpu_ns", "wait_ns", "nvcsw", "nivcsw", "fault_ns")  # event columns of trace format 2
# On-CPU time and run-queue wait of a span and of its fill and copy, in both tables (nullable).
CLOCK_COLUMNS: dict[str, object] = {f"{p}{c}": NA_INT for p in ("", "fill_", "copy_") for c in ("cpu_ns", "wait_ns")}


def select(events: pd.DataFrame, mask: np.ndarray, cols: list[str]) -> pd.DataFrame:
    """The rows of `mask`, these columns; a nullable one the frame lacks (written before it
    existed) comes back all NA, Int64, never zeros."""
    out = events.loc[mask, [c for c in cols if c in events.columns]]
    for c in NULLABLE:
        if c in cols:
            out[c] = out[c].astype(NA_INT) if c in out.columns else \
                pd.arrays.IntegerArray(np.zeros(len(out), "int64"), np.ones(len(out), bool))
    return out


def sum_at(at: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """int64 sums of `values` per position `at` in 0..n-1 (0 where none), exact."""
    out = np.zeros(n, "int64")
    np.add.at(out, at, values)
    return out


def kind_mask(events: pd.DataFrame, *kinds: str) -> np.ndarray:
    """Boolean mask of rows of these kinds, on the categorical codes (fast at 10M rows)."""
    col = events["kind"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        codes = [cats.get_loc(k) for k in kinds if k in cats]
        return np.isin(col.cat.codes.to_numpy(), codes)
    return col.isin(kinds).to_numpy()


def iteration_spans(rows: KindRows | pd.DataFrame) -> pd.DataFrame:
    """Every iteration's id, thread and [start_ns, end_ns], by the rules in the module docstring."""
    rows = kind_rows(rows)
    it = rows.of("iteration")
    it = it.drop_duplicates("iter").rename(columns={"faults": "span_faults"})
    it = it.assign(boundary=_boundary(len(it), "update_slots"))
    slot_tids = it["tid"].unique()

    dec = rows.of("decode")
    dec = dec.loc[~dec["tid"].isin(slot_tids).to_numpy()]
    if len(dec):
        dec = dec.sort_values(["tid", "end_ns"], kind="stable").rename(columns={"faults": "span_faults"})
        prev_end = dec.groupby("tid")["end_ns"].shift(1)
        dec["start_ns"] = prev_end.fillna(dec["tid"].map(rows.first_start)).astype("int64")
        # Ids above every kernel id, in order of end, so they never collide.
        base = rows.max_iter + 1
        order = np.lexsort((dec["tid"].to_numpy(), dec["end_ns"].to_numpy()))
        ids = np.empty(len(dec), dtype="int64")
        ids[order] = np.arange(base, base + len(dec), dtype="int64")
        # The decode row's clocks cover llama_decode only, not the iteration: not recorded.
        dec = dec.assign(iter=ids, boundary=_boundary(len(dec), "decode"), cpu_ns=pd.NA, wait_ns=pd.NA)
    spans = pd.concat([it, dec], ignore_index=True) if len(dec) else it
    if not len(spans):
        return empty_frame(SPAN_COLUMNS)
    spans = spans[list(SPAN_COLUMNS)].astype(SPAN_COLUMNS)
    return spans.sort_values(["start_ns", "tid"], kind="stable").reset_index(drop=True)


def _boundary(n: int, name: str) -> pd.Categorical:
    """n rows of one boundary kind, built from codes (a column of text would be converted per row)."""
    return pd.Categorical.from_codes(np.full(n, BOUNDARIES.index(name), "int8"), dtype=SPAN_COLUMNS["boundary"])


def assign_iterations(rows: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Iteration id (0 = none) for each row of `rows` (tid, start_ns, end_ns, iter) within `spans`."""
    out = np.zeros(len(rows), dtype="int64")
    if not len(rows) or not len(spans):
        return out
    tid = rows["tid"].to_numpy()
    start = rows["start_ns"].to_numpy()
    end = rows["end_ns"].to_numpy()

    # Kernel ids: keep them when the iteration was recorded and really encloses the row.
    ks = spans.loc[spans["boundary"] == "update_slots"].set_index("iter")
    if len(ks):
        r_iter = rows["iter"].to_numpy()
        pos = ks.index.get_indexer(r_iter)
        hit = pos >= 0
        p = np.where(hit, pos, 0)
        hit &= (r_iter != 0) & (ks["tid"].to_numpy()[p] == tid)
        hit &= (ks["start_ns"].to_numpy()[p] <= start) & (end <= ks["end_ns"].to_numpy()[p])
        out[hit] = r_iter[hit]

    # Decode boundaries: the first iteration on the thread that ends at or after the row starts.
    ds = spans.loc[spans["boundary"] == "decode", ["tid", "start_ns", "end_ns", "iter"]]
    if len(ds):
        dmask = np.isin(tid, ds["tid"].unique())
        left = pd.DataFrame({"pos": np.flatnonzero(dmask), "tid": tid[dmask],
                             "start_ns": start[dmask], "end_ns": end[dmask]}).sort_values("start_ns", kind="stable")
        right = ds.rename(columns={"start_ns": "span_start", "end_ns": "span_end"}).sort_values("span_end", kind="stable")
        m = pd.merge_asof(left, right, left_on="start_ns", right_on="span_end", by="tid", direction="forward")
        good = (m["iter"].notna() & (m["span_start"] <= m["start_ns"]) & (m["end_ns"] <= m["span_end"])).to_numpy()
        out[m["pos"].to_numpy()[good]] = m["iter"].to_numpy()[good].astype("int64")
    return out
