"""The rows the analysis reads, kind by kind, with only the columns it reads.

Built from a whole events frame (`from_frame`) or batch by batch from a trace file
(`from_file`, ckptrace.core.trace.iter_batches): then memory holds what the analysis keeps, never the
whole trace. Rows are kept in groups of kinds (GROUPS), in trace order within a group. Left out:
`decode` rows of threads that have `iteration` rows (spans.py uses decode rows only where
update_slots was not probed) and the kinds and columns no analysis reads. Kept as running figures
instead: the first start of each thread whose iterations come from decode rows (spans.py), the
largest iteration id, each process's rows, and the trace's first start and last end. An analysis
that reads another kind or column adds it to GROUPS.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckptrace.core.errors import TraceFormatError
from ckptrace.core.trace import (BATCH_ROWS, COLUMNS, KINDS, TraceFile, empty_frame, iter_kinds, iter_record_batches,
                                 normalize_events, opened)
from ckptrace.core.validate import check_ids

SPAN = ["tid", "start_ns", "end_ns"]
CLOCKS = ["cpu_ns", "wait_ns"]
PART = ["ckpt", *SPAN, "faults", *CLOCKS, "fault_ns", "pid", "iter", "bytes"]  # iter, bytes: prompt saves' copies
GPU = [c for c in COLUMNS if c.startswith("gpu_")]  # gpu.py's (NA in a trace of no CUDA target)
# Group -> (its kinds, the columns read from their rows). A group of several kinds keeps `kind`
# and their order in the trace (memory.py replays syscalls in that order).
GROUPS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "iteration": (("iteration",), ["iter", *SPAN, "tokens", "prompt_tokens", "faults", *CLOCKS, "pid"]),
    "decode": (("decode",), [*SPAN, "tokens", "prompt_tokens", "faults", "pid"]),
    "checkpoint": (("checkpoint",), ["ckpt", "iter", *SPAN, "bytes", "draft", "faults", *CLOCKS, "pid", "spec"]),
    "fill": (("fill",), PART),
    "copy": (("copy",), [*PART, *GPU, "state_flags", "addr"]),
    # memory.py's syscalls and RSS, and state_path.py's restores, creates and prompt saves
    "memory": (("mmap", "munmap", "mremap", "rss", "create", "restore", "restore_copy", "prompt_save",
                "slot_save", "slot_restore"),
               ["kind", "pid", *SPAN, "ckpt", "iter", "addr", "bytes", "phase", "draft", "faults", *CLOCKS,
                "fault_ns", "old_addr", "old_bytes", "state_flags", "outcome"]),
}
GROUP_OF = {k: g for g, (kinds, _) in GROUPS.items() for k in kinds}
READ = [c for c in COLUMNS if c in {"kind", "iter", "pid"} or any(c in cols for _, cols in GROUPS.values())]


@dataclass
class KindRows:
    frames: dict[str, pd.DataFrame]  # group -> its rows
    first_start: pd.Series  # tid -> its earliest start_ns over every row of the trace (threads with kept decode rows)
    max_iter: int  # the largest iteration id of any row (0 if none)
    per_pid: pd.DataFrame  # pid -> rows, max_iter: each process's row count and largest iteration id
    start_ns: int | None = None  # the trace's first start and last end, None without rows
    end_ns: int | None = None
    rows: int = 0  # rows in the trace
    _empty: dict = field(default_factory=dict, repr=False)
    _released: set = field(default_factory=set, repr=False)

    def release(self, keep: str) -> None:
        """Drop every group but `keep` (the analysis has read them): their memory goes back."""
        self.drop(*(set(GROUPS) - {keep}))

    def drop(self, *groups: str) -> None:
        """Drop these groups (read for the last time): their memory goes back."""
        self._released |= set(groups)
        self.frames = {g: f for g, f in self.frames.items() if g not in self._released}

    def of_group(self, group: str) -> pd.DataFrame:
        """The rows of a group (GROUPS[group] columns), an empty typed frame if none."""
        if group in self._released:
            raise RuntimeError(f"the {group} rows were released after the analysis read them")
        frame = self.frames.get(group)
        if frame is None:
            frame = self._empty.setdefault(group, empty_frame({c: COLUMNS[c] for c in GROUPS[group][1]}))
        return frame

    def rows_of(self, pid: int) -> int:
        return int(self.per_pid.at[pid, "rows"]) if pid in self.per_pid.index else 0

    def for_pid(self, pid: int) -> KindRows:
        """The rows of one process (threads' first starts stay the trace's: a tid is one thread)."""
        frames = {g: f.loc[(f["pid"] == pid).to_numpy()].reset_index(drop=True) for g, f in self.frames.items()}
        mine = self.per_pid.loc[self.per_pid.index == pid]
        return KindRows(frames, self.first_start, int(mine["max_iter"].max()) if len(mine) else 0, mine,
                        self.start_ns, self.end_ns, self.rows_of(pid))

    def of(self, kind: str) -> pd.DataFrame:
        """The rows of one kind (its group's columns)."""
        frame = self.of_group(GROUP_OF[kind])
        if len(GROUPS[GROUP_OF[kind]][0]) == 1:
            return frame
        return frame.loc[(frame["kind"] == kind).to_numpy()]

    def state_events(self) -> pd.DataFrame:
        """The memory group and, where creates were recorded, the checkpoint rows, as one frame
        (state_path.py's eviction rule reads creates, munmaps and checkpoints)."""
        memory = self.of_group("memory")
        ck = self.of("checkpoint")
        if not len(ck) or not (memory["kind"] == "create").any():
            return memory
        cols = {c: COLUMNS[c] for c in GROUPS["memory"][1]}
        return pd.concat([memory, normalize_events(ck[SPAN].assign(kind="checkpoint"), cols)], ignore_index=True)

    @classmethod
    def from_frame(cls, events: pd.DataFrame) -> KindRows:
        events = normalize_events(events[[c for c in READ if c in events.columns]], {c: COLUMNS[c] for c in READ})
        acc = _Accumulator(*_plan([(events["kind"].cat.codes.to_numpy(), events["tid"].to_numpy())]), "events")
        acc.add(pa.RecordBatch.from_pandas(events, preserve_index=False))
        return acc.result()

    @classmethod
    def from_file(cls, path: str | os.PathLike | TraceFile, batch_rows: int = BATCH_ROWS) -> KindRows:
        """Batch by batch, checked as read_trace checks (ids across the trace on the rows kept);
        two passes over one open file (`path` opened once when it is not a TraceFile)."""
        with opened(path) as f:
            return cls._from_file(f, batch_rows)

    @classmethod
    def _from_file(cls, f: TraceFile, batch_rows: int) -> KindRows:
        try:
            plan = _plan(iter_kinds(f, batch_rows))
        except TraceFormatError:
            for _ in iter_record_batches(f, READ, batch_rows, whole_checks=False):
                pass  # the checked read names the first problem its checks find
            raise
        acc = _Accumulator(*plan, f.shown)
        # Kept rows are copied in a second thread while this one checks the next batch (and the
        # reader's own thread decodes the one after): numpy's copies run without the GIL. The
        # copies stay in batch order, one at a time.
        with ThreadPoolExecutor(1, thread_name_prefix="ckptrace-keep") as pool:
            copying = None
            for batch in iter_record_batches(f, READ, batch_rows, whole_checks=False):
                if copying is not None:
                    copying.result()
                copying = pool.submit(acc.add, batch)
            if copying is not None:
                copying.result()
        pa.default_memory_pool().release_unused()  # the batches' memory: Arrow's allocator keeps it otherwise
        rows = acc.result()
        ck, it = rows.of("checkpoint"), rows.of("iteration")
        at = acc.row_numbers  # each kept row's row number in the trace: errors name it
        parts = pd.concat([rows.of(k)[["ckpt", "tid", "start_ns", "end_ns"]].assign(kind=k).set_axis(at.get(k, []))
                           for k in ("fill", "copy")])
        check_ids(ck[["ckpt", "tid", "start_ns", "end_ns"]].set_axis(at.get("checkpoint", [])), it["iter"],
                  parts[["kind", "ckpt", "tid", "start_ns", "end_ns"]], f.path)
        return rows


def kind_rows(events: KindRows | pd.DataFrame) -> KindRows:
    """`events` as KindRows (a whole events frame is split once)."""
    return events if isinstance(events, KindRows) else KindRows.from_frame(events)


def _plan(kinds) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """From each batch's (kind codes, tids): the rows each group will keep, the threads with
    update_slots rows (whose decode rows are not kept), and those whose decode rows are kept."""
    counts = np.zeros(len(KINDS), "int64")
    slot: set[int] = set()
    decode: dict[int, int] = {}  # tid -> its decode rows
    it, de = KINDS.index("iteration"), KINDS.index("decode")
    for codes, tid in kinds:
        counts += np.bincount(codes[codes >= 0], minlength=len(KINDS))
        slot.update(np.unique(tid[codes == it]).tolist())
        for t, n in zip(*(x.tolist() for x in np.unique(tid[codes == de], return_counts=True))):
            decode[t] = decode.get(t, 0) + n
    sizes = {g: int(counts[[KINDS.index(k) for k in kinds]].sum()) for g, (kinds, _) in GROUPS.items()}
    sizes["decode"] = sum(n for t, n in decode.items() if t not in slot)
    return sizes, np.array(sorted(slot), "int32"), np.array(sorted(set(decode) - slot), "int32")


class _Accumulator:
    """Running state over Arrow batches (iter_record_batches' form): each group's rows copied into
    numpy arrays of their final size (known from a first pass over the kinds: no chunks, no copy
    at the end, the batch's memory reused for the next), the decode threads' first starts, each
    process's rows and largest iteration id, the extremes."""

    def __init__(self, sizes: dict[str, int], slot_tids: np.ndarray, decode_tids: np.ndarray, source: str):
        self.sizes, self.slot_tids, self.decode_tids, self.source = sizes, slot_tids, decode_tids, source
        self.arrays = {g: {c: _column_arrays(c, sizes[g]) for c in cols} for g, (_, cols) in GROUPS.items()
                       if sizes[g]}
        self.filled = dict.fromkeys(self.arrays, 0)
        # The row numbers of the rows validate.check_ids reads, so an error names the trace's row.
        self.row_numbers = {g: np.empty(sizes[g], "int64") for g in ("checkpoint", "fill", "copy") if sizes[g]}
        self.codes = {g: [KINDS.index(k) for k in kinds] for g, (kinds, _) in GROUPS.items()}
        self.first: list[pa.Table] = []  # per batch: [tid, start_ns_min] of the decode threads
        self.per_pid: list[pa.Table] = []  # per batch: [pid, iter_count, iter_max]
        self.max_iter = 0
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.rows += batch.num_rows
        codes = batch.column("kind").indices
        codes = pc.fill_null(codes, -1).to_numpy() if codes.null_count else codes.to_numpy()
        tid = batch.column("tid").to_numpy()
        start = batch.column("start_ns").to_numpy()
        if len(self.decode_tids):  # only their iterations start at a thread's first row (spans.py)
            mine = np.isin(tid, self.decode_tids)
            self.first.append(pa.table({"tid": tid[mine], "start_ns": start[mine]}).group_by("tid")
                              .aggregate([("start_ns", "min")]))
        pid, it = batch.column("pid").to_numpy(), batch.column("iter").to_numpy()
        top = int(it.max())
        self.max_iter = max(self.max_iter, top)
        if pid[0] == pid.min() == pid.max():  # one process (the common case): no grouping
            self.per_pid.append(pa.table({"pid": pa.array([pid[0]], pa.int32()), "iter_count": [len(pid)],
                                          "iter_max": [top]}))  # no view: it would keep the batch's column
        else:
            self.per_pid.append(pa.table({"pid": pid, "iter": it}).group_by("pid")
                                .aggregate([("iter", "count"), ("iter", "max")]))
        lo, hi = int(start.min()), int(batch.column("end_ns").to_numpy().max())
        self.start_ns = lo if self.start_ns is None else min(self.start_ns, lo)
        self.end_ns = hi if self.end_ns is None else max(self.end_ns, hi)
        columns: dict[str, tuple] = {}  # each column's numpy form, made once per batch
        for group, arrays in self.arrays.items():
            want = self.codes[group]
            mask = codes == want[0] if len(want) == 1 else np.isin(codes, want)
            if group == "decode" and len(self.slot_tids):
                mask &= ~np.isin(tid, self.slot_tids)
            picked = np.flatnonzero(mask)
            at, k = self.filled[group], len(picked)
            if at + k > self.sizes[group]:
                raise TraceFormatError(f"{self.source}: the trace changed while it was read")
            if group in self.row_numbers:
                np.add(picked, self.rows - batch.num_rows, out=self.row_numbers[group][at:at + k])
            for c, dst in arrays.items():
                if c not in columns:
                    columns[c] = _numpy_column(batch.column(c))
                for src, out in zip(columns[c], dst):  # a batch without NA leaves the NA mask False
                    np.take(src, picked, out=out[at:at + k], mode="clip")  # "raise" buffers `out`: 4x slower
            self.filled[group] = at + k

    def result(self) -> KindRows:
        if self.filled != {g: self.sizes[g] for g in self.filled}:
            raise TraceFormatError(f"{self.source}: the trace changed while it was read")
        frames = {g: pd.DataFrame({c: _pandas_column(c, arrays.pop(c)) for c in list(arrays)}, copy=False)
                  for g, arrays in self.arrays.items()}
        self.arrays = {}
        if self.first:
            first = pa.concat_tables(self.first).group_by("tid").aggregate([("start_ns_min", "min")])
            first = pd.Series(first.column("start_ns_min_min").to_numpy(), index=first.column("tid").to_numpy())
        else:
            first = pd.Series([], dtype="int64")
        per_pid = pd.DataFrame({"rows": [], "max_iter": []}, dtype="int64")
        if self.per_pid:
            t = pa.concat_tables(self.per_pid).group_by("pid").aggregate([("iter_count", "sum"), ("iter_max", "max")])
            per_pid = pd.DataFrame({"rows": t.column("iter_count_sum").to_numpy(),
                                    "max_iter": t.column("iter_max_max").to_numpy()},
                                   index=t.column("pid").to_numpy()).sort_index()
        return KindRows(frames, first, self.max_iter, per_pid, self.start_ns, self.end_ns, self.rows)


def _column_arrays(name: str, rows: int) -> tuple:
    """Where a group's column is kept: (codes,) for kind and phase, (values, missing) for a nullable
    one, (values,) otherwise."""
    dtype = COLUMNS[name]
    if isinstance(dtype, pd.CategoricalDtype):
        return (np.empty(rows, "int8"),)
    if isinstance(dtype, pd.Int64Dtype):
        return np.empty(rows, "int64"), np.zeros(rows, bool)
    return (np.empty(rows, dtype),)


def _numpy_column(values: pa.Array) -> tuple:
    """A checked batch column as numpy: (codes,) for kind and phase (codes into KINDS/PHASES),
    (values, missing) for a nullable one, (values,) otherwise."""
    if isinstance(values, pa.DictionaryArray):  # a null (a frame's unknown name) stays NA: code -1
        return (pc.fill_null(values.indices, -1).to_numpy(zero_copy_only=False),)
    if pa.types.is_int64(values.type) and values.null_count:
        return pc.fill_null(values, 0).to_numpy(), values.is_null().to_numpy(zero_copy_only=False)
    return (values.to_numpy(zero_copy_only=False),)


def _pandas_column(name: str, arrays: tuple):
    """A kept column with its declared dtype (COLUMNS), without a copy."""
    dtype = COLUMNS[name]
    if isinstance(dtype, pd.CategoricalDtype):
        return pd.Categorical.from_codes(arrays[0], dtype=dtype)
    if isinstance(dtype, pd.Int64Dtype):
        return pd.arrays.IntegerArray(*arrays)
    return arrays[0]
