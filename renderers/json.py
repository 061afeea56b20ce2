"""The `--json` documents of `analyze` and `compare`: plain JSON values only.

JSON has no NaN or infinity: an undefined or unbounded figure is null, and so is a value that was
not recorded (pandas NA), never 0. Every `--json` document of every command is an object whose
`schema_version` says its layout (docs/schemas/, built by renderers/json_schema.py).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd


# The layout of every --json document. Bump it for a change an existing reader would misread (a
# key removed, renamed or changing meaning); a key added keeps it (readers ignore keys they don't know).
SCHEMA_VERSION = 2  # 2: pool_hit means a reused, resident buffer (the `buffer` class), not "no fill"


def versioned(doc: dict) -> dict:
    """`doc` with `schema_version` first."""
    return {"schema_version": SCHEMA_VERSION, **doc}


def plain(v):
    """A JSON-ready value: None for NaN, infinity and NA."""
    if v is pd.NA or v is None:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts of plain Python values (to_dict unboxes numpy scalars); NA, NaN, inf -> None."""
    df = df.copy(deep=False)
    for col in df.columns:
        s = df[col]
        if s.dtype.kind == "f" or (isinstance(s.dtype, pd.api.extensions.ExtensionDtype)
                                   and not isinstance(s.dtype, pd.CategoricalDtype)):
            ok = s.notna().to_numpy().copy()
            if s.dtype.kind == "f":
                ok &= np.isfinite(s.to_numpy(dtype="float64", na_value=np.nan))
            df[col] = s.astype(object).where(ok, None)
    return df.to_dict("records")


def memory_json(memory: dict) -> dict:
    """An analysis' `memory` block with its releases table as a list of rows."""
    return {**memory, "releases": records(memory["releases"])}


def analysis_doc(analysis) -> dict:
    """`analyze --json`'s document with its tables as DataFrames: write_json encodes them a chunk
    of rows at a time; analysis_json makes them lists."""
    return {"schema_version": SCHEMA_VERSION, "trace": analysis.trace.meta.to_json(), "checkpoints": analysis.checkpoints,
            "iterations": analysis.iterations, "summary": analysis.summary, "memory": analysis.memory,
            "processes": [{**p, "memory": memory_json(p["memory"])} for p in analysis.processes],
            "restores": analysis.restores, "evictions": analysis.evictions, "prompt_saves": analysis.prompt_saves,
            "slot_files": analysis.slot_files, **_gpu_doc(analysis)}


def _gpu_doc(analysis) -> dict:
    """The CUDA copy path: a key only for a trace recorded with a CUDA target."""
    if analysis.gpu is None:
        return {}
    from ckptrace.analyzers.gpu import gpu_summary

    return {"gpu": {"summary": gpu_summary(analysis.gpu), "copies": analysis.gpu}}


def analysis_json(analysis) -> dict:
    return _listed(analysis_doc(analysis))


def _listed(value):
    """A document with every table (DataFrame) in it as a list of rows."""
    if isinstance(value, pd.DataFrame):
        return records(value)
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    return value


# Rows of a table encoded at once by write_json: memory holds one chunk's row dicts, never a
# table's (a day-long trace has millions of iterations).
CHUNK_ROWS = 1 << 16


def write_json(doc: dict, write) -> None:
    """Write `dumps(_listed(doc))` through `write` in pieces, the same text: each table (a
    DataFrame, in `doc` or a dict of it) CHUNK_ROWS rows at a time. `doc`'s keys are text."""
    write("{")
    for i, (key, value) in enumerate(doc.items()):
        write((", " if i else "") + json.dumps(key) + ": ")
        if isinstance(value, pd.DataFrame):
            write("[")
            for at in range(0, len(value), CHUNK_ROWS):
                write((", " if at else "") + dumps(records(value.iloc[at:at + CHUNK_ROWS]))[1:-1])
            write("]")
        elif isinstance(value, dict) and any(isinstance(v, pd.DataFrame) for v in value.values()):
            write_json(value, write)  # the memory block: its releases table
        else:
            write(dumps(value))
    write("}")


def comparison_json(c) -> dict:
    legs = records(c.legs)
    for leg in legs:
        leg["build_ids"] = [b for b in leg["build_ids"].split(",") if b]
    return {"schema_version": SCHEMA_VERSION, "headline": c.headline, "baseline": c.baseline, "candidate": c.candidate,
            "samples": c.samples,
            "seed": c.seed, "n_boot": c.n_boot, "min_effect_pct": c.min_effect_pct, "statistic": c.statistic,
            "legs": legs, "metrics": records(c.metrics),
            "pool": records(c.pool) if c.pool is not None else [],
            "memory": records(c.memory) if c.memory is not None else [],
            "warmup": {"setting": c.warmup_setting, "arms": records(c.warmup) if c.warmup is not None else []},
            "ttft": records(c.ttft) if c.ttft is not None else [],
            "machine": c.machine, "warnings": list(c.warnings), "explanation": c.explanation}


def dumps(doc: dict) -> str:
    """Strict JSON (no NaN); values JSON lacks (e.g. a Path in metadata) as strings."""
    return json.dumps(doc, default=str, allow_nan=False)
