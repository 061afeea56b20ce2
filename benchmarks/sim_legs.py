"""How often does compare's verdict rule read a metric the candidate does not change "slower"?

A simulation, not a recording: it shows why `ckptrace demo` records five legs of the sample
workload (A/B/A/B/A) rather than three. On a shared host a memory-bound span (the checkpoint's
copy) moves from leg to leg with the machine, not with the code: a CI-mode run of the suite here
(2026-12-02, one busy loop) read the README sample's copy about 6.3 ms on CPU pool-off and 8.0 ms
in its one pool-on leg, with the two pool-off legs' on-CPU checkpoint time 16.5% apart.

Each leg's mean is the true value times exp(N(0, sigma)) (the same for every arm: no real change).
compare's rule for a wall or on-CPU metric (analyzers/compare.py) is applied to the legs' means:
"slower" when the candidate arm's mean is above the baseline's by more than both the baseline
legs' spread (drift) and the 20% floor; the bootstrap interval over pooled checkpoints is left
out, as it excludes 0 whenever the legs differ at all (many checkpoints per leg). Printed: the
share of runs read "slower" and "faster", per leg pattern and sigma.

    .venv/bin/python benchmarks/sim_legs.py            # 200,000 runs per cell, seeded
"""
from __future__ import annotations

import argparse

import numpy as np

from ckptrace.analyzers.compare_config import DEFAULTS


def false_verdicts(pattern: str, sigma: float, runs: int, rng: np.random.Generator) -> tuple[float, float]:
    legs = np.exp(rng.normal(0.0, sigma, (runs, len(pattern))))
    a = legs[:, [i for i, c in enumerate(pattern) if c == "A"]]
    b = legs[:, [i for i, c in enumerate(pattern) if c == "B"]]
    base = a.mean(axis=1)
    change = 100.0 * (b.mean(axis=1) - base) / base
    bar = np.maximum(100.0 * (a.max(axis=1) - a.min(axis=1)) / base, DEFAULTS.min_effect_pct)
    return float((change > bar).mean()), float((change < -bar).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{'legs':<13} {'sigma':>5} {'slower':>8} {'faster':>8}")
    for sigma in (0.08, 0.10, 0.12, 0.15):
        for pattern in ("ABA", "ABABA", "ABABABA"):
            slower, faster = false_verdicts(pattern, sigma, args.runs, rng)
            print(f"{'/'.join(pattern):<13} {sigma:>5.2f} {slower:>8.2%} {faster:>8.2%}")


if __name__ == "__main__":
    main()
