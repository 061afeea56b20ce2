"""The Prometheus series of `ckptrace serve`: per-process checkpoint histograms, counters and gauges.

Events arrive in batches (live/session.py), folded per process by probes/fold.py (the fold `top`
and `record`'s status line share): each batch's checkpoints and restores computed by `analyze`'s
own rules, not a copy of them, and held memory by its own class, so a scrape and an analysis of
the same period agree (tests/test_serve.py). The series and their help text come from the metric table
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

from ckptrace.analyzers.metrics import METRICS
from ckptrace.probes.fold import ProcessFold

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
    "pool_hits": "Checkpoints whose buffer was reused and resident (no fill, the copy faulted nothing): pool hits.",
    "fresh_copy_bytes": "Bytes checkpoint copies wrote into pages they faulted in (no fill before them): on a CUDA "
                        "context, the slow pageable path (llama.cpp PR #201).",
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
    fold: ProcessFold  # carry, held buffers and their peak, kept across batches
    hists: dict[str, _Hist] = field(default_factory=lambda: {n: _Hist(h[2]) for n, h in HISTOGRAMS.items()})
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
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
            self._targets[(pid, start)] = _Target(labels, ProcessFold(fill_probed))

    def _live(self, pid: int) -> _Target | None:
        return next((t for (p, _), t in self._targets.items() if p == pid and t.ended_ns is None), None)

    def fold(self, pid: int, batch) -> None:
        """Add one batch of a process's events (live/session.py LiveBatch)."""
        t = self._live(pid)
        if t is None:
            return  # a process detached since (its last events come after it was served)
        folded = t.fold.fold(batch.events, batch.fault_ns, batch.sched_recorded)
        ck = folded.checkpoints
        with self._lock:
            for name, (col, scale, _, _) in HISTOGRAMS.items():
                v = ck[col]
                t.hists[name].observe(v[v >= 0] * scale)
            t.counters["checkpoints"] += len(ck["bytes"])
            t.counters["checkpoint_faults"] += int(ck["faults"].sum())
            t.counters["pool_hits"] += int(ck["pool_hit"].sum())
            t.counters["fresh_copy_bytes"] += int(ck["fresh_bytes"].sum())
            t.counters["restores"] += folded.restores
            folded.apply_held()

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
                     t.fold.buffers.held, t.fold.peak_bytes) for t in targets]
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

