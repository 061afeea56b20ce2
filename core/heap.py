"""Memory reused, not faulted in fresh, in the commands that read traces and exit.

By default glibc hands a large block (32 MiB at most, often much less) back to the kernel when it is
freed, so the next one comes back as fresh pages the kernel must fault in and zero: the cost
ckptrace measures in llama-server's checkpoints. An analysis allocates and frees many column-sized
arrays; kept, they are reused warm (at 10M events its system time fell from 0.83 to 0.07 s with
the same peak RSS, benchmarks/bench_analyzer.py). The memory is not given back before the process
exits, so only commands that exit when done ask for this. numpy's advice that its large arrays
take 2 MiB pages is turned off too: each such page is zeroed whole at its first touch, and the
analysis at 10M then took 0.58-0.60 CPU s against 1.07-1.23 with the advice (three runs each,
alternating, on a 2-core VM); peak RSS the same.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_NEVER = 2**31 - 1  # mallopt takes an int: trim only above 2 GiB of free heap top


def keep_freed_memory() -> bool:
    """Serve every block from the heap (no mapping of its own to unmap at free), keep the heap's
    free top, and no 2 MiB pages for numpy's arrays; False where the C library has no mallopt
    (only numpy's advice changed)."""
    try:  # imported here: the commands that never read a trace don't load numpy
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray

    set_huge = getattr(multiarray, "_set_madvise_hugepage", None)  # NUMPY_MADVISE_HUGEPAGE=0, in process
    if set_huge is not None:
        set_huge(False)
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no C library to load by name (not Linux)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_NEVER))


def return_freed_memory() -> bool:
    """Give the C heap's free memory back to the kernel now (glibc's malloc_trim(0)): what a
    long-running command freed while starting (symbol tables, a compile's output) stops counting
    in its resident memory. False where the C library has no malloc_trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
