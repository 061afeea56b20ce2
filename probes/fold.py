"""What each live batch adds to a process's checkpoint figures: the one fold `serve`'s series,
`top`'s view and the recorder's status line share.

A batch is the kernel's records as they came (live/session.py's LiveBatch, or the recorder's
flush); its checkpoints and restores are computed by `analyze`'s own rules, not a copy of them:
core/rules.py's `saved` and `checkpoint_rules` over per-checkpoint sums made with its `Ids`
and `Groups`, and its `restored` (numpy: analyze's pandas table would cost about 20 ms a batch, and
pandas 50 MiB of resident memory), and held memory by core/buffers.py's class (the rule
analyzers/memory.py replays); tests/test_serve.py and tests/test_top.py hold them to `analyze`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ckptrace.core.rules import Groups, Ids, checkpoint_rules, enclosing, mapped_destination, restored, saved
from ckptrace.core.buffers import HeldBuffers
from ckptrace.core.columns import KINDS, PHASES

STALE_CARRY_NS = 60_000_000_000  # a fill/copy whose checkpoint never returned (an exception) is dropped
K_CHECKPOINT, K_FILL, K_COPY, K_MMAP, K_MUNMAP, K_RESTORE, K_RESTORE_COPY = (
    KINDS.index(k) for k in ("checkpoint", "fill", "copy", "mmap", "munmap", "restore", "restore_copy"))
SYSCALL_KINDS = [KINDS.index(k) for k in ("mmap", "munmap", "mremap")]


@dataclass
class Folded:
    """One batch's part: its checkpoints ({column: float array, -1 = not recorded}, see
    checkpoints()), its restores, and the held-memory update, applied when the caller is ready
    (serve applies it under the lock its scrapes read with)."""
    checkpoints: dict[str, np.ndarray]
    restores: int
    apply_held: object  # () -> None


@dataclass
class ProcessFold:
    """One process's fold state across batches: rows waiting for the span they belong to
    (`carry`), its live checkpoint buffers and their high-water mark."""
    fill_probed: bool = True  # False: a build with no growth probe (analyze's derived fill)
    buffers: HeldBuffers = field(default_factory=HeldBuffers)
    peak_bytes: int = 0
    carry: tuple | None = None  # (rows, fault_ns) waiting for their checkpoint or restore

    def fold(self, events: np.ndarray, fault_ns: np.ndarray, sched_recorded: bool) -> Folded:
        """A batch of this process's records (kernel layout) with each row's fault time (-1: not measured)."""
        held = self._held_changes(events)  # on the new rows only: carried mmaps were applied when they came
        ev, fault = events, fault_ns
        if self.carry is not None:
            ev, fault = np.concatenate([self.carry[0], ev]), np.concatenate([self.carry[1], fault])
        ck, waiting = checkpoints(ev, fault, sched_recorded, self.fill_probed)
        restores, copies_waiting = _restores(ev)
        self.carry = _carry(ev, fault, waiting | copies_waiting)
        return Folded(ck, restores, held)

    def _held_changes(self, events: np.ndarray):
        """Checkpoint memory from the batch's mmap/munmap/mremap rows, by core/buffers.py's rule
        (a mapping made while a checkpoint was being made is held until unmapped); the update to
        apply. Rows in analyzers/memory.py's order: a mapping exists from the mmap's return, an
        munmap's pages go at its entry."""
        sc = events[np.isin(events["kind"], SYSCALL_KINDS)]
        t_ns = np.where(sc["kind"] == K_MUNMAP, sc["start_ns"], sc["end_ns"])
        sc = sc[np.argsort(t_ns, kind="stable")]
        rows = [(KINDS[k], PHASES[p], a, b, oa, ob) for k, p, a, b, oa, ob in
                zip(sc["kind"].tolist(), sc["phase"].tolist(), sc["addr"].tolist(), sc["bytes"].tolist(),
                    sc["old_addr"].tolist(), sc["old_bytes"].tolist())]

        def apply():
            for kind, phase, addr, nbytes, old_addr, old_bytes in rows:
                if self.buffers.step(kind, phase, addr, nbytes, old_addr, old_bytes)[0]:
                    self.peak_bytes = max(self.peak_bytes, self.buffers.held)
        return apply


def checkpoints(ev: np.ndarray, fault: np.ndarray, sched: bool, fill_probed: bool = True
                ) -> tuple[dict, np.ndarray]:
    """Per checkpoint of the batch, by analyze's rules (core/rules.py `saved` and
    `checkpoint_rules`, on sums made with its Ids and Groups): {column: float
    array, -1 = not recorded}, and which rows wait for their checkpoint (see _carry).

    fill_ns/copy_ns are the summed wall time of its fill/copy rows, fill_cpu_ns/copy_cpu_ns their
    on-CPU time (a derived fill's: the checkpoint's less its copies', as analyze); cpu/wait its
    own span's; fault_ns its fills' and copies' fault time summed, not recorded when any part
    was not measured (analyze estimates those; the live figures leave them out), nor for a
    derived fill (no growth probe: `fill_probed` False). A checkpoint's row comes at its
    return, after its fills, copies and mmaps (one thread, one ring buffer: in order), so a
    batch may end between them."""
    kind, ids = ev["kind"], ev["ckpt"].astype(np.int64, copy=False)
    part = ((kind == K_FILL) | (kind == K_COPY) | (kind == K_MMAP)) & (ids != 0)
    ck = ev[kind == K_CHECKPOINT]
    ck = ck[np.argsort(ck["ckpt"], kind="stable")]
    at = Ids(ck["ckpt"].astype(np.int64, copy=False)).find(ids)
    waiting = part & (at < 0)
    dur = ev["end_ns"].astype(np.int64) - ev["start_ns"].astype(np.int64)
    cpu = ev["cpu_ns"].astype(np.int64)  # CPU_UNKNOWN (2**64 - 1) becomes -1: not recorded
    n = len(ck)

    def summed(kind_code: int) -> dict[str, np.ndarray]:
        """Per checkpoint: rows of this kind, their wall and on-CPU time, faults, fault time, unmeasured parts."""
        rows = np.flatnonzero(part & (kind == kind_code) & ~waiting)
        g, f = Groups(at[rows], n), fault[rows]
        return {"n": g.count, "ns": g.sum(dur[rows]),
                "cpu_ns": np.where(g.any(cpu[rows] < 0), -1, g.sum(cpu[rows])),
                "faults": g.sum(ev["faults"][rows].astype(np.int64)),
                "fault_ns": g.sum(np.maximum(f, 0)), "missing": g.any(f < 0), "rows": rows}

    fill, copy, maps = summed(K_FILL), summed(K_COPY), summed(K_MMAP)
    mmaps, cr, mr = maps["n"], copy["rows"], maps["rows"]
    mapped = mapped_destination(at[cr], ev["addr"][cr], ev["bytes"][cr], at[mr], ev["addr"][mr], ev["bytes"][mr], n)
    total = ck["end_ns"].astype(np.int64) - ck["start_ns"].astype(np.int64)
    faults = ck["faults"].astype(np.int64)
    ck_cpu = ck["cpu_ns"].astype(np.int64)
    rules = checkpoint_rules(total, faults, copy["ns"], copy["faults"], fill["n"], fill["ns"], fill["faults"], mmaps,
                             ck["bytes"].astype(np.int64), mapped, fill_probed)
    fault_ns = np.where(fill["missing"] | copy["missing"] | (not fill_probed), -1, fill["fault_ns"] + copy["fault_ns"])
    fill_cpu = fill["cpu_ns"] if fill_probed else np.where((ck_cpu < 0) | (copy["cpu_ns"] < 0), -1,
                                                           ck_cpu - copy["cpu_ns"])
    clock = (lambda v: v.astype("float64")) if sched else (lambda v: np.full(n, -1.0))
    cols = {"total_ns": total, "fill_ns": rules["fill_ns"], "copy_ns": copy["ns"], "fault_ns": fault_ns,
            "cpu_ns": clock(ck_cpu), "wait_ns": clock(ck["wait_ns"]), "fill_cpu_ns": clock(fill_cpu),
            "copy_cpu_ns": clock(copy["cpu_ns"]), "bytes": ck["bytes"], "faults": faults,
            "pool_hit": rules["pool_hit"], "buffer": rules["buffer"], "fresh_bytes": rules["fresh_bytes"],
            "end_ns": ck["end_ns"]}
    kept = saved(copy["n"])
    return {c: (v[kept] if c in ("pool_hit", "buffer") else v[kept].astype("float64")) for c, v in cols.items()}, waiting


def _restores(ev: np.ndarray) -> tuple[int, np.ndarray]:
    """Checkpoint restores as analyze counts those of source "checkpoint" (core/rules.py
    `restored`, restore_table's rule: a load_tgt/load_dft span with a restore_copy inside it on its thread), and which
    rows wait: the copies no restore of this batch encloses (its row comes at its return, after
    them). A copy outside any restore (prompt cache, slot restore; analyze's source "other") waits
    until it is stale (_carry)."""
    kind = ev["kind"]
    copies = np.flatnonzero(kind == K_RESTORE_COPY)
    if not len(copies):
        return 0, np.zeros(len(ev), bool)
    spans, inner = ev[kind == K_RESTORE], ev[copies]
    waiting = np.zeros(len(ev), bool)
    waiting[copies[enclosing(inner, spans) < 0]] = True
    return int(restored(spans, inner).sum()), waiting


def _carry(ev: np.ndarray, fault: np.ndarray, waiting: np.ndarray) -> tuple | None:
    """The rows kept for the next batch: those waiting for the span they belong to, dropped after
    STALE_CARRY_NS (a checkpoint that never returned, a copy-in outside any restore)."""
    if not waiting.any():
        return None
    keep = waiting & (ev["end_ns"] > int(ev["end_ns"].max()) - STALE_CARRY_NS)
    return (ev[keep], fault[keep]) if keep.any() else None


class RunningMedian:
    """The median of every value seen, in bounded memory: counts in log-spaced bins (1 us to
    1000 s, 1.5% wide), the median read as its bin's geometric middle (within 0.75%)."""

    EDGES = np.geomspace(1e3, 1e12, 1393)  # ratio 1.015 per bin

    def __init__(self):
        self.counts = np.zeros(len(self.EDGES) + 1, dtype=np.int64)
        self.n = 0

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype="float64")
        v = v[v >= 0]
        if len(v):
            np.add.at(self.counts, np.searchsorted(self.EDGES, v, side="right"), 1)
            self.n += len(v)

    def median(self) -> float | None:
        """The middle value (the mean of the two middle ones for an even count), each read as its
        bin's geometric middle."""
        if not self.n:
            return None
        cum = np.cumsum(self.counts)
        ranks = (self.n + 1) // 2, self.n // 2 + 1  # 1-based; the same rank twice for an odd count
        return float(np.mean([self._middle(int(np.searchsorted(cum, r))) for r in ranks]))

    def _middle(self, i: int) -> float:
        lo = self.EDGES[i - 1] if i > 0 else 0.0
        hi = self.EDGES[i] if i < len(self.EDGES) else self.EDGES[-1]
        return float(np.sqrt(lo * hi)) if lo else float(hi) / 2
