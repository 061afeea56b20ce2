"""The Prometheus series of `ckptrace serve`: per-process checkpoint histograms, counters and gauges.

Events arrive in batches (probes/live.py); each batch's checkpoints and restores are computed
by `analyze`'s own rules, not a copy of them: analyzers/checkpoints.py's `saved` and
`checkpoint_rules` over per-checkpoint sums made with analyzers/spans.py's `Ids` and `Groups`
(numpy: the pandas table would cost about 20 ms a batch), analyzers/state_path.py's `restored`,
and held memory by analyzers/memory.py's own class, so a scrape and an analysis of the same
period agree (tests/test_serve.py). The series and their help text come from the metric table
(analyzers/metrics.py). The series live in a custom collector (prometheus_client's documented pattern for values
kept elsewhere): a scrape reads a snapshot under a lock, and a process that exited is served one
last time, with its final values, then its series end.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ckptrace.buffers import HeldBuffers
from ckptrace.columns import KINDS, PHASES
from ckptrace.analyzers.checkpoints import checkpoint_rules, saved
from ckptrace.analyzers.metrics import METRICS
from ckptrace.analyzers.spans import Groups, Ids
from ckptrace.analyzers.state_path import enclosing, restored

LABELS = ("pid", "label", "build_id")
PREFIX = "ckptrace_"
# Per-checkpoint durations: 10 us (a pool hit's bookkeeping) to 10 s (GiB of fresh pages).
SECONDS_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BYTES_BUCKETS = tuple(float(1 << (20 + 2 * k)) for k in range(8))  # 1 MiB .. 16 GiB, x4

# name (after the prefix) -> (checkpoint-table column, scale to base unit, buckets, help): every
# metric of the table (analyzers/metrics.py) with a `series`. Each is per checkpoint; a
# checkpoint whose value was not recorded is not observed.
HISTOGRAMS = {m.series: (m.columns[0], 1e-9 if m.unit == "ns" else 1.0,
                         SECONDS_BUCKETS if m.unit == "ns" else BYTES_BUCKETS, m.help)
              for m in METRICS.values() if m.series}
# name (the _total suffix is added by the exposition) -> help
COUNTERS = {
    "checkpoints": "Checkpoints saved (update_tgt/update_dft calls that copied state).",
    "checkpoint_faults": "Page faults (minor + major) taken inside checkpoints.",
    "pool_hits": "Checkpoints whose buffer did not need to grow (no fill): served by a pool.",
    "restores": "Checkpoint restores: load_tgt/load_dft calls that copied state in (analyze's restores of "
                "source checkpoint), where the build has the probes.",
}
# Exporter-wide, no labels: one ring buffer serves every process, so a drop is nobody's in particular.
LOST = ("lost_events", "Events the kernel side dropped, every process together (ring buffer or "
                       "per-thread map full): the other series undercount when this grows.")
GAUGES = {
    "checkpoint_memory_held_bytes": "Bytes in checkpoint buffers: mapped while a checkpoint was being made, "
                                    "not yet unmapped (as analyze's memory; since ckptrace attached).",
    "checkpoint_memory_peak_bytes": "High-water mark of checkpoint_memory_held_bytes since ckptrace attached.",
}
STALE_CARRY_NS = 60_000_000_000  # a fill/copy whose checkpoint never returned (an exception) is dropped
K_CHECKPOINT, K_FILL, K_COPY, K_MMAP, K_MUNMAP, K_RESTORE, K_RESTORE_COPY = (
    KINDS.index(k) for k in ("checkpoint", "fill", "copy", "mmap", "munmap", "restore", "restore_copy"))
SYSCALL_KINDS = [KINDS.index(k) for k in ("mmap", "munmap", "mremap")]


def series_names() -> set[str]:
    """Every series name a scrape can hold (histograms with their _bucket, _sum and _count)."""
    names = {f"{PREFIX}{n}{s}" for n in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
    names |= {f"{PREFIX}{n}_total" for n in [*COUNTERS, LOST[0]]}
    names |= {f"{PREFIX}{n}" for n in GAUGES}
    return names


@dataclass
class _Hist:
    buckets: tuple[float, ...]
    counts: np.ndarray = None  # per bucket, last one +Inf; not cumulative
    total: float = 0.0

    def __post_init__(self):
        self.counts = np.zeros(len(self.buckets) + 1, dtype=np.int64)

    def observe(self, values: np.ndarray) -> None:
        idx = np.searchsorted(np.asarray(self.buckets), values, side="left")  # le: value <= bound
        np.add.at(self.counts, idx, 1)
        self.total += float(values.sum())

    def exposed(self) -> tuple[list[tuple[str, float]], float]:
        cum = np.cumsum(self.counts)
        les = [repr(float(b)) for b in self.buckets] + ["+Inf"]
        return list(zip(les, cum.astype(float).tolist())), self.total


@dataclass
class _Target:
    labels: tuple[str, str, str]
    fill_probed: bool = True
    hists: dict[str, _Hist] = field(default_factory=lambda: {n: _Hist(h[2]) for n, h in HISTOGRAMS.items()})
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    buffers: HeldBuffers = field(default_factory=HeldBuffers)  # analyzers/memory.py's rule, kept across batches
    peak_bytes: int = 0
    carry: tuple | None = None  # (rows, fault_ns) of fills/copies/mmaps whose checkpoint has not returned yet
    ended_ns: int | None = None  # when its process exited; served once more after that
    scraped_after_end: bool = False


class CheckpointMetrics(Collector):
    """Per-process series, folded from event batches; thread-safe against the HTTP thread.

    A process is (pid, start time): a pid the kernel gives to a new process after the old one
    exited is a new process. The kernel side matches one process per pid at a time, so events
    (which carry the pid only) go to the one not yet ended."""

    def __init__(self):
        self._lock = threading.Lock()
        self._targets: dict[tuple[int, int | None], _Target] = {}
        self._lost = 0

    def add(self, pid: int, label: str, build_id: str, fill_probed: bool = True, start: int | None = None) -> None:
        """A process to serve (`start`: its start time); `fill_probed` False: its build has no
        growth probe (derived fill). An ended process with the same pid and labels is dropped
        now: the two would be one series (the new one starts as a counter reset)."""
        labels = (str(pid), label, build_id or "")
        with self._lock:
            for key in [k for k, t in self._targets.items() if t.labels == labels and t.ended_ns is not None]:
                del self._targets[key]
            self._targets[(pid, start)] = _Target(labels, fill_probed=fill_probed)

    def _live(self, pid: int) -> _Target | None:
        return next((t for (p, _), t in self._targets.items() if p == pid and t.ended_ns is None), None)

    def fold(self, pid: int, batch) -> None:
        """Add one batch of a process's events (probes/live.py LiveBatch)."""
        t = self._live(pid)
        if t is None:
            return  # a process detached since (its last events come after it was served)
        ev, fault = batch.events, batch.fault_ns
        held = _held_changes(t, ev)  # on the new rows only: carried mmaps were applied when they came
        if t.carry is not None:
            ev, fault = np.concatenate([t.carry[0], ev]), np.concatenate([t.carry[1], fault])
        ck, waiting = _checkpoints(ev, fault, batch.sched_recorded, t.fill_probed)
        restores, copies_waiting = _restores(ev)
        t.carry = _carry(ev, fault, waiting | copies_waiting)
        with self._lock:
            for name, (col, scale, _, _) in HISTOGRAMS.items():
                v = ck[col]
                t.hists[name].observe(v[v >= 0] * scale)
            t.counters["checkpoints"] += len(ck["bytes"])
            t.counters["checkpoint_faults"] += int(ck["faults"].sum())
            t.counters["pool_hits"] += int(ck["pool_hit"].sum())
            t.counters["restores"] += restores
            held()

    def set_lost(self, lost: int) -> None:
        """The kernel's count of dropped events, every process together (one ring buffer)."""
        with self._lock:
            self._lost = max(self._lost, int(lost))

    def end(self, pid: int) -> None:
        """The process exited: its series are served at one more scrape, then removed."""
        with self._lock:
            t = self._live(pid)
            if t is not None:
                t.ended_ns = time.monotonic_ns()

    def expire(self, linger_ns: int) -> list[tuple[int, int | None]]:
        """Remove ended processes already scraped once since, or ended more than linger_ns ago."""
        now = time.monotonic_ns()
        with self._lock:
            gone = [key for key, t in self._targets.items() if t.ended_ns is not None
                    and (t.scraped_after_end or now - t.ended_ns > linger_ns)]
            for key in gone:
                del self._targets[key]
        return gone

    def pids(self) -> list[tuple[int, int | None]]:
        """The processes served, as (pid, start time)."""
        with self._lock:
            return list(self._targets)

    def collect(self):
        with self._lock:
            targets = list(self._targets.values())
            for t in targets:
                if t.ended_ns is not None:
                    t.scraped_after_end = True
            snap = [(t.labels, {n: h.exposed() for n, h in t.hists.items()}, dict(t.counters),
                     t.buffers.held, t.peak_bytes) for t in targets]
            lost = self._lost
        for name, (_, _, _, doc) in HISTOGRAMS.items():
            fam = HistogramMetricFamily(PREFIX + name, doc, labels=LABELS)
            for labels, hists, *_ in snap:
                buckets, total = hists[name]
                fam.add_metric(labels, buckets, total)
            yield fam
        for name, doc in COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + name, doc, labels=LABELS)
            for labels, _, counters, *_ in snap:
                fam.add_metric(labels, counters[name])
            yield fam
        fam = CounterMetricFamily(PREFIX + LOST[0], LOST[1])
        fam.add_metric([], lost)
        yield fam
        for name, doc in GAUGES.items():
            fam = GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)
            for labels, _, _, held, peak in snap:
                fam.add_metric(labels, held if name.endswith("held_bytes") else peak)
            yield fam


def _checkpoints(ev: np.ndarray, fault: np.ndarray, sched: bool, fill_probed: bool = True
                 ) -> tuple[dict, np.ndarray]:
    """Per checkpoint of the batch, by analyze's rules (analyzers/checkpoints.py `saved` and
    `checkpoint_rules`, on sums made with analyzers/spans.py's Ids and Groups): {column: float
    array, -1 = not recorded}, and which rows wait for their checkpoint (see _carry).

    fill_ns/copy_ns are the summed wall time of its fill/copy rows; cpu/wait its own span's;
    fault_ns its fills' and copies' fault time summed, not recorded when any part was not
    measured (analyze estimates those; serve leaves them out), nor for a derived fill (no growth
    probe: `fill_probed` False). A checkpoint's row comes at its return, after its fills, copies
    and mmaps (one thread, one ring buffer: in order), so a batch may end between them."""
    kind, ids = ev["kind"], ev["ckpt"].astype(np.int64, copy=False)
    part = ((kind == K_FILL) | (kind == K_COPY) | (kind == K_MMAP)) & (ids != 0)
    ck = ev[kind == K_CHECKPOINT]
    ck = ck[np.argsort(ck["ckpt"], kind="stable")]
    at = Ids(ck["ckpt"].astype(np.int64, copy=False)).find(ids)
    waiting = part & (at < 0)
    dur = ev["end_ns"].astype(np.int64) - ev["start_ns"].astype(np.int64)
    n = len(ck)

    def summed(kind_code: int) -> dict[str, np.ndarray]:
        """Per checkpoint: rows of this kind, their wall time, faults, fault time, unmeasured parts."""
        rows = np.flatnonzero(part & (kind == kind_code) & ~waiting)
        g, f = Groups(at[rows], n), fault[rows]
        return {"n": g.count, "ns": g.sum(dur[rows]), "faults": g.sum(ev["faults"][rows].astype(np.int64)),
                "fault_ns": g.sum(np.maximum(f, 0)), "missing": g.any(f < 0)}

    fill, copy, mmaps = summed(K_FILL), summed(K_COPY), summed(K_MMAP)["n"]
    total = ck["end_ns"].astype(np.int64) - ck["start_ns"].astype(np.int64)
    faults = ck["faults"].astype(np.int64)
    rules = checkpoint_rules(total, faults, copy["ns"], copy["faults"], fill["n"], fill["ns"], fill["faults"], mmaps,
                             fill_probed)
    fault_ns = np.where(fill["missing"] | copy["missing"] | (not fill_probed), -1, fill["fault_ns"] + copy["fault_ns"])
    clock = (lambda c: ck[c].astype("float64")) if sched else (lambda c: np.full(n, -1.0))
    cols = {"total_ns": total, "fill_ns": rules["fill_ns"], "copy_ns": copy["ns"], "fault_ns": fault_ns,
            "cpu_ns": clock("cpu_ns"), "wait_ns": clock("wait_ns"), "bytes": ck["bytes"], "faults": faults,
            "pool_hit": rules["pool_hit"]}
    kept = saved(copy["n"])
    return {c: (v[kept] if c == "pool_hit" else v[kept].astype("float64")) for c, v in cols.items()}, waiting


def _restores(ev: np.ndarray) -> tuple[int, np.ndarray]:
    """Checkpoint restores as analyze counts those of source "checkpoint" (analyzers/state_path.py
    `restored`: a load_tgt/load_dft span with a restore_copy inside it on its thread), and which
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


def _held_changes(t: _Target, events: np.ndarray):
    """Checkpoint memory from the batch's mmap/munmap/mremap rows, by analyzers/memory.py's rule
    (a mapping made while a checkpoint was being made is held until unmapped); returns the update
    to apply under the lock. Rows in that module's order: a mapping exists from the mmap's return,
    an munmap's pages go at its entry."""
    sc = events[np.isin(events["kind"], SYSCALL_KINDS)]
    t_ns = np.where(sc["kind"] == K_MUNMAP, sc["start_ns"], sc["end_ns"])
    sc = sc[np.argsort(t_ns, kind="stable")]
    rows = [(KINDS[k], PHASES[p], a, b, oa, ob) for k, p, a, b, oa, ob in
            zip(sc["kind"].tolist(), sc["phase"].tolist(), sc["addr"].tolist(), sc["bytes"].tolist(),
                sc["old_addr"].tolist(), sc["old_bytes"].tolist())]

    def apply():
        for kind, phase, addr, nbytes, old_addr, old_bytes in rows:
            if t.buffers.step(kind, phase, addr, nbytes, old_addr, old_bytes)[0]:
                t.peak_bytes = max(t.peak_bytes, t.buffers.held)
    return apply
