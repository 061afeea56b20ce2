"""Pure functions from trace events (typed DataFrames) to breakdowns, summaries and comparisons.

`analyze_trace` is the facade; the tables come from `checkpoints`, `iterations` and `summary`,
and `compare` builds A/B/A verdicts on top of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ckptrace.trace import Trace

from .checkpoints import CHECKPOINT_COLUMNS, checkpoint_table
from .iterations import ITERATION_COLUMNS, iteration_spans, iteration_table, unassigned_checkpoints
from .summary import summarize

__all__ = ["Analysis", "analyze_trace", "checkpoint_table", "iteration_table", "unassigned_checkpoints",
           "summarize", "CHECKPOINT_COLUMNS", "ITERATION_COLUMNS"]


@dataclass
class Analysis:
    trace: Trace
    checkpoints: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict

    @property
    def unassigned(self) -> pd.DataFrame:
        return unassigned_checkpoints(self.checkpoints)


def analyze_trace(trace: Trace) -> Analysis:
    spans = iteration_spans(trace.events)
    checkpoints = checkpoint_table(trace.events, spans)
    iterations = iteration_table(trace.events, checkpoints, spans)
    return Analysis(trace, checkpoints, iterations, summarize(checkpoints, iterations, trace.meta))
