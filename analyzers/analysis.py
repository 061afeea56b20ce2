"""One trace's analysis (`Analysis`) and the calls that make it: one pass, each step using only
the ones before it: events -> spans (spans.py) -> checkpoints (checkpoints.py) -> iterations
(iterations.py) -> summary (summary.py). The package (analyzers/__init__.py) re-exports these."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import pandas as pd

from ckptrace.core.meta import ProcessInfo
from ckptrace.core.terminal import printable
from ckptrace.core.trace import BATCH_ROWS, Trace, TraceFile, opened, read_between, read_trace

from .checkpoints import CHECKPOINT_COLUMNS, checkpoint_table
from .events import KindRows
from .gpu import GPU_COPY_COLUMNS, gpu_copy_table, gpu_summary
from .iterations import ITERATION_COLUMNS, iteration_table
from .memory import memory_summary
from .processes import process_info, process_label, process_trace, process_traces
from .spans import iteration_spans
from .state_path import eviction_table, prompt_save_table, restore_table, slot_file_table
from .summary import summarize
from .memory_limit import limit_report
from .sums import SumOutOfRange



@dataclass
class Analysis:
    trace: Trace  # events None when analyze_file read the file batch by batch: `rows` has what was kept
    checkpoints: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    memory: dict  # checkpoint buffers held and RSS (memory.py; its `releases` a table)
    rows: KindRows  # the rows the analysis read (events.py)
    processes: list[dict] = field(default_factory=list)  # each process's breakdown (processes.py)
    restores: pd.DataFrame | None = None  # state_path.py (trace format 3)
    evictions: pd.DataFrame | None = None
    prompt_saves: pd.DataFrame | None = None  # state_path.py: prompt-cache saves and their copies
    gpu: pd.DataFrame | None = None  # gpu.py: the CUDA copies (None: no CUDA target was recorded)
    slot_files: pd.DataFrame | None = None  # state_path.py: slot saves and restores (trace format 5)

    def events_between(self, t0: int, t1: int) -> pd.DataFrame:
        """Every event lying within [t0, t1] ns: from memory, or read from the trace file."""
        ev = self.trace.events
        if ev is None:
            return read_between(self.trace.path, t0, t1)
        return ev.loc[((ev["start_ns"] >= t0) & (ev["end_ns"] <= t1)).to_numpy()]


def fill_probed(trace: Trace) -> bool:
    """Whether the recording had a probe on the growth behind resize() (every trace before format 3 did)."""
    profile = trace.meta.profile
    return profile is None or "fill" in profile.matched


def analyze_trace(trace: Trace, per_process: bool = True) -> Analysis:
    """The analysis of a trace in memory."""
    return analyze_rows(trace, KindRows.from_frame(trace.events), per_process)


def analyze_file(path: str | os.PathLike | TraceFile, batch_rows: int = BATCH_ROWS,
                 per_process: bool = True) -> Analysis:
    """The analysis of the trace file at `path` (or an open TraceFile), read batch by batch:
    memory holds the rows the analysis reads (analyzers/events.py) and its tables, never the
    whole trace. Equal to analyze_trace(read_trace(path)), checks included. The file is opened
    and checked once."""
    with opened(path) as f:
        if f.stream:  # a cut-short recording: read whole, as read_trace marks it cut short
            return analyze_trace(read_trace(f), per_process)
        rows = KindRows.from_file(f, batch_rows)
        return analyze_rows(Trace(events=None, meta=f.meta, path=f.path), rows, per_process)


def analyze_processes(trace: Trace | str | os.PathLike | TraceFile, on_rows=None
                      ) -> list[tuple[ProcessInfo, Analysis]]:
    """(process, its own analysis) for each process of a trace (a one-process trace: its
    analysis); a trace file is read batch by batch, each process's rows analysed in turn
    (`on_rows`: called with the kept rows (events.KindRows) before the analysis consumes them)."""
    if isinstance(trace, Trace):
        return [(info, analyze_trace(sub)) for info, sub in process_traces(trace)]
    with opened(trace) as f:
        if f.stream:
            return analyze_processes(read_trace(f))
        whole = Trace(events=None, meta=f.meta, path=f.path)
        rows = KindRows.from_file(f)
    if on_rows is not None:
        on_rows(rows)
    infos = process_info(whole, rows.per_pid.index)
    if len(infos) <= 1:
        return [(infos[0] if infos else ProcessInfo(pid=0, label=whole.label), analyze_rows(whole, rows))]
    return [(info, analyze_rows(process_trace(whole, info, rows.rows_of(info.pid)), rows.for_pid(info.pid)))
            for info in infos]


def analyze_rows(trace: Trace, rows: KindRows, per_process: bool = True) -> Analysis:
    """The analysis of `rows` (the kept rows of `trace`); with `per_process`, each process's too.
    It consumes `rows`: afterwards they hold the memory group only (what dashboards still draw);
    each other group goes as soon as its last reader is done, unless the processes' analyses
    read them again. A sum that would not fit in 64 bits is refused (sums.py), naming the trace."""
    try:
        return _analyze_rows(trace, rows, per_process)
    except SumOutOfRange as e:
        raise e.at(printable(trace.path) if trace.path else None) from None


def _analyze_rows(trace: Trace, rows: KindRows, per_process: bool) -> Analysis:
    infos = process_info(trace, rows.per_pid.index) if per_process else []
    several = len(infos) > 1
    memory = memory_summary(rows.of_group("memory"))  # first: its peak then adds to the kept rows alone
    done = (lambda *groups: None) if several else rows.drop
    spans = iteration_spans(rows)
    done("iteration", "decode")
    checkpoints = checkpoint_table(rows, spans, fill_probed(trace))
    prompt_saves = prompt_save_table(rows.of_group("memory"), rows.of("copy"), spans)
    gpu = gpu_copy_table(rows.of("copy"), printable(trace.path or "the trace")) if trace.meta.gpu is not None else None
    done("fill", "copy")
    restores = restore_table(rows.of_group("memory"), spans)
    slot_files = slot_file_table(rows.of_group("memory"), spans)
    evictions = eviction_table(rows.state_events())
    done("checkpoint")
    iterations = iteration_table(rows, spans, checkpoints)
    del spans  # the iteration table shares its columns
    summary = summarize(checkpoints, iterations, trace.meta)
    subs = [(info, _analyze_rows(process_trace(trace, info, rows.rows_of(info.pid)), rows.for_pid(info.pid),
                                per_process=False)) for info in infos] if several else []
    rows.release(keep="memory")
    a = Analysis(trace, checkpoints, iterations, summary, memory, rows, restores=restores, evictions=evictions,
                 prompt_saves=prompt_saves, gpu=gpu, slot_files=slot_files)
    memory["limit"] = limit_report(a)  # None unless the trace recorded a cgroup memory limit
    if per_process:
        subs = subs or [(infos[0] if infos else ProcessInfo(pid=0, label=trace.label), a)]
        a.processes = [{**asdict(info), "label": process_label(info), "summary": sub.summary, "memory": sub.memory}
                       for info, sub in subs]
    return a
