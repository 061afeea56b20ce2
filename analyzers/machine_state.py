"""The machine-state guard: were the legs recorded in one state of the machine, and what may a
verdict then say?

Each leg's trace carries what else the machine was doing (meta.machine, probes/machine.py) and
its spans' run-queue wait (summary's wait shares). Legs are in one state when every figure of
STATE_FIGURES spreads over the legs by no more than its tolerance. When they are not, the
metrics that state moves (STATE_MOVED: wall times, and on-CPU time of memory-bound spans:
another task's memory traffic slows a zero fill or a copy on the CPU too) are judged only where
the change is larger than the state can explain, `bound()`:
- on CPU: by CPU_FACTOR either way (the largest ratio a background job switched on and off
  between legs gave in an A/A/A, with margin: docs/validation.md, "Machine state");
- wall time: that times the ratio of the legs' 1 / (1 - wait share) (a span that waited a share w
  of its wall time for a CPU took 1 / (1 - w) times its wall time without waiting), highest leg
  over lowest;
- request metrics (TTFT, throughput) have no bound: they are judged only in one state.
A change whose 95% interval lies wholly outside that factor keeps its verdict; any other reads
"not judged". Exact counts (page faults) are never moved by the state: always judged.

With enough legs per arm, interleaved (A/B/A/B/...), a verdict need not rest on one state: the
legs' own statistics are ranked (Mann-Whitney U, exact, two-sided, as benchstat does) and a
moved metric keeps its verdict where p < ALPHA. The smallest p two arms of n and m legs can give
is 2 / C(n + m, n): 4 legs per arm at least (or 3 and 5).

Legs without a machine record (traces made before it, or a recording cut short) are "not
recorded": compare then falls back to the busy-machine rule (compare.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

# figure -> (what it is, how it is shown, tolerance: the largest spread over the legs that is one
# state). The spread is highest less lowest, except for the CPU frequency (of the highest) and the
# spans' wait (the ratio of the legs' 1 / (1 - wait share): what waiting did to their wall times;
# at 80% waiting, 5 points more wait is 1.33 times the wall time).
STATE_FIGURES: dict[str, tuple[str, str, float]] = {
    "others_cores": ("other tasks' CPU", "cores", 0.3),
    "psi_cpu_some": ("time some task waited for a CPU (PSI)", "%", 0.15),
    "psi_memory_some": ("time some task stalled on memory (PSI)", "%", 0.05),
    "steal_share": ("steal", "%", 0.05),
    "cpu_mhz": ("CPU frequency", "MHz", 0.05),
    "throttle_events": ("thermal throttling", "events", 0.0),
    "wait_share": ("the spans' waiting for a CPU", "%", 1.10),  # from the trace's own spans
}


def spread(name: str, lo: float, hi: float) -> float:
    """How far apart the legs are on a figure, in the unit of its tolerance."""
    if name == "cpu_mhz":
        return (hi - lo) / hi if hi else 0.0
    if name == "wait_share":
        return math.inf if hi >= 1 else (1 - lo) / (1 - hi)
    return hi - lo
CPU_FACTOR = 1.5  # measured: 1.26 at most in 20 A/A/A, docs/validation.md, "Machine state"
ALPHA = 0.05
MAX_SPLITS = 20_000  # above this many splits of the legs, the rank test samples them
WAIT_SOURCES = {"checkpoint": ("wait_share",), "prefill iteration": ("prefill_wait_share",),
                "restore": ("wait_share", "prefill_wait_share"),
                "prompt save": ("wait_share", "prefill_wait_share")}


@dataclass
class Guard:
    recorded: bool  # every leg has a machine record
    one_state: bool
    differences: list[str]  # which figures differ, and how (one phrase each)
    not_recorded: list[int]  # legs (1-based) without a machine record
    legs: list[dict]  # each leg's figures (None: not available)
    analyses: list = field(default_factory=list, repr=False)

    def said(self) -> str:
        """One line for the report."""
        if not self.recorded:
            which = ", ".join(map(str, self.not_recorded))
            return (f"machine state: not recorded (leg{'s' if len(self.not_recorded) > 1 else ''} {which}: "
                    "a trace from before the record, or cut short); the busy-machine rule applies")
        if self.one_state:
            return "machine state: the legs ran in one state (" + _summary(self.legs) + ")"
        return "machine state: the legs did not run in one state: " + "; ".join(self.differences)


def leg_figures(analysis) -> dict | None:
    """A leg's state figures, or None when its trace has no machine record."""
    m = analysis.trace.meta.machine
    if m is None or not m.recorded:
        return None
    s = analysis.summary
    waits = [x for x in (s.get("wait_share"), s.get("prefill_wait_share")) if x is not None]
    return {"others_cores": m.others_cores, "others_cores_min": m.others_cores_min,
            "others_cores_max": m.others_cores_max, "cpus": m.cpus,
            "psi_cpu_some": m.psi_cpu_some, "psi_memory_some": m.psi_memory_some, "steal_share": m.steal_share,
            "cpu_mhz": m.cpu_mhz_max, "cpu_mhz_min": m.cpu_mhz_min, "throttle_events": m.throttle_events,
            "wait_share": max(waits) if waits else None}


def _show(name: str, v: float) -> str:
    unit = STATE_FIGURES[name][1]
    if unit == "%":
        return f"{100 * v:.0f}%"
    if unit == "cores":
        return f"{v:.2f}"
    return f"{v:.0f}"


def _summary(legs: list[dict]) -> str:
    o = [x["others_cores"] for x in legs if x["others_cores"] is not None]
    return (f"other tasks' CPU {min(o):.2f} to {max(o):.2f} cores of {legs[0]['cpus']}" if o
            else "other tasks' CPU not available")


def guard(analyses: list) -> Guard:
    figures = [leg_figures(a) for a in analyses]
    missing = [i + 1 for i, f in enumerate(figures) if f is None]
    if missing:
        return Guard(False, False, [], missing, [], analyses)
    diffs = []
    for name, (what, unit, tol) in STATE_FIGURES.items():
        values = [(i + 1, f[name]) for i, f in enumerate(figures) if f[name] is not None]
        if len(values) < 2:
            continue
        lo, hi = min(v for _, v in values), max(v for _, v in values)
        if spread(name, lo, hi) > tol:
            per_leg = ", ".join(f"leg {i} {_show(name, v)}" for i, v in values)
            extra = f" (of {figures[0]['cpus']} CPUs)" if name == "others_cores" else ""
            diffs.append(f"{what} {per_leg}{extra}")
    return Guard(True, not diffs, diffs, [], figures, analyses)


def factor(g: Guard, sample: str, wall: bool) -> float:
    """How much the legs' states can move a metric of `sample` units by themselves (1: not at all;
    inf: unbounded). In one state, 1."""
    if g.one_state:
        return 1.0
    if not wall:
        return CPU_FACTOR
    keys = WAIT_SOURCES.get(sample)
    if keys is None:
        return math.inf
    inflation = []
    for a in g.analyses:
        waits = [a.summary.get(k) for k in keys]
        if any(w is None for w in waits):
            return math.inf
        w = max(waits)
        inflation.append(math.inf if w >= 1 else 1 / (1 - w))
    return CPU_FACTOR * max(inflation) / min(inflation)


def beyond(lo_pct: float, hi_pct: float, f: float) -> bool:
    """The change's whole 95% interval lies outside what a factor `f` either way explains."""
    if not (math.isfinite(lo_pct) and math.isfinite(hi_pct)) or not math.isfinite(f):
        return False
    return 1 + hi_pct / 100 < 1 / f or 1 + lo_pct / 100 > f


def _u(x: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney U of x against y (ties count a half)."""
    return float(((x[:, None] > y[None, :]).sum() + 0.5 * (x[:, None] == y[None, :]).sum()))


def mann_whitney_p(x, y) -> float:
    """Exact two-sided p of Mann-Whitney U for small samples (every split of the pooled values)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    if not n or not m:
        return 1.0
    pooled = np.concatenate([x, y])
    mean_u = n * m / 2
    seen = abs(_u(x, y) - mean_u)
    if math.comb(n + m, n) <= MAX_SPLITS:
        splits = (list(idx) for idx in itertools.combinations(range(n + m), n))
    else:  # too many to list: a seeded sample of them
        rng = np.random.default_rng(0)
        splits = (rng.permutation(n + m)[:n] for _ in range(MAX_SPLITS))
    count = total = 0
    for idx in splits:
        mask = np.zeros(n + m, bool)
        mask[idx] = True
        total += 1
        count += abs(_u(pooled[mask], pooled[~mask]) - mean_u) >= seen - 1e-9
    return count / total


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided p an exact rank test of n against m legs can give."""
    return 2 / math.comb(n + m, n) if n and m else 1.0


def legs_needed(n: int, m: int) -> str:
    """What a leg-level verdict needs, as benchstat says it."""
    return (f"a verdict from the legs alone needs a smallest possible p under {ALPHA} (exact rank test, as "
            f"benchstat): at least 4 legs per arm, interleaved (A/B/A/B/A/B/A/B), or 3 and 5; these "
            f"arms have {n} and {m} (smallest p {smallest_p(n, m):.2f})")
