"""Pure functions from trace events (typed DataFrames) to breakdowns, summaries and comparisons.

One pass, each step using only the ones before it:
events -> spans (spans.py) -> checkpoints (checkpoints.py) -> iterations (iterations.py)
-> summary (summary.py). `compare` builds A/B/A verdicts on analyses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from ckptrace.trace import Trace

from .checkpoints import CHECKPOINT_COLUMNS, checkpoint_table
from .iterations import ITERATION_COLUMNS, iteration_table
from .memory import memory_summary
from .processes import process_label, process_traces
from .spans import iteration_spans
from .state_path import eviction_table, restore_table
from .summary import summarize

__all__ = ["Analysis", "analyze_trace", "checkpoint_table", "iteration_spans", "iteration_table", "summarize",
           "CHECKPOINT_COLUMNS", "ITERATION_COLUMNS"]


@dataclass
class Analysis:
    trace: Trace
    checkpoints: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    memory: dict  # checkpoint buffers held and RSS (memory.py)
    processes: list[dict] = field(default_factory=list)  # each process's breakdown (processes.py)
    restores: pd.DataFrame | None = None  # state_path.py (trace format 3)
    evictions: pd.DataFrame | None = None


def fill_probed(trace: Trace) -> bool:
    """Whether the recording had a probe on the growth behind resize() (every trace before format 3 did)."""
    profile = trace.meta.profile
    return profile is None or "fill" in profile.matched


def analyze_trace(trace: Trace, per_process: bool = True) -> Analysis:
    spans = iteration_spans(trace.events)
    checkpoints = checkpoint_table(trace.events, spans, fill_probed(trace))
    iterations = iteration_table(trace.events, spans, checkpoints)
    a = Analysis(trace, checkpoints, iterations, summarize(checkpoints, iterations, trace.meta),
                 memory_summary(trace.events), restores=restore_table(trace.events, spans),
                 evictions=eviction_table(trace.events))
    if per_process:
        parts = process_traces(trace)
        subs = [(info, a if len(parts) == 1 else analyze_trace(sub, per_process=False)) for info, sub in parts]
        a.processes = [{**asdict(info), "label": process_label(info), "summary": sub.summary, "memory": sub.memory}
                       for info, sub in subs]
    return a
