"""Checkpoint buffers held, one syscall row at a time: the rule analyzers/memory.py replays over a
trace and `serve` and `top` keep per process across live batches (pure Python, no pandas: the
long-running commands import it alone).

A checkpoint buffer is a mapping made while a checkpoint was being made (an mmap whose phase is
one of BUFFER_PHASES); it is held until unmapped, and an mremap moves or resizes it
(analyzers/memory.py's docstring has the whole rule and its limits).
"""
from __future__ import annotations

BUFFER_PHASES = ("fill", "checkpoint", "create")


class HeldBuffers:
    """One process's live checkpoint buffers as [start, end) ranges, replayed one syscall row at a
    time in order (`serve` keeps one per process across its batches)."""

    def __init__(self):
        self.live: dict[int, int] = {}  # start -> end of each live buffer range
        self.held = 0

    def step(self, kind: str, phase: str, addr: int, nbytes: int, old_addr: int = 0,
             old_bytes: int = 0) -> tuple[bool, int]:
        """Apply an mmap/munmap/mremap row: (whether the held bytes changed, bytes it freed)."""
        a, b = addr, addr + nbytes
        if kind == "mremap" and old_addr:  # a buffer (or part of one) moved or resized: held at its new range
            moved = _cut(self.live, old_addr, old_addr + old_bytes)
            if not moved:
                return False, 0
            self.held += b - a - moved - _cut(self.live, a, b)
            self.live[a] = b
            return True, 0
        if kind == "mremap":  # the old range not recorded (an older trace): a buffer resized where it is
            if a not in self.live:
                return False, 0
            self.held += b - self.live[a]
            self.live[a] = b
            return True, 0
        if kind == "mmap" and phase in BUFFER_PHASES:
            self.held += b - a - _cut(self.live, a, b)
            self.live[a] = b
            return True, 0
        freed = _cut(self.live, a, b)  # an munmap, or a mapping placed over a buffer
        self.held -= freed
        return bool(freed), freed


def _cut(live: dict[int, int], a: int, b: int) -> int:
    """Remove [a, b) from the live ranges; the bytes removed."""
    removed = 0
    if a in live and live[a] <= b:  # the common case: a whole buffer unmapped
        removed = live.pop(a) - a
        if b - a == removed:
            return removed
    for s, e in [(s, e) for s, e in live.items() if s < b and e > a]:
        del live[s]
        removed += min(e, b) - max(s, a)
        if s < a:
            live[s] = a
        if e > b:
            live[b] = e
    return removed
