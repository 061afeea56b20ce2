"""`whatif` on a trace: each process analysed (analysis.py), its checkpoint buffers replayed
against a pool policy (whatif.py's simulator) and the replay checked against the process's
cgroup memory limit (memory_limit.py)."""
from __future__ import annotations

import dataclasses

import pandas as pd

from ckptrace.core.terminal import printable
from ckptrace.core.trace import Trace, read_meta

from .analysis import analyze_processes
from .memory_limit import memory_limit_check
from .whatif import POLICIES, Policy, Replay, first_fill_starts, replay_input, simulate


def predict(trace, policy: Policy | None = None) -> list[Replay]:
    """Every process of a trace (a path, or a ckptrace.core.trace.Trace) replayed against `policy`
    (default PR #201's): one Replay each, in the trace's process order, with its `input` and
    `analysis` (a process that mapped no checkpoint buffer has no gets). A path is read batch by
    batch (analyze_processes): memory holds the rows the analysis keeps, never the whole trace."""
    fills: list[pd.DataFrame] = []
    analyses = analyze_processes(trace, on_rows=lambda rows: fills.append(rows.of("fill")[["pid", "ckpt", "start_ns"]]))
    path = trace.path if isinstance(trace, Trace) else getattr(trace, "path", trace)
    label = trace.label if isinstance(trace, Trace) else Trace(events=None, meta=read_meta(trace), path=path).label
    where = printable(str(path)) if path else "the trace"
    out = []
    for info, analysis in analyses:
        info = dataclasses.replace(info, label=info.label or label)
        first = None
        if fills:  # read batch by batch: the fill rows went with the analysis, their first starts kept here
            mine = fills[0] if len(analyses) <= 1 else fills[0].loc[(fills[0]["pid"] == info.pid).to_numpy()]
            first = first_fill_starts(mine)
        r = simulate(replay_input(analysis, info, first), policy or POLICIES["pr201"], where)
        r.limit = memory_limit_check(r.input, r)
        r.analysis = analysis
        out.append(r)
    return out
