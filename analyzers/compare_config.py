"""compare's defaults, written once: the analyzer, the API, the command's options and demo read them.

No numpy or pandas here: the commands read it for their option defaults before anything loads.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompareConfig:
    """How legs are compared (analyzers/compare.py's module docstring says what each does)."""
    seed: int = 0  # the bootstrap's seed: the same seed, the same output
    n_boot: int = 2000  # bootstrap resamples per arm and metric (--resamples)
    min_effect_pct: float = 20.0  # changes up to this read "within drift" (--min-effect)
    statistic: str = "mean"  # what an arm is summarised by (compare.STATISTICS)
    warmup: int | str = "auto"  # each thread's warm-up (analyzers/warmup.py: N or "auto")


DEFAULTS = CompareConfig()
MIN_SAMPLES = 5  # per leg: fewer make no trustworthy interval (a warning; pool classes read "too few samples")
