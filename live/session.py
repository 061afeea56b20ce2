"""Live events for `ckptrace serve`: the recorder's BPF program on running processes, in batches.

Nothing here is a second copy of the recorder: the program, its load, the probe resolution and
the attach order are probes/loader.py's. What this adds is
the long-running side: each batch is handed over and forgotten (memory stays flat), a span's
fault time is computed as it arrives (probes/fault_time.py's rule and resident-time model, the
calibration kept per size), and a process can be detached while the others go on.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ckptrace.core.columns import KINDS
from ckptrace.core.errors import CkptraceError, TargetError
from ckptrace.core.heap import return_freed_memory
from ckptrace.probes import drain, fault_time, kernel, loader
from ckptrace.probes.record_session import RecordOptions
from ckptrace.probes.targets import Targets, resolve_process
from ckptrace.probes.target import alive, process_of
from ckptrace.core.terminal import printable

MAX_CAL_SIZES = 32  # distinct span sizes calibrated; past this, resident time is interpolated


@dataclass
class LiveTarget:
    """One attached process and what identifies it in the metrics."""
    pid: int
    comm: str
    executable: str
    build_id: str
    probes: int  # uprobes attached
    plan: object = field(repr=False)  # plan.ProbePlan
    start: int | None = None  # its start time: (pid, start) names it, a reused pid does not

    @property
    def key(self) -> tuple[int, int | None]:
        return self.pid, self.start

    def alive(self) -> bool:
        """Running, and still this process (not a later one given its pid)."""
        return alive(self.pid, self.start)


@dataclass
class LiveBatch:
    """Events of every attached process since the last batch, as the kernel wrote them (struct
    ckpt_event; its `pid` field says whose)."""
    events: np.ndarray
    fault_ns: np.ndarray  # per row, fault_time.py's rule; -1 where not measured
    sched_recorded: bool  # cpu_ns/wait_ns hold the thread's clocks (else 0: not recorded)

    def by_pid(self) -> dict[int, LiveBatch]:
        pids = self.events["pid"]
        return {int(p): LiveBatch(self.events[pids == p], self.fault_ns[pids == p], self.sched_recorded)
                for p in np.unique(pids)}


class LiveProbes:
    """One load of the recorder's program for every process (its kernel `targets` map says which);
    processes are attached and detached while it runs, and its events drained on demand."""

    def __init__(self, ringbuf_pages: int = 512, status: bool = False, preload: bool = True,
                 compile_line: bool = False):
        """`preload` False: each program is verified when first attached, not all now (a caller
        that attaches its processes at once: about a quarter of a second less to start).
        `compile_line`: a compile is said in a line off a terminal too (top)."""
        # The recorder's machine checks, minus its output file: a failure is one line, before anything attaches.
        loader.machine_checks()
        # No RSS rows: serve has no series for them (the recorder's kmem:rss_stat program is left out).
        self.opts = RecordOptions(output=Path(os.devnull), ringbuf_pages=ringbuf_pages, status=status,
                                  rss_step_mib=0, compile_line=compile_line)
        self.bpf = loader.load_program(Targets([]), self.opts, preload=preload)
        self.sched_recorded = self.bpf.sched.recorded
        # The ring buffer's records as they come (the recorder's drain also streams them to its
        # file; serve only needs the bytes): the record layout from the compiler, as the recorder.
        self.dtype = np.dtype(self.bpf[b"event_layout"].Leaf)
        self.chunks: list[bytes] = []
        self.bpf[b"events"].open_ring_buffer(self._on_event)
        self.calibration: dict[str, list[list[int]]] = {"fill": [], "copy": []}

    def attach(self, pid: int) -> LiveTarget:
        """Resolve the probe points in the live process and attach; a CkptraceError (TargetError,
        SymbolError, EbpfUnavailable) when it can't, also when it exits meanwhile, and nothing
        of it left attached."""
        if len(self.bpf[b"targets"]) >= loader.MAX_TARGETS:  # said before its symbols are read
            raise TargetError(f"PID {pid}: serve follows at most {loader.MAX_TARGETS} processes at once")
        t = resolve_process(process_of(pid)[0])
        kernel.open_files_for(loader.uprobe_count(t.plan, gpu=False), f"PID {t.pid}")
        loader.trace_process(self.bpf, t.pid, t.plan)
        try:
            attached, _ = loader.attach_probes(self.bpf, t.plan, t.pid, t.start, gpu=False)  # no CUDA series
        except BaseException:
            self._forget(t.pid)
            raise
        return_freed_memory()  # the symbol tables read to resolve it
        return LiveTarget(t.pid, printable(t.comm), t.plan.target, t.build_id or "", attached, t.plan, t.start)

    def batch(self) -> LiveBatch | None:
        """Every event since the last batch, in the kernel's own layout (a numpy record array:
        no DataFrame per batch, see docs/performance.md's serve overhead), with each span's fault time; None
        when there was none."""
        self.bpf.ring_buffer_consume()
        if not self.chunks:
            return None
        events = np.frombuffer(b"".join(self.chunks), dtype=self.dtype)
        self.chunks = []
        return LiveBatch(events, self._fault_ns(events), self.sched_recorded)

    def _on_event(self, ctx, data, size) -> int:
        self.chunks.append(ctypes.string_at(data, size))
        return 0

    def lost(self) -> int:
        """Events the kernel dropped so far, every process together (ring buffer or map full)."""
        counters = self.bpf[b"counters"]
        return sum(int(counters[counters.Key(c)].value) for c in (loader.C_LOST, loader.C_MAP_FULL))

    def detach(self, target: LiveTarget) -> None:
        """Stop matching its pid (it may be reused) and remove its probes. In this thread: bcc is
        not safe to call from two (a detach in a thread beside the drain crashed the interpreter)."""
        self._forget(target.pid)

    def close(self) -> None:
        self.bpf.cleanup()  # closes the uprobes from 32 threads (bpf_runtime.Program._close_uprobes)

    def _forget(self, pid: int) -> None:
        loader.untrace_process(self.bpf, pid)
        self.bpf.detach_process(pid)

    def _fault_ns(self, ev: np.ndarray) -> np.ndarray:
        """fault_time.py's rule per fill/copy row (cpu_ns minus the resident time of the same
        bytes, where that is at most RESIDENT_MAX_SHARE of it; 0 without faults), -1 where not
        measured; each new span size is calibrated once (at most MAX_CAL_SIZES)."""
        out = np.full(len(ev), -1, dtype=np.int64)
        if not self.sched_recorded:
            return out
        kind, faults = ev["kind"], ev["faults"]
        out[faults == 0] = 0
        for name in ("fill", "copy"):
            rows = np.flatnonzero((kind == KINDS.index(name)) & (faults > 0))
            if not len(rows):
                continue
            self._calibrate(ev["bytes"][rows])
            cpu = ev["cpu_ns"][rows].astype("float64")
            resident = fault_time.resident_ns(self.calibration[name], ev["bytes"][rows])
            ok = (resident <= fault_time.RESIDENT_MAX_SHARE * cpu) & (ev["cpu_ns"][rows] != drain.CPU_UNKNOWN)
            out[rows[ok]] = np.round(cpu[ok] - resident[ok]).astype(np.int64)
        return out

    def _calibrate(self, sizes: np.ndarray) -> None:
        known = {s for s, _ in self.calibration["fill"]}
        new = [s for s in fault_time.calibration_sizes(sizes) if s not in known]
        new = new[:max(0, MAX_CAL_SIZES - len(known))]
        if new:
            cal = fault_time.calibrate(new)
            for kind in ("fill", "copy"):
                self.calibration[kind] = sorted(self.calibration[kind] + cal[kind])


def attach_given(pids, attach, note, doing: str, verb: str) -> None:
    """--pid's processes, each attached with attach(pid) (serve's and top's rule): one that exited
    while being attached is one note ("not {doing} PID ...") and the others are followed, unless
    it was the only one; TargetError when every one exited ("nothing to {verb}")."""
    attached = 0
    for pid in pids:
        try:
            attach(pid)
            attached += 1
        except CkptraceError as e:
            if len(pids) == 1 or alive(pid):
                raise
            note(f"not {doing} PID {pid}: {e}")  # it exited: follow the others
    if pids and not attached:
        raise TargetError(f"every process given exited while its probes were being attached: nothing to {verb}")
