"""What the kernel side does differently on the running machine's architecture (uname -m), and
its page size. The BPF program gets these as integer -D defines (cflags); each entry says why.

- llama_decode(ctx, llama_batch batch): the batch is a 56-byte struct passed by value. The x86-64
  SysV ABI passes it in memory: at the function's first instruction it sits just above the return
  address, at sp + 8. AAPCS64 passes a composite over 16 bytes by reference: the caller's copy's
  address is in the register the argument takes, x1 (PT_REGS_PARM2). BATCH_BY_REFERENCE picks.
- Page faults on a CUDA copy's destination (the only per-fault program at the defaults' reach, and
  only while a CUDA target is traced): exceptions:page_fault_user/kernel exist on x86 only; where
  they don't, the `page-faults` software perf event (PERF_COUNT_SW_PAGE_FAULTS, on every CPU, a
  sample per fault) gives the same faults with their address (bpf_perf_event_data.addr).
- Syscalls: the recorder attaches syscalls:sys_enter_mmap and its kin by name, which each
  architecture's kernel maps to its own numbers (arm64's generic table: mmap 222, munmap 215,
  mremap 216); no number is written here.
- Uprobes at a function's entry: on aarch64 built with -mbranch-protection the first instruction
  is `bti c` or `paciasp`, which the kernel single-steps like any other (a hint instruction).
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass

PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS = 1, 2  # linux/perf_event.h


@dataclass(frozen=True)
class Arch:
    machine: str  # uname -m
    batch_by_reference: bool  # llama_decode's llama_batch: its address in the second argument register
    fault_tracepoints: bool  # exceptions:page_fault_user / page_fault_kernel exist


ARCHES = {
    "x86_64": Arch("x86_64", batch_by_reference=False, fault_tracepoints=True),
    "aarch64": Arch("aarch64", batch_by_reference=True, fault_tracepoints=False),
}


def running(machine: str | None = None) -> Arch:
    """The running machine's entry; another architecture is read as aarch64 is (the generic
    ABI: a large struct by reference, no x86 exception tracepoints)."""
    machine = machine or platform.machine()
    return ARCHES.get(machine) or Arch(machine, batch_by_reference=True, fault_tracepoints=False)


def cflags(arch: Arch) -> list[str]:
    """The -D defines checkpoint.bpf.c reads for this architecture (integers only)."""
    return [f"-DBATCH_BY_REFERENCE={int(arch.batch_by_reference)}"]


def page_size() -> int:
    """The running kernel's page size in bytes (4 KiB on x86-64; 4, 16 or 64 KiB on arm64)."""
    return os.sysconf("SC_PAGE_SIZE")


def ring_pages(kib4: int, page: int | None = None) -> int:
    """Kernel pages for a ring buffer of `kib4` 4 KiB units (--ringbuf-pages keeps its size in bytes
    on a 16 or 64 KiB kernel): at least one page, a power of two as the kernel wants."""
    page = page or page_size()
    return max(1, kib4 * 4096 // page)
