"""Warm-up: each thread's first prefill iterations, and the checkpoints made in them (cold).

A process's first checkpoints are made with nothing to reuse: a pool is empty (every one a
miss), the heap, the page cache and the code are cold. They are the same work in every arm, so
they are compared only with each other, never set against another arm's steady state, and the
iteration statistics leave them out, as pyperf and hyperfine leave out their warm-up runs.

- `warmup` is a number N (each thread's first N prefill iterations; 0: no warm-up) or "auto":
  each thread's prefill iterations up to and including the first one that made a checkpoint
  (a thread with checkpoints but none inside a prefill iteration: its first checkpoint). Chosen
  by measurement (docs/validation.md, "Warm-up"): on the sample workload and llama-server the
  first checkpointing iteration is where a pool-on leg's misses are and where both arms' first
  checkpoints take longer; the iterations after it are in the steady state.
- A checkpoint is cold when it started before its thread's warm-up ended; warm otherwise.
- A leg with no warm prefill iteration or no warm checkpoint left is `short`: nothing is judged
  on it (compare says so in one line).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

AUTO = "auto"


def parse_warmup(value: str | int) -> int | str:
    """`--warmup`'s value: a count >= 0 or "auto"; ValueError (one line) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif str(value).strip().lower() == AUTO:
        return AUTO
    else:
        try:
            n = int(str(value).strip())
        except ValueError:
            raise ValueError(f"--warmup takes a number of prefill iterations (0 or more) or 'auto', "
                             f"not {value!r}") from None
    if n < 0:
        raise ValueError(f"--warmup takes a number of prefill iterations (0 or more) or 'auto', not {n}")
    return n


@dataclass
class Warmup:
    """One leg's warm-up: masks over its checkpoint table and its prefill iterations."""
    setting: int | str
    cold: np.ndarray  # per checkpoint (rows of analysis.checkpoints): made during its thread's warm-up
    warmup_iterations: np.ndarray  # per prefill iteration (analysis.iterations' prefill rows, in order)
    short: bool  # no warm prefill iteration or no warm checkpoint left

    @property
    def warm(self) -> np.ndarray:
        return ~self.cold

    @property
    def warm_iterations(self) -> np.ndarray:
        return ~self.warmup_iterations


def prefill_rows(iterations: pd.DataFrame) -> pd.DataFrame:
    return iterations.loc[(iterations["kind"] == "prefill").to_numpy()]


def split(analysis, warmup: int | str = AUTO) -> Warmup:
    """The leg's warm-up under `warmup` (see the module docstring)."""
    ck, pre = analysis.checkpoints, prefill_rows(analysis.iterations)
    ck_tid, ck_start = ck["tid"].to_numpy(), ck["start_ns"].to_numpy()
    it_tid, it_start, it_end = pre["tid"].to_numpy(), pre["start_ns"].to_numpy(), pre["end_ns"].to_numpy()
    made = pre["checkpoints"].to_numpy() > 0
    in_warmup = np.zeros(len(pre), bool)
    cold = np.zeros(len(ck), bool)
    for tid in np.union1d(np.unique(ck_tid), np.unique(it_tid)):
        mine = np.flatnonzero(it_tid == tid)
        mine = mine[np.argsort(it_start[mine], kind="stable")]
        if warmup == AUTO:
            first = np.flatnonzero(made[mine])
            upto = int(first[0]) + 1 if len(first) else 0
            if not len(first):  # no prefill iteration made one: the thread's first checkpoint is its warm-up
                own = ck_tid == tid
                if own.any():
                    cold |= own & (ck_start == ck_start[own].min())
        else:
            upto = min(int(warmup), len(mine))
        in_warmup[mine[:upto]] = True
        if upto:
            cold |= (ck_tid == tid) & (ck_start < it_end[mine[upto - 1]])
    short = bool(not (~cold).any() or (len(pre) and in_warmup.all()))
    return Warmup(warmup, cold, in_warmup, short)


def described(warmup: int | str) -> str:
    """The setting in words, for reports."""
    if warmup == AUTO:
        return "auto: each thread's prefill iterations through the first that made a checkpoint"
    if int(warmup) == 0:
        return "none (--warmup 0)"
    return f"each thread's first {int(warmup)} prefill iteration{'s' if int(warmup) > 1 else ''}"
