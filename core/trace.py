"""The trace file: one Parquet table of events plus a JSON metadata block, versioned.

Plain pandas reads it without ckptrace: `pd.read_parquet(path)` gives the events and
`.attrs["ckptrace"]` the metadata (pandas >= 2.1 restores attrs from Parquet). The same JSON
is also stored under the schema key `ckptrace` for pyarrow and other readers.
While recording, and after a recorder that was killed, the file is instead an Arrow IPC stream
of the same columns (core/stream.py); both read here, the stream as a cut-short trace.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptrace.core.columns import (ADDED_IN_3, ADDED_IN_5, COLUMN_TYPES, FORMAT, GPU_COLUMNS, KINDS, META_KEY,  # noqa: F401 (also read from here)
                                   MIN_READER_VERSION, OPTIONAL, OUTCOMES, PHASES, STATE_FLAG_ON_DEVICE,
                                   STATE_FLAG_PARTIAL_ONLY, VERSION, with_meta)
from ckptrace.core.errors import TraceFormatError
from ckptrace.core.meta import JSON_MAX, TraceMeta
from ckptrace.core.output import write_output
from ckptrace.core.terminal import printable
from ckptrace.core import stream
from ckptrace.core.validate import (FOOTER_MAX, STREAM_EXPANSION, KeyTwice, budget_rows, check_column, check_events, check_ids, check_table,
                                    check_types, memory_budget, no_key_twice, open_regular, reversed_error)

# The tables share columns and rely on copy-on-write, pandas 3's rule: under pandas 2.2 and 2.3
# it is an option, turned on here (every analysis imports this module), so a write to one table
# never changes another that shares its column.
if int(pd.__version__.split(".")[0]) < 3:
    pd.set_option("mode.copy_on_write", True)

# The format's identity, kinds, phases and column types live in core/columns.py (no pandas:
# the recorder streams with it alone); COLUMNS are their pandas dtypes.
_DTYPES = {"kind": pd.CategoricalDtype(KINDS), "phase": pd.CategoricalDtype(PHASES), "Int64": pd.Int64Dtype()}
COLUMNS: dict[str, object] = {c: _DTYPES[t] if t in _DTYPES else np.dtype(t) for c, t in COLUMN_TYPES.items()}
# Rows per batch iter_batches yields: ~20 MiB of decoded columns, whatever the row groups.
BATCH_ROWS = 1 << 18
# Rows per Parquet row group of a finished trace: readers skip or read a trace a group at a time.
ROW_GROUP_ROWS = 1 << 17  # also the recorder's finished trace (probes/finish.py)
# Integer columns written delta-encoded: times rise and ids and counters change little from row to
# row, so a 10M-event trace is 3.2x smaller (45 against 153 MiB) and decodes in 30% less CPU than
# with dictionary pages (benchmarks/bench_analyzer.py's trace). The thread and process ids repeat:
# dictionary pages suit them. Any Parquet reader decodes either; the trace format is unchanged.
DELTA_COLUMNS = [c for c, t in COLUMNS.items() if c not in ("tid", "pid") and (
    isinstance(t, pd.Int64Dtype) or (isinstance(t, np.dtype) and t.kind in "iu"))]
PARQUET_OPTIONS = {"compression": "zstd", "use_dictionary": [c for c in COLUMNS if c not in DELTA_COLUMNS],
                   "column_encoding": dict.fromkeys(DELTA_COLUMNS, "DELTA_BINARY_PACKED")}


@dataclass
class Trace:
    events: pd.DataFrame | None  # None: read batch by batch, never held whole (iter_batches)
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


def normalize_events(df: pd.DataFrame, columns: dict[str, object] = COLUMNS) -> pd.DataFrame:
    """Missing columns get their 'none' value; every column gets its declared dtype (`columns`:
    these of COLUMNS only)."""
    out = {}
    n = len(df)
    for col, dtype in columns.items():
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
    """Write atomically (ckptrace.core.output): a reader never sees a half-written trace."""
    write_output(path, trace_writer(events, meta), what="trace")


def trace_columns(meta: TraceMeta) -> dict[str, object]:
    """The columns a trace with this metadata holds: the GPU columns only where CUDA was probed."""
    return COLUMNS if meta.gpu is not None else {c: t for c, t in COLUMNS.items() if c not in GPU_COLUMNS}


def trace_writer(events: pd.DataFrame, meta: TraceMeta):
    """A function writing the trace of `events` and `meta` into a binary file object."""
    table = pa.Table.from_pandas(normalize_events(events, trace_columns(meta)), preserve_index=False)
    table = table.replace_schema_metadata(trace_schema(meta, table.schema).metadata)
    rows = ROW_GROUP_ROWS
    return lambda f: pq.write_table(table, f, row_group_size=rows, **PARQUET_OPTIONS)


def trace_schema(meta: TraceMeta, schema: pa.Schema | None = None, pandas_attrs: bool = True) -> pa.Schema:
    """The events' Arrow schema carrying `meta`, stamped with this writer's format version
    (`pandas_attrs`: a second copy for pandas' read_parquet, which a stream's readers don't use)."""
    return with_meta(schema or event_schema(trace_columns(meta)), meta, pandas_attrs)


def event_schema(columns: dict[str, object] = COLUMNS) -> pa.Schema:
    """The Arrow schema of COLUMNS, or of `columns` of them (kind and phase as dictionaries of their names)."""
    return pa.Schema.from_pandas(empty_frame(columns), preserve_index=False)


def to_batch(events: pd.DataFrame, schema: pa.Schema) -> pa.RecordBatch:
    """Events (any subset of COLUMNS) as one record batch of `schema`."""
    return pa.RecordBatch.from_pandas(normalize_events(events), schema=schema, preserve_index=False)


def time_origin(meta: TraceMeta, events: pd.DataFrame | int | None) -> int:
    """Where a recording's time axis starts: probes in place (attach_ns), else the first event
    (`events`: the events, or the first one's start_ns, None without events)."""
    for ns in (meta.attach_ns, meta.first_event_ns):
        if ns:
            return ns
    if isinstance(events, pd.DataFrame):
        return int(events["start_ns"].min()) if len(events) else 0
    return events or 0


def _check_footer(source: pa.NativeFile, size: int, path) -> None:
    """A Parquet footer's length, from the file's last 8 bytes, bounded before pyarrow reads it."""
    if size < 12:
        return  # too short to be Parquet: pyarrow says so
    tail = source.read_at(8, size - 8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] == b"PAR1" and (length > FOOTER_MAX or length > size - 12):
        why = "more than the file holds" if length > size - 12 else f"over the {FOOTER_MAX >> 20} MiB a trace has"
        raise TraceFormatError(f"{printable(path)}: its Parquet footer claims {length} bytes, {why}: a damaged or "
                               "hostile trace?")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a trace can hold")


class TraceFile:
    """A trace file opened once: the open file (a regular file, ckptrace.core.validate.open_regular),
    whether it is a recording's stream or a finished Parquet trace (sniffed from its first bytes),
    and its metadata, checked. Every reader below takes one (or a path, opened for that call), so
    an analysis opens, sniffs and checks a file once. A context manager; `close()` closes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.shown = printable(path)
        self.source = open_regular(path)
        self.parquet: pq.ParquetFile | None = None
        self._checked = False
        self._stream_events: tuple[pd.DataFrame, TraceMeta] | None = None
        try:
            self.size = self.source.size()
            self.stream = self.source.read(4) == stream.STREAM_MAGIC
            self.source.seek(0)
            if self.stream:
                schema = stream.open_stream(path, self.source).schema
            else:  # a local file: read-ahead only costs memory
                _check_footer(self.source, self.size, path)
                self.parquet = pq.ParquetFile(self.source, pre_buffer=False)
                schema = self.parquet.schema_arrow
            self.meta = _checked_meta(schema, path)
        except (pa.ArrowException, OSError) as e:
            self.close()
            raise TraceFormatError(
                f"{path}: not a ckptrace trace (not a readable Parquet file: {_first_line(e)})"
            ) from None
        except BaseException:
            self.close()
            raise

    def checked_parquet(self) -> pq.ParquetFile:
        """The Parquet file, its column types and memory bound checked (once) before decoding."""
        assert self.parquet is not None, "a stream has no Parquet file"
        if not self._checked:
            try:
                check_table(self.parquet, COLUMNS, self.size, self.shown, self.source)
            except (pa.ArrowException, OSError) as e:
                raise TraceFormatError(f"{self.path}: trace is damaged ({_first_line(e)})") from None
            self._checked = True
        return self.parquet

    def stream_trace(self) -> tuple[pd.DataFrame, TraceMeta]:
        """A stream's events and cut-short metadata, read whole once (a cut-short recording)."""
        if self._stream_events is None:
            self._stream_events = _read_stream(self)
        return self._stream_events

    @property
    def closed(self) -> bool:
        return self.source is None or self.source.closed

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        self._stream_events = None

    def __enter__(self) -> TraceFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def opened(trace: str | os.PathLike | TraceFile) -> Iterator[TraceFile]:
    """`trace` itself when it is an open TraceFile, else the file at that path, opened for the
    `with` block."""
    if isinstance(trace, TraceFile):
        yield trace
        return
    with TraceFile(trace) as f:
        yield f


def read_meta(path: str | os.PathLike | TraceFile) -> TraceMeta:
    """Metadata only, with the same checks as read_trace."""
    with opened(path) as f:
        return f.meta


def _checked_meta(schema: pa.Schema, path) -> TraceMeta:
    raw = (schema.metadata or {}).get(META_KEY.encode())
    if raw is None:
        raise TraceFormatError(f"{path}: a Parquet file, but not a ckptrace trace (no '{META_KEY}' metadata)")
    if len(raw) > JSON_MAX:
        raise TraceFormatError(f"{path}: its ckptrace metadata is {len(raw)} bytes, over the {JSON_MAX >> 20} MiB a "
                               "trace has: a damaged or hostile trace?")
    try:  # NaN/Infinity would break --json later; a key twice: which one counts is anyone's guess
        meta = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=no_key_twice)
    except KeyTwice as e:
        raise TraceFormatError(f"{path}: ckptrace metadata holds the key {printable(e.key)[:80]!r} twice "
                               "(which one counts is anyone's guess): a damaged or hostile trace?") from None
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
    missing = [c for c in COLUMNS if c not in schema.names and c not in OPTIONAL | ADDED_IN_3 | ADDED_IN_5]
    if missing:
        raise TraceFormatError(f"{path}: trace lacks columns {', '.join(missing)}")
    try:
        return TraceMeta.from_json(meta)
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from None


def read_trace(path: str | os.PathLike | TraceFile) -> Trace:
    with opened(path) as f:
        return _read_trace(f)


def _read_trace(f: TraceFile) -> Trace:
    path, meta = f.path, f.meta
    if f.stream:
        events, cut_meta = f.stream_trace()
        return Trace(events=events, meta=cut_meta, path=path)
    # Column by column: peak memory is the frame plus one decoded column, not twice the frame.
    cols = {}
    shown = f.shown
    pf = f.checked_parquet()
    try:
        for col in COLUMNS:
            if col not in pf.schema_arrow.names:
                continue  # a column added after this trace was written: normalize_events makes it NA
            values = pf.read(columns=[col]).column(0)
            check_column(col, values, COLUMNS[col], shown)
            cols[col] = values.to_pandas(self_destruct=True)
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
    return Trace(events=df, meta=meta, path=path)


def _read_stream(f: TraceFile) -> tuple[pd.DataFrame, TraceMeta]:
    """A cut-short trace (a stream a killed recorder left): every batch up to the last complete one."""
    path, shown = f.path, f.shown
    try:
        f.source.seek(0)
        data = f.source.read_buffer()  # both passes read these same bytes, whatever the file does
        rows, size = budget_rows(data.size, COLUMNS), memory_budget(data.size, STREAM_EXPANSION)
        reader = stream.open_stream(path, pa.BufferReader(data))
        check_types(reader.schema, COLUMNS, shown)
        stream.check_claims(path, data, rows, size)
        table, progress, torn = stream.read_stream_table(path, reader, rows)
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
    return df, stream.cut_short_meta(f.meta, progress, torn, df)


KIND_VALUES = pa.array(KINDS)
PHASE_VALUES = pa.array(PHASES)


def iter_record_batches(path: str | os.PathLike | TraceFile, columns=None, batch_rows: int = BATCH_ROWS, *,
                        whole_checks: bool = True,
                        between: tuple[int, int] | None = None) -> Iterator[pa.RecordBatch]:
    """iter_batches' batches as Arrow record batches, the cheaper form for code that picks rows:
    the same checks, every requested column there (one the trace lacks filled as read_trace fills
    it) with its declared type; kind and phase dictionary-encoded over KINDS and PHASES."""
    wanted = list(COLUMNS) if columns is None else list(columns)
    unknown = [c for c in wanted if c not in COLUMNS]
    if unknown:
        raise ValueError(f"not trace columns: {', '.join(unknown)}")
    with opened(path) as f:
        yield from _record_batches(f, wanted, batch_rows, whole_checks, between)


def _record_batches(f: TraceFile, wanted: list[str], batch_rows: int, whole_checks: bool,
                    between: tuple[int, int] | None) -> Iterator[pa.RecordBatch]:
    path, meta = f.path, f.meta
    if f.stream:  # a cut-short recording: read whole (read_trace), handed out in batches
        events = f.stream_trace()[0]
        for i in range(0, len(events), batch_rows):
            yield pa.RecordBatch.from_pandas(events.iloc[i:i + batch_rows][wanted], preserve_index=False)
        return
    whole_checks = whole_checks and between is None
    checked = {"kind", "phase", "start_ns", "end_ns"} | ({"ckpt", "iter", "tid"} if whole_checks else set())
    types = [c for c in COLUMNS if c in checked or c in wanted]
    shown = f.shown
    kept: dict[str, list] = {"checkpoint": [], "iteration": [], "parts": []}
    kept_rows: dict[str, list] = {"checkpoint": [], "iteration": [], "parts": []}  # their row numbers
    row = 0
    bad, first = 0, None
    pf = f.checked_parquet()
    batches = None
    try:
        names = set(pf.schema_arrow.names)
        groups = None if between is None else _groups_between(pf, *between)
        batches = read_ahead(pf.iter_batches(batch_size=batch_rows, row_groups=groups,
                                             columns=[c for c in types if c in names], use_threads=False))
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    break
                n = batch.num_rows
                cols = {}
                for col in types:
                    if col in names:
                        values = batch.column(col)
                        check_column(col, values, COLUMNS[col], shown)
                        cols[col] = _arrow_typed(col, values, path)
                    else:
                        cols[col] = _arrow_missing(col, n, meta.pid)
            except (pa.ArrowException, OSError) as e:
                raise TraceFormatError(f"{path}: trace is damaged ({_first_line(e)})") from None
            codes = cols["kind"].indices.to_numpy()
            start, end = cols["start_ns"].to_numpy(), cols["end_ns"].to_numpy()
            reversed_ = np.flatnonzero(end < start)
            if len(reversed_):
                i = int(reversed_[0])
                bad += len(reversed_)
                first = first or (pd.DataFrame({"kind": [KINDS[codes[i]]], "start_ns": [start[i]],
                                                "end_ns": [end[i]]}), row + i)
            if whole_checks and not bad:
                for what, kinds, names_ in (("checkpoint", (0,), ["ckpt", "tid", "start_ns", "end_ns"]),
                                            ("iteration", (3,), ["iter"]),
                                            ("parts", (1, 2), ["kind", "ckpt", "tid", "start_ns", "end_ns"])):
                    pick = np.flatnonzero(np.isin(codes, kinds))
                    kept[what].append(pa.record_batch([cols[c] for c in names_], names=names_).take(pick))
                    kept_rows[what].append(pick + row)
            row += n
            if not bad:
                yield pa.record_batch([cols[c] for c in wanted], names=wanted)
    finally:
        if batches is not None:
            batches.close()  # its thread stops before the file closes
    if bad:
        raise reversed_error(first[0], 0, bad, shown, row=first[1])
    if whole_checks and kept["checkpoint"]:
        ck, it, parts = (arrow_frame(pa.Table.from_batches(kept[k])).set_axis(np.concatenate(kept_rows[k]))
                         for k in ("checkpoint", "iteration", "parts"))
        check_ids(ck, it["iter"], parts, shown)


def read_ahead(items: Iterator) -> Iterator:
    """`items`, each taken from it in a second thread while the caller works on the one before:
    Parquet decodes without the GIL, so reading overlaps the caller's numpy work (one item more
    in memory). An exception from `items` comes out where its item would have."""
    with ThreadPoolExecutor(1, thread_name_prefix="ckptrace-read") as pool:
        ahead = pool.submit(next, items, None)
        while (item := ahead.result()) is not None:
            ahead = pool.submit(next, items, None)
            yield item


def iter_kinds(path: str | os.PathLike | TraceFile, batch_rows: int = BATCH_ROWS
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each batch's kind codes (into KINDS) and tids, nothing else decoded: a first pass that
    sizes what a second one (iter_record_batches, with every check) keeps. The metadata and
    column types are checked first; a damaged page or an unknown kind raises TraceFormatError
    (the second pass names the first problem its checks find)."""
    with opened(path) as f:
        if f.stream:
            for batch in _record_batches(f, ["kind", "tid"], batch_rows, False, None):
                yield batch.column("kind").indices.to_numpy(zero_copy_only=False), batch.column("tid").to_numpy()
            return
        shown = f.shown
        pf = f.checked_parquet()
        try:
            batches = read_ahead(pf.iter_batches(batch_size=batch_rows, columns=["kind", "tid"], use_threads=False))
            try:
                for batch in batches:
                    kind, tid = batch.column(0), batch.column(1)
                    check_column("kind", kind, COLUMNS["kind"], shown)
                    check_column("tid", tid, COLUMNS["tid"], shown)
                    yield (_arrow_typed("kind", kind, f.path).indices.to_numpy(),
                           _arrow_typed("tid", tid, f.path).to_numpy())
            finally:
                batches.close()  # its thread stops before the file closes
        except (pa.ArrowException, OSError) as e:
            raise TraceFormatError(f"{f.path}: trace is damaged ({_first_line(e)})") from None


def iter_batches(path: str | os.PathLike | TraceFile, columns=None, batch_rows: int = BATCH_ROWS, *,
                 whole_checks: bool = True, between: tuple[int, int] | None = None) -> Iterator[pd.DataFrame]:
    """The events of the trace at `path` in file order, at most `batch_rows` rows at a time, with
    only `columns` (names from COLUMNS; all by default), typed as read_trace types them.

    Memory is one batch, whatever the trace's length. The checks are read_trace's: metadata,
    column types and the memory bound before decoding; each batch's values, kinds, phases and span
    order before it is yielded (an error names the first offending value of the first batch that
    has one). The checks across rows (unique ids, fill and copy inside their checkpoint) keep a
    few columns of those rows and run after the last batch; a caller that keeps those rows anyway
    passes `whole_checks=False` and calls validate.check_ids itself. `between=(t0, t1)` reads
    only the row groups whose start_ns statistics can hold rows starting in [t0, t1] (all of them
    where the file has no statistics) and no checks across rows.
    """
    for batch in iter_record_batches(path, columns, batch_rows, whole_checks=whole_checks, between=between):
        yield arrow_frame(batch)


def arrow_frame(data: pa.RecordBatch | pa.Table) -> pd.DataFrame:
    """A typed events frame (COLUMNS' dtypes) of an Arrow batch or table from iter_record_batches."""
    out = {}
    for name in data.column_names:
        values, dtype = data.column(name), COLUMNS[name]
        chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
        if isinstance(dtype, pd.CategoricalDtype):
            # a null (a frame's unknown name, never a checked file's) stays NA: code -1
            codes = np.concatenate([pc.fill_null(c.indices, -1).to_numpy() for c in chunks]) if chunks \
                else np.array([], "int8")
            out[name] = pd.Categorical.from_codes(codes, dtype=dtype)
        elif isinstance(dtype, pd.Int64Dtype):
            out[name] = pd.arrays.IntegerArray(pc.fill_null(values, 0).to_numpy(), values.is_null().to_numpy(
                zero_copy_only=False))
        else:
            out[name] = values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) else values.to_numpy()
    return pd.DataFrame(out, copy=False)


def _arrow_typed(name: str, values: pa.Array, path) -> pa.Array:
    """A checked column with its declared type; kind and phase as codes into KINDS and PHASES."""
    dtype = COLUMNS[name]
    if isinstance(dtype, pd.CategoricalDtype):
        if not pa.types.is_dictionary(values.type):
            values = pc.dictionary_encode(values)
        known = list(dtype.categories)
        names = values.dictionary.to_pylist()
        every = KIND_VALUES if name == "kind" else PHASE_VALUES
        if names == known[:len(names)] and not values.null_count and pa.types.is_int8(values.indices.type):
            return pa.DictionaryArray.from_arrays(values.indices, every)  # ckptrace's own order: codes as they are
        lut = np.array([known.index(v) if v in known else -1 for v in names] or [-1], "int8")
        codes = lut[values.indices.to_numpy(zero_copy_only=False)]
        if (codes < 0).any():
            what = "event kinds" if name == "kind" else "phases"
            raise TraceFormatError(f"{path}: trace has {what} this version does not know")
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8()), every)
    want = pa.bool_() if dtype == np.dtype("bool") else pa.int64() if isinstance(dtype, pd.Int64Dtype) else \
        pa.from_numpy_dtype(dtype)
    return values if values.type == want else values.cast(want)


def _arrow_missing(name: str, n: int, pid: int | None) -> pa.Array:
    """A column the trace lacks, as read_trace fills it."""
    dtype = COLUMNS[name]
    if name == "phase":
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, "int8")), PHASE_VALUES)
    if name in OPTIONAL:
        return pa.nulls(n, pa.int64())
    if dtype == np.dtype("bool"):
        return pa.array(np.zeros(n, bool))
    return pa.array(np.full(n, pid if name == "pid" and pid else 0, dtype=dtype))


def read_between(path: str | os.PathLike | TraceFile, t0: int, t1: int, columns=None) -> pd.DataFrame:
    """The rows lying within [t0, t1] ns, reading only the row groups that can hold them (a
    close-up of a trace too long to hold whole)."""
    parts = [b.loc[((b["start_ns"] >= t0) & (b["end_ns"] <= t1)).to_numpy()]
             for b in iter_batches(path, columns, between=(t0, t1))]
    return pd.concat(parts, ignore_index=True) if parts else empty_frame(
        {c: t for c, t in COLUMNS.items() if columns is None or c in columns})


def _groups_between(pf: pq.ParquetFile, t0: int, t1: int) -> list[int]:
    md = pf.metadata
    col = pf.schema_arrow.names.index("start_ns")
    keep = []
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max or (stats.min <= t1 and stats.max >= t0):
            keep.append(i)
    return keep


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
