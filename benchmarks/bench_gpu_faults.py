"""What the CUDA path's page fault program costs a fault: every process's faults reach it while a
CUDA target is traced (checkpoint.bpf.c gpu_fault, on exceptions:page_fault_user/kernel).

This process faults in a fresh anonymous mapping (memset of --mib MiB, pages touched once) and
times it on its own thread CPU clock, in three conditions interleaved trial by trial: the program
detached; attached with no destination range open (one array read per fault: the common case); and
attached with a range open in another process (the read, then a hash lookup of this process that
misses). Reported: ns per fault in each, and the attached ones over the detached, medians of the
trials. Run as root:

    .venv/bin/python benchmarks/bench_gpu_faults.py --trials 15
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import time
from pathlib import Path

from ckptrace.probes import arch, cuda, loader
from ckptrace.probes.record_session import RecordOptions
from ckptrace.probes.targets import Targets

_libc = ctypes.CDLL(None)
_libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)


def fault_ns(n: int) -> tuple[float, int]:
    """Thread CPU ns per page to fault in `n` fresh bytes, and the faults taken."""
    buf = mmap.mmap(-1, n)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    f0 = _faults()
    t0 = time.thread_time_ns()
    _libc.memset(addr, 1, n)
    t = time.thread_time_ns() - t0
    faults = _faults() - f0
    del addr
    buf.close()
    return t / max(faults, 1), faults


def _faults() -> int:
    import resource

    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_minflt + ru.ru_majflt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    loader.machine_checks()
    opts = RecordOptions(output=Path("/dev/null"), rss_step_mib=0)
    bpf = loader.load_program(Targets([]), opts, preload=False)  # the fault programs load as attached
    bpf[b"dst_ranges"][ctypes.c_uint32(1)] = bpf[b"dst_ranges"].Leaf()  # another process (pid 1) with a table
    conditions = ("detached", "attached, none open", "attached, one open elsewhere")
    per = {c: [] for c in conditions}
    n = a.mib << 20
    fault_ns(n)  # warm up: the allocator and page tables of this process
    on = False
    try:
        for _ in range(a.trials):
            for c in conditions:
                attached = c != "detached"
                if attached and not on:
                    loader.attach_gpu_faults(bpf)
                if not attached and on:
                    if loader.gpu_fault_source() == "perf":  # arm64: the page-faults perf event
                        bpf.detach_perf_event(arch.PERF_TYPE_SOFTWARE, arch.PERF_COUNT_SW_PAGE_FAULTS)
                    for tp in cuda.FAULT_TRACEPOINTS if loader.gpu_fault_source() == "tracepoints" else ():
                        bpf.detach_tracepoint(tp.encode())
                on = attached
                bpf[b"gpu_open"][ctypes.c_int(0)] = ctypes.c_uint64(1 if c.endswith("elsewhere") else 0)
                per[c].append(fault_ns(n)[0])
    finally:
        bpf.cleanup()
    med = {c: statistics.median(v) for c, v in per.items()}
    out = {"mib": a.mib, "trials": a.trials, "ns_per_fault": med,
           "ratio": {c: med[c] / med["detached"] for c in conditions[1:]}}
    if a.json:
        print(json.dumps(out))
        return
    for c in conditions:
        extra = "" if c == "detached" else f"  ({out['ratio'][c]:.3f}x)"
        print(f"{c:30} {med[c]:8.0f} ns per fault{extra}")


if __name__ == "__main__":
    main()
