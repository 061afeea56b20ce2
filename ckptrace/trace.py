"""The trace file: one Parquet table of events plus a JSON metadata block, versioned.

Plain pandas reads it without ckptrace: `pd.read_parquet(path)` gives the events and
`.attrs["ckptrace"]` the metadata (pandas >= 2.1 restores attrs from Parquet). The same JSON
is also stored under the schema key `ckptrace` for pyarrow and other readers.
While recording, and after a recorder that was killed, the file is instead an Arrow IPC stream
of the same columns (ckptrace/stream.py); both read here, the stream as a cut-short trace.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ckptrace.errors import TraceFormatError
from ckptrace.meta import TraceMeta
from ckptrace.output import write_output
from ckptrace.terminal import printable
from ckptrace import stream
from ckptrace.validate import budget_rows, check_column, check_events, check_table, check_types, open_regular

FORMAT = "ckptrace-trace"
VERSION = 3
# Oldest reader that can read what this version writes. Bump VERSION for additions; bump this
# only for changes an old reader would misread. Never reuse a removed column name.
MIN_READER_VERSION = 1
META_KEY = "ckptrace"

# What a row is. Spans have start_ns < end_ns; mmap/munmap/mremap are syscalls (enter..exit).
KINDS = ["checkpoint", "fill", "copy", "iteration", "decode", "mmap", "munmap", "mremap",
         "create", "restore", "restore_copy", "spec_state", "prompt_save", "rss"]  # version 3
# What the thread was doing when the event happened (the innermost open span).
PHASES = ["none", "iteration", "checkpoint", "fill", "copy",
          "create", "restore", "restore_copy", "spec_state", "prompt_save"]  # version 3

# Column -> dtype. Units are in the names; 0 means "none" for ids.
COLUMNS: dict[str, object] = {
    "kind": pd.CategoricalDtype(KINDS),
    "tid": np.dtype("int32"),
    "start_ns": np.dtype("int64"),  # CLOCK_MONOTONIC (bpf_ktime_get_ns)
    "end_ns": np.dtype("int64"),
    "ckpt": np.dtype("int64"),  # checkpoint id the row belongs to (its own id for a checkpoint)
    "iter": np.dtype("int64"),  # iteration id (update_slots call) the row belongs to
    "bytes": np.dtype("int64"),  # checkpoint/copy: state bytes copied; fill: bytes appended; mmap*: length
    "addr": np.dtype("uint64"),  # copy: destination; mmap/mremap: returned address; munmap: address
    "faults": np.dtype("int64"),  # the thread's min_flt + maj_flt delta over the span
    "fault_timed": np.dtype("int64"),  # faults whose service time was measured (sampled)
    "fault_timed_ns": np.dtype("int64"),  # summed service time of those faults
    "tokens": np.dtype("int32"),  # decode/iteration: batch tokens
    "prompt_tokens": np.dtype("int32"),  # decode/iteration: tokens that request no logits (prompt)
    "phase": pd.CategoricalDtype(PHASES),
    "draft": np.dtype("bool"),  # checkpoint from update_dft rather than update_tgt
    # Version 2. NA = not recorded (a v1 trace, a kernel without the field, a row without spans).
    "cpu_ns": pd.Int64Dtype(),  # the thread's on-CPU time over the span
    "wait_ns": pd.Int64Dtype(),  # its run-queue wait (runnable, waiting for a CPU) over the span
    "nvcsw": pd.Int64Dtype(),  # voluntary context switches over the span
    "nivcsw": pd.Int64Dtype(),  # involuntary context switches (preemptions) over the span
    "fault_ns": pd.Int64Dtype(),  # whole cost of the span's page faults to the thread (fault_time)
    # Version 3.
    "pid": np.dtype("int32"),  # process of the row (older traces: the trace's meta.pid)
    "spec": np.dtype("bool"),  # checkpoint made for a speculative round
}
# Columns a trace may lack (older versions): read as NA, never as zeros.
OPTIONAL = {"cpu_ns", "wait_ns", "nvcsw", "nivcsw", "fault_ns"}
# Version 3 columns an older trace lacks: read as their "none" value (pid: the trace's meta.pid).
ADDED_IN_3 = {"pid", "spec"}


@dataclass
class Trace:
    events: pd.DataFrame
    meta: TraceMeta
    path: str | None = None

    @property
    def label(self) -> str:
        return self.meta.label or Path(self.path or "trace").stem


def empty_frame(columns: dict[str, object]) -> pd.DataFrame:
    """No rows, but every column with its declared dtype."""
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})


def empty_events() -> pd.DataFrame:
    return empty_frame(COLUMNS)


def normalize_events(df: pd.DataFrame) -> pd.DataFrame:
    """Missing columns get their 'none' value; every column gets its declared dtype."""
    out = {}
    n = len(df)
    for col, dtype in COLUMNS.items():
        if col in df.columns:
            values = df[col].array  # positional (the caller's index must not reorder rows), no copy
        elif col == "phase":
            values = np.full(n, "none", dtype=object)
        elif col in ("draft", "spec"):
            values = np.zeros(n, dtype=bool)
        elif col in OPTIONAL:
            values = pd.array([pd.NA] * n, dtype=dtype)
        else:
            values = np.zeros(n, dtype="int64")
        s = pd.Series(values, copy=False)
        out[col] = s if s.dtype == dtype else s.astype(dtype)
    return pd.DataFrame(out, copy=False)


def write_trace(path: str | os.PathLike, events: pd.DataFrame, meta: TraceMeta) -> None:
    """Write atomically (ckptrace.output): a reader never sees a half-written trace."""
    write_output(path, trace_writer(events, meta), what="trace")


def trace_writer(events: pd.DataFrame, meta: TraceMeta):
    """A function writing the trace of `events` and `meta` into a binary file object."""
    table = pa.Table.from_pandas(normalize_events(events), preserve_index=False)
    table = table.replace_schema_metadata(trace_schema(meta, table.schema).metadata)
    return lambda f: pq.write_table(table, f, compression="zstd")


def trace_schema(meta: TraceMeta, schema: pa.Schema | None = None, pandas_attrs: bool = True) -> pa.Schema:
    """The events' Arrow schema carrying `meta`, stamped with this writer's format version
    (`pandas_attrs`: a second copy for pandas' read_parquet, which a stream's readers don't use)."""
    schema = schema or event_schema()
    doc = {**meta.to_json(), "format": FORMAT, "version": VERSION, "min_reader_version": MIN_READER_VERSION}
    blob = json.dumps(doc, default=_plain)
    md = dict(schema.metadata or {})
    md[META_KEY.encode()] = blob.encode()
    if pandas_attrs:  # pandas restores DataFrame.attrs from this key: plain read_parquet sees the metadata
        md[b"PANDAS_ATTRS"] = json.dumps({META_KEY: json.loads(blob)}).encode()
    return schema.with_metadata(md)


def event_schema() -> pa.Schema:
    """The Arrow schema of COLUMNS (kind and phase as dictionaries of their names)."""
    return pa.Schema.from_pandas(empty_events(), preserve_index=False)


def to_batch(events: pd.DataFrame, schema: pa.Schema) -> pa.RecordBatch:
    """Events (any subset of COLUMNS) as one record batch of `schema`."""
    return pa.RecordBatch.from_pandas(normalize_events(events), schema=schema, preserve_index=False)


def _plain(value):
    """numpy scalars as Python numbers; anything else JSON can't hold as text, never a failed write."""
    return value.item() if isinstance(value, np.generic) else str(value)


def time_origin(meta: TraceMeta, events: pd.DataFrame) -> int:
    """Where a recording's time axis starts: probes in place (attach_ns), else the first event."""
    for ns in (meta.attach_ns, meta.first_event_ns):
        if ns:
            return ns
    return int(events["start_ns"].min()) if len(events) else 0


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a trace can hold")


def read_meta(path: str | os.PathLike) -> TraceMeta:
    """Metadata only, with the same checks as read_trace."""
    path = Path(path)
    try:
        with open_regular(path) as source:
            if source.read(4) == stream.STREAM_MAGIC:
                source.seek(0)
                schema = stream.open_stream(path, source).schema
            else:
                source.seek(0)
                schema = pq.read_schema(source)
    except (pa.ArrowException, OSError) as e:
        raise TraceFormatError(
            f"{path}: not a ckptrace trace (not a readable Parquet file: {_first_line(e)})"
        ) from None
    raw = (schema.metadata or {}).get(META_KEY.encode())
    if raw is None:
        raise TraceFormatError(f"{path}: a Parquet file, but not a ckptrace trace (no '{META_KEY}' metadata)")
    try:
        meta = json.loads(raw, parse_constant=_no_constant)  # NaN/Infinity would break --json later
    except (ValueError, RecursionError):  # RecursionError: nested too deep to be ours
        raise TraceFormatError(f"{path}: ckptrace metadata is not valid JSON") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(f"{path}: ckptrace metadata is not a JSON object")
    if meta.get("format") != FORMAT:
        raise TraceFormatError(f"{path}: not a ckptrace trace (format is {meta.get('format')!r})")
    version = meta.get("version")
    min_reader = meta.get("min_reader_version", version)
    if not isinstance(version, int) or not isinstance(min_reader, int):
        raise TraceFormatError(f"{path}: trace has no usable format version")
    if min_reader > VERSION:
        raise TraceFormatError(
            f"{path}: trace format version {version} needs a reader of version >= {min_reader}; "
            f"this ckptrace reads up to {VERSION}: upgrade ckptrace"
        )
    missing = [c for c in COLUMNS if c not in schema.names and c not in OPTIONAL | ADDED_IN_3]
    if missing:
        raise TraceFormatError(f"{path}: trace lacks columns {', '.join(missing)}")
    try:
        return TraceMeta.from_json(meta)
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from None


def read_trace(path: str | os.PathLike) -> Trace:
    meta = read_meta(path)
    if stream.is_stream(path):
        return _read_stream(path, meta)
    # Column by column: peak memory is the frame plus one decoded column, not twice the frame.
    cols = {}
    shown = printable(path)
    try:
        source = open_regular(path)
        pf = pq.ParquetFile(source)
        check_table(pf, COLUMNS, source.size(), shown)
        for col in COLUMNS:
            if col not in pf.schema_arrow.names:
                continue  # a column added after this trace was written: normalize_events makes it NA
            values = pf.read(columns=[col]).column(0)
            check_column(col, values, COLUMNS[col], shown)
            cols[col] = values.to_pandas(self_destruct=True)
        source.close()
    except (pa.ArrowException, OSError) as e:
        raise TraceFormatError(f"{path}: trace is damaged ({_first_line(e)})") from None
    cols_read = set(cols)
    df = pd.DataFrame(cols, copy=False)
    del cols
    try:
        df = normalize_events(df)
    except (ValueError, TypeError) as e:
        raise TraceFormatError(f"{path}: a column has the wrong type ({_first_line(e)})") from None
    if df["kind"].isna().any():
        raise TraceFormatError(f"{path}: trace has event kinds this version does not know")
    if "pid" not in cols_read and meta.pid:
        df["pid"] = np.int32(meta.pid)  # before version 3 a trace held one process

    check_events(df, shown)
    return Trace(events=df, meta=meta, path=str(path))


def _read_stream(path, meta: TraceMeta) -> Trace:
    """A cut-short trace (a stream a killed recorder left): every batch up to the last complete one."""
    shown = printable(path)
    try:
        with open_regular(path) as source:
            reader = stream.open_stream(path, source)
            check_types(reader.schema, COLUMNS, shown)
            table, progress, torn = stream.read_stream_table(path, reader, budget_rows(source.size(), COLUMNS))
        cols = {}
        for col in COLUMNS:
            if col in table.schema.names:
                values = table.column(col)
                check_column(col, values, COLUMNS[col], shown)
                cols[col] = values.to_pandas()
        del table
        df = normalize_events(pd.DataFrame(cols, copy=False))
    except (pa.ArrowException, OSError) as e:
        raise TraceFormatError(f"{path}: trace is damaged ({_first_line(e)})") from None
    except (ValueError, TypeError) as e:
        raise TraceFormatError(f"{path}: a column has the wrong type ({_first_line(e)})") from None
    if df["kind"].isna().any():
        raise TraceFormatError(f"{path}: trace has event kinds this version does not know")
    check_events(df, shown)
    return Trace(events=df, meta=stream.cut_short_meta(meta, progress, torn, df), path=str(path))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
