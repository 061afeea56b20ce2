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

from ckptrace.core.trace import empty_frame
from ckptrace.core.validate import in_order, increasing

from .events import KindRows, kind_rows
from ckptrace.core.rules import Groups as _Groups, Ids  # noqa: F401 (Ids: also read from here)
from .sums import bound

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


def sorted_by(frame: pd.DataFrame, major: str, minor: str) -> pd.DataFrame:
    """`frame` sorted by `major`, then `minor` (stable), with a fresh index; rows usually come in
    that order already, and then nothing is sorted or copied."""
    if not in_order(frame[major].to_numpy(), frame[minor].to_numpy()):
        frame = frame.sort_values([major, minor], kind="stable")
    return frame.reset_index(drop=True)


def by_start(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` sorted by start_ns, then tid: the tables' order."""
    return sorted_by(frame, "start_ns", "tid")


class Groups(_Groups):
    __doc__ = _Groups.__doc__

    def sum(self, values: np.ndarray, what: str | None = None) -> np.ndarray:
        """Each group's sum (0 for a group without rows), `values` bounded first (sums.bound,
        `what` naming them); None: the caller has bounded them (with others a row adds to them)."""
        if what is not None:
            bound(what, values)
        return super().sum(values)

    def sum_na(self, values, zero: np.ndarray, what: str | None = None) -> pd.arrays.IntegerArray:
        """Each group's sum of a nullable column, NA when any part is (not recorded); a group
        without rows is 0 where `zero`, NA elsewhere. `what`: as sum's."""
        values = pd.array(values, dtype=NA_INT, copy=False)
        if what is not None:
            bound(what, values)
        # A copy only where it is the result itself (otherwise the array may be the column's own).
        total = self._reduce(np.add, values.to_numpy("int64", na_value=0, copy=self.full), fresh=self.full)
        na = self._reduce(np.logical_or, np.asarray(values.isna()), empty=~zero)
        return pd.arrays.IntegerArray(total, na)


def kind_mask(events: pd.DataFrame, *kinds: str) -> np.ndarray:
    """Boolean mask of rows of these kinds, on the categorical codes (fast at 10M rows)."""
    col = events["kind"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        codes = [cats.get_loc(k) for k in kinds if k in cats]
        codes_of = col.cat.codes.to_numpy()
        mask = np.zeros(len(col), bool)
        for code in codes:  # a comparison per kind: far cheaper than np.isin on millions of codes
            mask |= codes_of == code
        return mask
    return col.isin(kinds).to_numpy()


def iteration_spans(rows: KindRows | pd.DataFrame) -> pd.DataFrame:
    """Every iteration's id, thread and [start_ns, end_ns], by the rules in the module docstring."""
    rows = kind_rows(rows)
    it = rows.of("iteration")
    if not increasing(it["iter"].to_numpy()):  # ids in order (the kernel's counter) are unique
        it = it.drop_duplicates("iter")
    it = it.rename(columns={"faults": "span_faults"}).assign(boundary=_boundary(len(it), "update_slots"))

    dec = rows.of("decode")
    if len(dec):
        dec = dec.loc[~dec["tid"].isin(it["tid"].unique()).to_numpy()]
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
    # Converted only where the type differs (a copy otherwise, of millions of rows).
    spans = pd.DataFrame({c: spans[c] if spans[c].dtype == t else spans[c].astype(t) for c, t in SPAN_COLUMNS.items()},
                         copy=False)
    return by_start(spans)


def _boundary(n: int, name: str) -> pd.Categorical:
    """n rows of one boundary kind, built from codes (a column of text would be converted per row)."""
    return pd.Categorical.from_codes(np.full(n, BOUNDARIES.index(name), "int8"), dtype=SPAN_COLUMNS["boundary"])


def assign_iterations(rows, spans: pd.DataFrame) -> np.ndarray:
    """Iteration id (0 = none) for each row of `rows` (a frame, or a dict of arrays: tid, start_ns,
    end_ns, iter) within `spans`."""
    tid, start, end = (np.asarray(rows[c]) for c in ("tid", "start_ns", "end_ns"))
    out = np.zeros(len(tid), dtype="int64")
    if not len(tid) or not len(spans):
        return out
    boundary = spans["boundary"].cat.codes.to_numpy()
    s_tid, s_start, s_end, s_iter = (spans[c].to_numpy() for c in ("tid", "start_ns", "end_ns", "iter"))

    # Kernel ids: keep them when the iteration was recorded and really encloses the row.
    slots = boundary == BOUNDARIES.index("update_slots")
    if slots.any():
        ks = None if slots.all() else np.flatnonzero(slots)  # the update_slots spans' rows
        r_iter = np.asarray(rows["iter"])
        p = Ids(s_iter if ks is None else s_iter[ks]).find(r_iter)
        hit = (p >= 0) & (r_iter != 0)
        p = np.where(hit, p, 0)
        if ks is not None:
            p = ks[p]
        hit &= (s_tid[p] == tid) & (s_start[p] <= start) & (end <= s_end[p])
        out[hit] = r_iter[hit]

    # Decode boundaries: the first iteration on the thread that ends at or after the row starts.
    if not slots.all():
        ds = spans.loc[~slots, ["tid", "start_ns", "end_ns", "iter"]]
        dmask = np.isin(tid, ds["tid"].unique())
        left = pd.DataFrame({"pos": np.flatnonzero(dmask), "tid": tid[dmask],
                             "start_ns": start[dmask], "end_ns": end[dmask]}).sort_values("start_ns", kind="stable")
        right = ds.rename(columns={"start_ns": "span_start", "end_ns": "span_end"}).sort_values("span_end", kind="stable")
        m = pd.merge_asof(left, right, left_on="start_ns", right_on="span_end", by="tid", direction="forward")
        good = (m["iter"].notna() & (m["span_start"] <= m["start_ns"]) & (m["end_ns"] <= m["span_end"])).to_numpy()
        out[m["pos"].to_numpy()[good]] = m["iter"].to_numpy()[good].astype("int64")
    return out
