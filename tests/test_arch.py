"""The per-architecture table of the kernel side (probes/arch.py), checked on any machine; the
x86-64 rows are what tests/test_record.py records with, the aarch64 ones what an arm64 kernel gets."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from ckptrace.probes import arch, loader

SOURCE = Path(loader.BPF_SOURCE).read_text()


def test_llama_batch_is_read_where_each_abi_passes_it():
    # SysV x86-64: a 56-byte struct in memory above the return address; AAPCS64: by reference in x1
    assert arch.cflags(arch.ARCHES["x86_64"]) == ["-DBATCH_BY_REFERENCE=0"]
    assert arch.cflags(arch.ARCHES["aarch64"]) == ["-DBATCH_BY_REFERENCE=1"]
    decode = SOURCE[SOURCE.index("int decode_enter("):SOURCE.index("int decode_return(")]
    by_ref, by_value = re.search(r"#if BATCH_BY_REFERENCE\n(.*?)#else\n(.*?)#endif", decode, re.S).groups()
    assert "PT_REGS_PARM2(ctx)" in by_ref and "PT_REGS_SP(ctx) + 8" in by_value


def test_the_fault_source_exists_on_each_architecture():
    assert arch.ARCHES["x86_64"].fault_tracepoints and not arch.ARCHES["aarch64"].fault_tracepoints
    assert arch.running("riscv64") == arch.Arch("riscv64", batch_by_reference=True, fault_tracepoints=False)


def test_this_machine_and_its_page_size():
    assert arch.running() == arch.ARCHES.get(platform.machine(), arch.running())
    assert arch.page_size() == os.sysconf("SC_PAGESIZE") and arch.page_size() & (arch.page_size() - 1) == 0


def test_the_ring_buffer_keeps_its_bytes_on_larger_pages():
    # --ringbuf-pages counts 4 KiB units: 512 is 2 MiB on 4, 16 and 64 KiB kernels, and never below one page
    assert [arch.ring_pages(512, p) for p in (4096, 16384, 65536)] == [512, 128, 32]
    assert [arch.ring_pages(1, p) for p in (4096, 16384, 65536)] == [1, 1, 1]
    assert arch.ring_pages(512) == 512 * 4096 // arch.page_size()
