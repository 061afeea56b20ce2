"""Load checkpoint.bpf.c into the kernel, attach it to one or more processes, and stream their
events to a trace.

Events go to disk as they come (core/stream.py: a batch at least every FLUSH_S), so the
recorder's memory does not grow with the recording and a killed recorder leaves a cut-short trace.
A clean stop rewrites the stream, batch by batch, into the finished Parquet trace."""
from __future__ import annotations

import array
import ctypes
import datetime as dt
import errno
import itertools
import os
import platform
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ckptrace import __version__
from ckptrace.core import stopping
from ckptrace.core.columns import GPU_COLUMNS, KINDS, OPTIONAL, PHASES, arrow_array, arrow_schema, category_array, with_meta
from ckptrace.core.errors import CkptraceError, EbpfUnavailable, TargetError
from ckptrace.core.heap import return_freed_memory
from ckptrace.core.meta import (FaultTime, GpuInfo, ObjectInfo, OpenSpans, ProbeInfo, ProcessInfo, ProcessMemory,
                                SchedCounters, TraceMeta)
from ckptrace.probes import arch, bpf_compile, bpf_runtime, cuda, fault_time, kernel
from ckptrace.probes.process_memory import host_memory_bytes, read_process_memory
from ckptrace.probes.fold import ProcessFold, RunningMedian
from ckptrace.probes.target import alive, comm_of, process_of, processes_named, resident_members, start_time
from ckptrace.probes.launch import HeldChild
from ckptrace.probes.machine import MachineSampler
from ckptrace.core.output import OutputError, check_output, write_new, write_output
from ckptrace.core.stdio import PipeClosed
from ckptrace.core.terminal import printable
from ckptrace.core.stream import CUT_SHORT, Recording, StreamFull, batches

BPF_SOURCE = Path(__file__).with_name("checkpoint.bpf.c")

# probe point -> (entry program, return program) in checkpoint.bpf.c
PROGRAMS = {
    "update_tgt": ("ckpt_enter_tgt", "ckpt_return"),
    "update_dft": ("ckpt_enter_dft", "ckpt_return"),
    "state_size": ("ckpt_enter_size", None),  # ik_llama.cpp: opens the checkpoint; the copy's return closes it
    "resize_grow": ("fill_enter", "fill_return"),
    "state_copy": ("copy_enter", "copy_return"),
    "update_slots": ("iter_enter", "iter_return"),
    "llama_decode": ("decode_enter", "decode_return"),
    "resize_grow_libcxx": ("fill_enter", "fill_return"),
    "resize_libcxx": ("fill_enter_resize", "fill_return"),
    "llama_process": ("process_enter", "decode_return"),
    "create_checkpoint": ("create_enter", "create_return"),
    "load_tgt": ("restore_enter_tgt", "aux_return"),
    "load_dft": ("restore_enter_dft", "aux_return"),
    "state_restore": ("restore_copy_enter", "restore_copy_return"),
    "spec_state": ("spec_state_enter", "aux_return"),
    "prompt_save": ("prompt_save_enter", "aux_return"),
    "slot_save": ("slot_save_enter", "slot_return"),
    "slot_restore": ("slot_restore_enter", "slot_return"),
    # call sites, not functions: plain uprobes on the call and on the instruction after it
    "fill_call_end": ("fill_return", None),
    "fill_call": ("fill_enter_call", None),
    "save_call_end": ("save_call_return", None),
    "save_call": ("save_call_enter", None),
}
# The CUDA copy path (probes/cuda.py): each point's role -> its programs
GPU_PROGRAMS = {
    "copy_rt": ("gpu_copy_rt", "gpu_copy_return"),
    "copy_dtoh": ("gpu_copy_dtoh", "gpu_copy_return"),
    "copy_other": ("gpu_copy_other", "gpu_copy_return"),
    "sync": ("gpu_sync_enter", "gpu_sync_return"),
    "pin": ("gpu_pin_enter", "gpu_pin_return"),
    "pin_out": ("gpu_pin_out_enter", "gpu_pin_return"),
    "unpin": ("gpu_unpin", None),
}
PROGRAMS.update({point: GPU_PROGRAMS[role] for point, role in cuda.POINTS.items()})
GPU_FAULT_PROGRAM = "gpu_fault"  # on cuda.FAULT_TRACEPOINTS (x86), while a CUDA target is traced
GPU_FAULT_PERF_PROGRAM = "gpu_fault_perf"  # on cuda.FAULT_PERF_EVENT where those don't exist (arm64)
# spans other probed calls nest in: attached last (see attach_probes)
OUTER_POINTS = ("update_tgt", "update_dft", "update_slots", "create_checkpoint", "load_tgt", "load_dft",
                "prompt_save", "slot_save", "slot_restore")
# llama_batch_ext (llama-batch.h, the same in 0.3.36 and 11434): its token vector's offset,
# offsetof(token, output), and sizeof(token) by standard library (unordered_set is 56 bytes in
# libstdc++, 40 in libc++); measured by compiling the struct with g++ and clang++ -stdlib=libc++.
BATCH_TOKENS_OFF, BATCH_OUTPUT_OFF = 64, 16
TOKEN_SIZE = {"libstdc++": 96, "libc++": 80}
TARGET_TRACED, TARGET_CREATE, TARGET_LIBCXX, TARGET_LOAD_BOOL = 1, 2, 4, 8  # checkpoint.h enum ckpt_target_flag


def target_flags(plan) -> int:
    """The `targets` map value for a process with this probe plan (checkpoint.h TARGET_*)."""
    return (TARGET_TRACED | (TARGET_CREATE if plan.by_point("create_checkpoint") else 0)
            | (TARGET_LIBCXX if plan.stdlib == "libc++" else 0)
            | (TARGET_LOAD_BOOL if plan.load_returns_bool else 0))


def trace_process(bpf, pid: int, plan) -> None:
    """Public API: the kernel side traces this process's threads from now (its `targets` entry;
    a CUDA target also its empty pinned ranges and copy destinations)."""
    if plan.gpu_points:
        for table in (b"pinned", b"dst_ranges"):
            bpf[table][ctypes.c_uint32(pid)] = bpf[table].Leaf()
    bpf[b"targets"][ctypes.c_uint32(pid)] = ctypes.c_uint32(target_flags(plan))


def untrace_process(bpf, pid: int) -> None:
    """Public API: stop matching this pid (it exited, and may be given to another process)."""
    for table in (b"targets", b"pinned", b"dst_ranges"):
        try:
            del bpf[table][ctypes.c_uint32(pid)]
        except KeyError:
            pass
SCHED_COLUMNS = ("cpu_ns", "wait_ns", "nvcsw", "nivcsw")
CPU_UNKNOWN = 2**64 - 1  # checkpoint.bpf.c: a span's cpu_ns read wrong, written as null (unknown)
# Indices of the kernel's `counters` array (checkpoint.h enum ckpt_counter; C_NEXT_ID is the
# kernel's id allocator, never read here). tests/test_enums.py holds these to the header.
C_LOST, C_PARTIAL, C_ABANDONED, C_MAP_FULL, C_THREADS_SEEN, C_THREADS_PRUNED, C_THREADS_PEAK = 0, 1, 3, 4, 5, 6, 7
C_GPU_RANGES_FULL, C_PINNED_FULL = 9, 10
K_CHECKPOINT, K_ITERATION = KINDS.index("checkpoint"), KINDS.index("iteration")
K_FILL, K_COPY = KINDS.index("fill"), KINDS.index("copy")
GPU_KINDS = [KINDS.index(k) for k in ("copy", "restore_copy")]  # rows the GPU columns belong to
SYSCALL_KINDS = [KINDS.index(k) for k in ("mmap", "munmap", "mremap", "rss")]  # instants: no span counters

FAULT_SAMPLE_CHOICES = (0, 1, 2, 4, 8, 16, 64)
SLICE_S = 0.25  # fault timing is on for one slice of this length in every --fault-sample slices
FAULT_PROGRAMS = (("rss_stat", "fault_accounted"), ("page_fault_user", "fault_enter"))  # attach order
# The legacy per-fault interval (--fault-sample; fault_timed, fault_timed_ns). fault_ns is
# fault_time.py's and needs none of it; measured here this interval is about half the whole cost.
FAULT_TIME_DEFINITION = (
    "per timed fault: exceptions:page_fault_user to the next kmem:rss_stat on the same thread "
    "(the new page accounted); a lower bound without trap entry/exit or hypervisor faults. "
    "Faults are timed during one 0.25 s slice in every fault_sample_every slices"
)
NO_CHECKPOINT_HINT_S = 30.0
# Each stops a recording the same way, the trace written; the reason recorded is the value.
STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup",
                signal.SIGQUIT: "quit"}
POLL_S = 0.1  # drain period; events are submitted without wakeups (2 MiB of ring: 130k events/s)
SLICE_POLL_S = 0.05  # with --fault-sample: the timed slices' edges are this exact
FLUSH_S = 0.5  # a batch goes to disk at least this often (what a killed recorder can lose)
CHUNK_ROWS = 1 << 15  # rows the finishing pass takes from the stream at a time
MAX_THREADS = 8192  # default size of the kernel's per-thread map
MAX_TARGETS = 64  # processes one recording follows (the kernel's `targets` map)
COMM_POLL_S = 0.5  # --comm: how often to look for a process of that name while none runs


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
class Target:
    """One traced process: its probe plan (processes may be different builds) and its label."""
    pid: int
    label: str
    comm: str
    plan: object  # symbols.ProbePlan
    ended_ns: int | None = None  # CLOCK_MONOTONIC when it was seen gone
    start: int | None = None  # target.start_time: with pid, this process and not a later one with its pid
    memory: ProcessMemory | None = None  # its RSS and cgroup limit as last read while it ran

    def read_memory(self) -> None:
        """Read its RSS and cgroup memory limit again, if it is still this process."""
        mem = read_process_memory(self.pid)
        if mem is not None and self.alive():
            self.memory = mem

    @property
    def build_id(self) -> str | None:
        return next((o.build_id for o in self.plan.objects if o.path == self.plan.target), None)

    def alive(self) -> bool:
        """Still running, and still this process (its pid was not given to another)."""
        return alive(self.pid, self.start)

    def info(self) -> ProcessInfo:
        return ProcessInfo(pid=self.pid, label=self.label, comm=self.comm, executable=self.plan.target,
                           build_id=self.build_id, exited_ns=self.ended_ns, profile=self.plan.profile.name,
                           start_ticks=self.start, memory=self.memory)


class Targets(list):
    """The processes of a recording; a process that exits ends its part, the others go on."""

    def __init__(self, items, bpf=None):
        super().__init__(items)
        self.bpf = bpf

    def any_alive(self) -> bool:
        for t in self:
            if t.ended_ns is None and not t.alive():
                t.ended_ns = time.monotonic_ns()
                if self.bpf is not None:  # its pid may be reused: stop matching it
                    untrace_process(self.bpf, t.pid)
                if any(o.ended_ns is None for o in self):
                    _say(f"ckptrace: PID {t.pid} ({printable(t.comm)}) exited; recording the others")
        return any(t.ended_ns is None for t in self)


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


class Interrupted(KeyboardInterrupt):
    """A stop signal while the recording was starting (resolving, compiling, attaching): what was
    set up is undone, nothing was recorded; the exit status is a shell's for that signal. A
    KeyboardInterrupt, so no `except Exception` on the way (a library's) takes it for a failure."""

    def __init__(self, signum: int, command: bool):
        name = signal.Signals(signum).name
        super().__init__(f"{STOP_SIGNALS.get(signum, 'stopped')} ({name}) while starting, before the output "
                         f"was opened: nothing was recorded{', the command was not run' if command else ''}")
        self.exit_code = stopping.exit_code(signum)


class _Stopping:
    """The stop signals of one recording, from its first instant. While it starts, the first one
    raises Interrupted where the start is (a compile, an attach, a wait for --comm: each undoes
    itself), once; from the moment the output is opened they are noted and the session stops at
    its next poll, writing the trace. A signal the CLI held before (core/stopping.py) counts."""

    def __init__(self, command: bool):
        self.command = command
        self.signum: int | None = None
        self.raising = True
        self.session: _Session | None = None
        # A dropped SSH session (SIGHUP) or Ctrl-\\ (SIGQUIT) stops like Ctrl-C: the trace is
        # written. Under nohup (SIGHUP ignored) a hangup still leaves the recording running.
        signals = stopping.held() or [s for s in STOP_SIGNALS
                                      if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        self.old = {s: signal.signal(s, self) for s in signals}
        if stopping.pending() is not None:
            self.signum = stopping.pending()

    def __call__(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.session is not None:
            self.session.request_stop(signum, frame)
        elif self.raising:
            self.raising = False  # once: the start undoes itself on the way out
            raise Interrupted(signum, self.command)

    def started(self) -> None:
        """The output is about to be opened: from now a signal is noted (the trace is written).
        Interrupted if one came (and was swallowed on the way) before."""
        self.raising = False
        if self.signum is not None:
            raise Interrupted(self.signum, self.command)

    def attach(self, session: _Session) -> None:
        self.session = session
        if self.signum is not None:
            session.request_stop(self.signum, None)

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def record(opts: RecordOptions, pid: int | list | None = None, command: list[str] | None = None,
           comm: str | None = None) -> RecordResult:
    """Record processes: attach to pid(s) (an int, or a list of ints or (pid, label) pairs) or to
    every process named `comm`, or launch `command`, held until the probes are in. A stop signal
    at any moment ends it cleanly: before the output is opened with Interrupted (nothing
    recorded), after with the trace written."""
    stop = _Stopping(command=bool(command))
    fifo = None
    try:
        fifo = _preflight(opts)
        return _record(opts, pid, command, comm, stop, fifo)
    finally:
        stop.restore()
        if fifo is not None:
            os.close(fifo)


def _record(opts: RecordOptions, pid, command: list[str] | None, comm: str | None, stop: _Stopping,
            fifo: int | None) -> RecordResult:
    child, targets = resolve_targets(pid, command, comm, opts)
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
                _say(f"ckptrace: note: PID {t.pid} exited while its probes were being attached; "
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

    return_freed_memory()  # what resolving and loading left behind (pyelftools' symbol tables)
    meta = _trace_meta(opts, targets, command, attach_retries)
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
    session = _Session(bpf, opts, sched_recorded=bpf.sched.recorded, out=out, gpu=meta.gpu is not None,
                       fill_probed={t.pid: t.plan.fill_probed for t in targets})
    session.machine = MachineSampler([t.pid for t in targets], child.pid if child else None)
    session.machine.start()
    stop.attach(session)  # a signal since the output was opened stops the session at once
    _say(_start_line(opts, targets, child, command, attached, meta.sched_counters, bpf.rss_sampled))

    stop_reason = "interrupted"
    released = False
    try:
        if opts.fault_sample:
            session.set_fault_timing(True)  # the first slice is a timed one, from the first instruction
        if child and session.stop_reason is None:
            child.release()
            released = True
        elif child:  # stopped before it ran: the trace says so, and the command never starts
            child.abandon()
        stop_reason = session.run(child, targets)
    except KeyboardInterrupt:
        stop_reason = "interrupted"
    finally:
        # Our handlers stay in place until the trace is written: a second Ctrl-C while we stop
        # only asks again, it does not lose the recording.
        if child and child.poll() is None:
            child.terminate()  # we started it: we stop it
        meta.exit_code = child.exit_code if released else None
        meta.stop_ns = time.monotonic_ns()
        meta.machine = session.machine.stop()
        session.drain()
        session.flush()
        session.clear_status()
        _note_stop(meta, session, "disk full" if session.full else stop_reason)
        targets.any_alive()  # who had gone by the end
        for t in targets:
            if t.ended_ns is None:
                t.read_memory()
        meta.processes = [t.info() for t in targets]
        targets.bpf = None
        bpf.cleanup()  # the probes leave the targets now, not after the trace is written
        try:
            if session.full and out.in_place:
                written, why_not = _rescue_full(opts.output, out, session, meta)
            else:
                written, why_not = _finish(opts.output, out, session, meta, fifo)
        finally:
            out.close()
            bpf.cleanup()
    if session.full:
        raise TargetError(why_not or f"no space left for the recording's spool in TMPDIR "
                                     f"({session.full.strerror or 'write failed'}): recording stopped there; "
                                     f"what was recorded up to then is in {printable(str(written))}")
    if why_not:
        raise TargetError(f"{why_not}; the recording was saved to {written}")
    result = RecordResult(Path(opts.output), session.rows, int(session.counts[K_CHECKPOINT]),
                          int(session.counts[K_ITERATION]), meta.lost_events,
                          "disk full" if session.full else stop_reason, meta.exit_code, meta)
    _say(_end_line(result))
    return result


def _preflight(opts: RecordOptions) -> int | None:
    """Every check that needs no target, so a bad option or machine fails before anything starts.
    -o a FIFO: its write end, held open until the end (see _fifo_writer)."""
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
    return _fifo_writer(opts.output)


def _fifo_writer(path: Path) -> int | None:
    """-o names a FIFO: a write end opened now without waiting (held until the trace is written,
    so its reader sees no end of file before it), or one line when nothing reads it: the write at
    the end would wait in open() for a reader, deaf to Ctrl-C, the recording done. None otherwise."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return None
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise TargetError(f"{printable(str(path))}: a FIFO that no process reads: start its reader "
                              "first (e.g. cat FIFO > trace.parquet), or give a file path") from None
        return None  # gone or not ours to open: check_output and the write say what is wrong


def _fifo_has_reader(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        return True
    except OSError:
        return False


def machine_checks() -> None:
    """Public API (record and serve): root, bcc installed (not imported: it maps its compiler,
    see probes/bpf_runtime.py), its runtime library, kernel headers, tracefs; one line each."""
    kernel.require_privileges()
    bpf_compile.bcc_version()
    bpf_runtime.library()
    kernel.kernel_headers_dir()
    kernel.tracefs_dir()


def resolve_process(pid: int, label: str | None = None) -> Target:
    """Public API (record and serve): a running process as a Target, its probe points resolved in
    the objects it has mapped and its start time taken (label None: its comm). TargetError (one
    line) when it can't be traced, including a process that exits meanwhile: a vanishing
    /proc/PID file never escapes as a plain OSError."""
    from ckptrace.probes import symbols

    start = start_time(pid)
    try:
        plan = symbols.resolve_pid(pid, note=_note)
    except OSError as e:
        raise _gone_or(pid, f"PID {pid}: cannot read its mappings ({e.strerror or e})") from None
    name = comm_of(pid)
    if start is None or not alive(pid, start):
        raise _gone_or(pid, "")
    return Target(pid, name if label is None else label, name, plan, start=start)


def _gone_or(pid: int, why: str) -> TargetError:
    return TargetError(why if why and alive(pid) else f"PID {pid} exited while its probes were being resolved")


def resolve_targets(pid, command: list[str] | None, comm: str | None, opts: RecordOptions):
    """Public API (record): the processes to record, as (held child or None, Targets). `pid` is
    an int or a list of ints or (pid, label) pairs; `comm` takes every process of that name running
    now (waiting while there is none; later ones are not added); `command` is launched, held
    before its exec until the probes are in."""
    from ckptrace.probes import symbols

    if command:
        child = HeldChild(command)
        try:
            plan = symbols.resolve_binary(child.path, note=_note)
        except BaseException:
            child.abandon()
            raise
        name = Path(child.path).name[:15]
        return child, Targets([Target(child.pid, f"{name}#1", name, plan, start=start_time(child.pid))])
    wanted = _wait_for_comm(comm, opts) if comm else [pid] if isinstance(pid, int) else list(pid)
    chosen: dict[int, str | None] = {}
    for item in wanted:
        p, label = item if isinstance(item, tuple) else (item, None)
        p, note = process_of(p)  # a thread id names its process
        if note:
            _say(f"ckptrace: note: {note}")
        if p not in chosen or label:
            chosen[p] = label
    if len(chosen) > MAX_TARGETS:
        raise TargetError(f"{len(chosen)} processes: one recording follows at most {MAX_TARGETS}")
    targets, seen = [], {}
    for p, label in chosen.items():
        name = comm_of(p)
        seen[name] = seen.get(name, 0) + 1
        if label is None:  # its name and rank: the same process label in every leg (compare --per-process)
            label = f"{name}#{seen[name]}"
        try:
            targets.append(resolve_process(p, label))
        except TargetError:
            if len(chosen) == 1 or alive(p):
                raise
            _say(f"ckptrace: note: PID {p} exited while its probes were being resolved; recording the others")
    if not targets:
        raise TargetError("every process exited while its probes were being resolved: nothing recorded")
    return None, Targets(targets)


def _wait_for_comm(comm: str, opts: RecordOptions) -> list[int]:
    """The pids of every process named `comm`; while there is none, wait (a status line), say so
    after the hint time, and give up at --duration."""
    if not comm or "/" in comm or len(comm.encode()) > 255:
        raise TargetError(f"--comm takes a process name (as in /proc/PID/comm), got {printable(comm)!r}")
    t0 = time.monotonic()
    hinted = drawn = False
    while True:
        found = processes_named(comm)
        if found:
            if drawn:
                _to_stderr("\r" + " " * 79 + "\r")
            return found
        waited = time.monotonic() - t0
        if opts.duration_s and waited >= opts.duration_s:
            raise TargetError(f"no process named {printable(comm)!r} appeared in {opts.duration_s:g} s: "
                              "nothing recorded")
        if opts.status and sys.stderr.isatty():
            _to_stderr("\r" + f"{waited:7.1f} s  waiting for a process named {printable(comm)}"[:79].ljust(79))
            drawn = True
        if not hinted and waited >= opts.no_checkpoint_hint_s:
            hinted = True
            if drawn:
                _to_stderr("\r" + " " * 79 + "\r")
            _say(f"ckptrace: no process named {printable(comm)!r} in {opts.no_checkpoint_hint_s:g} s "
                 "(names are the kernel's comm, at most 15 characters: see `ps -o comm`); still waiting, "
                 "Ctrl-C to stop")
        time.sleep(COMM_POLL_S)


def _trace_meta(opts: RecordOptions, targets: Targets, command: list[str] | None,
                attach_retries: int) -> TraceMeta:
    """The trace's metadata as known once the probes are in; _note_stop adds the rest. Objects,
    probes and missing points are the union over the processes (each one's are in `processes`)."""
    plans = [t.plan for t in targets]
    one = targets[0] if len(targets) == 1 else None
    return TraceMeta(
        tool_version=__version__,
        label=opts.label,
        mode="launch" if command else "attach",
        command=list(command) if command else None,
        pid=one.pid if one else None,
        executable=one.plan.target if one else None,
        objects=list(dict.fromkeys(ObjectInfo(o.path, o.build_id) for pl in plans for o in pl.objects)),
        probes=list(dict.fromkeys(ProbeInfo(p.point, p.symbol, p.object, p.vaddr, p.offset, p.build_id)
                                  for pl in plans for p in pl.points)),
        missing_optional=sorted({m for pl in plans for m in pl.missing_optional}),
        # several processes: one profile when they all matched the same (each one's is in `processes`)
        profile=plans[0].profile if len({pl.profile.name for pl in plans}) == 1 else None,
        kernel=platform.release(),
        arch=platform.machine(),
        page_size=arch.page_size(),
        host=socket.gethostname(),
        host_memory_bytes=host_memory_bytes(),
        start_time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        attach_ns=time.monotonic_ns(),
        attach_retries=attach_retries,
        fault_sample_every=opts.fault_sample,
        fault_time_definition=FAULT_TIME_DEFINITION if opts.fault_sample else None,
        complete=False,  # what the stream says until the finished trace replaces it
        cut_short=CUT_SHORT,
        max_threads=opts.max_threads,
        gpu=_gpu_info(plans, attached=command is None, source=opts.gpu_fault_source),
    )


def _gpu_info(plans, attached: bool, source: str = "") -> GpuInfo | None:
    """The CUDA copy path as it will be recorded; None for a recording of no CUDA target."""
    points = [p for pl in plans for p in pl.gpu_points]
    if not points:
        return None
    return GpuInfo(libraries=list(dict.fromkeys(p.object for p in points)),
                   points=list(dict.fromkeys(p.point for p in points)),
                   fault_tracepoints=gpu_fault_events(source), pinned_known_from_start=not attached)


def _note_stop(meta: TraceMeta, session: _Session, stop_reason: str) -> None:
    """What the recording learned by its end: counters, spans left open, how it stopped."""
    open_ckpt, open_iter = session.open_spans()
    for key, value in session.progress().items():
        if hasattr(meta, key):
            setattr(meta, key, value)
    meta.first_event_ns = session.first_ns
    meta.stop_reason = stop_reason
    meta.open_at_stop = OpenSpans(open_ckpt, open_iter)
    meta.fault_slices_timed = session.fault_slices
    meta.events = session.rows
    if meta.gpu is not None:
        c = session.counters()
        meta.gpu.ranges_full, meta.gpu.pinned_full = c[C_GPU_RANGES_FULL], c[C_PINNED_FULL]


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


def _calibrate(session: _Session, meta: TraceMeta) -> dict | None:
    """Fault-time calibration for the spans' sizes; None (fault_ns NA) where it can't run."""
    if not session.sched_recorded:
        meta.fault_time = FaultTime(definition="not measured: the on-CPU time was not recorded")
        return None
    try:
        cal, meta.fault_time = fault_time.calibration(session.sizes.calibration_sizes())
        return cal
    except (OSError, MemoryError, ValueError) as e:
        meta.fault_time = FaultTime(definition=f"not measured: calibration failed ({e})")
        return None


def _finish(path: Path, out: Recording, session: _Session, meta: TraceMeta,
            fifo: int | None = None) -> tuple[Path, str | None]:
    """The finished trace from the stream, in place of the stream (or rescued elsewhere). `fifo`:
    -o is a FIFO we hold open; its reader must still be there, else the trace is rescued (opening
    it would wait, the recording done, for a reader that may never come)."""
    write, n = _finisher(out, session, meta)
    if fifo is not None and not _fifo_has_reader(path):
        written, failures = _rescue(write)
        gone = f"cannot write the trace {printable(str(path))}: its reader went away"
        if written is None:
            raise TargetError(f"{gone}; no copy could be saved either ({'; '.join(failures)}): "
                              f"the recording ({n} events) is lost")
        return written, gone
    return _write_or_rescue(path, write, n, own=out.identity)


def _finisher(out: Recording, session: _Session, meta: TraceMeta):
    """A writer of the finished trace: the stream and what the disk had no room for, batch by
    batch, with fault_ns; and its event count. pandas and Parquet are loaded here, at the stop:
    the recording streams without them."""
    import pyarrow.parquet as pq

    from ckptrace.core.trace import PARQUET_OPTIONS, trace_schema

    cal = _calibrate(session, meta)
    meta.complete, meta.cut_short = True, None
    meta.events = session.rows + session.dropped
    schema = trace_schema(meta)

    def write(f):
        _say(f"ckptrace: writing the finished trace ({meta.events} events)")  # a long recording takes seconds
        with pq.ParquetWriter(f, schema, **PARQUET_OPTIONS) as w:
            for table in _finished_tables(out, session.unwritten, cal, session.batch_min_start, schema):
                w.write_table(table)
    return write, meta.events


def _rescue_full(path: Path, out: Recording, session: _Session, meta: TraceMeta) -> tuple[Path | None, str]:
    """The disk filled while streaming: the stream at `path` stays (cut short, readable); the whole
    recording goes to a rescue folder if one has room. Returns the copy and the one-line error."""
    shown = printable(str(path))
    head = f"cannot write the trace {shown}: {session.full.strerror or 'write failed'}; recording stopped"
    write, n = _finisher(out, session, meta)
    written, failures = _rescue(write)
    if written is None:
        return None, (f"{head}: {shown} holds the {session.rows} events written before, as a cut-short trace; "
                      f"the {session.dropped} after them are lost: no copy could be saved ({'; '.join(failures)})")
    return written, (f"{head}; the whole recording ({n} events) was saved to {written}; {shown} holds the "
                     f"first {session.rows}, as a cut-short trace")


def _finished_tables(out: Recording, unwritten: list[pa.RecordBatch], cal: dict | None, min_starts: array.array,
                     schema: pa.Schema):
    """The stream's rows with fault_ns, in (start_ns, end_ns) order, a row group at a time.
    A batch's rows come when their span ended; a row is let out once no later batch can hold an
    earlier start (the suffix minimum of the batches' first starts), so memory holds only the
    rows of spans still open across flushes, not the recording."""
    import pandas as pd

    from ckptrace.core.trace import ROW_GROUP_ROWS, arrow_frame, normalize_events

    later = np.minimum.accumulate(np.asarray(min_starts, dtype="int64")[::-1])[::-1]
    carry: dict = {}
    held = pd.DataFrame()
    ready: list[pd.DataFrame] = []
    n_ready = 0
    flushed = (b for b, _ in batches(out.read()) if b.num_rows)  # not the header's empty batch
    for i, table in _chunks(itertools.chain(flushed, unwritten)):
        df = normalize_events(arrow_frame(table))
        df["fault_ns"] = fault_time.span_fault_ns(df, cal, carry) if cal else pd.array([pd.NA] * len(df), "Int64")
        held = pd.concat([held, df], ignore_index=True) if len(held) else df
        cut = later[i + 1] if i + 1 < len(later) else np.iinfo("int64").max
        go = held["start_ns"].to_numpy() < cut
        if go.any():
            ready.append(held[go])
            n_ready += int(go.sum())
            held = held[~go].reset_index(drop=True)
        if n_ready >= ROW_GROUP_ROWS:
            yield _sorted_table(ready, schema)
            ready, n_ready = [], 0
    if len(held):
        ready.append(held)
    if ready:
        yield _sorted_table(ready, schema)


def _chunks(stream) -> Iterator[tuple[int, pa.Table]]:
    """Consecutive batches joined into tables of at least CHUNK_ROWS rows (the flushes' batches
    are small, and the pandas work per table costs the same at 50 rows as at 50,000), each with
    the index of its last batch."""
    parts, rows, i = [], 0, -1
    for i, b in enumerate(stream):
        parts.append(b)
        rows += b.num_rows
        if rows >= CHUNK_ROWS:
            yield i, pa.Table.from_batches(parts)
            parts, rows = [], 0
    if parts:
        yield i, pa.Table.from_batches(parts)


def _sorted_table(parts: list, schema: pa.Schema) -> pa.Table:
    import pandas as pd

    from ckptrace.core.trace import to_batch

    df = pd.concat(parts, ignore_index=True).sort_values(["start_ns", "end_ns"], kind="stable")
    return pa.Table.from_batches([to_batch(df, schema.remove_metadata())]).replace_schema_metadata(schema.metadata)


def _write_or_rescue(path: Path, write, rows: int, own: tuple[int, int] | None = None) -> tuple[Path, str | None]:
    """Write the trace; if that fails (disk full, folder gone, another recorder writing at `path`
    now), write it where there is room. `own`: the stream it replaces (st_dev, st_ino). Returns
    where it went and why not to `path` (None when it did)."""
    try:
        return write_output(path, write, what="trace", own=own), None
    except OutputError as e:
        first = e
    except PipeClosed:  # -o /dev/stdout or a FIFO whose reader left: keep the recording
        first = OutputError(f"cannot write the trace {printable(str(path))}: its reader went away (broken pipe)")
    written, failures = _rescue(write)
    if written is None:
        raise TargetError(f"{first}; no copy could be saved either ({'; '.join(failures)}): "
                          f"the recording ({rows} events) is lost")
    return written, str(first)


def _rescue(write) -> tuple[Path | None, list[str]]:
    """The trace written into the first folder with room: its path, or None and each folder's failure."""
    failures = []
    for folder in dict.fromkeys([tempfile.gettempdir(), "/dev/shm", "/var/tmp", "/tmp"]):
        try:
            return write_new(folder, "ckptrace-rescued-", ".parquet", write, what="rescued trace"), failures
        except OutputError as e:
            failures.append(f"{folder}: {e.reason}")
    return None, failures


def _note(text: str) -> None:
    """A note from symbol resolution (an object of the target left out, and why)."""
    _say(f"ckptrace: note: {text}")


def _say(text: str) -> None:
    _to_stderr(printable(text, lines=True) + "\n")


def _to_stderr(text: str) -> None:
    """Write to stderr; a terminal that went away (hangup: EIO, or a closed pipe) must not stop
    the recording from being finished, so what can't be shown is dropped."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):  # ValueError: stderr already closed
        pass


def load_program(targets: Targets, opts: RecordOptions, attach: bool = True, preload: bool = True):
    """Public API (record and serve): checkpoint.bpf.c compiled with `opts` as integer defines
    only (and the running kernel's offsets), from the cache or compiled now in a child process
    (probes/bpf_compile.py), loaded with every program (a verifier rejection is one line now),
    tracing `targets` (none for serve, which adds its processes with trace_process as it
    attaches them). `attach` False: the targets are launched commands, not yet exec'ed (their
    RSS counts from the exec). `preload` False with no targets: the uprobe programs are loaded
    as they are attached (serve --pid attaches at once: its verifier errors come then, still one
    line). Returns a bpf_runtime.Program; its `sched` (SchedCounters) says whether the scheduler
    counters are recorded."""
    pages = arch.ring_pages(opts.ringbuf_pages)  # the option counts 4 KiB units, the kernel its own pages
    # Integers only: nothing the user typed becomes C source.
    cflags = [
        f"-I{BPF_SOURCE.parent}",
        f"-DMAX_TARGETS={MAX_TARGETS}",
        f"-DRSS_STEP={int(opts.rss_step_mib) << 20}",
        f"-DRSS_PER_FAULT={int(opts.rss_per_fault)}",
        f"-DRINGBUF_PAGES={int(pages)}",
        f"-DMAX_THREADS={int(opts.max_threads)}",
        f"-DBATCH_TOKENS_OFF={BATCH_TOKENS_OFF}",
        f"-DBATCH_OUTPUT_OFF={BATCH_OUTPUT_OFF}",
        f"-DTOKEN_SIZE_STDCXX={TOKEN_SIZE['libstdc++']}",
        f"-DTOKEN_SIZE_LIBCXX={TOKEN_SIZE['libc++']}",
        *arch.cflags(arch.running()),
    ]
    status = _Status(opts.status, line=opts.compile_line)
    try:
        obj = bpf_compile.compiled(BPF_SOURCE, cflags, kernel.kernel_headers_dir(), status=status.draw, note=_note)
    finally:
        status.clear()
    # kmem:rss_stat runs on every fault: attached only when asked (--rss-per-fault). Its exec
    # companion ends a launched command's pre-exec time, for RSS read either way.
    skip = {b"kmem:rss_stat"} if not (opts.rss_step_mib and opts.rss_per_fault) else set()
    skip |= {b"sched:sched_process_exec"} if not opts.rss_step_mib else set()
    bpf = _quietly("could not load the BPF program", bpf_runtime.Program, obj, frozenset(skip))
    bpf.sched = SchedCounters(obj["kernel"]["sched"], obj["kernel"]["sched_note"])
    bpf.rss_sampled = obj["kernel"]["rss"]  # the mm's counters are readable (RSS at defaults)
    try:
        # Load the uprobe programs now, so a verifier rejection is reported here, in one line:
        # those the targets' probe points use, or (serve, attaching later) every one.
        points = {p.point for t in targets for p in t.plan.points} if targets else set(PROGRAMS) if preload else set()
        for fn in dict.fromkeys(fn for point in points for fn in PROGRAMS[point] if fn):
            _quietly(f"the kernel rejected the BPF program {fn}", bpf.load_func, fn.encode(), bpf_runtime.KPROBE)
        if any(t.plan.gpu_points for t in targets):  # attached only for a CUDA target (attach_gpu_faults)
            fn, kind = ((GPU_FAULT_PERF_PROGRAM, bpf_runtime.PERF_EVENT) if gpu_fault_source(opts.gpu_fault_source) == "perf"
                        else (GPU_FAULT_PROGRAM, bpf_runtime.TRACEPOINT))
            _quietly(f"the kernel rejected the BPF program {fn}", bpf.load_func, fn.encode(), kind)
        seeds = bpf[b"rss_seed"]
        for t in targets:
            trace_process(bpf, t.pid, t.plan)
            if not attach:
                bpf[b"rss_before_exec"][ctypes.c_uint32(t.pid)] = ctypes.c_uint32(1)
            # A running process's counters so far; a launched one starts from zero at its exec.
            members = resident_members(t.pid) if attach else None
            if members is not None and opts.rss_step_mib and opts.rss_per_fault:
                seed = seeds.Leaf()
                for i, v in enumerate(members):
                    seed.member[i] = v
                seeds[ctypes.c_uint32(t.pid)] = seed
    except BaseException:
        bpf.cleanup()
        raise
    return bpf


class _Status:
    """A transient line on a terminal (the first run's compile takes seconds), cleared after;
    `line`: elsewhere, the same said once as a line of its own."""

    def __init__(self, enabled: bool, line: bool = False):
        self.enabled = enabled and sys.stderr.isatty()
        self.line = line and not self.enabled
        self.drawn = False

    def draw(self, text: str) -> None:
        if self.enabled:
            _to_stderr("\r" + f"ckptrace: {text}"[:79].ljust(79))
            self.drawn = True
        elif self.line:
            _say(f"ckptrace: {text}")
            self.line = False

    def clear(self) -> None:
        if self.drawn:
            _to_stderr("\r" + " " * 79 + "\r")
            self.drawn = False


def _quietly(what: str, call, *args, **kwargs):
    """Run a bcc call with libbcc's own printing captured; failures become one line."""
    failure = None
    with kernel.captured_output() as out:
        try:
            return call(*args, **kwargs)
        except CkptraceError:
            raise
        except Exception as e:  # bcc's runtime raises bare Exception
            failure = e
    text = out[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # A verifier log ends with "processed N insns"; the reason is the line before it.
    reason = next((lines[i - 1] for i, ln in enumerate(lines) if ln.startswith("processed ") and i), None)
    raise EbpfUnavailable(f"{what}: {reason or failure}")


def uprobe_count(plan, gpu: bool = True) -> int:
    """Public API (record and serve): the uprobes attach_probes puts on a process of this plan."""
    return sum(1 + (len(ends(p) or [None]) if PROGRAMS[p.point][1] else 0)
               for p in plan.points if gpu or p.point not in cuda.POINTS)


_ENDS: dict[tuple[str, int, str], list[tuple[int, int]] | None] = {}


def ends(p) -> list[tuple[int, int]] | None:
    """Public API: where a probed function's return program goes: [(vaddr, file offset)] of its
    return instructions (plain uprobes, which leave the stack as it is: an exception thrown
    through the function still unwinds), or None for a uretprobe (its returns can't all be found:
    probes/returns.py; a CUDA library's functions, which throw nothing, keep theirs)."""
    if p.point in cuda.POINTS:
        return None
    key = (p.object, p.vaddr, p.build_id)
    if key not in _ENDS:
        from ckptrace.probes import returns

        _ENDS[key] = returns.return_sites(p.object, p.vaddr, p.mangled)
    return _ENDS[key]


def attach_probes(bpf, plan, target: int, start: int | None = None, gpu: bool = True) -> tuple[int, int]:
    """Public API (record and serve): attach every probe point of `plan` into process `target`
    (start: its start time, so a pid reused meanwhile is not taken for it; gpu False: not the
    CUDA points); returns (uprobes attached, retries). TargetError when the process exits
    meanwhile (the caller detaches what was attached), EbpfUnavailable when the kernel refuses a
    probe."""
    gone = TargetError(f"PID {target} exited while its probes were being attached")
    n = retries = 0
    # Attached into a running process, order decides what a call in flight looks like: every
    # return probe first, then the entries, the outer ones (checkpoint, iteration) last. So a
    # call whose entry is seen has its return and its inner calls seen too; one already running
    # is at worst a return without its entry, dropped and counted (partial_spans).
    points = [p for p in plan.points if gpu or p.point not in cuda.POINTS]
    order = [(p, False) for p in points if PROGRAMS[p.point][1]] + sorted(
        ((p, True) for p in points), key=lambda pe: pe[0].point in OUTER_POINTS)
    for p, entry in order:
        enter, ret = PROGRAMS[p.point]
        what = f"could not attach a uprobe to {p.symbol} in {p.object}"
        if entry:
            calls = [(bpf.attach_uprobe, p.offset, enter)]
        else:  # a uprobe on each return instruction, else a uretprobe (see ends())
            sites = ends(p)
            calls = ([(bpf.attach_uprobe, off, ret) for _, off in sites] if sites
                     else [(bpf.attach_uretprobe, p.offset, ret)])
        for attach, offset, fn in calls:
            # The kernel has refused an attach here now and then (libbcc hides the errno) and
            # accepted the same one a moment later: retry with backoff, and count it.
            for delay in (0.1, 0.3, 0.9, 0.0):
                try:
                    _quietly(what, attach, p.object, offset, fn.encode(), pid=target)
                    break
                except EbpfUnavailable:
                    if not alive(target, start):
                        raise gone from None
                    if not delay:
                        raise
                    retries += 1
                    time.sleep(delay)
            n += 1
    if not alive(target, start):
        raise gone
    return n, retries


def gpu_fault_source(source: str = "") -> str:
    """"tracepoints" where the kernel has x86's exceptions:page_fault_user/kernel, else "perf"
    (probes/arch.py); `source` chosen by the caller wins."""
    if source in ("tracepoints", "perf"):
        return source
    if source:
        raise ValueError(f"gpu_fault_source must be 'tracepoints' or 'perf', not {source!r}")
    return "tracepoints" if arch.running().fault_tracepoints else "perf"


def gpu_fault_events(source: str = "") -> list[str]:
    """The events the fault program is attached to, as the trace's metadata names them."""
    return list(cuda.FAULT_TRACEPOINTS) if gpu_fault_source(source) == "tracepoints" else [cuda.FAULT_PERF_EVENT]


def attach_gpu_faults(bpf, source: str = "") -> None:
    """The page fault program that counts faults on CUDA copies' destinations (every process's
    faults reach it: attached only while a CUDA target is traced), on x86's exception tracepoints
    or, where they don't exist, the page-faults software perf event (its address kept)."""
    if gpu_fault_source(source) == "perf":
        _quietly(f"could not attach the BPF program {GPU_FAULT_PERF_PROGRAM} to {cuda.FAULT_PERF_EVENT}",
                 bpf.attach_perf_event, arch.PERF_TYPE_SOFTWARE, arch.PERF_COUNT_SW_PAGE_FAULTS,
                 GPU_FAULT_PERF_PROGRAM.encode())
        return
    for tp in cuda.FAULT_TRACEPOINTS:
        _quietly(f"could not attach the BPF program {GPU_FAULT_PROGRAM} to {tp}", bpf.attach_tracepoint,
                 tp=tp.encode(), fn_name=GPU_FAULT_PROGRAM.encode())


class _Session:
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
                _say(f"ckptrace: no checkpoint seen in {self.opts.no_checkpoint_hint_s:g} s: only models "
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
        _to_stderr("\r" + text[:79].ljust(79))
        self.status_drawn = True

    def clear_status(self) -> None:
        if self.status_drawn:
            _to_stderr("\r" + " " * 79 + "\r")
            self.status_drawn = False

    def drain(self) -> None:
        self.bpf.ring_buffer_consume()

    def open_spans(self) -> tuple[int, int]:
        states = list(self.bpf[b"threads"].values())
        return sum(1 for s in states if s.ckpt), sum(1 for s in states if s.iter)
