"""The finishing pass at a recording's stop: the stream (and what the disk had no room for)
rewritten batch by batch into the finished Parquet trace, in start order, with each span's fault
time. pandas and Parquet are loaded here: the recording streams without them."""
from __future__ import annotations

import array
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ckptrace.core.meta import FaultTime, TraceMeta
from ckptrace.core.stream import Recording, batches
from ckptrace.probes import fault_time
from ckptrace.probes.messages import say

if TYPE_CHECKING:
    from ckptrace.probes.drain import Drain

CHUNK_ROWS = 1 << 15  # rows the finishing pass takes from the stream at a time


def _calibrate(session: Drain, meta: TraceMeta) -> dict | None:
    """Fault-time calibration for the spans' sizes; None (fault_ns NA) where it can't run."""
    if not session.sched_recorded:
        meta.fault_time = FaultTime(definition="not measured: the on-CPU time was not recorded")
        return None
    try:
        cal, meta.fault_time = fault_time.calibration(session.sizes.calibration_sizes())
        return cal
    except (OSError, MemoryError, ValueError) as e:
        meta.fault_time = FaultTime(definition=f"not measured: calibration failed ({e})")
        return None


def finisher(out: Recording, session: Drain, meta: TraceMeta):
    """A writer of the finished trace: the stream and what the disk had no room for, batch by
    batch, with fault_ns; and its event count. pandas and Parquet are loaded here, at the stop:
    the recording streams without them."""
    import pyarrow.parquet as pq

    from ckptrace.core.trace import PARQUET_OPTIONS, trace_schema

    cal = _calibrate(session, meta)
    meta.complete, meta.cut_short = True, None
    meta.events = session.rows + session.dropped
    schema = trace_schema(meta)

    def write(f):
        say(f"ckptrace: writing the finished trace ({meta.events} events)")  # a long recording takes seconds
        with pq.ParquetWriter(f, schema, **PARQUET_OPTIONS) as w:
            for table in _finished_tables(out, session.unwritten, cal, session.batch_min_start, schema):
                w.write_table(table)
    return write, meta.events


def _finished_tables(out: Recording, unwritten: list[pa.RecordBatch], cal: dict | None, min_starts: array.array,
                     schema: pa.Schema):
    """The stream's rows with fault_ns, in (start_ns, end_ns) order, a row group at a time.
    A batch's rows come when their span ended; a row is let out once no later batch can hold an
    earlier start (the suffix minimum of the batches' first starts), so memory holds only the
    rows of spans still open across flushes, not the recording."""
    import pandas as pd

    from ckptrace.core.trace import ROW_GROUP_ROWS, arrow_frame, normalize_events

    later = np.minimum.accumulate(np.asarray(min_starts, dtype="int64")[::-1])[::-1]
    carry: dict = {}
    held = pd.DataFrame()
    ready: list[pd.DataFrame] = []
    n_ready = 0
    flushed = (b for b, _ in batches(out.read()) if b.num_rows)  # not the header's empty batch
    for i, table in _chunks(itertools.chain(flushed, unwritten)):
        df = normalize_events(arrow_frame(table))
        df["fault_ns"] = fault_time.span_fault_ns(df, cal, carry) if cal else pd.array([pd.NA] * len(df), "Int64")
        held = pd.concat([held, df], ignore_index=True) if len(held) else df
        cut = later[i + 1] if i + 1 < len(later) else np.iinfo("int64").max
        go = held["start_ns"].to_numpy() < cut
        if go.any():
            ready.append(held[go])
            n_ready += int(go.sum())
            held = held[~go].reset_index(drop=True)
        if n_ready >= ROW_GROUP_ROWS:
            yield _sorted_table(ready, schema)
            ready, n_ready = [], 0
    if len(held):
        ready.append(held)
    if ready:
        yield _sorted_table(ready, schema)


def _chunks(stream) -> Iterator[tuple[int, pa.Table]]:
    """Consecutive batches joined into tables of at least CHUNK_ROWS rows (the flushes' batches
    are small, and the pandas work per table costs the same at 50 rows as at 50,000), each with
    the index of its last batch."""
    parts, rows, i = [], 0, -1
    for i, b in enumerate(stream):
        parts.append(b)
        rows += b.num_rows
        if rows >= CHUNK_ROWS:
            yield i, pa.Table.from_batches(parts)
            parts, rows = [], 0
    if parts:
        yield i, pa.Table.from_batches(parts)


def _sorted_table(parts: list, schema: pa.Schema) -> pa.Table:
    import pandas as pd

    from ckptrace.core.trace import to_batch

    df = pd.concat(parts, ignore_index=True).sort_values(["start_ns", "end_ns"], kind="stable")
    return pa.Table.from_batches([to_batch(df, schema.remove_metadata())]).replace_schema_metadata(schema.metadata)
