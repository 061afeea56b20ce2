# %% [markdown]
# # `analyze --json` and `compare --json`, rebuilt from the Python API alone
#
# Notebook-style (each `# %%` is a cell): every figure comes from `ckptrace.open()` and
# `ckptrace.compare()` (docs/api.md); pandas and json do the rest. Run as a script, it prints
# {"analyze": {TRACE: document, ...}, "compare": document} for the traces given (compare with
# two or more), which
# tests/test_api.py holds equal to what the commands print:
#
#     python docs/examples/reproduce_json.py samples/traces/{1-pool-off,2-pool-on,3-pool-off}.parquet

# %%
import json
import math
import sys

import pandas as pd

import ckptrace


def plain(value):
    """A JSON value: NA, NaN and infinity as null (JSON has none of them)."""
    if value is None or value is pd.NA or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def rows(frame: pd.DataFrame) -> list[dict]:
    """A table as JSON rows (object dtype gives plain Python values)."""
    return [{k: plain(v) for k, v in r.items()} for r in frame.astype(object).to_dict("records")]


# %% [markdown]
# ## One trace: `ckptrace analyze TRACE --json`

# %%
def summary_of(t: ckptrace.Trace, process=None) -> dict:
    stats = t.summary(process)[["count", "not_recorded", "mean", "median", "p90", "p99"]]
    return {**t.figures(process), "stats": {m: {k: plain(v) for k, v in r.items()}
                                            for m, r in stats.astype(object).iterrows()}}


def memory_of(t: ckptrace.Trace, process=None) -> dict:
    return {**rows(t.memory(process))[0], "releases": rows(t.releases(process)), "limit": t.memory_limit(process)}


def analyze_doc(path: str) -> dict:
    with ckptrace.open(path) as t:
        processes = [{**p, "summary": summary_of(t, p["pid"]), "memory": memory_of(t, p["pid"])}
                     for p in rows(t.processes)]
        doc = {"schema_version": ckptrace.SCHEMA_VERSION, "trace": t.meta.to_json(),
               "checkpoints": rows(t.checkpoints()), "iterations": rows(t.iterations()),
               "summary": summary_of(t), "memory": memory_of(t), "processes": processes,
               "restores": rows(t.restores()), "evictions": rows(t.evictions()),
               "prompt_saves": rows(t.prompt_saves()), "slot_files": rows(t.slot_files())}
        if t.meta.gpu is not None:  # recorded with a CUDA target: its copies
            doc["gpu"] = {"summary": t.gpu_summary(), "copies": rows(t.gpu_copies())}
        return doc


# %% [markdown]
# ## A/B/A legs: `ckptrace compare TRACE... --json`

# %%
def compare_doc(paths: list[str]) -> dict:
    c = ckptrace.compare(paths)
    legs = rows(c.legs)
    for leg in legs:
        leg["build_ids"] = [b for b in leg["build_ids"].split(",") if b]
    warmup = {"setting": c.warmup_setting, "arms": rows(c.warmup) if c.warmup is not None else []}
    return {"schema_version": ckptrace.SCHEMA_VERSION, "headline": c.headline_figures, "baseline": c.baseline,
            "candidate": c.candidate, "samples": c.samples, "seed": c.seed, "n_boot": c.n_boot,
            "min_effect_pct": c.min_effect_pct, "statistic": c.statistic, "legs": legs, "metrics": rows(c.metrics),
            "pool": rows(c.pool), "memory": rows(c.memory), "ttft": rows(c.ttft) if c.ttft is not None else [],
            "warmup": warmup, "machine": c.machine,
            "warnings": c.warnings, "explanation": c.explanation}


# %%
if __name__ == "__main__":
    paths = sys.argv[1:]
    doc = {"analyze": {p: analyze_doc(p) for p in paths}}
    if len(paths) > 1:
        doc["compare"] = compare_doc(paths)
    print(json.dumps(doc, default=str, allow_nan=False))
