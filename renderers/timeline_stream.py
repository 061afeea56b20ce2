"""The timeline of trace files in bounded memory: the same slices, counters and order as
build_timeline (timeline.py), made while the writers write them.

build_timeline holds every slice of the trace (a Python object and a dict of arguments each:
about 1.6 KB per event). Here a trace is read batch by batch (trace.iter_record_batches): each
batch's span rows are sorted by the timeline's order (process, thread, then nest order: start,
longer first, outer kind first, then the order build_timeline appends them in) and written to a
temporary Arrow IPC file as one sorted run, in small record batches; the fault counter's points
likewise. The writers then take each thread's slices from a merge of the runs (heapq.merge, one
small batch per run in memory), nested as `nest` nests them. Checkpoint and iteration slices come
from the analysis' tables (as in build_timeline), sorted and turned into slices a chunk at a time.

Memory: the analysis (stream_analysis': the kept rows while read, then the checkpoint table, the
iteration table's shown columns and the counters' held and RSS series; not analyze's whole) plus one batch being sorted (trace.BATCH_ROWS rows), plus one record
batch of MERGE_ROWS rows per run (a run per BATCH_ROWS rows of the trace), plus the slices that
would cross another's boundary (none in a recording: the kernel emits nested calls per thread).
The runs go to two temporary files under TMPDIR (about 78 bytes per event), unlinked as they are
made (O_TMPFILE where the file system has it): nothing is left behind, even when export is killed.
"""
from __future__ import annotations

import heapq
from itertools import chain
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from ckptrace.analyzers.analysis import Analysis, analyze_file, fill_probed
from ckptrace.analyzers.checkpoints import checkpoint_table
from ckptrace.analyzers.events import KindRows
from ckptrace.analyzers.iterations import iteration_table
from ckptrace.analyzers.memory import held_series, rss_series
from ckptrace.analyzers.spans import iteration_spans
from ckptrace.analyzers.sums import SumOutOfRange
from ckptrace.core.terminal import printable, shown_label
from ckptrace.core.trace import BATCH_ROWS, KINDS, PHASES, Trace, iter_record_batches, opened

from .timeline import (CHECKPOINT_ARGS, DEFAULT_ARGS, FAULT_SPANS, FROM_ANALYSIS, ITERATION_ARGS, NEST_RANK,
                       POINT_KINDS, RAW_ARGS, SLICE_NAMES, SYNTHETIC_BASE, Counter, Process, Slice, Thread, Timeline,
                       row_args, process_comm, recording_slice)

MERGE_ROWS = 1024  # rows of a run decoded at a time while merging
CHUNK = 4096  # analysis rows turned into slices at a time
ARG_COLUMNS = ["ckpt", "iter", "bytes", "addr", "faults", "cpu_ns", "wait_ns", "fault_ns", "tokens", "prompt_tokens",
               "phase", "draft"]
READ = ["kind", "pid", "tid", "start_ns", "end_ns", *ARG_COLUMNS]
KIND_RANK = np.array([NEST_RANK.get(k, 9) for k in KINDS], "int8")
KIND_SLICE = np.array([k not in FROM_ANALYSIS and k not in POINT_KINDS for k in KINDS])
KIND_FAULTS = np.isin(np.array(KINDS), FAULT_SPANS)
KIND_ARGS = [RAW_ARGS.get(k, DEFAULT_ARGS) for k in KINDS]
KIND_LABELS = [(SLICE_NAMES.get(k, k), f"draft {SLICE_NAMES.get(k, k)}") for k in KINDS]


@dataclass
class _Leg:
    """What the spill pass keeps of one trace: per process, its rows' count, first start, last end
    and threads; where each sorted run lies in the spill files."""
    analysis: object
    path: str
    pids: dict[int, list] = field(default_factory=dict)  # pid -> [rows, first start, last end, tids]
    spans: object = None  # the span rows' file (unlinked: tempfile.TemporaryFile)
    span_runs: list[list[int]] = field(default_factory=list)  # per run: its record batches' indexes
    faults: object = None
    fault_runs: list[list[int]] = field(default_factory=list)
    fault_threads: set = field(default_factory=set)  # (pid, tid) with fault counter points
    first_ts: int | None = None  # the earliest span start
    streams: tuple | None = None  # the merged span and fault runs, once writing reaches the leg
    series: tuple = ()  # (held, rss): the counters' series, made before the analysis' memory rows go


class _Counted:
    """Slices handed to the writers, counted as they go (slice_count after writing)."""
    def __init__(self):
        self.n = 0


class StreamTimeline(Timeline):
    """A Timeline whose processes (and their threads' slices) are made as they are written:
    iterate `processes` once. `ts_base` is known up front (Chrome's writer needs it first)."""

    def __init__(self, legs: list[_Leg]):
        super().__init__(processes=[])
        self.legs, self.counted = legs, _Counted()
        self.recordings: list[Slice] = []
        self._plan()

    def _plan(self) -> None:
        """The processes' fixed parts (ids, names, recording slices, counters), legs in order."""
        taken: set[int] = set()
        self.plans = []
        first = []
        for leg_no, leg in enumerate(self.legs):
            a = leg.analysis
            meta = a.trace.meta
            ids = set(leg.pids) | {t for p in leg.pids.values() for t in p[3]}
            shift = SYNTHETIC_BASE * (leg_no + 1) if ids & taken else 0
            taken |= {i + shift for i in ids}
            held, rss = leg.series
            pids = sorted(leg.pids) or [int(meta.pid or 0)]
            for pid in pids:
                rows, start, end, tids = leg.pids.get(pid, [0, None, None, set()])
                rec = recording_slice(a.trace, leg.path, pid, _Span(rows, start, end))
                counters = []
                for name, series, col in (("held checkpoint memory", held, "held_bytes"),
                                          ("resident memory (RSS)", rss, "rss_bytes")):
                    mine = series.loc[series["pid"] == pid]
                    if len(mine):
                        counters.append(Counter(name, "bytes", _Points(mine["t_ns"].to_numpy(), mine[col].to_numpy())))
                        first.append(int(mine["t_ns"].iat[0]))
                self.recordings.append(rec)
                first.append(rec.ts)
                self.plans.append((leg_no, pid, shift, len(pids), rec, counters))
            if leg.first_ts is not None:
                first.append(leg.first_ts)
            for frame in (a.checkpoints, a.iterations):
                tids = {t for p in leg.pids.values() for t in p[3]}
                mine = frame.loc[frame["tid"].isin(tids)]
                if len(mine):
                    first.append(int(mine["start_ns"].min()))
        self.ts_base = int(min(first, default=0))
        self.processes = _Once(self._processes())

    def _processes(self) -> Iterator[Process]:
        for leg_no, pid, shift, n_pids, rec, counters in self.plans:
            leg = self.legs[leg_no]
            trace = leg.analysis.trace
            comm = shown_label(process_comm(trace.meta, pid))
            label = trace.label if n_pids <= 1 else \
                next((p.label for p in trace.meta.processes if p.pid == pid and p.label), f"{comm} {pid}")
            name = f"{shown_label(label)} ({printable(os.path.basename(str(leg.path)))})"
            if shift:
                name += f", pid {pid}"
            proc = next((p for p in trace.meta.processes if p.pid == pid), None)
            exe = (proc and proc.executable) or trace.meta.executable
            cmdline = trace.meta.command if trace.meta.command and pid == trace.meta.pid else [exe] if exe else []
            self.counted.n += 1  # the recording slice
            if leg.streams is None:  # one merge per leg: its processes come in pid order, as the runs do
                pids = sorted(leg.pids)
                spans_file, faults_file = self._reader(leg.spans), self._reader(leg.faults)
                leg.streams = (_Peek(heapq.merge(*[_run_items(spans_file, r) for r in leg.span_runs],
                                                 chain.from_iterable(_analysis_items(leg.analysis, p, leg.pids[p][3])
                                                                     for p in pids), key=_key)),
                               _Peek(heapq.merge(*[_fault_items(faults_file, r) for r in leg.fault_runs], key=_key)))
            threads = _Once(self._threads(leg, pid, shift, comm))
            yield Process(leg_no, pid + shift, pid, name, threads, counters, rec,
                          cmdline=[printable(c) for c in cmdline])
            for _ in threads:  # a writer that stopped early: the merge moves on all the same
                pass

    def _threads(self, leg: _Leg, pid: int, shift: int, comm: str) -> Iterator[Thread]:
        spans, faults = leg.streams
        while spans.head is not None and spans.head[0][0] == pid:
            tid = spans.head[0][1]
            th = Thread(tid + shift, tid, comm, [], [], [])
            th.slices = _Once(self._slices(spans, pid, tid, th))
            if (pid, tid) in leg.fault_threads:
                th.faults = _Lazy(lambda tid=tid: _points(faults, pid, tid))
            yield th
            for _ in th.slices:
                pass

    def _slices(self, spans: _Peek, pid: int, tid: int, th: Thread) -> Iterator[Slice]:
        """The thread's slices in begin order, nested as timeline.nest nests them: one that would
        cross an open slice's end goes to th.overlapping."""
        stack: list[int] = []
        while spans.head is not None and spans.head[0][0] == pid and spans.head[0][1] == tid:
            s = spans.pop()[1]()
            self.counted.n += 1
            while stack and stack[-1] <= s.ts:
                stack.pop()
            if stack and s.end > stack[-1]:
                th.overlapping.append(s)
                continue
            stack.append(s.end)
            yield s

    def _reader(self, spill) -> pa.ipc.RecordBatchFileReader:
        """One reader per spill file, whatever the number of runs in it (they read it in turn)."""
        return pa.ipc.open_file(pa.PythonFile(spill, mode="r"))

    def close(self) -> None:
        _close(self.legs)


def _key(item: tuple) -> tuple:
    return item[0]


def _points(faults: _Peek, pid: int, tid: int) -> Iterator[tuple[int, int]]:
    """The thread's fault counter points, in (ts, value) order; points of threads no writer asked for are skipped."""
    while faults.head is not None and faults.head[0][:2] < (pid, tid):
        faults.pop()
    while faults.head is not None and faults.head[0][:2] == (pid, tid):
        yield faults.pop()[1]()


class _Peek:
    """An iterator with its next item at hand (`head`, None at the end)."""
    def __init__(self, it):
        self.it = it
        self.head = next(it, None)

    def pop(self):
        item, self.head = self.head, next(self.it, None)
        return item


class _Once:
    """An iterator the writers may also test for emptiness (truthy until known empty)."""
    def __init__(self, it):
        self.it = iter(it)

    def __iter__(self):
        return self.it

    def __bool__(self) -> bool:
        return True


class _Lazy:
    """Points made when iterated (once), truthy: a thread has them (known from the spill pass)."""
    def __init__(self, make):
        self.make, self.it = make, None

    def __iter__(self):
        if self.it is None:
            self.it = self.make()
        return self.it

    def __bool__(self) -> bool:
        return True


class _Points:
    """A counter's (ts, value) points from two arrays, made as they are written."""
    def __init__(self, ts: np.ndarray, values: np.ndarray):
        self.ts, self.values = ts, values

    def __iter__(self):
        for i in range(0, len(self.ts), CHUNK):
            yield from zip(self.ts[i:i + CHUNK].tolist(), self.values[i:i + CHUNK].tolist())

    def __len__(self) -> int:
        return len(self.ts)

    def __bool__(self) -> bool:
        return len(self.ts) > 0


@dataclass
class _Span:
    """What recording_slice reads of a process's events: their count, first start and last end."""
    rows: int
    start: int | None
    end: int | None

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, col: str):
        return _MinMax(self.start if col == "start_ns" else self.end)


@dataclass
class _MinMax:
    value: int | None

    def min(self) -> int:
        return self.value

    def max(self) -> int:
        return self.value


def _with_pids(frame: pd.DataFrame, meta) -> pd.DataFrame:
    none = frame["pid"].to_numpy() == 0
    if none.any() and meta.pid:
        frame = frame.assign(pid=np.where(none, np.int32(meta.pid), frame["pid"].to_numpy()))
    return frame


def stream_timeline(traces, analyses, batch_rows: int = BATCH_ROWS) -> StreamTimeline:
    """The timeline of trace files (paths or open ckptrace.core.trace.TraceFile), each with its
    analysis (analyzers.analyze_file's: read batch by batch); close() it after writing.
    `batch_rows`: rows read, sorted and spilled as one run at a time. It consumes the analyses
    (_consume): their memory rows and the table columns no slice shows go."""
    legs: list[_Leg] = []
    try:
        for t, a in zip(traces, analyses):
            legs.append(_Leg(a, str(getattr(t, "path", t)), spans=_spill_file(), faults=_spill_file(),
                             series=_consume(a)))
            _spill(t, legs[-1], batch_rows)
            pa.default_memory_pool().release_unused()  # the batches' memory: Arrow's allocator keeps it otherwise
        return StreamTimeline(legs)
    except BaseException:
        _close(legs)
        raise


def stream_analysis(path) -> Analysis:
    """What the timeline reads of a trace file's analysis (analyze_file's), made without the rest
    of it (issue 39): the checkpoint table, the iteration table's shown columns and the counters'
    series (in `series`), each group of rows dropped after its last reader; no summary, state-path
    or GPU tables, no per-process analyses. A cut-short recording: analyze_file's analysis."""
    with opened(path) as f:
        if f.stream:
            return analyze_file(f)
        trace = Trace(events=None, meta=f.meta, path=f.path)
        rows = KindRows.from_file(f)
    try:
        spans = iteration_spans(rows)
        rows.drop("iteration", "decode")
        checkpoints = checkpoint_table(rows, spans, fill_probed(trace))
        rows.drop("fill", "copy", "checkpoint")
        # The series before the iteration table: their making's peak then holds one table less.
        memory = _with_pids(rows.of_group("memory"), trace.meta)
        series = held_series(memory), rss_series(memory)
        del memory
        iterations = iteration_table(rows, spans, checkpoints, columns={*ITERATION_ARGS, "kind"})
    except SumOutOfRange as e:
        raise e.at(printable(trace.path) if trace.path else None) from None
    del spans
    rows.drop("memory")
    a = Analysis(trace, checkpoints, iterations, {}, {}, rows)
    a.series = series
    return a


def _consume(analysis) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The counters' series (held checkpoint memory, RSS) of an analysis, made before its memory
    rows are dropped (about 110 bytes a row against 24 a point; stream_analysis' made already);
    and its checkpoint and iteration tables cut to the columns their slices show, in place
    (issue 39: 8 of the iteration table's 27 columns, about 60 bytes an iteration)."""
    series = getattr(analysis, "series", None)
    if series is None:
        memory = _with_pids(analysis.rows.of_group("memory"), analysis.trace.meta)
        series = held_series(memory), rss_series(memory)
        del memory
        analysis.rows.drop("memory")
    else:
        del analysis.series
    for frame, shown in ((analysis.checkpoints, {*CHECKPOINT_ARGS, "draft"}),
                         (analysis.iterations, {*ITERATION_ARGS, "kind"})):
        for c in [c for c in frame.columns if c not in {"tid", "start_ns", "end_ns", *shown}]:
            del frame[c]  # a column at a time: no copy of the others
    return series


def _spill_file():
    """A read-write file with no name (unlinked at creation): the kernel frees it when it is closed
    or the process dies, SIGKILL included."""
    return tempfile.TemporaryFile(prefix="ckptrace-export-")


def _close(legs: list[_Leg]) -> None:
    for leg in legs:
        for f in (leg.spans, leg.faults):
            if f is not None:
                f.close()


SPAN_SCHEMA = pa.schema([("pid", pa.int32()), ("tid", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                         ("rank", pa.int8()), ("first", pa.int64()), ("row", pa.int64()), ("kind", pa.int8()),
                         ("ckpt", pa.int64()), ("iter", pa.int64()), ("bytes", pa.int64()), ("addr", pa.uint64()),
                         ("faults", pa.int64()), ("cpu_ns", pa.int64()), ("wait_ns", pa.int64()),
                         ("fault_ns", pa.int64()), ("tokens", pa.int32()), ("prompt_tokens", pa.int32()),
                         ("phase", pa.int8()), ("draft", pa.bool_())])
FAULT_SCHEMA = pa.schema([("pid", pa.int32()), ("tid", pa.int32()), ("ts", pa.int64()), ("value", pa.int64())])


def _spill(trace, leg: _Leg, batch_rows: int) -> None:
    """One pass over the trace: its span rows and fault points as sorted runs in the leg's two files."""
    meta = leg.analysis.trace.meta
    first_of: dict[tuple[int, int], int] = {}  # (pid, kind code) -> its first row: build_timeline's group order
    row = 0
    # PythonFile: closing the IPC writers must leave the unlinked files open for the merge.
    sf, ff = pa.PythonFile(leg.spans, mode="w"), pa.PythonFile(leg.faults, mode="w")
    with opened(trace) as f, pa.ipc.new_file(sf, SPAN_SCHEMA) as spans, pa.ipc.new_file(ff, FAULT_SCHEMA) as faults:
        n_span = n_fault = 0
        for batch in iter_record_batches(f, READ, batch_rows, whole_checks=False):
            n = batch.num_rows
            pid = batch.column("pid").to_numpy()
            if meta.pid:
                pid = np.where(pid == 0, np.int32(meta.pid), pid).astype("int32")
            tid = batch.column("tid").to_numpy()
            start, end = batch.column("start_ns").to_numpy(), batch.column("end_ns").to_numpy()
            kind = batch.column("kind").indices.to_numpy()
            _count(leg.pids, pid, tid, start, end)
            take = np.flatnonzero(KIND_SLICE[kind])
            if len(take):
                rows = row + take
                k, p = kind[take], pid[take]
                first = np.empty(len(take), "int64")
                for key in set(zip(p.tolist(), k.tolist())):
                    at = np.flatnonzero((p == key[0]) & (k == key[1]))
                    first[at] = first_of.setdefault(key, int(rows[at[0]]))
                s, e, t = start[take], end[take], tid[take]
                order = np.lexsort((rows, first, KIND_RANK[k], ~e, s, t, p))
                cols = {"pid": p, "tid": t, "start_ns": s, "end_ns": e, "rank": KIND_RANK[k], "first": first,
                        "row": rows, "kind": k.astype("int8")}
                for c in ARG_COLUMNS:
                    v = batch.column(c)
                    cols[c] = v.indices if c == "phase" else v
                run = pa.record_batch([pa.array(cols[c]) if isinstance(cols[c], np.ndarray) else cols[c].take(
                    pa.array(take)) for c in SPAN_SCHEMA.names], schema=SPAN_SCHEMA).take(pa.array(order))
                leg.span_runs.append(list(range(n_span, n_span + -(-run.num_rows // MERGE_ROWS))))
                for i in range(0, run.num_rows, MERGE_ROWS):
                    spans.write_batch(run.slice(i, MERGE_ROWS))
                n_span = leg.span_runs[-1][-1] + 1
                leg.first_ts = int(s.min()) if leg.first_ts is None else min(leg.first_ts, int(s.min()))
                fs = take[KIND_FAULTS[k]]
                if len(fs):
                    fp, ft = np.repeat(pid[fs], 2), np.repeat(tid[fs], 2)
                    ts = np.column_stack([start[fs], end[fs]]).ravel()
                    val = np.column_stack([batch.column("faults").to_numpy()[fs], np.zeros(len(fs), "int64")]).ravel()
                    order = np.lexsort((val, ts, ft, fp))
                    pts = pa.record_batch([pa.array(fp[order]), pa.array(ft[order]), pa.array(ts[order]),
                                           pa.array(val[order])], schema=FAULT_SCHEMA)
                    leg.fault_runs.append(list(range(n_fault, n_fault + -(-pts.num_rows // MERGE_ROWS))))
                    for i in range(0, pts.num_rows, MERGE_ROWS):
                        faults.write_batch(pts.slice(i, MERGE_ROWS))
                    n_fault = leg.fault_runs[-1][-1] + 1
                    leg.fault_threads |= set(zip(fp.tolist(), ft.tolist()))
            row += n
    leg.spans.flush()
    leg.faults.flush()


def _count(pids: dict, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    for p in np.unique(pid).tolist():
        at = pid == p
        entry = pids.setdefault(p, [0, None, None, set()])
        s, e = int(start[at].min()), int(end[at].max())
        entry[0] += int(at.sum())
        entry[1] = s if entry[1] is None else min(entry[1], s)
        entry[2] = e if entry[2] is None else max(entry[2], e)
        entry[3] |= set(np.unique(tid[at]).tolist())


def _batches(reader: pa.ipc.RecordBatchFileReader, run: list[int]) -> Iterator[pa.RecordBatch]:
    for i in run:
        yield reader.get_batch(i)


def _run_items(reader: pa.ipc.RecordBatchFileReader, run: list[int]) -> Iterator[tuple]:
    """A span run's rows in its order: (sort key, a function making the row's Slice)."""
    phases = [printable(p) for p in PHASES]
    for b in _batches(reader, run):
        cols = {c: b.column(c).to_pylist() for c in SPAN_SCHEMA.names}
        for i in range(b.num_rows):
            key = (cols["pid"][i], cols["tid"][i], cols["start_ns"][i], ~cols["end_ns"][i], cols["rank"][i], 2,
                   cols["first"][i], cols["row"][i])
            yield key, (lambda i=i, cols=cols: _raw_slice(cols, i, phases))


def _raw_slice(cols: dict, i: int, phases: list[str]) -> Slice:
    """A span row's slice, as build_timeline makes it (row_args: NA figures left out)."""
    k = cols["kind"][i]
    args = {}
    for c in KIND_ARGS[k]:
        v = cols[c][i]
        if v is None:
            continue
        args[c] = f"0x{v:x}" if c == "addr" else phases[v] if c == "phase" else v
    return Slice(cols["start_ns"][i], cols["end_ns"][i], KIND_LABELS[k][1 if cols["draft"][i] else 0], KINDS[k], args)


def _fault_items(reader: pa.ipc.RecordBatchFileReader, run: list[int]) -> Iterator[tuple]:
    for b in _batches(reader, run):
        pid, tid, ts, val = (b.column(c).to_pylist() for c in FAULT_SCHEMA.names)
        for i in range(b.num_rows):
            yield (pid[i], tid[i], ts[i], val[i]), (lambda p=(ts[i], val[i]): p)


def _analysis_items(analysis, pid: int, tids: set) -> Iterator[tuple]:
    """The process's checkpoint and iteration slices (build_timeline's), in the merge's order."""
    parts = []
    for cls, (name, frame, cols) in enumerate((("checkpoint", analysis.checkpoints, CHECKPOINT_ARGS),
                                               ("iteration", analysis.iterations, ITERATION_ARGS))):
        mine = np.flatnonzero(frame["tid"].isin(tids).to_numpy())
        if len(mine):
            parts.append((cls, name, frame, cols, mine))
    if not parts:
        return
    # Narrow types where the values fit: these arrays hold a figure per checkpoint and iteration.
    tid = np.concatenate([p[2]["tid"].to_numpy("int32")[p[4]] for p in parts])
    ts = np.concatenate([p[2]["start_ns"].to_numpy("int64")[p[4]] for p in parts])
    end = np.concatenate([p[2]["end_ns"].to_numpy("int64")[p[4]] for p in parts])
    cls = np.concatenate([np.full(len(p[4]), p[0], "int8") for p in parts])
    pos = np.concatenate([np.arange(len(p[4]), dtype="int64") for p in parts])
    rank = np.where(cls == 0, NEST_RANK["checkpoint"], NEST_RANK["iteration"]).astype("int8")
    order = np.lexsort((pos, cls, rank, ~end, ts, tid))
    for i in range(0, len(order), CHUNK):
        at = order[i:i + CHUNK]
        made: dict[int, list] = {}
        for c, name, frame, cols, mine in parts:
            sel = at[cls[at] == c]
            rows = frame.iloc[mine[pos[sel]]]
            names = (np.where(rows["draft"], "draft checkpoint", "checkpoint") if name == "checkpoint"
                     else (rows["kind"].astype(str) + " iteration").to_numpy())
            made[c] = [Slice(t, e, label, name, a) for t, e, label, a in zip(
                rows["start_ns"].tolist(), rows["end_ns"].tolist(), names.tolist(), row_args(rows, cols))]
        taken = {c: iter(v) for c, v in made.items()}
        for j in at.tolist():
            s = next(taken[int(cls[j])])
            key = (pid, int(tid[j]), int(ts[j]), ~int(end[j]), int(rank[j]), int(cls[j]), 0, int(pos[j]))
            yield key, (lambda s=s: s)
