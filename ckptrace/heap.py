"""glibc's allocator told to keep freed memory for reuse, in the commands that read traces and exit.

By default glibc hands a large block (32 MiB at most, often much less) back to the kernel when it is
freed, so the next one comes back as fresh pages the kernel must fault in and zero: the cost
ckptrace measures in llama-server's checkpoints. An analysis allocates and frees many column-sized
arrays; kept, they are reused warm (at 10M events its system time fell from 0.83 to 0.07 s with
the same peak RSS, benchmarks/bench_analyzer.py). The memory is not given back before the process
exits, so only commands that exit when done ask for this.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_NEVER = 2**31 - 1  # mallopt takes an int: trim only above 2 GiB of free heap top


def keep_freed_memory() -> bool:
    """Serve every block from the heap (no mapping of its own to unmap at free) and keep the
    heap's free top; False, nothing changed, where the C library has no mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_NEVER))
