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

from ckptrace.core import pages
from ckptrace.core.errors import TraceFormatError
from ckptrace.core.order import in_order, increasing  # noqa: F401 (also read from here)
from ckptrace.core.terminal import printable

# Bounds, so the analysis' int64 arithmetic (analyzers/sums.py) is exact or refused, never wrapped
# (docs/trace-format.md, "Bounds"). A trace holds at most ROWS_MAX rows (4.3 billion: the memory
# bound below refuses far fewer on any machine with less than 1.4 TiB to spare). Then:
# - counts: ROWS_MAX x COUNT_MAX = 2^32 x 2^30 = 2^62 < 2^63, so any sum of counts over any rows
#   fits (2^30 faults in one span is 4 TiB of 4 KiB pages);
# - tokens: ROWS_MAX x INT32_MAX = 2^63 - 2^32 < 2^63: any sum of tokens fits;
# - times and ids: each in 0..NS_MAX (146 years of ns), so a span's length end - start, and the
#   difference of any two times, lies in -2^62..2^62. Ids are not summed; ids made above a
#   trace's largest (spans.py) stay under NS_MAX + 1 + ROWS_MAX < 2^63;
# - bytes: 0..2^48 each, but ROWS_MAX x 2^48 = 2^80: a sum of bytes can wrap, and so can a sum of
#   span lengths (2^62 each: their rows on one thread don't overlap, check_ids, but threads can
#   hold 2^62 ns each). Those sums are checked where they are made (analyzers/sums.py: refused
#   once the magnitudes add up past SUM_MAX = 2^62), not bounded here.
NS_MAX = 1 << 62
COUNT_MAX = 1 << 30
INT32_MAX = (1 << 31) - 1
ROWS_MAX = 1 << 32
# Column -> inclusive value range. addr is an address: any uint64.
RANGES = {
    "tid": (0, INT32_MAX), "start_ns": (0, NS_MAX), "end_ns": (0, NS_MAX), "ckpt": (0, NS_MAX),
    "iter": (0, NS_MAX), "bytes": (0, 1 << 48), "addr": (0, (1 << 64) - 1), "faults": (0, COUNT_MAX),
    "fault_timed": (0, COUNT_MAX), "fault_timed_ns": (0, NS_MAX), "tokens": (0, INT32_MAX),
    "prompt_tokens": (0, INT32_MAX), "cpu_ns": (0, NS_MAX), "wait_ns": (0, NS_MAX),
    "nvcsw": (0, COUNT_MAX), "nivcsw": (0, COUNT_MAX), "fault_ns": (0, NS_MAX),
    "pid": (0, INT32_MAX), "old_addr": (0, (1 << 64) - 1), "old_bytes": (0, 1 << 48),
    "gpu_copies": (0, COUNT_MAX), "gpu_bytes": (0, 1 << 48), "gpu_pinned_bytes": (0, 1 << 48),
    "gpu_pageable_bytes": (0, 1 << 48), "gpu_enqueue_ns": (0, NS_MAX), "gpu_syncs": (0, COUNT_MAX),
    "gpu_sync_ns": (0, NS_MAX), "gpu_dst_faults": (0, COUNT_MAX), "gpu_driver_faults": (0, COUNT_MAX),
    "state_flags": (0, (1 << 32) - 1), "outcome": (0, 2),
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
# Pages a column chunk may have: pyarrow ends a page only between batches of 1,024 values, so its
# chunks have at most one page per 1,024 values and a few more (a dictionary page, the last one);
# a file of millions of empty pages would only cost time to walk.
VALUES_PER_PAGE = 64
PAGES_MIN = 8
# A Parquet footer: ckptrace's holds the metadata (at most meta.JSON_MAX, twice) and 2-3 KiB per
# row group of 131,072 rows, so 64 MiB is over 2 billion events; a longer one is refused before
# pyarrow reads it (a sparse file's lying footer length once made it read 2.2 GB).
FOOTER_MAX = 64 << 20


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
    except ValueError:  # no path holds a NUL byte
        raise TraceFormatError(f"{shown}: not a file name (it holds a NUL byte)") from None
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


def check_table(pf: pq.ParquetFile, columns: dict, size: int, shown: str,
                source: pa.NativeFile | None = None) -> None:
    """Before decoding: each column's Parquet type, and the memory the events would take: the
    decoded columns, and every page of the columns read as its own header says it inflates
    (`source`: the open file; the footer's sizes are the writer's word, a page header is what the
    reader allocates), per column and in total."""
    check_types(pf.schema_arrow, columns, shown)
    md = pf.metadata
    rows = md.num_rows
    if rows > ROWS_MAX:
        raise TraceFormatError(f"{shown}: {rows} events, more than the {ROWS_MAX} a trace may hold (their "
                               "sums would not stay in 64 bits): a damaged or hostile trace?")
    row_bytes = sum(_itemsize(d) for d in columns.values())
    budget = memory_budget(size)
    decoded = 2 * rows * row_bytes  # the frame, a copy while typing it
    if decoded > budget:
        raise _over_budget(shown, rows, decoded, size, budget)
    per_column = _page_bytes(pf, columns, size, shown, source)
    need = decoded + sum(per_column.values())
    if need > budget:
        worst = max(per_column, key=lambda c: per_column[c])
        raise _over_budget(shown, rows, need, size, budget,
                           f" (its pages inflate to {sum(per_column.values()) >> 20} MiB, column {worst}'s to "
                           f"{per_column[worst] >> 20} MiB)")


def _over_budget(shown: str, rows: int, need: int, size: int, budget: int, detail: str = "") -> TraceFormatError:
    return TraceFormatError(
        f"{shown}: {rows} events would take about {need >> 20} MiB of memory{detail} from a {size >> 10} KiB "
        f"file; ckptrace reads at most {budget >> 20} MiB here ({EXPANSION}x the file, at least "
        f"{MIN_BUDGET >> 20} MiB, at most half the available memory): a damaged or hostile trace?")


def _page_bytes(pf: pq.ParquetFile, columns: dict, size: int, shown: str,
                source: pa.NativeFile | None) -> dict[str, int]:
    """Each column read -> the bytes its pages inflate to: their headers' word when the file is at
    hand, never less than the footer's (a chunk's pages are walked to its end, so a footer that
    misplaces a chunk is caught too)."""
    md = pf.metadata
    names = pf.schema_arrow.names
    out: dict[str, int] = {}
    for j in range(md.num_columns):
        name = md.schema.column(j).path
        if name not in columns or name not in names:
            continue  # not read
        for i in range(md.num_row_groups):
            chunk = md.row_group(i).column(j)
            claimed = chunk.total_uncompressed_size
            if source is not None:
                try:
                    found = pages.chunk_pages(source, chunk, size)
                except pages.PageError as e:
                    raise TraceFormatError(f"{shown}: trace is damaged (column {name}: {e})") from None
                if found.pages > PAGES_MIN + chunk.num_values // VALUES_PER_PAGE:
                    raise TraceFormatError(
                        f"{shown}: column {name} has {found.pages} pages for {chunk.num_values} values in row group "
                        f"{i}; ckptrace reads at most one page per {VALUES_PER_PAGE} values: a damaged or hostile "
                        "trace?")
                claimed = max(claimed, found.uncompressed)
            out[name] = out.get(name, 0) + max(claimed, 0)
    return out


def memory_budget(size: int, expansion: int = EXPANSION) -> int:
    """Memory a trace file of `size` bytes may expand to when read."""
    return min(max(expansion * size, MIN_BUDGET), _available() // 2)


def budget_rows(size: int, columns: dict) -> int:
    """Rows a file of `size` bytes may hold (a stream, whose row count is known only as it is read)."""
    return min(memory_budget(size, STREAM_EXPANSION) // (3 * sum(_itemsize(d) for d in columns.values())), ROWS_MAX)


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
    """After typing: spans in order, one row per checkpoint and iteration id, checkpoints apart on
    their thread, fill/copy inside their checkpoint and apart. `df`'s index is the row number."""
    check_phases(df, shown)
    reversed_ = np.flatnonzero(df["end_ns"].to_numpy() < df["start_ns"].to_numpy())
    if len(reversed_):
        raise reversed_error(df, int(reversed_[0]), len(reversed_), shown)
    kind = df["kind"]
    check_ids(df.loc[kind == "checkpoint", ["ckpt", "tid", "start_ns", "end_ns"]], df.loc[kind == "iteration", "iter"],
              df.loc[kind.isin(["fill", "copy"]), ["kind", "ckpt", "tid", "start_ns", "end_ns"]], shown)


def check_phases(df: pd.DataFrame, shown: str) -> None:
    if df["phase"].isna().any():
        raise TraceFormatError(f"{shown}: trace has phases this version does not know")


def reversed_error(df: pd.DataFrame, i: int, count: int, shown: str, row: int | None = None) -> TraceFormatError:
    """Row `i` of `df` (row `row` of the trace) is the first of `count` spans ending before they start."""
    start, end = int(df["start_ns"].iat[i]), int(df["end_ns"].iat[i])
    return TraceFormatError(f"{shown}: {count} events end before they start (first: row {i if row is None else row}, "
                            f"{df['kind'].iat[i]} {start}..{end} ns)")


def check_ids(ck: pd.DataFrame, iters: pd.Series, parts: pd.DataFrame, shown: str) -> None:
    """Across the whole trace: one checkpoint row per checkpoint id (`ck`: ckpt, tid, start_ns,
    end_ns of the checkpoint rows), one iteration row per iteration id (`iters`), no two
    checkpoints overlapping on one thread, and each fill and copy row (`parts`: kind, ckpt, tid,
    start_ns, end_ns) inside its checkpoint and overlapping no other fill or copy of it. Each
    frame's index is its rows' row numbers in the trace: an error names the first bad row (the
    lowest row number) with its kind, thread and times. Spans ending at or after they start
    (checked before) are assumed. Sorting is by numpy on a few columns, no row-by-row step."""
    for kind, ids in (("checkpoint", ck["ckpt"]), ("iteration", iters)):
        if increasing(ids.to_numpy()):  # the recorder's order: no id twice, nothing to hash
            continue
        ids = ids[ids > 0]
        dup = ids[ids.duplicated()]
        if len(dup):
            raise TraceFormatError(f"{shown}: {kind} id {int(dup.iat[0])} appears {int((ids == dup.iat[0]).sum())} "
                                   "times")
    c_tid, c_start, c_end = (ck[c].to_numpy() for c in ("tid", "start_ns", "end_ns"))
    c_row = ck.index.to_numpy()
    bad = _overlapping(c_tid, c_start, c_end, c_row)
    if bad is not None:
        i, j, count = bad
        raise TraceFormatError(
            f"{shown}: {count} checkpoints overlap an earlier one on their thread (first: row {c_row[i]}, checkpoint "
            f"{int(ck['ckpt'].iat[i])} tid {c_tid[i]} {c_start[i]}..{c_end[i]} ns, overlapping row {c_row[j]}, "
            f"checkpoint {int(ck['ckpt'].iat[j])} {c_start[j]}..{c_end[j]} ns)")
    if not len(parts) or not len(ck):
        return
    # Each part's checkpoint, by position in `ck` (-1: none, e.g. a prompt save's copy, ckpt 0):
    # the recorder's ids count up one by one (a subtraction), else rise (a binary search), else
    # through a sort.
    ck_ids, p_ids = ck["ckpt"].to_numpy(), parts["ckpt"].to_numpy()
    n = len(ck_ids)
    if increasing(ck_ids) and ck_ids[-1] - ck_ids[0] == n - 1:
        at = p_ids - ck_ids[0]
        at[(at < 0) | (at >= n)] = -1
    else:
        sorter = None if increasing(ck_ids) else np.argsort(ck_ids, kind="stable")
        at = np.minimum(np.searchsorted(ck_ids, p_ids, sorter=sorter), n - 1)
        if sorter is not None:
            at = sorter[at]
        at[ck_ids[at] != p_ids] = -1
    mine = None if (at >= 0).all() else np.flatnonzero(at >= 0)  # usually every part is a checkpoint's
    pick = (lambda v: v) if mine is None else (lambda v: v[mine])
    at = pick(at)
    p_start, p_end, p_row = pick(parts["start_ns"].to_numpy()), pick(parts["end_ns"].to_numpy()), \
        pick(parts.index.to_numpy())

    def part(i: int) -> str:  # the part at `i` (of those with a checkpoint) as an error names it
        k = i if mine is None else int(mine[i])
        return f"{parts['kind'].iat[k]} tid {parts['tid'].iat[k]} {p_start[i]}..{p_end[i]} ns"

    out = (p_start < c_start[at]) | (p_end > c_end[at])
    if out.any():
        k = np.flatnonzero(out)
        i = int(k[np.argmin(p_row[k])])
        what = part(i)
        raise TraceFormatError(
            f"{shown}: a {what.split()[0]} of checkpoint {int(ck_ids[at[i]])} lies outside its checkpoint ({len(k)} "
            f"such rows), first at row {p_row[i]}: {what}, its checkpoint row {c_row[at[i]]} "
            f"{c_start[at[i]]}..{c_end[at[i]]} ns")
    bad = _overlapping(at, p_start, p_end, p_row)
    if bad is not None:
        i, j, count = bad
        kind_i, _, rest = part(i).partition(" ")
        raise TraceFormatError(
            f"{shown}: {count} fills and copies overlap another of their checkpoint (first: row {p_row[i]}, "
            f"{kind_i} of checkpoint {int(ck_ids[at[i]])} {rest}, overlapping row {p_row[j]}, "
            f"{part(j).split()[0]} {p_start[j]}..{p_end[j]} ns)")


def _overlapping(group: np.ndarray, start: np.ndarray, end: np.ndarray, row: np.ndarray):
    """Spans (start <= end) overlapping an earlier-starting span of their group (a thread, a
    checkpoint): None when none does, else (i, j, count): the one with the lowest row number, the
    span of its group it overlaps (the one reaching furthest among those starting before it), and
    how many overlap. Touching (one ending where the next starts) is not overlapping.

    In start order, a span overlaps an earlier one iff it overlaps the one just before it, or an
    overlap comes before it (the first overlap in a group is with its predecessor): so one
    comparison of neighbours says whether any overlap, and only then the exact rule runs. Rows
    usually come in order already (one thread in time order; a checkpoint's fill then its copy):
    then nothing is sorted, or one stable sort by group of presorted runs."""
    if len(start) < 2:
        return None
    order = None
    if not in_order(group, start):
        order = np.argsort(group, kind="stable")
        if not in_order(group[order], start[order]):
            order = np.lexsort((start, group))
    g, s, e = (group, start, end) if order is None else (group[order], start[order], end[order])
    same = g[1:] == g[:-1]
    if not (same & (s[1:] < e[:-1])).any():
        return None
    order = np.lexsort((row, start, group))  # an overlap: the exact rule, ties in row order
    g, s, e = group[order], start[order], end[order]
    same = g[1:] == g[:-1]
    reach = pd.Series(e).groupby(g).cummax().to_numpy()  # furthest end so far in the group
    over = np.zeros(len(s), bool)
    over[1:] = same & (s[1:] < reach[:-1])
    k = np.flatnonzero(over)
    first = int(k[np.argmin(row[order][k])])
    lo = int(np.searchsorted(g, g[first]))  # its group's first span, in this order
    j = lo + int(np.argmax(e[lo:first]))
    return int(order[first]), int(order[j]), len(k)


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


class KeyTwice(ValueError):
    """A JSON object naming one key twice (json's object_pairs_hook keeps the last silently)."""
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def no_key_twice(pairs: list[tuple[str, object]]) -> dict:
    """object_pairs_hook for json.loads: the object, or KeyTwice naming the first repeated key."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise KeyTwice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out
