"""A trace file checked before anything is computed from it; the first problem is one line.

A trace may come from anyone. Before decoding: it is a regular file, and what it would expand
to in memory is bounded by its size and by the machine (a few KiB of Parquet can claim
gigabytes of rows). Before pandas sees a column: its Parquet type is the one written (no string
"False" read as True, no float 1e30 cast to INT64_MIN), it has no nulls unless it may, and its
values are in range, so sums and differences can't overflow. After: spans end at or after they
start, ids are unique, and a checkpoint's fill and copy lie inside it.
"""
from __future__ import annotations

import os
import stat

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptrace.errors import TraceFormatError
from ckptrace.terminal import printable

NS_MAX = 1 << 62  # 146 years of nanoseconds: any sum of a trace's times stays in int64
COUNT_MAX = 1 << 40
INT32_MAX = (1 << 31) - 1
# Column -> inclusive value range. addr is an address: any uint64.
RANGES = {
    "tid": (0, INT32_MAX), "start_ns": (0, NS_MAX), "end_ns": (0, NS_MAX), "ckpt": (0, NS_MAX),
    "iter": (0, NS_MAX), "bytes": (0, 1 << 48), "addr": (0, (1 << 64) - 1), "faults": (0, COUNT_MAX),
    "fault_timed": (0, COUNT_MAX), "fault_timed_ns": (0, NS_MAX), "tokens": (0, INT32_MAX),
    "prompt_tokens": (0, INT32_MAX), "cpu_ns": (0, NS_MAX), "wait_ns": (0, NS_MAX),
    "nvcsw": (0, COUNT_MAX), "nivcsw": (0, COUNT_MAX), "fault_ns": (0, NS_MAX),
    "pid": (0, INT32_MAX), "old_addr": (0, (1 << 64) - 1), "old_bytes": (0, 1 << 48),
}
TEXT_COLUMNS = {"kind", "phase"}
BOOL_COLUMNS = {"draft", "spec"}
# Memory a trace may expand to: this many times its file size, at least MIN_BUDGET, and never more
# than half the memory available now. Delta-encoded traces (trace.PARQUET_OPTIONS) of real recordings
# expand about 2-30x; a very regular one up to about 70x (the 10M-event benchmark trace). A
# recording's stream (zstd Arrow IPC, no delta encoding) keeps the older bound.
EXPANSION = 256
STREAM_EXPANSION = 64
MIN_BUDGET = 256 << 20


def open_regular(path, what: str = "trace") -> pa.NativeFile:
    """The file at `path` opened for reading, refused unless it is a regular file (a FIFO would
    block, a device never ends). The check and the read are on the same open file. `what` names
    the file in messages."""
    shown = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TraceFormatError(f"{shown}: no such file") from None
    except OSError as e:
        raise TraceFormatError(f"{shown}: cannot read it ({e.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise TraceFormatError(f"{shown}: is a directory, not a {what} file")
        if not stat.S_ISREG(mode):
            raise TraceFormatError(f"{shown}: not a regular file (a FIFO, socket or device); ckptrace "
                                   f"reads {what}s from regular files only")
        return pa.OSFile(f"/proc/self/fd/{fd}")  # the same open file, read natively by Arrow
    finally:
        os.close(fd)


def check_table(pf: pq.ParquetFile, columns: dict, size: int, shown: str) -> None:
    """Before decoding: each column's Parquet type, and the memory the events would take."""
    check_types(pf.schema_arrow, columns, shown)
    md = pf.metadata
    rows = md.num_rows
    row_bytes = sum(_itemsize(d) for d in columns.values())
    stored = sum(md.row_group(i).column(j).total_uncompressed_size
                 for i in range(md.num_row_groups) for j in range(md.num_columns))
    need = 2 * rows * row_bytes + stored  # the frame, a copy while typing it, the decoded pages
    budget = memory_budget(size)
    if need > budget:
        raise TraceFormatError(
            f"{shown}: {rows} events would take about {need >> 20} MiB of memory from a {size >> 10} KiB "
            f"file; ckptrace reads at most {budget >> 20} MiB here ({EXPANSION}x the file, at least "
            f"{MIN_BUDGET >> 20} MiB, at most half the available memory): a damaged or hostile trace?")


def memory_budget(size: int, expansion: int = EXPANSION) -> int:
    """Memory a trace file of `size` bytes may expand to when read."""
    return min(max(expansion * size, MIN_BUDGET), _available() // 2)


def budget_rows(size: int, columns: dict) -> int:
    """Rows a file of `size` bytes may hold (a stream, whose row count is known only as it is read)."""
    return memory_budget(size, STREAM_EXPANSION) // (3 * sum(_itemsize(d) for d in columns.values()))


def check_types(schema: pa.Schema, columns: dict, shown: str) -> None:
    """Each known column's Arrow type is the one written (text, true/false or integers)."""
    for name in columns:
        if name not in schema.names:
            continue  # read_meta has said which columns must be there
        t = schema.field(name).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        ok = ((pa.types.is_string(t) or pa.types.is_large_string(t)) if name in TEXT_COLUMNS
              else pa.types.is_boolean(t) if name in BOOL_COLUMNS
              else pa.types.is_integer(t))
        if not ok:
            want = "text" if name in TEXT_COLUMNS else "true/false" if name in BOOL_COLUMNS else "integers"
            raise TraceFormatError(f"{shown}: column {name} holds {t}, not {want}")


def check_column(name: str, values: pa.ChunkedArray, dtype, shown: str) -> None:
    """Before pandas converts a column: no nulls unless its dtype is nullable (NA = not recorded),
    every value in range."""
    if values.null_count and not isinstance(dtype, pd.Int64Dtype):
        raise TraceFormatError(f"{shown}: column {name} has {values.null_count} missing values")
    if name not in RANGES or len(values) == values.null_count:
        return
    lo, hi = RANGES[name]
    mm = pc.min_max(values)
    vmin, vmax = mm["min"].as_py(), mm["max"].as_py()
    if vmin < lo or vmax > hi:
        bad = vmin if vmin < lo else vmax
        raise TraceFormatError(f"{shown}: column {name} holds {bad}, outside {lo}..{hi}")


def check_events(df: pd.DataFrame, shown: str) -> None:
    """After typing: spans in order, one row per checkpoint and iteration id, fill/copy inside."""
    check_phases(df, shown)
    reversed_ = np.flatnonzero(df["end_ns"].to_numpy() < df["start_ns"].to_numpy())
    if len(reversed_):
        raise reversed_error(df, int(reversed_[0]), len(reversed_), shown)
    kind = df["kind"]
    check_ids(df.loc[kind == "checkpoint", ["ckpt", "start_ns", "end_ns"]], df.loc[kind == "iteration", "iter"],
              df.loc[kind.isin(["fill", "copy"]), ["kind", "ckpt", "start_ns", "end_ns"]], shown)


def check_phases(df: pd.DataFrame, shown: str) -> None:
    if df["phase"].isna().any():
        raise TraceFormatError(f"{shown}: trace has phases this version does not know")


def reversed_error(df: pd.DataFrame, i: int, count: int, shown: str, row: int | None = None) -> TraceFormatError:
    """Row `i` of `df` (row `row` of the trace) is the first of `count` spans ending before they start."""
    start, end = int(df["start_ns"].iat[i]), int(df["end_ns"].iat[i])
    return TraceFormatError(f"{shown}: {count} events end before they start (first: row {i if row is None else row}, "
                            f"{df['kind'].iat[i]} {start}..{end} ns)")


def check_ids(ck: pd.DataFrame, iters: pd.Series, parts: pd.DataFrame, shown: str) -> None:
    """Across the whole trace: one checkpoint row per checkpoint id (`ck`: ckpt, start_ns, end_ns
    of the checkpoint rows), one iteration row per iteration id (`iters`), and each fill and copy
    row (`parts`: kind, ckpt, start_ns, end_ns) inside its checkpoint."""
    for kind, ids in (("checkpoint", ck["ckpt"]), ("iteration", iters)):
        if increasing(ids.to_numpy()):  # the recorder's order: no id twice, nothing to hash
            continue
        ids = ids[ids > 0]
        dup = ids[ids.duplicated()]
        if len(dup):
            raise TraceFormatError(f"{shown}: {kind} id {int(dup.iat[0])} appears {int((ids == dup.iat[0]).sum())} "
                                   "times")
    ck_ids = ck["ckpt"].to_numpy()
    if increasing(ck_ids):  # found by binary search, not through a hashed index
        at = np.minimum(np.searchsorted(ck_ids, parts["ckpt"].to_numpy()), max(len(ck_ids) - 1, 0))
        found = ck_ids[at] == parts["ckpt"].to_numpy() if len(ck_ids) else np.zeros(len(parts), bool)
        parts, at = parts.loc[found], at[found]
        outer = {c: ck[c].to_numpy()[at] for c in ("start_ns", "end_ns")}
    else:
        ck = ck.set_index("ckpt")
        parts = parts.loc[parts["ckpt"].isin(ck.index)]
        outer = ck.loc[parts["ckpt"].to_numpy()] if len(parts) else None
    if len(parts):
        out = (parts["start_ns"].to_numpy() < np.asarray(outer["start_ns"])) | \
              (parts["end_ns"].to_numpy() > np.asarray(outer["end_ns"]))
        if out.any():
            row = parts.iloc[int(np.flatnonzero(out)[0])]
            raise TraceFormatError(f"{shown}: a {row['kind']} of checkpoint {int(row['ckpt'])} lies outside "
                                   f"its checkpoint ({int(out.sum())} such rows)")


def increasing(values: np.ndarray, strict: bool = True) -> bool:
    """Whether `values` never decrease (strict: always increase, so none appears twice), e.g. ids
    in the order the recorder's counters gave them."""
    return len(values) < 2 or bool(((values[1:] > values[:-1]) if strict else (values[1:] >= values[:-1])).all())


def _itemsize(dtype) -> int:
    if isinstance(dtype, pd.CategoricalDtype):
        return 1
    if isinstance(dtype, pd.api.extensions.ExtensionDtype):
        return 9  # values and a mask byte
    return np.dtype(dtype).itemsize


def _available() -> int:
    """MemAvailable from /proc/meminfo, in bytes (the machine's total if unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
