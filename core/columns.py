"""The trace format's identity, row kinds and columns, without pandas.

core/trace.py builds its pandas dtypes (`COLUMNS`) from these and reads and writes traces;
the recorder streams a recording with only this module and pyarrow (core/stream.py), so a
long-running recorder or `serve` never loads pandas (about 50 MiB resident: docs/performance.md).
"""
from __future__ import annotations

import json

FORMAT = "ckptrace-trace"
VERSION = 5
# Oldest reader that can read what this version writes. Bump VERSION for additions; bump this
# only for changes an old reader would misread. Never reuse a removed column name.
MIN_READER_VERSION = 1
META_KEY = "ckptrace"

# What a row is. Spans have start_ns < end_ns; mmap/munmap/mremap are syscalls (enter..exit).
KINDS = ["checkpoint", "fill", "copy", "iteration", "decode", "mmap", "munmap", "mremap",
         "create", "restore", "restore_copy", "spec_state", "prompt_save", "rss",  # version 3
         "slot_save", "slot_restore"]  # version 5
# What the thread was doing when the event happened (the innermost open span).
PHASES = ["none", "iteration", "checkpoint", "fill", "copy",
          "create", "restore", "restore_copy", "spec_state", "prompt_save",  # version 3
          "slot_save", "slot_restore"]  # version 5

# Column -> type. Units are in the names; 0 means "none" for ids. "kind"/"phase": a category of
# KINDS/PHASES; "Int64": a 64-bit integer that may be NA (not recorded); else a numpy dtype.
COLUMN_TYPES: dict[str, str] = {
    "kind": "kind",
    "tid": "int32",
    "start_ns": "int64",  # CLOCK_MONOTONIC (bpf_ktime_get_ns)
    "end_ns": "int64",
    "ckpt": "int64",  # checkpoint id the row belongs to (its own id for a checkpoint)
    "iter": "int64",  # iteration id (update_slots call) the row belongs to
    "bytes": "int64",  # checkpoint/copy: state bytes copied; fill: bytes appended; mmap*: length
    "addr": "uint64",  # copy: destination; mmap/mremap: returned address; munmap: address
    "faults": "int64",  # the thread's min_flt + maj_flt delta over the span
    "fault_timed": "int64",  # faults whose service time was measured (sampled)
    "fault_timed_ns": "int64",  # summed service time of those faults
    "tokens": "int32",  # decode/iteration: batch tokens
    "prompt_tokens": "int32",  # decode/iteration: tokens that request no logits (prompt)
    "phase": "phase",
    "draft": "bool",  # checkpoint from update_dft rather than update_tgt
    # Version 2. NA = not recorded (a v1 trace, a kernel without the field, a row without spans).
    "cpu_ns": "Int64",  # the thread's on-CPU time over the span
    "wait_ns": "Int64",  # its run-queue wait (runnable, waiting for a CPU) over the span
    "nvcsw": "Int64",  # voluntary context switches over the span
    "nivcsw": "Int64",  # involuntary context switches (preemptions) over the span
    "fault_ns": "Int64",  # whole cost of the span's page faults to the thread (fault_time)
    # Version 3.
    "pid": "int32",  # process of the row (older traces: the trace's meta.pid)
    "spec": "bool",  # checkpoint made for a speculative round
    "old_addr": "uint64",  # mremap: the address it moved or resized from (0: not recorded)
    "old_bytes": "int64",  # mremap: the old length
    # Version 4: CUDA targets only (a trace without them has none of these columns), on copy and
    # restore_copy rows, NA on the others: the span's outermost CUDA calls (probes/cuda.py).
    "gpu_copies": "Int64",  # copy calls
    "gpu_bytes": "Int64",  # their bytes, any direction
    "gpu_pinned_bytes": "Int64",  # device-to-host bytes into pinned host memory
    "gpu_pageable_bytes": "Int64",  # device-to-host bytes into pageable host memory
    "gpu_enqueue_ns": "Int64",  # time inside the copy calls
    "gpu_syncs": "Int64",  # synchronize calls (waits for the device)
    "gpu_sync_ns": "Int64",  # time inside them
    "gpu_dst_faults": "Int64",  # page faults on the pageable destination range, any thread
    "gpu_driver_faults": "Int64",  # of those, taken by other threads than the span's
    # Version 5.
    "state_flags": "int64",  # copy, restore_copy: the llama_state_seq_flags of the call (2: ON_DEVICE)
    "outcome": "int8",  # restore, restore_copy, slot_*: 1 ok, 2 failed, 0 not reported (OUTCOMES)
}
# `outcome` values (checkpoint.h enum ckpt_outcome)
OUTCOMES = ["not recorded", "ok", "failed"]
STATE_FLAG_PARTIAL_ONLY, STATE_FLAG_ON_DEVICE = 1, 2  # llama.h LLAMA_STATE_SEQ_FLAGS_*
GPU_COLUMNS = [c for c in COLUMN_TYPES if c.startswith("gpu_")]
# Columns a trace may lack (older versions; a trace of no CUDA target): read as NA, never as zeros.
OPTIONAL = {"cpu_ns", "wait_ns", "nvcsw", "nivcsw", "fault_ns", *GPU_COLUMNS}
# Version 3 columns an older trace lacks: read as their "none" value (pid: the trace's meta.pid).
ADDED_IN_3 = {"pid", "spec", "old_addr", "old_bytes"}  # old_*: added within version 3, read as 0 (not recorded)
ADDED_IN_5 = {"state_flags", "outcome"}  # read as 0: not recorded


def arrow_schema(gpu: bool = False):
    """The events' Arrow schema, as trace.event_schema(trace_columns(meta)) types it but without
    pandas' own metadata (a stream is read back through ckptrace, which types every column
    itself); the GPU columns only with `gpu` (a recording of a CUDA target)."""
    import pyarrow as pa

    def arrow(t: str):
        if t in ("kind", "phase"):
            return pa.dictionary(pa.int8(), pa.large_string())
        return pa.int64() if t == "Int64" else pa.bool_() if t == "bool" else pa.from_numpy_dtype(t)
    return pa.schema([pa.field(c, arrow(t)) for c, t in COLUMN_TYPES.items() if gpu or c not in GPU_COLUMNS])


def with_meta(schema, meta, pandas_attrs: bool = True):
    """`schema` carrying `meta` (a TraceMeta), stamped with this writer's format version
    (`pandas_attrs`: a second copy for pandas' read_parquet, which a stream's readers don't use)."""
    doc = {**meta.to_json(), "format": FORMAT, "version": VERSION, "min_reader_version": MIN_READER_VERSION}
    blob = json.dumps(doc, default=_plain)
    md = dict(schema.metadata or {})
    md[META_KEY.encode()] = blob.encode()
    if pandas_attrs:  # pandas restores DataFrame.attrs from this key: plain read_parquet sees the metadata
        md[b"PANDAS_ATTRS"] = json.dumps({META_KEY: json.loads(blob)}).encode()
    return schema.with_metadata(md)


def _plain(value):
    """numpy scalars as Python numbers; anything else JSON can't hold as text, never a failed write."""
    item = getattr(value, "item", None)
    return item() if callable(item) and type(value).__module__ == "numpy" else str(value)


def arrow_array(values, type, mask=None):
    """A numpy array as an Arrow array of `type` (a numeric or bool type), nulls where `mask`;
    built from its buffers, since pyarrow's pa.array() loads pandas to check its input."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    validity, nulls = None, 0
    if mask is not None and mask.any():
        validity, nulls = pa.py_buffer(np.packbits(~mask, bitorder="little")), int(mask.sum())
    if pa.types.is_boolean(type):
        data = pa.py_buffer(np.packbits(np.asarray(values, dtype=bool), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=np.dtype(str(type))))
    return pa.Array.from_buffers(type, n, [validity, data], null_count=nulls)


def string_array(values: list[str]):
    """Strings as an Arrow large_string array (the dictionary of kind and phase), without pandas."""
    import numpy as np
    import pyarrow as pa

    raw = [v.encode() for v in values]
    offsets = np.cumsum([0, *map(len, raw)], dtype="int64")
    return pa.Array.from_buffers(pa.large_string(), len(raw), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])


def category_array(codes, names: list[str]):
    """Codes into `names` as the dictionary array kind and phase are stored as."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(arrow_array(codes, pa.int8()), string_array(names))
