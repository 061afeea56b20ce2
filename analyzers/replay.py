"""`whatif` on a trace: each process analysed (analysis.py), its checkpoint buffers replayed
against a pool policy (whatif.py's simulator) and the replay checked against the process's
cgroup memory limit (memory_limit.py).

A trace file is read batch by batch (events.KindRows) and only what the replay reads is made of
it (`ReplaySource`): the checkpoint table, the update_slots spans and the memory rows; not the
iteration table, summary or state-path tables `analyze` makes (the iteration table alone is
about 200 bytes per iteration: some 600 MiB at 10M events, issue 39). Once a
process's replay input is made, its source keeps only the trace's first and last times."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from ckptrace.core.meta import ProcessInfo
from ckptrace.core.terminal import printable
from ckptrace.core.trace import Trace, TraceFile, opened, read_meta, read_trace

from .analysis import analyze_processes, fill_probed
from .checkpoints import checkpoint_table
from .events import GROUPS, KindRows
from .memory_limit import memory_limit_check
from .processes import process_info, process_trace
from .spans import iteration_spans
from .sums import SumOutOfRange
from .whatif import POLICIES, Policy, Replay, first_fill_starts, replay_input, simulate


@dataclass
class ReplaySource:
    """What replay_input reads of one process's analysis, made without the rest of it: the
    checkpoint table, the iteration table's update_slots rows (start_ns, end_ns, boundary: its
    spans, in the same order) and the kept rows (their memory group)."""
    trace: Trace
    checkpoints: pd.DataFrame
    iterations: pd.DataFrame
    rows: KindRows

    def done(self) -> None:
        """The replay input is made: the tables and rows go (rows.start_ns and end_ns stay)."""
        self.rows.drop(*GROUPS)
        self.checkpoints = self.iterations = None


def predict(trace, policy: Policy | None = None) -> list[Replay]:
    """Every process of a trace (a path, an open TraceFile or a ckptrace.core.trace.Trace) replayed
    against `policy` (default PR #201's): one Replay each, in the trace's process order, with its
    `input` and `analysis` (a Trace's: its analyze_processes analysis; a file's: its ReplaySource,
    emptied) (a process that mapped no checkpoint buffer has no gets). A file is read batch by
    batch: memory holds the rows the replay reads, never the whole trace."""
    if isinstance(trace, Trace):
        return _replays([(info, a, None) for info, a in analyze_processes(trace)], trace.label, trace.path, policy)
    with opened(trace) as f:
        if f.stream:  # a cut-short recording: read whole, as read_trace marks it cut short
            t = read_trace(f)
            return _replays([(info, a, None) for info, a in analyze_processes(t)], t.label, t.path, policy)
        label = Trace(events=None, meta=read_meta(f), path=f.path).label
        return _replays(replay_sources(f), label, f.path, policy)


def _replays(sources, label: str, path, policy: Policy | None) -> list[Replay]:
    where = printable(str(path)) if path else "the trace"
    out = []
    for info, source, first in sources:
        info = dataclasses.replace(info, label=info.label or label)
        inp = replay_input(source, info, first)
        if isinstance(source, ReplaySource):
            source.done()  # before the replay: its tables and rows are not held while it runs (issue 39)
        r = simulate(inp, policy or POLICIES["pr201"], where)
        r.limit = memory_limit_check(r.input, r)
        r.analysis = source
        out.append(r)
    return out


def replay_sources(f: TraceFile) -> list[tuple[ProcessInfo, ReplaySource, pd.Series]]:
    """(process, its ReplaySource, ckpt -> its first fill's start) for each process of the
    (complete) trace file `f`, as analyze_processes splits them, read batch by batch."""
    whole = Trace(events=None, meta=f.meta, path=f.path)
    rows = KindRows.from_file(f)
    fills = rows.of("fill")[["pid", "ckpt", "start_ns"]]
    infos = process_info(whole, rows.per_pid.index)
    if len(infos) <= 1:
        info = infos[0] if infos else ProcessInfo(pid=0, label=whole.label)
        return [(info, _source(whole, rows), first_fill_starts(fills))]
    out = []
    for info in infos:
        mine = fills.loc[(fills["pid"] == info.pid).to_numpy()]
        out.append((info, _source(process_trace(whole, info, rows.rows_of(info.pid)), rows.for_pid(info.pid)),
                    first_fill_starts(mine)))
    return out


def _source(trace: Trace, rows: KindRows) -> ReplaySource:
    """The analysis' first steps (analysis._analyze_rows'), each group of rows dropped after its
    last reader: spans, then checkpoints; the memory group stays for the replay input."""
    try:
        spans = iteration_spans(rows)
        rows.drop("iteration", "decode")
        # Only what checkpoint_table (assign_iterations) and the replay read of the spans: the
        # others are about 40 bytes an iteration while the checkpoint table is made (issue 39).
        spans = spans[["iter", "tid", "start_ns", "end_ns", "boundary"]]
        checkpoints = checkpoint_table(rows, spans, fill_probed(trace))
    except SumOutOfRange as e:
        raise e.at(printable(trace.path) if trace.path else None) from None
    rows.drop("fill", "copy", "checkpoint")
    slots = spans.loc[(spans["boundary"] == "update_slots").to_numpy(), ["start_ns", "end_ns", "boundary"]]
    return ReplaySource(trace, checkpoints, slots.reset_index(drop=True), rows)
