"""One recording from start to stop (`record`): its options checked, its targets resolved, the
program loaded and attached, the ring buffer drained to the stream at -o until a stop, then the
finished trace written (or rescued) and one line said at each end.

Events go to disk as they come (core/stream.py: a batch at least every FLUSH_S), so the
recorder's memory does not grow with the recording and a killed recorder leaves a cut-short trace.
A clean stop rewrites the stream, batch by batch, into the finished Parquet trace."""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from ckptrace.core.columns import arrow_schema, with_meta
from ckptrace.core.errors import TargetError
from ckptrace.core.heap import return_freed_memory
from ckptrace.core.meta import SchedCounters, TraceMeta
from ckptrace.core.output import check_output
from ckptrace.core.stream import Recording
from ckptrace.core.terminal import printable
from ckptrace.probes import kernel
from ckptrace.probes.drain import K_CHECKPOINT, K_ITERATION, Drain
from ckptrace.probes.loader import (attach_gpu_faults, attach_probes, gpu_fault_source, load_program, machine_checks,
                                    uprobe_count, untrace_process)
from ckptrace.probes.machine import MachineSampler
from ckptrace.probes.messages import say
from ckptrace.probes.record_meta import note_stop, trace_meta
from ckptrace.probes.rescue import fifo_writer, rescue_full, write_trace
from ckptrace.probes.stop import Stopping
from ckptrace.probes.targets import Targets, resolve_targets

FAULT_SAMPLE_CHOICES = (0, 1, 2, 4, 8, 16, 64)
NO_CHECKPOINT_HINT_S = 30.0
MAX_THREADS = 8192  # default size of the kernel's per-thread map


@dataclass
class RecordOptions:
    output: Path
    label: str = ""
    duration_s: float | None = None
    fault_sample: int = 0  # the legacy per-fault interval, off: fault_ns needs no per-fault program
    # where a CUDA copy's destination faults are seen: "tracepoints" (x86's exceptions:page_fault_*),
    # "perf" (the page-faults software event, any architecture); "" = the running architecture's
    gpu_fault_source: str = ""
    ringbuf_pages: int = 512
    max_threads: int = MAX_THREADS  # entries of the kernel's per-thread map (threads alive at once)
    status: bool = True  # live status line (only drawn on a terminal)
    no_checkpoint_hint_s: float = NO_CHECKPOINT_HINT_S
    rss_step_mib: int = 1  # an `rss` row when a process's RSS moved by this much (0: not recorded)
    compile_line: bool = False  # off a terminal too, say in a line that the program is being compiled (top)
    rss_per_fault: bool = False  # RSS from kmem:rss_stat (a program on every fault), not at events


@dataclass
class RecordResult:
    path: Path
    events: int
    checkpoints: int
    iterations: int
    lost_events: int
    stop_reason: str
    exit_code: int | None
    meta: TraceMeta


def record(opts: RecordOptions, pid: int | list | None = None, command: list[str] | None = None,
           comm: str | None = None) -> RecordResult:
    """Record processes: attach to pid(s) (an int, or a list of ints or (pid, label) pairs) or to
    every process named `comm`, or launch `command`, held until the probes are in. A stop signal
    at any moment ends it cleanly: before the output is opened with Interrupted (nothing
    recorded), after with the trace written."""
    stop = Stopping(command=bool(command))
    fifo = None
    try:
        fifo = _preflight(opts)
        return _record(opts, pid, command, comm, stop, fifo)
    finally:
        stop.restore()
        if fifo is not None:
            os.close(fifo)


def _record(opts: RecordOptions, pid, command: list[str] | None, comm: str | None, stop: Stopping,
            fifo: int | None) -> RecordResult:
    child, targets = resolve_targets(pid, command, comm, opts)
    bpf, attached, attach_retries = _load_and_attach(opts, child, targets, stop)
    return_freed_memory()  # what resolving and loading left behind (pyelftools' symbol tables)
    meta, out = _open_output(opts, targets, command, bpf, child, attach_retries)
    session = Drain(bpf, opts, sched_recorded=bpf.sched.recorded, out=out, gpu=meta.gpu is not None,
                    fill_probed={t.pid: t.plan.fill_probed for t in targets})
    session.machine = MachineSampler([t.pid for t in targets], child.pid if child else None)
    session.machine.start()
    stop.attach(session)  # a signal since the output was opened stops the session at once
    say(_start_line(opts, targets, child, command, attached, meta.sched_counters, bpf.rss_sampled))

    stop_reason = "interrupted"
    released = False
    try:
        released = _begin(opts, session, child)
        stop_reason = session.run(child, targets)
    except KeyboardInterrupt:
        stop_reason = "interrupted"
    finally:
        # Our handlers stay in place until the trace is written: a second Ctrl-C while we stop
        # only asks again, it does not lose the recording.
        written, why_not = _stop(opts, session, meta, targets, child, released, stop_reason, fifo)
    if session.full:
        raise TargetError(why_not or f"no space left for the recording's spool in TMPDIR "
                                     f"({session.full.strerror or 'write failed'}): recording stopped there; "
                                     f"what was recorded up to then is in {printable(str(written))}")
    if why_not:
        raise TargetError(f"{why_not}; the recording was saved to {written}")
    result = RecordResult(Path(opts.output), session.rows, int(session.counts[K_CHECKPOINT]),
                          int(session.counts[K_ITERATION]), meta.lost_events,
                          "disk full" if session.full else stop_reason, meta.exit_code, meta)
    say(_end_line(result))
    return result


def _load_and_attach(opts: RecordOptions, child, targets: Targets, stop: Stopping):
    """The program loaded and attached to every target (one that exits meanwhile is left out
    while others remain): (bpf, uprobes attached, retries). Any failure or stop signal undoes
    it all: the probes leave, a launched command never runs."""
    bpf = None
    try:
        kernel.open_files_for(sum(uprobe_count(t.plan) for t in targets), f"tracing {len(targets)} processes")
        bpf = load_program(targets, opts, attach=child is None)
        targets.bpf = bpf
        attached, attach_retries = 0, 0
        for t in list(targets):
            try:
                n, r = attach_probes(bpf, t.plan, t.pid, t.start)
            except TargetError:
                if len(targets) == 1 or t.alive():
                    raise
                say(f"ckptrace: note: PID {t.pid} exited while its probes were being attached; "
                    "recording the others")
                targets.remove(t)
                untrace_process(bpf, t.pid)
                continue
            attached, attach_retries = attached + n, attach_retries + r
        if any(t.plan.gpu_points for t in targets):
            attach_gpu_faults(bpf, opts.gpu_fault_source)
        stop.started()
    except BaseException:
        if child:
            child.abandon()
        if bpf is not None:
            bpf.cleanup()  # the probes leave the targets now
        raise
    return bpf, attached, attach_retries


def _open_output(opts: RecordOptions, targets: Targets, command: list[str] | None, bpf, child,
                 attach_retries: int) -> tuple[TraceMeta, Recording]:
    """The metadata known at attach and the stream at -o, its header holding them."""
    meta = trace_meta(opts, targets, command, attach_retries)
    meta.sched_counters = bpf.sched
    for t in targets:
        t.read_memory()
    meta.processes = [t.info() for t in targets]  # in the stream's header too
    try:
        out = Recording(opts.output, with_meta(arrow_schema(gpu=meta.gpu is not None), meta, pandas_attrs=False))
    except BaseException:
        bpf.cleanup()
        if child:
            child.abandon()
        raise
    return meta, out


def _begin(opts: RecordOptions, session: Drain, child) -> bool:
    """The first fault slice on, a launched command let go: whether it was (released)."""
    if opts.fault_sample:
        session.set_fault_timing(True)  # the first slice is a timed one, from the first instruction
    if child and session.stop_reason is None:
        child.release()
        return True
    if child:  # stopped before it ran: the trace says so, and the command never starts
        child.abandon()
    return False


def _stop(opts: RecordOptions, session: Drain, meta: TraceMeta, targets: Targets, child, released: bool,
          stop_reason: str, fifo: int | None) -> tuple[Path | None, str | None]:
    """The recording stopped: the command stopped, the last events drained, the metadata
    completed, the probes out, then the finished trace written or rescued: (where, why not -o)."""
    if child and child.poll() is None:
        child.terminate()  # we started it: we stop it
    meta.exit_code = child.exit_code if released else None
    meta.stop_ns = time.monotonic_ns()
    meta.machine = session.machine.stop()
    session.drain()
    session.flush()
    session.clear_status()
    note_stop(meta, session, "disk full" if session.full else stop_reason)
    targets.any_alive()  # who had gone by the end
    for t in targets:
        if t.ended_ns is None:
            t.read_memory()
    meta.processes = [t.info() for t in targets]
    targets.bpf = None
    session.bpf.cleanup()  # the probes leave the targets now, not after the trace is written
    out = session.out
    try:
        if session.full and out.in_place:
            return rescue_full(opts.output, out, session, meta)
        return write_trace(opts.output, out, session, meta, fifo)
    finally:
        out.close()
        session.bpf.cleanup()


def _preflight(opts: RecordOptions) -> int | None:
    """Every check that needs no target, so a bad option or machine fails before anything starts.
    -o a FIFO: its write end, held open until the end (see fifo_writer)."""
    if opts.fault_sample not in FAULT_SAMPLE_CHOICES:
        raise TargetError(f"--fault-sample must be one of {', '.join(map(str, FAULT_SAMPLE_CHOICES))}")
    if opts.ringbuf_pages < 1 or opts.ringbuf_pages & (opts.ringbuf_pages - 1):
        raise TargetError(f"--ringbuf-pages must be a power of two, got {opts.ringbuf_pages}")
    if not 1 <= opts.max_threads <= 1 << 20:
        raise TargetError(f"--max-threads must be from 1 to {1 << 20}, got {opts.max_threads}")
    gpu_fault_source(opts.gpu_fault_source)
    check_output(opts.output, what="trace")  # a refused -o is said now, not after the recording
    machine_checks()
    if opts.fault_sample and not kernel.tracepoint_exists("exceptions", "page_fault_user"):
        raise TargetError(f"--fault-sample needs the exceptions:page_fault_user tracepoint, which this kernel "
                          f"({platform.machine()}) does not have: leave it off (the fault time analyze reports, "
                          "fault_ns, needs no per-fault program)")
    return fifo_writer(opts.output)


def _start_line(opts: RecordOptions, targets: Targets, child, command, attached: int,
                sched: SchedCounters, rss_sampled: bool = True) -> str:
    what = (f"command {command[0]!r} (pid {targets[0].pid})" if child else
            ", ".join(f"PID {t.pid} ({t.plan.target}" + (f", {t.label}" if len(targets) > 1 else "") + ")"
                      for t in targets))
    objects = len({p.object for t in targets for p in t.plan.points})
    faults = ("page faults (+ legacy service interval always)" if opts.fault_sample == 1 else
              f"page faults (+ legacy service interval in 1 of {opts.fault_sample} slices)"
              if opts.fault_sample else "page faults")
    faults += ", on-CPU time and run-queue wait" if sched.recorded else f" ({sched.note.split(':')[0]})"
    rss = (f", RSS (a row per {opts.rss_step_mib} MiB moved, " + ("per fault)" if opts.rss_per_fault else
                                                                  "at checkpoints, iterations, munmaps)")
           if opts.rss_step_mib and (opts.rss_per_fault or rss_sampled) else "")
    gpu = [t.plan.gpu_line() for t in targets if t.plan.gpu_points]
    if gpu:
        rss += f", CUDA copies ({gpu[0]}; faults on their destinations)"
    profiles = ", ".join(dict.fromkeys(t.plan.profile.name for t in targets))
    line = (f"ckptrace: tracing {what}: {attached} uprobes in {objects} "
            f"objects (profile {profiles}), {faults}, mmap/munmap/mremap{rss}. "
            + ("Ctrl-C to stop." if not opts.duration_s else f"{opts.duration_s:g} s, or Ctrl-C to stop."))
    if opts.rss_step_mib and not opts.rss_per_fault and not rss_sampled:
        line += ("\nckptrace: note: RSS not recorded: this kernel's BTF does not say where a process's "
                 "resident counters are; --rss-per-fault takes it from kmem:rss_stat")
    for fill in dict.fromkeys(t.plan.fill for t in targets if t.plan.by_point("fill_call")):
        line += (f"\nckptrace: note: fill: {fill}: each fill is a memset call to its return "
                 "(operator new's mmap before it is its own row)")
    if not all(t.plan.fill_probed for t in targets):
        line += ("\nckptrace: note: no fill probe: the growth behind resize() is inlined in this build "
                 "(no _M_default_append, __append or libc++ resize symbol); analyze derives each "
                 "checkpoint's fill as its total minus its copy (fill_source: derived)")
    return line


def _end_line(r: RecordResult) -> str:
    meta = r.meta
    tail = f", exit code {r.exit_code}" if r.exit_code is not None else ""
    notes = []
    if meta.lost_events:
        notes.append(f"{meta.lost_events} events LOST")
    if meta.abandoned_spans:
        notes.append(f"{meta.abandoned_spans} spans never returned (an exception or a longjmp left them, or their "
                     "thread exited): not rows")
    if meta.partial_spans:
        why = "entered before recording" if meta.mode == "attach" else "a return without its entry"  # launched: held
        notes.append(f"{meta.partial_spans} partial spans dropped ({why})")
    if meta.open_at_stop.total:
        notes.append(f"{meta.open_at_stop.total} spans still open at stop, dropped")
    if meta.gpu is not None and meta.gpu.ranges_full:
        notes.append(f"{meta.gpu.ranges_full} CUDA copy spans without their destination's faults (more than "
                     "8 copy spans open at once in a process)")
    if meta.gpu is not None and meta.gpu.pinned_full:
        notes.append(f"{meta.gpu.pinned_full} pinned ranges not remembered (more than 64 at once): copies into "
                     "them count as pageable")
    if meta.map_full:
        notes.append(f"{meta.map_full} thread events not seen: the per-thread map was full "
                     f"({meta.max_threads} threads; raise --max-threads)")
    return (f"ckptrace: wrote {r.path}: {r.checkpoints} checkpoints, {r.iterations} iterations, "
            f"{r.events} events, {meta.lost_events} lost (stopped: {r.stop_reason}{tail})"
            + ("; " + "; ".join(notes) if notes else ""))
