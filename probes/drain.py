"""The ring buffer drained while recording: raw events into one batch on the stream every
FLUSH_S (no pandas), running counts and medians for the status line, the per-fault programs
switched per slice, and when to stop (a signal, --duration, the targets gone, the disk full)."""
from __future__ import annotations

import array
import ctypes
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ckptrace.core.columns import GPU_COLUMNS, KINDS, OPTIONAL, PHASES, arrow_array, arrow_schema, category_array
from ckptrace.core.stream import Recording, StreamFull
from ckptrace.probes import fault_time
from ckptrace.probes.fold import ProcessFold, RunningMedian
from ckptrace.probes.launch import HeldChild
from ckptrace.probes.loader import C_LOST, C_MAP_FULL, C_THREADS_PEAK, C_ABANDONED, C_PARTIAL, C_THREADS_PRUNED, C_THREADS_SEEN
from ckptrace.probes.machine import MachineSampler
from ckptrace.probes.messages import say, to_stderr
from ckptrace.probes.stop import STOP_SIGNALS

if TYPE_CHECKING:
    from ckptrace.probes.record_session import RecordOptions
    from ckptrace.probes.targets import Targets

SCHED_COLUMNS = ("cpu_ns", "wait_ns", "nvcsw", "nivcsw")
CPU_UNKNOWN = 2**64 - 1  # checkpoint.bpf.c: a span's cpu_ns read wrong, written as null (unknown)
K_CHECKPOINT, K_ITERATION = KINDS.index("checkpoint"), KINDS.index("iteration")
K_FILL, K_COPY = KINDS.index("fill"), KINDS.index("copy")
GPU_KINDS = [KINDS.index(k) for k in ("copy", "restore_copy")]  # rows the GPU columns belong to
SYSCALL_KINDS = [KINDS.index(k) for k in ("mmap", "munmap", "mremap", "rss")]  # instants: no span counters
SLICE_S = 0.25  # fault timing is on for one slice of this length in every --fault-sample slices
FAULT_PROGRAMS = (("rss_stat", "fault_accounted"), ("page_fault_user", "fault_enter"))  # attach order
POLL_S = 0.1  # drain period; events are submitted without wakeups (2 MiB of ring: 130k events/s)
SLICE_POLL_S = 0.05  # with --fault-sample: the timed slices' edges are this exact
FLUSH_S = 0.5  # a batch goes to disk at least this often (what a killed recorder can lose)


class Drain:
    """Ring buffer consumer: raw events until the next flush, running counts and aggregates for
    the status line and the stop, knows when to stop. Holds no more than one flush of events."""

    def __init__(self, bpf, opts: RecordOptions, sched_recorded: bool, out: Recording | None = None,
                 gpu: bool = False, fill_probed: dict[int, bool] | None = None):
        self.bpf = bpf
        self.sched_recorded = sched_recorded
        self.opts = opts
        self.out = out
        self.schema = arrow_schema(gpu=gpu)
        self.layout = bpf[b"event_layout"].Leaf
        self.dtype = np.dtype(self.layout)
        self.kind_off = self.layout.kind.offset
        self.faults_off = self.layout.faults.offset
        self.chunks: list[bytes] = []
        self.counts = np.zeros(len(KINDS), dtype=np.int64)
        self.ckpt_faults = 0
        self.rows = 0  # events on disk
        self.dropped = 0  # events not written (disk full)
        self.first_ns: int | None = None
        self.batch_min_start = array.array("q")  # per batch on disk: its earliest start_ns
        self.sizes = fault_time.SizeSketch()
        self.threads_peak = 0
        self.full: StreamFull | None = None
        self.unwritten: list[pa.RecordBatch] = []  # what the full disk did not take
        self.last_flush = time.monotonic()
        self.stop_reason: str | None = None
        self.tty = opts.status and sys.stderr.isatty()
        self.fault_on = False
        self.fault_slices = 0
        self.status_drawn = False
        self.machine = MachineSampler([])  # record() gives it the targets (probes/machine.py)
        # The status line's running medians: each process's checkpoints folded as serve folds them.
        self.fill_probed = fill_probed or {}
        self.folds: dict[int, ProcessFold] = {}
        self.median = {"fill_ns": RunningMedian(), "copy_ns": RunningMedian()}
        bpf[b"events"].open_ring_buffer(self._on_event)

    def _on_event(self, ctx, data, size):
        raw = ctypes.string_at(data, size)
        self.chunks.append(raw)
        kind = int.from_bytes(raw[self.kind_off:self.kind_off + 4], "little")
        if kind < len(self.counts):
            self.counts[kind] += 1
        if kind == K_CHECKPOINT:
            self.ckpt_faults += int.from_bytes(raw[self.faults_off:self.faults_off + 8], "little")
        return 0

    def request_stop(self, signum, frame):
        self.stop_reason = STOP_SIGNALS.get(signum, "terminated")

    def set_fault_timing(self, on: bool) -> None:
        """Attach or detach the per-fault programs: their cost is paid only while attached."""
        if on == self.fault_on:
            return
        for tp, fn in (FAULT_PROGRAMS if on else reversed(FAULT_PROGRAMS)):
            if on:
                self.bpf.attach_raw_tracepoint(tp=tp.encode(), fn_name=fn.encode())
            else:
                self.bpf.detach_raw_tracepoint(tp=tp.encode())
        self.fault_on = on
        self.fault_slices += on

    def run(self, child: HeldChild | None, targets: Targets) -> str:
        t0 = time.monotonic()
        last_status = 0.0
        hinted = False
        every = self.opts.fault_sample
        while True:
            if every:
                self.set_fault_timing(int((time.monotonic() - t0) / SLICE_S) % every == 0)
            time.sleep(SLICE_POLL_S if every else POLL_S)
            self.bpf.ring_buffer_consume()
            now = time.monotonic()
            if now - self.last_flush >= FLUSH_S:
                self.flush()
                for t in targets:  # a process may move to another cgroup after it starts (a wrapper)
                    if t.ended_ns is None:
                        t.read_memory()
                self.machine.sample()
                if self.full:
                    return "disk full"
            if self.stop_reason:
                return self.stop_reason
            if self.opts.duration_s and now - t0 >= self.opts.duration_s:
                return "duration"
            if (child.poll() is not None) if child else not targets.any_alive():
                return "target exited"
            if self.tty and now - last_status >= 0.5:
                self.draw_status(now - t0)
                last_status = now
            if not hinted and self.counts[K_CHECKPOINT] == 0 and now - t0 >= self.opts.no_checkpoint_hint_s:
                hinted = True
                self.clear_status()
                say(f"ckptrace: no checkpoint seen in {self.opts.no_checkpoint_hint_s:g} s: only models "
                    "with recurrent state or SWA make them, checkpoints may be disabled "
                    "(--ctx-checkpoints 0), or no prompt has been processed yet")

    def counters(self) -> list[int]:
        return [int(v.value) for v in self.bpf[b"counters"].values()]

    def progress(self) -> dict:
        """The kernel's counters now, as the trace's metadata names them."""
        c = self.counters()
        self.threads_peak = max(self.threads_peak, c[C_THREADS_PEAK])
        return {"lost_events": c[C_LOST], "partial_spans": c[C_PARTIAL], "abandoned_spans": c[C_ABANDONED],
                "map_full": c[C_MAP_FULL], "threads_seen": c[C_THREADS_SEEN],
                "threads_pruned": c[C_THREADS_PRUNED], "threads_peak": self.threads_peak,
                "events": self.rows}

    def flush(self) -> None:
        """The events since the last flush, as one batch on disk (none if there were none)."""
        self.last_flush = time.monotonic()
        if not self.chunks:
            return
        arr = np.frombuffer(b"".join(self.chunks), dtype=self.dtype)
        self.chunks = []
        arr = arr[np.lexsort((arr["end_ns"], arr["start_ns"]))]
        batch = self.batch(arr)
        kind = arr["kind"]
        self.sizes.add(arr["bytes"][((kind == K_FILL) | (kind == K_COPY)) & (arr["faults"] > 0)])
        if self.tty:
            self._fold(arr)
        first = int(arr["start_ns"][0])
        self.batch_min_start.append(first)
        self.first_ns = first if self.first_ns is None else min(self.first_ns, first)
        if not self.full:
            try:
                self.out.writer.append(batch, {**self.progress(), "events": self.rows + len(arr)})
                self.rows += len(arr)
                return
            except StreamFull as e:
                self.full = e
        self.unwritten.append(batch)  # for a rescue copy: at most this flush and the final drain
        self.dropped += len(arr)

    def batch(self, arr: np.ndarray) -> pa.RecordBatch:
        """Kernel events (sorted) as a record batch of the trace's columns, straight from the
        array (no DataFrame, no pandas: this runs twice a second for as long as the recording lasts)."""
        n = len(arr)
        kind = arr["kind"].astype("int8")
        not_span = np.isin(kind, SYSCALL_KINDS) | (not self.sched_recorded)
        cols = []
        for field in self.schema:
            name, t = field.name, field.type
            if pa.types.is_dictionary(t):
                cols.append(category_array(kind if name == "kind" else arr[name].astype("int8"),
                                           KINDS if name == "kind" else PHASES))
            elif name == "cpu_ns":
                cols.append(arrow_array(arr[name], t, mask=not_span | (arr[name] == CPU_UNKNOWN)))
            elif name in SCHED_COLUMNS:
                cols.append(arrow_array(arr[name], t, mask=not_span))
            elif name in GPU_COLUMNS:  # the event's field of the same name; NA but on state copy rows
                cols.append(arrow_array(arr[name], t, mask=~np.isin(kind, GPU_KINDS)))
            elif name in arr.dtype.names:
                cols.append(arrow_array(arr[name], t))
            elif name in OPTIONAL:
                cols.append(pa.nulls(n, t))  # fault_ns: filled in when the trace is finished
            else:
                cols.append(arrow_array(np.zeros(n, dtype="int64"), t))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def _fold(self, arr: np.ndarray) -> None:
        """The batch's checkpoints into the running medians of fill and copy (wall time)."""
        pids = arr["pid"]
        for pid in np.unique(pids).tolist():
            fold = self.folds.setdefault(pid, ProcessFold(self.fill_probed.get(pid, True)))
            rows = arr[pids == pid]
            ck = fold.fold(rows, np.full(len(rows), -1, dtype=np.int64), self.sched_recorded).checkpoints
            for col, med in self.median.items():
                med.add(ck[col])

    def draw_status(self, elapsed: float) -> None:
        c = self.counters()
        fill, copy = (m.median() for m in self.median.values())
        medians = (f"fill {fill / 1e6:.3g} copy {copy / 1e6:.3g} ms p50" if fill is not None
                   else "fill - copy - ms p50")
        seen = f"{elapsed:7.1f} s  checkpoints {self.counts[K_CHECKPOINT]}  {medians}  "
        rest = f"iterations {self.counts[K_ITERATION]}  checkpoint faults {self.ckpt_faults}"
        # A full thread map is never silent: it comes before what the 79 columns might cut.
        text = (seen + f"lost {c[C_LOST]}  map full {c[C_MAP_FULL]}  {rest}" if c[C_MAP_FULL]
                else seen + f"lost {c[C_LOST]}  {rest}")
        to_stderr("\r" + text[:79].ljust(79))
        self.status_drawn = True

    def clear_status(self) -> None:
        if self.status_drawn:
            to_stderr("\r" + " " * 79 + "\r")
            self.status_drawn = False

    def drain(self) -> None:
        self.bpf.ring_buffer_consume()

    def open_spans(self) -> tuple[int, int]:
        states = list(self.bpf[b"threads"].values())
        return sum(1 for s in states if s.ckpt), sum(1 for s in states if s.iter)
