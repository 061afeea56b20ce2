"""The JSON Schemas (draft 2020-12) of every command's `--json` document, built from the tables'
own column declarations so they cannot drift from the code: docs/schemas/NAME.schema.json is
`python -m ckptrace.renderers.json_schema docs/schemas` (tests/test_json_schema.py checks the
files are current and validates real output against them).

A table's rows list every column with its JSON type (a column that may be not recorded allows
null); summary and memory blocks list their keys. Objects whose keys come from elsewhere (the
trace metadata, a symbol plan) require the keys a reader relies on and allow others.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ckptrace.analyzers.checkpoints import BUFFER_CLASSES, CHECKPOINT_COLUMNS
from ckptrace.analyzers.gpu import GPU_COPY_COLUMNS
from ckptrace.analyzers.compare import LEG_COLUMNS, MEMORY_COLUMNS, METRIC_COLUMNS, POOL_COLUMNS, WARMUP_COLUMNS
from ckptrace.analyzers.iterations import ITERATION_COLUMNS
from ckptrace.analyzers.memory import RELEASE_COLUMNS
from ckptrace.analyzers.requests import REQUEST_COLUMNS
from ckptrace.analyzers.state_path import EVICTION_COLUMNS, PROMPT_SAVE_COLUMNS, RESTORE_COLUMNS, SLOT_FILE_COLUMNS
from ckptrace.analyzers.summary import STAT_METRICS
from ckptrace.analyzers.ttft import TTFT_COLUMNS
from ckptrace.core.meta import TraceMeta

from .json import SCHEMA_VERSION

DRAFT = "https://json-schema.org/draft/2020-12/schema"
NUMBER = {"type": ["number", "null"]}  # a float: null for NaN, infinity or not recorded
COUNT = {"type": "integer", "minimum": 0}


def column_schema(dtype) -> dict:
    """A table column's JSON type (renderers/json.py's records(): NA, NaN and infinity are null)."""
    if isinstance(dtype, pd.CategoricalDtype):
        return {"enum": [str(c) for c in dtype.categories]}
    if isinstance(dtype, pd.Int64Dtype) or dtype == "Int64":
        return {"type": ["integer", "null"]}
    if isinstance(dtype, pd.BooleanDtype):
        return {"type": ["boolean", "null"]}
    if dtype in ("str", "string"):
        return {"type": "string"}
    if dtype == "object":
        return {}
    d = np.dtype(dtype)
    if d.kind == "b":
        return {"type": "boolean"}
    if d.kind in "iu":
        return {"type": "integer"}
    if d.kind == "f":
        return NUMBER
    return {}


def rows(columns: dict, **overrides) -> dict:
    """An array of a table's rows: every column, no other key."""
    props = {c: overrides.get(c, column_schema(t)) for c, t in columns.items()}
    return {"type": "array", "items": {"type": "object", "properties": props, "required": list(props),
                                       "additionalProperties": False}}


def strict(props: dict, optional: tuple = ()) -> dict:
    return {"type": "object", "properties": props, "required": [k for k in props if k not in optional],
            "additionalProperties": False}


def loose(required: list[str], props: dict | None = None) -> dict:
    return {"type": "object", "required": required, "properties": props or {}}


VERSION = {"const": SCHEMA_VERSION}
DESCRIBED = strict({"count": COUNT, "not_recorded": COUNT, "mean": NUMBER, "median": NUMBER, "p90": NUMBER,
                    "p99": NUMBER})
NULLABLE_INT = {"type": ["integer", "null"]}
SUMMARY = strict({
    "checkpoints": COUNT, "pool_hits": COUNT, "pool_hit_rate": NUMBER, "draft_checkpoints": COUNT,
    "buffers": strict({c: COUNT for c in BUFFER_CLASSES}), "fresh_copy_checkpoints": COUNT,
    "fresh_copy_bytes": COUNT,
    "unassigned_checkpoints": COUNT, "checkpoint_bytes": COUNT, "iterations": COUNT, "prefill_iterations": COUNT,
    "decode_iterations": COUNT, "stats": strict({m: DESCRIBED for m in STAT_METRICS}),
    "checkpoint_share_of_prefill": NUMBER, "faults_per_mib": NUMBER, "ns_per_mib": NUMBER,
    "fill_ns_per_mib": NUMBER, "copy_ns_per_mib": NUMBER,
    "fault_sources": {"type": "object", "additionalProperties": COUNT},
    "fault_time": {"type": ["object", "null"]}, "sched_counters": {"type": ["object", "null"]},
    "cpu_time_recorded": {"type": "boolean"}, "wait_share": NUMBER, "prefill_wait_share": NUMBER,
    "lost_events": COUNT, "complete": {"type": "boolean"}, "map_full": COUNT, "partial_spans": COUNT,
    "open_at_stop": COUNT, "reliable": {"type": "boolean"}, "reliability": {"type": "string"},
    "notes": {"type": "array", "items": {"type": "string"}},
    "requests": {"type": "object"},  # analyze --requests: the distributions over requests
}, optional=("requests",))
MEMORY = strict({
    "peak_held_bytes": COUNT, "peak_held_ns": NULLABLE_INT, "end_held_bytes": COUNT, "buffers_mapped": COUNT,
    "buffer_bytes_mapped": COUNT, "released_bytes": COUNT, "peak_rss_bytes": NULLABLE_INT, "rss_samples": COUNT,
    "releases": rows(RELEASE_COLUMNS),
    "limit": {"type": ["object", "null"]}})  # the cgroup memory limit check (analyzers/memory_limit.py), null unless recorded
TRACE_META = loose(["label", "clock", "lost_events"],
                   {f.name: {} for f in dataclasses.fields(TraceMeta) if f.name != "extra"})
PROCESS = loose(["pid", "label", "summary", "memory"], {"summary": SUMMARY, "memory": MEMORY})


def analyze_schema() -> dict:
    return {"$schema": DRAFT, "title": "ckptrace analyze --json", **strict({
        "schema_version": VERSION, "trace": TRACE_META, "checkpoints": rows(CHECKPOINT_COLUMNS),
        "iterations": rows(ITERATION_COLUMNS), "summary": SUMMARY, "memory": MEMORY,
        "processes": {"type": "array", "items": PROCESS},
        "restores": rows(RESTORE_COLUMNS), "evictions": rows(EVICTION_COLUMNS),
        "prompt_saves": rows(PROMPT_SAVE_COLUMNS), "slot_files": rows(SLOT_FILE_COLUMNS),
        "requests": rows(REQUEST_COLUMNS),
        # a trace recorded with a CUDA target (trace format 4): its copies, by destination
        "gpu": strict({"summary": {"type": "object"}, "copies": rows(GPU_COPY_COLUMNS)})},
        optional=("requests", "gpu"))}


def comparison(extra: dict | None = None) -> dict:
    leg = rows(LEG_COLUMNS, build_ids={"type": "array", "items": {"type": "string"}})
    return strict({
        "schema_version": VERSION, **(extra or {}), "baseline": {"type": "string"}, "candidate": {"type": "string"},
        "samples": {"type": "string"}, "seed": {"type": "integer"}, "n_boot": {"type": "integer"},
        "min_effect_pct": {"type": "number"}, "statistic": {"type": "string"}, "legs": leg,
        "metrics": rows(METRIC_COLUMNS), "pool": rows(POOL_COLUMNS),
        "memory": rows(MEMORY_COLUMNS, legs_mib={"type": "array", "items": NUMBER}),
        # each TTFT percentile's change split by the traced checkpoint path (analyzers/ttft.py)
        "ttft": rows(TTFT_COLUMNS),
        # the answer first (analyzers/headline.py), each arm's warm-up, the machine-state guard
        "headline": loose(["sentence", "checkpoint", "prefill", "ttft_p90", "hit_rate", "memory"],
                          {"sentence": {"type": "string"}}),
        "warmup": strict({"setting": {"type": ["integer", "string"]}, "arms": rows(WARMUP_COLUMNS)}),
        "machine": loose(["recorded", "one_state", "differences", "said"],
                         {"recorded": {"type": "boolean"}, "one_state": {"type": "boolean"},
                          "differences": {"type": "array", "items": {"type": "string"}}, "said": {"type": "string"}}),
        "warnings": {"type": "array", "items": {"type": "string"}}, "explanation": {"type": "string"}})


def compare_schema() -> dict:
    per_process = strict({"schema_version": VERSION, "processes": {
        "type": "array", "items": comparison({"process": {"type": "string"}})}})
    return {"$schema": DRAFT, "title": "ckptrace compare --json (--per-process: one per process label)",
            "oneOf": [comparison(), per_process]}


def doctor_schema() -> dict:
    check = strict({"check": {"type": "string"}, "ok": {"type": "boolean"}, "detail": {"type": "string"},
                    "fix": {"type": "string"}})
    return {"$schema": DRAFT, "title": "ckptrace doctor --json",
            **strict({"schema_version": VERSION, "checks": {"type": "array", "items": check}})}


def drive_schema() -> dict:
    from ckptrace.core.requests_file import COLUMNS

    return {"$schema": DRAFT, "title": "ckptrace drive --json (-o FILE writes `requests` alone: the request file)",
            **strict({"schema_version": VERSION, "requests": rows(COLUMNS)})}


def record_schema() -> dict:
    process = strict({"pid": {"type": "integer"}, "label": {"type": "string"}, "exited_ns": NULLABLE_INT})
    return {"$schema": DRAFT, "title": "ckptrace record --json", **strict({
        "schema_version": VERSION, "trace": {"type": "string"}, "events": COUNT, "checkpoints": COUNT,
        "iterations": COUNT, "lost_events": COUNT, "stop_reason": {"type": ["string", "null"]},
        "exit_code": NULLABLE_INT, "processes": {"type": "array", "items": process}})}


def symbols_schema() -> dict:
    point = loose(["point", "symbol", "object", "vaddr", "offset"])
    return {"$schema": DRAFT, "title": "ckptrace symbols --json", **loose(
        ["schema_version", "target", "pid", "objects", "points", "missing_optional", "profile"],
        {"schema_version": VERSION, "points": {"type": "array", "items": point}})}


def demo_schema() -> dict:
    return {"$schema": DRAFT, "title": "ckptrace demo --json", **strict({
        "schema_version": VERSION, "traces": {"type": "array", "items": {"type": "string"}},
        "checks": {"type": "array", "items": {"type": "string"}}, "comparison": comparison(),
        "report": {"type": "string"}, "perfetto": {"type": "string"},
        "requests": {"type": "array"}}, optional=("requests",))}


def whatif_schema() -> dict:
    from ckptrace.analyzers.whatif import OUTCOME_COLUMNS, POOLED_COLUMNS

    process = loose(["trace", "pid", "label", "warnings"], {
        "trace": {"type": "string"}, "pid": {"type": "integer"}, "label": {"type": "string"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "summary": loose(["gets", "hits", "misses", "pooled_hwm_bytes", "faults_avoided", "fill_cpu_saved_ns"]),
        "outcomes": rows(OUTCOME_COLUMNS), "pooled": rows(POOLED_COLUMNS)})
    return {"$schema": DRAFT, "title": "ckptrace whatif --json", **strict({
        "schema_version": VERSION, "processes": {"type": "array", "items": process},
        "warnings": {"type": "array", "items": {"type": "string"}}})}


def top_schema() -> dict:
    from ckptrace.renderers.top import WINDOW_COLUMNS

    stat = strict({"count": COUNT, "p50": NUMBER, "p99": NUMBER})
    process = strict({
        "pid": {"type": "integer"}, "comm": {"type": "string"}, "start_ticks": COUNT, "attached_ns": COUNT,
        "exited": {"type": "boolean"}, "checkpoints": COUNT, "pool_hits": COUNT, "fresh_copies": COUNT, "restores": COUNT,
        "checkpoints_per_s": {"type": "number"}, "held_bytes": {"type": "integer"}, "peak_held_bytes": COUNT,
        "window": strict({"checkpoints": COUNT, **{c: stat for c in WINDOW_COLUMNS}})})
    return {"$schema": DRAFT, "title": "ckptrace top --json (one document per frame, one per line)", **strict({
        "schema_version": VERSION, "time": {"type": "number"}, "interval_s": {"type": "number"},
        "once": {"type": "boolean"}, "window_s": {"type": "number"}, "elapsed_s": {"type": "number"},
        "monotonic_ns": COUNT, "lost_events": COUNT, "processes": {"type": "array", "items": process},
        "waiting": {"type": "string"}}, optional=("waiting",))}


SCHEMAS = {"analyze": analyze_schema, "compare": compare_schema, "doctor": doctor_schema, "drive": drive_schema,
           "record": record_schema, "symbols": symbols_schema, "demo": demo_schema, "whatif": whatif_schema,
           "top": top_schema}


def schema_text(name: str) -> str:
    """docs/schemas/NAME.schema.json's text."""
    return json.dumps(SCHEMAS[name](), indent=1) + "\n"


def main(argv: list[str]) -> None:
    out = Path(argv[0] if argv else "docs/schemas")
    out.mkdir(parents=True, exist_ok=True)
    for name in SCHEMAS:
        (out / f"{name}.schema.json").write_text(schema_text(name))


if __name__ == "__main__":
    main(sys.argv[1:])
