"""Pure functions from trace events (typed DataFrames) to breakdowns, summaries and comparisons.

One pass, each step using only the ones before it:
events -> spans (spans.py) -> checkpoints (checkpoints.py) -> iterations (iterations.py)
-> summary (summary.py); analysis.py runs it. `compare` builds A/B/A verdicts on analyses.

The names below are imported from their modules on first use (PEP 562), not when the package is:
so the numpy-only metric table (metrics.py) loads without pandas, as `serve`, `top` and the
recorder's status line need them (about 50 MiB less resident: docs/performance.md).
"""
from __future__ import annotations

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    **dict.fromkeys(("Analysis", "analyze_file", "analyze_processes", "analyze_rows", "analyze_trace", "fill_probed"),
                    "analysis"),
    "KindRows": "events",
    "checkpoint_table": "checkpoints", "CHECKPOINT_COLUMNS": "checkpoints",
    "iteration_table": "iterations", "ITERATION_COLUMNS": "iterations",
    "iteration_spans": "spans",
    "summarize": "summary",
    "gpu_copy_table": "gpu", "gpu_summary": "gpu", "GPU_COPY_COLUMNS": "gpu",
    "SumOutOfRange": "sums",
}

__all__ = ["Analysis", "KindRows", "analyze_file", "analyze_processes", "analyze_rows", "analyze_trace", "checkpoint_table",
           "iteration_spans", "iteration_table", "summarize", "gpu_copy_table", "gpu_summary", "CHECKPOINT_COLUMNS",
           "ITERATION_COLUMNS", "GPU_COPY_COLUMNS"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
