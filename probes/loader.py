"""The loader: checkpoint.bpf.c compiled (or taken from the cache), loaded into the kernel and
attached to a process's probe points; the kernel program's names (its programs per probe point,
its counters, its target flags). `record`, `serve` and `top` load and attach through it."""
from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ckptrace.core.errors import CkptraceError, EbpfUnavailable, TargetError
from ckptrace.core.meta import SchedCounters
from ckptrace.probes import arch, bpf_compile, bpf_runtime, cuda, kernel
from ckptrace.probes.messages import note, say, to_stderr
from ckptrace.probes.target import alive, resident_members

if TYPE_CHECKING:
    from ckptrace.probes.record_session import RecordOptions
    from ckptrace.probes.targets import Targets

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
# Indices of the kernel's `counters` array (checkpoint.h enum ckpt_counter; C_NEXT_ID is the
# kernel's id allocator, never read here). tests/test_enums.py holds these to the header.
C_LOST, C_PARTIAL, C_ABANDONED, C_MAP_FULL, C_THREADS_SEEN, C_THREADS_PRUNED, C_THREADS_PEAK = 0, 1, 3, 4, 5, 6, 7
C_GPU_RANGES_FULL, C_PINNED_FULL = 9, 10
MAX_TARGETS = 64  # processes one recording follows (the kernel's `targets` map)


def machine_checks() -> None:
    """Public API (record and serve): root, bcc installed (not imported: it maps its compiler,
    see probes/bpf_runtime.py), its runtime library, kernel headers, tracefs; one line each."""
    kernel.require_privileges()
    bpf_compile.bcc_version()
    bpf_runtime.library()
    kernel.kernel_headers_dir()
    kernel.tracefs_dir()


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
        obj = bpf_compile.compiled(BPF_SOURCE, cflags, kernel.kernel_headers_dir(), status=status.draw, note=note)
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
            to_stderr("\r" + f"ckptrace: {text}"[:79].ljust(79))
            self.drawn = True
        elif self.line:
            say(f"ckptrace: {text}")
            self.line = False

    def clear(self) -> None:
        if self.drawn:
            to_stderr("\r" + " " * 79 + "\r")
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
