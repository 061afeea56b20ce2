"""Checkpoint memory, the cost side of a pool: bytes held in checkpoint buffers over time, and RSS.

A checkpoint buffer is a mapping made while a checkpoint was being made: an `mmap` row whose phase
is `fill`, `checkpoint` or `create` (the vector's growth asks glibc, which maps anything above its
mmap threshold). It is held from that mmap's return until a `munmap` (any thread, any phase)
returns its pages; a partial munmap returns part of it. An `mremap` of a buffer (realloc) moves
or resizes it: its old range (`old_addr`, `old_bytes`) stops being held and its new one is held
(a trace recorded before those columns, old_addr 0: only a resize in place is seen). So a pool that keeps buffers instead of
freeing them holds more, and a trim that unmaps them shows as releases. Limits, said where shown:
buffers mapped before recording began are not known (attach mode); a buffer glibc serves from the
heap (at most its mmap threshold, 32 MiB at most) is never mapped, so it is not counted.

RSS comes from `rss` rows (kmem:rss_stat in the kernel, emitted when the process's resident
bytes moved by at least the recorder's step, see probes/checkpoint.bpf.c): `bytes` is the
resident size after the change.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.buffers import BUFFER_PHASES, HeldBuffers
from ckptrace.core.trace import empty_frame

from .spans import in_order, sorted_by
from .sums import bound, checked_sum

HELD_COLUMNS: dict[str, object] = {"t_ns": np.dtype("int64"), "pid": np.dtype("int32"),
                                   "held_bytes": np.dtype("int64")}
RSS_COLUMNS: dict[str, object] = {"t_ns": np.dtype("int64"), "pid": np.dtype("int32"),
                                  "rss_bytes": np.dtype("int64")}
RELEASE_COLUMNS: dict[str, object] = {"t_ns": np.dtype("int64"), "pid": np.dtype("int32"), "tid": np.dtype("int32"),
                                      "bytes": np.dtype("int64"), "phase": object, "held_after_bytes": np.dtype("int64")}


def _names(phase: pd.Series, rows: np.ndarray) -> np.ndarray:
    """The values of these rows of a categorical as str objects, one per category shared by its
    rows ("nan" for NA)."""
    cat = phase.array if isinstance(phase.dtype, pd.CategoricalDtype) else pd.Categorical(phase)
    names = np.array([*map(str, cat.categories), "nan"], dtype=object)
    return names[cat.codes[rows]]


MMAP, MUNMAP, MREMAP = 0, 1, 2
KIND_NAMES = ("mmap", "munmap", "mremap")
# Address segments per row the vectorised replay takes on before it replays row by row instead
# (a row covering many buffers' edges, e.g. one munmap of a whole region, expands to many).
MAX_SEGMENTS_PER_ROW = 4


def held_series(events: pd.DataFrame) -> pd.DataFrame:
    """[t_ns, pid, held_bytes]: one row per change of the bytes held in checkpoint buffers, per
    process, in time order (a step function: the value holds until the next row of its pid)."""
    held, _ = _walk(events, *_kinds(events))
    return held


def releases(events: pd.DataFrame) -> pd.DataFrame:
    """[t_ns, pid, tid, bytes, phase, held_after_bytes]: every munmap that returned checkpoint
    buffer memory (an eviction when its phase is checkpoint/create, a free or a trim otherwise)."""
    _, rel = _walk(events, *_kinds(events))
    return rel


def rss_series(events: pd.DataFrame) -> pd.DataFrame:
    """[t_ns, pid, rss_bytes] from the `rss` rows (empty when RSS was not recorded)."""
    rows = events.loc[events["kind"] == "rss", ["start_ns", "pid", "bytes"]]
    out = rows.rename(columns={"start_ns": "t_ns", "bytes": "rss_bytes"}).sort_values("t_ns", kind="stable")
    return out.astype(RSS_COLUMNS).reset_index(drop=True)


def memory_summary(events: pd.DataFrame) -> dict:
    """The `memory` block of `analyze --json`: high-water marks and each release, whole trace
    (peaks are of the sum over processes: a process's own are in its `processes` entry).
    `releases` is a table (RELEASE_COLUMNS) like the analysis' others, a row per release
    (a pool-off server releases a buffer per checkpoint); renderers/json.py makes it a list."""
    kind, is_buffer = _kinds(events)
    held, rel = _walk(events, kind, is_buffer)
    rss = rss_series(events)
    total = _summed(held, "held_bytes")
    if len(rss) and rss["pid"].nunique() > 1:  # the sum over processes is at most that of their peaks
        bound("the processes' peak RSS bytes", rss.groupby("pid")["rss_bytes"].max().to_numpy())
    rss_total = _summed(rss, "rss_bytes")
    peak = int(total["value"].max()) if len(total) else 0
    return {
        "peak_held_bytes": peak,
        "peak_held_ns": int(total["t_ns"].iat[int(total["value"].to_numpy().argmax())]) if len(total) else None,
        "end_held_bytes": int(total["value"].iat[-1]) if len(total) else 0,
        "buffers_mapped": int(is_buffer.sum()),
        "buffer_bytes_mapped": checked_sum(events["bytes"].to_numpy("int64")[is_buffer],
                                           "the checkpoint buffers' bytes"),
        "released_bytes": int(rel["bytes"].sum()),  # at most what was mapped (_walk's bound)
        "peak_rss_bytes": int(rss_total["value"].max()) if len(rss_total) else None,
        "rss_samples": int(len(rss)),
        "releases": rel,
    }


def _summed(series: pd.DataFrame, col: str) -> pd.DataFrame:
    """[t_ns, value]: the sum over processes of a per-process step series, at each change
    (`series` in time order): each row adds its change from its process's previous value, so the
    running total after the last row at a time is every process's latest value summed."""
    if not len(series):
        return pd.DataFrame({"t_ns": np.array([], "int64"), "value": np.array([], "int64")})
    value = series[col].to_numpy("int64")
    pid = series["pid"].to_numpy()
    if pid[0] == pid[-1] and (pid == pid[0]).all():  # one process: the sum is its own series
        total = value
    else:
        previous = series.groupby("pid", sort=False)[col].shift(1, fill_value=0).to_numpy("int64")
        total = np.cumsum(value - previous)
    t = series["t_ns"].to_numpy("int64")
    last = np.r_[t[1:] != t[:-1], True]  # the last row at each time
    return pd.DataFrame({"t_ns": t[last], "value": total[last]})


def _kinds(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's MMAP/MUNMAP/MREMAP code (-1 for any other kind), and whether it maps a
    checkpoint buffer (an mmap in a BUFFER_PHASES phase)."""
    kind = _lookup(events["kind"], {"mmap": MMAP, "munmap": MUNMAP, "mremap": MREMAP}, -1)
    return kind, (kind == MMAP) & (_lookup(events["phase"], dict.fromkeys(BUFFER_PHASES, 1), 0) == 1)


def _walk(events: pd.DataFrame, kind: np.ndarray, is_buffer: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay each process's mappings in time order, keeping the live checkpoint buffers as
    [start, end) address ranges. Only rows that can touch a buffer are walked; only the columns
    the replay reads are taken, as numpy arrays. `sel` (the walked rows in walk order) stays None
    while that is every row as stored (one process, its rows in time order: the common case), so
    the columns are read in place, not copied."""
    if not is_buffer.any():
        return empty_frame(HELD_COLUMNS), empty_frame(RELEASE_COLUMNS)
    pid = events["pid"].to_numpy()
    mine = kind >= 0
    if pid.min() != pid.max():  # several processes: only those that mapped a buffer
        mine &= np.isin(pid, np.unique(pid[is_buffer]))
    addr, nbytes = events["addr"].to_numpy("uint64"), events["bytes"].to_numpy("int64")
    # Held bytes only grow by a buffer's mmap or an mremap, each by at most its length: bounded by
    # their sum, so is every held figure, per process or summed over them, and every release.
    bound("the checkpoint buffers' mmap and mremap bytes", nbytes[is_buffer | (kind == MREMAP)])
    end = addr + nbytes.view("uint64")  # the bits of nbytes.astype("uint64"), without a copy
    lo, hi = addr[is_buffer].min(), end[is_buffer].max()
    remap = (kind == MREMAP) & mine
    if remap.any():  # a buffer may move anywhere: every new range may hold one (mremap rows are few)
        lo, hi = min(lo, addr[remap].min()), max(hi, end[remap].max())
    near = is_buffer | remap | (mine & (end > lo) & (addr < hi))  # the rest can't overlap any buffer
    del end, remap, mine  # freed before the walk's own temporaries: a lower peak
    sel = None if near.all() else np.flatnonzero(near)
    # A mapping exists from the mmap's return; an munmap's pages go at its entry.
    k = _take(kind, sel)
    t = np.where(k == MUNMAP, _take(events["start_ns"].to_numpy(), sel), _take(events["end_ns"].to_numpy(), sel))
    p = _take(pid, sel)
    if not in_order(p, t):  # by pid, then time, else in row order
        order = np.lexsort((t, p))
        sel, t, p = (order if sel is None else sel[order]), t[order], p[order]
    if "old_addr" in events.columns and "old_bytes" in events.columns:
        old_addr, old_bytes = events["old_addr"].to_numpy("uint64"), events["old_bytes"].to_numpy("int64")
    else:  # a trace from before those columns: not recorded
        old_addr, old_bytes = np.zeros(len(events), "uint64"), np.zeros(len(events), "int64")
    cols = [_take(c, sel) for c in (kind, is_buffer, addr, nbytes, old_addr, old_bytes)]  # in walk order
    cuts = np.r_[0, np.flatnonzero(p[1:] != p[:-1]) + 1, len(p)]
    # one process at a time: its own address space
    parts = [_replay(*(c[a:b] for c in cols)) for a, b in zip(cuts[:-1], cuts[1:])]
    changed, freed, held = parts[0] if len(parts) == 1 else map(np.concatenate, zip(*parts))
    held_df = _by_time(pd.DataFrame({"t_ns": t[changed], "pid": p[changed], "held_bytes": held[changed]}),
                       HELD_COLUMNS)
    out = np.flatnonzero(changed & (cols[0] == MUNMAP) & (freed > 0))  # cols[0]: each walked row's kind
    at = out if sel is None else sel[out]
    rel_df = _by_time(pd.DataFrame({"t_ns": t[out], "pid": p[out], "tid": events["tid"].to_numpy()[at],
                                    "bytes": freed[out], "phase": pd.Series(_names(events["phase"], at), dtype=object),
                                    "held_after_bytes": held[out]}), RELEASE_COLUMNS)
    return held_df, rel_df


def _take(values: np.ndarray, sel: np.ndarray | None) -> np.ndarray:
    """The values at `sel`; all of them, in place, when None."""
    return values if sel is None else values[sel]


def _by_time(frame: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """`frame` (walked by pid, then time) as `columns`, sorted by time, then pid (stable)."""
    return sorted_by(frame.astype(columns), "t_ns", "pid")


def _lookup(values: pd.Series, codes: dict, other: int) -> np.ndarray:
    """Each row's code for its value (`other` for any value not in `codes`, NA included), read
    through the categories, not row by row."""
    cat = values.array if isinstance(values.dtype, pd.CategoricalDtype) else pd.Categorical(values)
    lut = np.array([codes.get(c, other) for c in cat.categories] + [other], "int8")
    return lut[cat.codes]


def _replay(kind: np.ndarray, buffer: np.ndarray, addr: np.ndarray, nbytes: np.ndarray, old_addr: np.ndarray,
            old_bytes: np.ndarray):
    """One process's rows in time order -> (held changed, bytes freed, held after) per row: the
    vectorised replay where it applies, else HeldBuffers row by row (the same rule)."""
    out = _replay_segments(kind, buffer, addr, nbytes, old_addr, old_bytes)
    if out is not None:
        return out
    buffers = HeldBuffers()
    changed = np.zeros(len(kind), bool)
    freed = np.zeros(len(kind), "int64")
    held = np.zeros(len(kind), "int64")
    phases = np.where(buffer, BUFFER_PHASES[0], "none")  # step() asks only whether an mmap is a buffer's
    rows = zip(kind.tolist(), phases.tolist(), addr.tolist(), nbytes.tolist(), old_addr.tolist(), old_bytes.tolist())
    for i, (k, phase, a, n, oa, ob) in enumerate(rows):
        changed[i], freed[i] = buffers.step(KIND_NAMES[k], phase, a, n, oa, ob)
        held[i] = buffers.held
    return changed, freed, held


def _replay_segments(kind: np.ndarray, buffer: np.ndarray, addr: np.ndarray, nbytes: np.ndarray,
                     old_addr: np.ndarray, old_bytes: np.ndarray):
    """HeldBuffers' rule without a Python step per row, or None where it needs the ranges
    themselves: an mremap with its old range recorded changes nothing unless that range overlaps
    a buffer; one without, unless it starts where a live range starts, which can only be a
    buffer's start or another row's end; such an mremap needs the row-by-row rule."""
    n = len(kind)
    remap = kind == MREMAP
    if not remap.any():
        return _segments(buffer, addr, nbytes)
    keep = ~remap
    moved = remap & (old_addr != 0)
    if moved.any() and buffer.any():  # does any old range overlap any buffer's range?
        order = np.argsort(addr[buffer], kind="stable")
        starts = addr[buffer][order]
        reach = np.maximum.accumulate((addr[buffer] + nbytes[buffer].astype("uint64"))[order])
        last = np.searchsorted(starts, old_addr[moved] + old_bytes[moved].astype("uint64")) - 1  # starts before its end
        if ((last >= 0) & (reach[np.maximum(last, 0)] > old_addr[moved])).any():
            return None
    if np.isin(addr[remap & ~moved], np.concatenate([addr[buffer], addr[keep] + nbytes[keep].astype("uint64")])).any():
        return None
    changed, freed, held = np.zeros(n, bool), np.zeros(n, "int64"), np.zeros(n, "int64")
    if not keep.any():
        return changed, freed, held
    sub = _segments(buffer[keep], addr[keep], nbytes[keep])
    if sub is None:
        return None
    changed[keep], freed[keep] = sub[0], sub[1]
    last = np.cumsum(keep) - 1  # the last other row at or before each row: its held stands
    held[:] = np.where(last >= 0, sub[2][np.maximum(last, 0)], 0)
    return changed, freed, held


def _segments(buffer: np.ndarray, addr: np.ndarray, nbytes: np.ndarray):
    """mmap/munmap rows replayed on address segments: cut the address space at every row's start
    and end, so each row covers whole segments; a segment is held after a row covering it when
    that row is a buffer's mmap, and not held after any other (an munmap, or a mapping placed
    over it). A row's held change is the sum over its segments of (now - before) x length.
    None for an empty or wrapping range, or rows covering too many segments."""
    n = len(buffer)
    stop = addr + nbytes.view("uint64")
    if (nbytes <= 0).any() or (stop <= addr).any():
        return None
    by_addr = np.argsort(addr, kind="stable")
    a, s = addr[by_addr], stop[by_addr]
    same = a[1:] == a[:-1]
    # Rows at one start end at one place, and end before the next start: every row is a segment
    # of its own (pool-off's common case: each munmap returns one mmap's whole range).
    if np.where(same, s[1:] == s[:-1], s[:-1] <= a[1:]).all():
        return _one_segment_each(buffer, nbytes, by_addr, same)
    del a, s, same, by_addr
    edges = np.unique(np.concatenate([addr, stop]))
    first = np.searchsorted(edges, addr)
    count = np.searchsorted(edges, stop) - first  # segments each row covers, >= 1
    total = int(count.sum())
    if total > MAX_SEGMENTS_PER_ROW * n:
        return None
    row = np.repeat(np.arange(n), count)
    offset = np.cumsum(count) - count  # each row's first entry
    seg = np.arange(total) - np.repeat(offset - first, count)
    order = np.argsort(seg, kind="stable")  # by segment, each in row (time) order
    s_seg = seg[order]
    now = buffer[row[order]]
    before = np.zeros(total, bool)
    before[1:] = now[:-1] & (s_seg[1:] == s_seg[:-1])
    length = np.diff(edges).astype("int64")[s_seg]
    delta = np.empty(total, "int64")
    delta[order] = (now.astype("int64") - before) * length
    lost = np.empty(total, "int64")
    lost[order] = np.where(before & ~now, length, 0)
    freed = np.add.reduceat(lost, offset)
    return buffer | (freed > 0), freed, np.cumsum(np.add.reduceat(delta, offset))


def _one_segment_each(buffer: np.ndarray, nbytes: np.ndarray, by_addr: np.ndarray, same: np.ndarray):
    """_segments' rule where each row is one segment: `by_addr` orders the rows by segment, each
    in row order, and `same` says where the next row in that order is of the same segment. Each
    row's change is then +length (a buffer mapped where none was), -length (the buffer there
    went) or 0, computed in row order: no int64 array is gathered or scattered."""
    now = buffer[by_addr]
    after_buffer = np.zeros(len(now), bool)
    after_buffer[1:] = now[:-1] & same
    before = np.empty(len(now), bool)  # each row's segment held a buffer before it
    before[by_addr] = after_buffer
    delta = (buffer.view("int8") - before.view("int8")) * nbytes
    freed = np.where(before & ~buffer, nbytes, 0)
    return buffer | (freed > 0), freed, np.cumsum(delta)
