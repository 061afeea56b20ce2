"""The `--json` documents of `analyze` and `compare`: plain JSON values only.

JSON has no NaN or infinity: an undefined or unbounded figure is null, and so is a value that was
not recorded (pandas NA), never 0.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd


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


def analysis_json(analysis) -> dict:
    return {"trace": analysis.trace.meta.to_json(), "checkpoints": records(analysis.checkpoints),
            "iterations": records(analysis.iterations), "summary": analysis.summary,
            "memory": memory_json(analysis.memory),
            "processes": [{**p, "memory": memory_json(p["memory"])} for p in analysis.processes],
            "restores": records(analysis.restores), "evictions": records(analysis.evictions),
            "prompt_saves": records(analysis.prompt_saves)}


def comparison_json(c) -> dict:
    legs = records(c.legs)
    for leg in legs:
        leg["build_ids"] = [b for b in leg["build_ids"].split(",") if b]
    return {"baseline": c.baseline, "candidate": c.candidate, "samples": c.samples,
            "seed": c.seed, "n_boot": c.n_boot, "min_effect_pct": c.min_effect_pct, "statistic": c.statistic,
            "legs": legs, "metrics": records(c.metrics),
            "pool": records(c.pool) if c.pool is not None else [],
            "memory": records(c.memory) if c.memory is not None else [],
            "warnings": list(c.warnings), "explanation": c.explanation}


def dumps(doc: dict) -> str:
    """Strict JSON (no NaN); values JSON lacks (e.g. a Path in metadata) as strings."""
    return json.dumps(doc, default=str, allow_nan=False)
