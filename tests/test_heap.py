"""ckptrace.core.heap: the commands that read traces keep freed memory for reuse, so a block freed and
allocated again comes back without fresh-page faults (each a page the kernel must zero), and ask
numpy for no 2 MiB pages."""
from __future__ import annotations

import subprocess
import sys

import pytest

# Faults of a 64 MiB block allocated again after a first was freed, in a fresh interpreter (the
# setting is process-wide: never in pytest's own process).
SCRIPT = """
import resource, sys
import numpy as np
try:
    from numpy._core import multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray
from ckptrace.core.heap import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    print("no-mallopt")
    sys.exit()
if multiarray._get_madvise_hugepage() != (sys.argv[1] == "default"):
    sys.exit("numpy's huge page advice not as asked")
a = np.ones(64 << 20, "uint8")
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(64 << 20, "uint8")
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "no-mallopt":
        pytest.skip("this C library has no mallopt (not glibc)")
    return int(r.stdout)


def test_a_freed_block_is_reused_without_faults():
    kept, default = faults("keep"), faults("default")
    # glibc's default unmaps a block this size at free: 32 huge pages or 16,384 small ones again.
    assert default >= 32, default
    assert kept < 8, kept
