"""The Prometheus series of `ckptrace serve`: per-process checkpoint histograms, counters and gauges.

Events arrive in batches (probes/live.py); each batch's checkpoints are computed with the
definitions of `analyze` (analyzers/checkpoints.py; held memory by analyzers/memory.py's own
class), so a scrape and an analysis of the same period agree (tests/test_serve.py). The series live in a custom collector (prometheus_client's documented pattern for values
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

from ckptrace.analyzers.memory import HeldBuffers
from ckptrace.trace import KINDS, PHASES

LABELS = ("pid", "label", "build_id")
PREFIX = "ckptrace_"
# Per-checkpoint durations: 10 us (a pool hit's bookkeeping) to 10 s (GiB of fresh pages).
SECONDS_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BYTES_BUCKETS = tuple(float(1 << (20 + 2 * k)) for k in range(8))  # 1 MiB .. 16 GiB, x4

# name (after the prefix) -> (checkpoint-table column, scale to base unit, buckets, help).
# Every series is per checkpoint; a checkpoint whose value was not recorded is not observed.
HISTOGRAMS = {
    "checkpoint_seconds": ("total_ns", 1e-9, SECONDS_BUCKETS,
                           "Wall time of each checkpoint (update_tgt/update_dft, entry to return)."),
    "checkpoint_fill_seconds": ("fill_ns", 1e-9, SECONDS_BUCKETS,
                                "Wall time zero-filling the checkpoint buffer's growth (vector resize), "
                                "page faults included; 0 for a pool hit."),
    "checkpoint_copy_seconds": ("copy_ns", 1e-9, SECONDS_BUCKETS,
                                "Wall time copying the state in (llama_state_seq_get_data_ext)."),
    "checkpoint_fault_seconds": ("fault_ns", 1e-9, SECONDS_BUCKETS,
                                 "On-CPU cost of the checkpoint's page faults (span on-CPU time minus "
                                 "the same work on resident pages), where measured (not observed where "
                                 "a fill or copy had faults that could not be measured)."),
    "checkpoint_cpu_seconds": ("cpu_ns", 1e-9, SECONDS_BUCKETS,
                               "The thread's on-CPU time during the checkpoint."),
    "checkpoint_wait_seconds": ("wait_ns", 1e-9, SECONDS_BUCKETS,
                                "Time the thread waited for a CPU (run queue) during the checkpoint."),
    "checkpoint_bytes": ("bytes", 1.0, BYTES_BUCKETS, "State bytes copied into each checkpoint."),
}
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
K_CHECKPOINT, K_FILL, K_COPY, K_MMAP, K_MUNMAP, K_RESTORE = (
    KINDS.index(k) for k in ("checkpoint", "fill", "copy", "mmap", "munmap", "restore"))
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
        restores = _restores(ev)
        if t.carry is not None:
            ev, fault = np.concatenate([t.carry[0], ev]), np.concatenate([t.carry[1], fault])
        ck, t.carry = _checkpoints(ev, fault, batch.sched_recorded, t.fill_probed)
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


def _checkpoints(ev: np.ndarray, fault: np.ndarray, sched: bool, fill_probed: bool = True) -> tuple[dict, tuple | None]:
    """Per checkpoint of the batch, as analyzers/checkpoints.py defines it (the test holds the
    two to each other): {column: float array, -1 = not recorded}, and the rows to carry.

    The same definitions in numpy rather than that module's pandas: its checkpoint table costs
    about 20 ms a call (docs/performance.md's serve overhead). A checkpoint is an update_tgt/update_dft row
    with at least one state copy; fill_ns/copy_ns the summed wall time of its fill/copy rows (0
    when none: a fill-less checkpoint is a pool hit); cpu/wait its own span's; fault_ns its
    fills' and copies' fault time summed, not recorded when any part was not measured (analyze
    estimates those; serve leaves them out). A build without a growth probe (`fill_probed`
    False) gets analyze's derived fill: the checkpoint minus its copies, its faults minus theirs,
    a pool hit when it neither faulted nor mapped memory, fault time not recorded. A
    checkpoint's row comes at its return, after its fills, copies and mmaps (one thread, one ring
    buffer: in order), so a batch may end between them: those rows wait for it, dropped after
    STALE_CARRY_NS (a checkpoint that never returned)."""
    kind, ids = ev["kind"], ev["ckpt"]
    part = ((kind == K_FILL) | (kind == K_COPY) | (kind == K_MMAP)) & (ids != 0)
    ck = ev[kind == K_CHECKPOINT]
    waiting = part & ~np.isin(ids, ck["ckpt"])
    carry = None
    if waiting.any():
        keep = waiting & (ev["end_ns"] > int(ev["end_ns"].max()) - STALE_CARRY_NS)
        carry = (ev[keep], fault[keep]) if keep.any() else None
    ck = ck[np.argsort(ck["ckpt"], kind="stable")]
    ck_ids = ck["ckpt"]
    dur = (ev["end_ns"] - ev["start_ns"]).astype("float64")

    def summed(kind_code: int) -> dict[str, np.ndarray]:
        """Per checkpoint: rows of this kind, their wall time, faults, fault time, unmeasured parts."""
        rows = part & (kind == kind_code) & ~waiting
        pos = np.searchsorted(ck_ids, ids[rows])
        f = fault[rows]
        out = {}
        for name, v in (("n", 1.0), ("ns", dur[rows]), ("faults", ev["faults"][rows].astype("float64")),
                        ("fault_ns", np.maximum(f, 0).astype("float64")), ("missing", (f < 0).astype("float64"))):
            out[name] = np.zeros(len(ck_ids))
            np.add.at(out[name], pos, v)
        return out

    fill, copy, mmaps = summed(K_FILL), summed(K_COPY), summed(K_MMAP)["n"]
    total = (ck["end_ns"] - ck["start_ns"]).astype("float64")
    faults = ck["faults"].astype("float64")
    if fill_probed:
        fill_ns, pool_hit = fill["ns"], fill["n"] == 0
        fault_ns = np.where((fill["missing"] + copy["missing"]) > 0, -1.0, fill["fault_ns"] + copy["fault_ns"])
    else:
        fill_ns = np.maximum(total - copy["ns"], 0)
        pool_hit = (np.maximum(faults - copy["faults"], 0) == 0) & (mmaps == 0)
        fault_ns = np.full(len(ck), -1.0)  # the fill's own fault time is not measured
    saved = copy["n"] > 0  # an update that copied no state saved nothing: not a checkpoint
    clock = (lambda c: ck[c].astype("float64")) if sched else (lambda c: np.full(len(ck), -1.0))
    cols = {"total_ns": total, "fill_ns": fill_ns, "copy_ns": copy["ns"], "fault_ns": fault_ns,
            "cpu_ns": clock("cpu_ns"), "wait_ns": clock("wait_ns"), "bytes": ck["bytes"].astype("float64"),
            "faults": faults, "pool_hit": pool_hit}
    return {c: v[saved] for c, v in cols.items()}, carry


def _restores(ev: np.ndarray) -> int:
    """Checkpoint restores as analyzers/state_path.py counts those of source "checkpoint": a
    load_tgt/load_dft span that copied state in (its bytes are its copies'). A copy-in outside
    any restore (prompt cache, slot restore; analyze's source "other") is not counted: telling it
    from a restore's own copy takes the enclosing span, which may come in a later batch."""
    return int(((ev["kind"] == K_RESTORE) & (ev["bytes"] > 0)).sum())


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
