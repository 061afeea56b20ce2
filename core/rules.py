"""analyze's rules that the live tools apply too, in numpy only: which calls are checkpoints, a
checkpoint's fill, buffer class and pool hit, which restores restored state, and the per-checkpoint sums they
read (Ids, Groups). analyzers/checkpoints.py, spans.py and state_path.py use them on a trace;
`serve`, `top` and the recorder's status line (probes/fold.py) on each live batch, without
pandas (about 50 MiB resident). Beside the layers, as core/buffers.py: probes/ and analyzers/
both read it, and neither imports the other.
"""
from __future__ import annotations

import numpy as np

from ckptrace.core.order import increasing


class Ids:
    """Positions of ids in an array of unique ids. Ids usually grow with time, often one by one
    (the recorder's counters): consecutive ids are found by subtraction, increasing ones by binary
    search, others through a stable argsort."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids
        self.sorter = None if increasing(ids) else np.argsort(ids, kind="stable")
        self.first = ids[0] if len(ids) and self.sorter is None and ids[-1] - ids[0] == len(ids) - 1 else None

    def find(self, of: np.ndarray) -> np.ndarray:
        """Each id's position, -1 for an id not there."""
        n = len(self.ids)
        if self.first is not None:
            at = of - self.first
            gone = (at < 0) | (at >= n)
            if gone.any():
                at[gone] = -1
            return at
        if not n:
            return np.full(len(of), -1, "int64")
        at = np.searchsorted(self.ids, of, sorter=self.sorter)
        np.minimum(at, n - 1, out=at)
        if self.sorter is not None:
            at = self.sorter[at]
        return np.where(self.ids[at] == of, at, -1)


class Groups:
    """Rows grouped by a position `at` in 0..n-1 (-1: in no group), e.g. each fill's checkpoint, for
    several exact int64 reductions per group: the rows are put in group order once (no sort when
    they already are, the usual case) and each reduction is one ufunc.reduceat, none when each
    group has one row (a checkpoint's copy, an iteration's checkpoint: the usual case too). A sum
    is exact: its values are bounded first (analyzers/sums.py), by the caller."""

    def __init__(self, at: np.ndarray, n: int):
        self.n = n
        mine = at >= 0
        if mine.all() and increasing(at, strict=False):
            self.order, s = None, at
        else:
            self.order = np.flatnonzero(mine)
            s = at[self.order]
            if not increasing(s, strict=False):
                self.order = self.order[np.argsort(s, kind="stable")]
                s = at[self.order]
        self.starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1]))) if len(s) else np.zeros(0, "int64")
        self.present = s[self.starts]
        self.count = np.zeros(n, "int64")
        self.count[self.present] = np.diff(np.append(self.starts, len(s)))
        self.has = self.count > 0
        self.single = len(self.starts) == len(s)  # one row per group: nothing to reduce
        self.full = len(self.present) == n  # rows in every group: no zeros to fill in

    def _reduce(self, ufunc: np.ufunc, values: np.ndarray, fresh: bool = False, empty: np.ndarray | None = None
                ) -> np.ndarray:
        """Each group's reduction; `empty` (zeros if None) holds the groups without rows and is
        filled in. `fresh`: `values` is the caller's own temporary, fit to be returned as the result."""
        v = values if self.order is None else values[self.order]
        if not self.single:
            v = ufunc.reduceat(v, self.starts)
        if not self.full:
            out = np.zeros(self.n, values.dtype) if empty is None else empty
            out[self.present] = v
            return out
        return v.copy() if v is values and not fresh else v  # a new array, never the caller's

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Each group's sum (0 for a group without rows); the caller has bounded `values`
        (analyzers/spans.py's Groups does, given what they are)."""
        return self._reduce(np.add, values)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Each group's largest value (0 for a group without rows)."""
        return self._reduce(np.maximum, values)

    def any(self, values: np.ndarray) -> np.ndarray:
        """Whether any of each group's (boolean) values is true (False for a group without rows)."""
        return self._reduce(np.logical_or, values)


def saved(copy_rows: np.ndarray) -> np.ndarray:
    """Which update_tgt/update_dft calls are checkpoints: those that copied state (`copy_rows`:
    each call's copy rows). llama-server calls update_dft on every checkpoint, and without a draft
    model it returns at once: it saved nothing."""
    return copy_rows > 0


# What a checkpoint's destination buffer's pages did (checkpoint_rules; docs/metrics.md "Buffer
# classes"), the codes of the `buffer` column. Only "reused" is a pool hit.
BUFFER_CLASSES = ("reused", "grown", "fresh", "partial", "touched")
REUSED, GROWN, FRESH, PARTIAL, TOUCHED = range(len(BUFFER_CLASSES))
PAGE_BYTES = 4096  # a fault is counted as one base page (x86-64's; no transparent huge pages)
# A copy "faulted" when its faults reach 1/64 of its pages: fewer are strays (the tracer's first
# hit of a probe, a stack or source page), not its destination (a 48 MiB copy: 192 faults).
STRAY_SHARE = 64


def mapped_destination(copy_at: np.ndarray, copy_addr: np.ndarray, copy_bytes: np.ndarray, map_at: np.ndarray,
                       map_addr: np.ndarray, map_bytes: np.ndarray, n: int) -> np.ndarray:
    """Per checkpoint (positions 0..n-1; -1: in none), whether a mapping made while it was open
    (map_*: its mmap rows) overlaps where its copies wrote ([addr, addr + bytes) of its copy rows,
    their hull): the destination was mapped by this checkpoint, not reused."""
    copy_addr, map_addr = copy_addr.astype("int64", copy=False), map_addr.astype("int64", copy=False)
    copy_end = copy_addr + copy_bytes.astype("int64", copy=False)
    g = Groups(copy_at, n)
    lo, hi = -g.max(-copy_addr), g.max(copy_end)  # a checkpoint without copies: [0, 0), overlaps nothing
    mine = map_at >= 0
    at = map_at[mine]
    start, end = map_addr[mine], map_addr[mine] + map_bytes[mine].astype("int64", copy=False)
    overlaps = (start < hi[at]) & (end > lo[at]) & g.has[at]
    return np.bincount(at[overlaps], minlength=n) > 0


def checkpoint_rules(total_ns: np.ndarray, faults: np.ndarray, copy_ns: np.ndarray, copy_faults: np.ndarray,
                     fill_rows: np.ndarray, fill_ns: np.ndarray, fill_faults: np.ndarray, mmaps: np.ndarray,
                     nbytes: np.ndarray, mapped: np.ndarray, fill_probed: bool = True) -> dict[str, np.ndarray]:
    """A checkpoint's fill, buffer class, pool hit and other time from its own span (total_ns,
    faults, nbytes: the bytes its copies wrote), the per-checkpoint sums of its parts and
    `mapped` (mapped_destination): the one definition analyze (checkpoint_table) and the live
    tools (probes/fold.py) apply (numpy arrays, one value per checkpoint).

    The fill: probed, its fill rows; not probed (the growth inlined), the checkpoint less its
    copies, in time and faults, other_ns 0 (folded into the fill). The buffer (BUFFER_CLASSES),
    by what its pages did: "grown" when a fill ran (a fill row; derived: the checkpoint faulted
    outside its copies); else by the copy's faults: none (or strays, under 1/STRAY_SHARE of its
    pages), "reused" (a pool hit) unless the destination was mapped while the checkpoint was open
    ("touched": fresh pages made resident before the copy); at least one per page of its
    bytes, "fresh" (the copy faulted every page in: the fill moved into the copy); between,
    "partial". fresh_bytes: the bytes the copy wrote into pages it faulted in (a fault a page, at
    most its bytes; 0 for strays)."""
    if fill_probed:
        out = {"fill_ns": fill_ns, "fill_faults": fill_faults, "other_ns": total_ns - fill_ns - copy_ns}
        grown = fill_rows > 0
    else:
        derived_faults = np.maximum(faults - copy_faults, 0)
        out = {"fill_ns": np.maximum(total_ns - copy_ns, 0), "fill_faults": derived_faults,
               "other_ns": np.zeros_like(total_ns)}
        grown = derived_faults > 0
    nbytes, copy_faults = nbytes.astype("int64", copy=False), copy_faults.astype("int64", copy=False)
    pages = -(-nbytes // PAGE_BYTES)
    faulted = (copy_faults > 0) & (copy_faults * STRAY_SHARE >= pages)
    buffer = np.select([grown, ~faulted, copy_faults >= pages], [GROWN, np.where(mapped, TOUCHED, REUSED), FRESH],
                       PARTIAL).astype("int8")
    out.update(buffer=buffer, pool_hit=buffer == REUSED,
               fresh_bytes=np.where(faulted, np.minimum(copy_faults * PAGE_BYTES, nbytes), 0))
    return out


def enclosing(inner, outer) -> np.ndarray:
    """For each inner row (tid, start_ns, end_ns), the position in `outer` of the span on the same
    thread that encloses it (the latest one starting at or before it; of several starting then,
    the last), -1 when none. Frames or numpy records (the exporter's batches)."""
    out = np.full(len(inner), -1, dtype="int64")
    if not len(inner) or not len(outer):
        return out
    i_tid, i_start, i_end = (np.asarray(inner[c]) for c in ("tid", "start_ns", "end_ns"))
    o_tid, o_start, o_end = (np.asarray(outer[c]) for c in ("tid", "start_ns", "end_ns"))
    order = np.lexsort((o_start, o_tid))  # by thread, then start; equal starts in their own order
    o_tid_sorted, o_start_sorted = o_tid[order], o_start[order]
    for tid in np.unique(i_tid):  # a server's threads: a handful
        lo, hi = np.searchsorted(o_tid_sorted, tid, "left"), np.searchsorted(o_tid_sorted, tid, "right")
        if lo == hi:
            continue
        rows = np.flatnonzero(i_tid == tid)
        k = np.searchsorted(o_start_sorted[lo:hi], i_start[rows], "right") - 1
        rows, k = rows[k >= 0], k[k >= 0]
        pos = order[lo + k]
        fits = i_end[rows] <= o_end[pos]
        out[rows[fits]] = pos[fits]
    return out


def restored(restores, copies) -> np.ndarray:
    """Which restore spans restored state: those with a restore_copy inside them on their thread
    (a load_dft without a draft model returns at once, copying nothing). restore_table's rule;
    the live tools count restores by it (probes/fold.py). Frames or numpy records."""
    parent = enclosing(copies, restores)
    return np.bincount(parent[parent >= 0], minlength=len(restores)) > 0
