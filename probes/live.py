"""Live events for `ckptrace serve`: the recorder's BPF program on running processes, in batches.

Nothing here is a second copy of the recorder: the program, its load, the probe resolution and
the attach order are probes/recorder.py's, the ring buffer's decoding its `_Session`. What this
adds is the long-running side: each batch is handed over and forgotten (memory stays flat), a
span's fault time is computed as it arrives (probes/fault_time.py's rule, with a calibration
kept per size), and a process can be detached while the others go on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ckptrace.probes import fault_time, kernel, recorder
from ckptrace.probes.target import alive
from ckptrace.terminal import printable

MAX_CAL_SIZES = 32  # distinct span sizes calibrated; past this, resident time is interpolated


@dataclass
class LiveTarget:
    """One attached process and what identifies it in the metrics."""
    pid: int
    comm: str
    executable: str
    build_id: str
    probes: int  # uprobes attached
    bpf: object = field(repr=False)
    session: object = field(repr=False)

    def alive(self) -> bool:
        return alive(self.pid)


class LiveProbes:
    """Attaches the recorder's program to processes and drains each one's events on demand."""

    def __init__(self, ringbuf_pages: int = 512):
        # The recorder's machine checks, minus its output file: a failure is one line, before anything attaches.
        kernel.require_privileges()
        self.bcc = kernel.import_bcc()
        kernel.kernel_headers_dir()
        kernel.tracefs_dir()
        self.offsets = kernel.task_struct_offsets()
        self.sched, self.sched_note = kernel.sched_offsets()
        self.opts = recorder.RecordOptions(output=Path(os.devnull), ringbuf_pages=ringbuf_pages, status=False,
                                           rss_step_mib=0)
        self.calibration: dict[str, list[list[int]]] = {"fill": [], "copy": []}

    def attach(self, pid: int) -> LiveTarget:
        """Resolve the probe points in the live process and attach; TargetError/SymbolError when it can't."""
        _, targets = recorder._resolve_target(pid, None, None, self.opts)
        pid, plan = targets[0].pid, targets[0].plan
        bpf = recorder._load(self.bcc, targets, self.offsets, self.sched, self.opts)
        try:
            attached, _ = recorder._attach(bpf, plan, pid)
        except BaseException:
            bpf.cleanup()
            raise
        session = recorder._Session(bpf, self.opts, sched_recorded=self.sched is not None)
        exe = next((o for o in plan.objects if o.path == plan.target), plan.objects[0])
        return LiveTarget(pid, _comm(pid), plan.target, exe.build_id, attached, bpf, session)

    def batch(self, target: LiveTarget) -> pd.DataFrame:
        """Every event since the last batch, typed as a trace's (with fault_ns)."""
        s = target.session
        s.drain()
        events = s.frame()
        s.chunks = []
        events["fault_ns"] = self._fault_ns(events)
        return events

    def lost(self, target: LiveTarget) -> int:
        """Events the kernel dropped so far (ring buffer or per-thread map full)."""
        counters = target.bpf["counters"]
        return int(counters[counters.Key(recorder.C_LOST)].value)

    def detach(self, target: LiveTarget) -> None:
        """Remove its probes. This takes a second or two (measured: 1.7 s for the sample's 14
        uprobes and 5 tracepoints), in this thread: bcc is not safe to call from two threads (a
        detach in a thread beside the drain crashed the interpreter); the ring buffers hold the
        other processes' events meanwhile."""
        target.bpf.cleanup()

    def _fault_ns(self, events: pd.DataFrame) -> pd.Series:
        """The recorder's fault time per span, calibrating each new span size once (capped)."""
        if events["cpu_ns"].isna().all():
            return pd.Series(pd.NA, index=events.index, dtype="Int64")
        faulting = events[events["kind"].isin(["fill", "copy"]) & (events["faults"] > 0)]
        known = {s for s, _ in self.calibration["fill"]}
        new = [s for s in fault_time.calibration_sizes(faulting["bytes"]) if s not in known]
        new = new[:max(0, MAX_CAL_SIZES - len(known))]
        if new:
            cal = fault_time.calibrate(new)
            for kind in ("fill", "copy"):
                self.calibration[kind] = sorted(self.calibration[kind] + cal[kind])
        return fault_time.span_fault_ns(events, self.calibration)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{int(pid)}/comm") as f:
            return printable(f.read().rstrip("\n"))
    except OSError:
        return ""
