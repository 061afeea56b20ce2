"""One trace, several processes: each process's rows as a trace of its own, analysed apart.

A recording of several processes (`record --pid A --pid B`, `--comm NAME`) has a `pid` on every
row and one `processes` metadata entry per process (its label, comm, executable, build-id). A
process's sub-trace keeps the recording's label (the leg, for compare) and names the process in
its `processes` entry; a trace from before version 3 is one process, its `pid` metadata.
"""
from __future__ import annotations

import dataclasses

from ckptrace.core.errors import TraceFormatError
from ckptrace.core.meta import MAX_PROCESSES, ProcessInfo
from ckptrace.core.terminal import printable
from ckptrace.core.trace import Trace


def process_info(trace: Trace, pids=None) -> list[ProcessInfo]:
    """Every process of the trace: its metadata entries, then any pid with rows but no entry
    (`pids`: the pids of its rows, when its events are not in memory)."""
    known = list(trace.meta.processes)
    if not known and trace.meta.pid is not None:  # before version 3: one process, named by its executable
        name = (trace.meta.executable or "").rsplit("/", 1)[-1][:15]
        known = [ProcessInfo(pid=trace.meta.pid, label=f"{name or 'process'}#1", comm=name,
                             executable=trace.meta.executable)]
    seen = {p.pid for p in known}
    pids = trace.events["pid"].unique() if pids is None else pids
    extra = sorted(int(p) for p in pids if int(p) not in seen and int(p) != 0)
    if len(known) + len(extra) > MAX_PROCESSES:  # each is analysed apart: a hostile trace's 20,000 took 90 s
        raise TraceFormatError(f"{printable(trace.path or 'the trace')}: rows of {len(known) + len(extra)} processes; "
                               f"a recording follows at most {MAX_PROCESSES}: a damaged or hostile trace?")
    return known + [ProcessInfo(pid=p, label=f"pid {p}") for p in extra]


def process_label(info: ProcessInfo) -> str:
    return info.label or info.comm or f"pid {info.pid}"


def process_traces(trace: Trace) -> list[tuple[ProcessInfo, Trace]]:
    """(process, its sub-trace) for each process; a one-process trace is itself."""
    infos = process_info(trace)
    if len(infos) <= 1:
        return [(infos[0] if infos else ProcessInfo(pid=0, label=trace.label), trace)]
    pids = trace.events["pid"].to_numpy()
    out = []
    for info in infos:
        events = trace.events.loc[pids == info.pid].reset_index(drop=True)
        out.append((info, process_trace(trace, info, len(events), events)))
    return out


def process_trace(trace: Trace, info: ProcessInfo, rows: int, events=None) -> Trace:
    """The sub-trace of one process: `rows` rows, `events` when they are in memory."""
    meta = dataclasses.replace(trace.meta, pid=info.pid, executable=info.executable, processes=[info], events=rows)
    return Trace(events=events, meta=meta, path=trace.path)
