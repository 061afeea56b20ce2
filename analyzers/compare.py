"""Baseline against candidate over A/B/A legs: bootstrap intervals of the change and drift-aware verdicts.

Rules:
- Legs come in run order and are grouped by label; the first label is the baseline, the second
  the candidate. A third label is an error.
- An arm's samples are the per-checkpoint values (per prefill iteration for
  `prefill_iteration_ns`) of all its legs, pooled. A leg with any value of a metric not recorded
  (NA: no clocks, fault time not recorded) is left out of that metric, never read as 0; an arm
  left empty that way reads "not recorded" (empty otherwise: "not measured").
- Each arm is summarised by a statistic, the mean by default (`statistic`; STATISTICS). Chosen by
  measurement (benchmarks/bench_verdicts.py, docs/validation.md): a pool-on leg is a mixture of warm-up misses
  and hits, whose median jumps between a miss's value and 0 as the hit fraction crosses one half,
  so median verdicts flipped between repetitions of the same A/B/A; the mean moves smoothly with
  the hit fraction. Means also add up (total = fill + copy + other).
- `change_pct = 100 * (candidate - baseline) / baseline` of the statistic. Its 95% interval is the
  2.5th..97.5th percentile of the same change over `n_boot` bootstrap resamples of each arm
  (numpy Generator seeded from `seed` and the metric's position, so reruns are identical).
  Checkpoint metrics resample pool hits and misses apart (stratified): a resample keeps the
  arm's hit count, which the pool's warm-up sets, not chance.
  scipy.stats.bootstrap's percentile method gives the same intervals (the same resampling) but
  took 1.1-2x longer on the sample traces and 5x longer with 5x the memory at 20k values per arm,
  and its BCa method is undefined (NaN) where an arm is constant (a pool's fill): kept numpy.
- When the baseline's statistic is 0 (e.g. fill faults with a pool-on baseline) a percentage
  means nothing: `change_pct` and its interval are 0 when the candidate's is 0 too, else None
  (NaN in the frame), and the verdict uses the interval of the plain difference (`diff_ci_low`,
  `diff_ci_high`, in the metric's unit) and the drift in that unit.
- Drift, with >= 2 baseline legs: the largest difference between baseline legs' statistic, in
  percent of the baseline's (`drift_pct`).
- Verdict: interval includes 0 -> "no change"; else |change| <= max(drift, min_effect_pct) ->
  "within drift"; else "faster" (change < 0) or "slower". The floor (default 20%) is there
  because two baseline legs give a single, often tiny, drift estimate, while whole runs of the
  same workload moved by more between legs on this project's shared 2-core VM (A/A/A, docs/validation.md).
  Every metric is a time or a fault count, so lower is faster.
- Busy machine: when any leg's checkpoints or prefill iterations waited for a CPU more than 10% of
  their wall time, the wall-time metrics (WALL_METRICS) read "not judged": their change is the
  machine's load as much as the code's (20 A/A/A runs on a loaded 2-core VM read faster or slower
  in 7 of 20 on wall time, each with a leg waiting 35-72%; on-CPU metrics in none). Their
  figures are still reported; the on-CPU, fault and fault-count metrics are judged as usual.
- Pool hits (`pool`, when any leg has them): the candidate's hits and its misses, each against
  the baseline (the baseline's own hits or misses when it has hits too), by their medians (one
  population per class), with the same interval, drift and verdict rules.
- Warnings: legs whose checkpoints or prefill iterations waited for a CPU more than 10% of their
  wall time (read the on-CPU metrics), values not recorded, too few samples, lost events, builds.
- The legs' own guard rails (leg_checks.py): the same recording twice is refused; arms the labels
  or the order contradict, an unbracketed candidate and legs of different programs or builds are
  warned, first.

The words (the verdicts' names, the explanation, the warnings) are compare_text.py's; the defaults
(seed, resamples, the floor, the statistic, the warm-up) compare_config.py's CompareConfig.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ckptrace.core.errors import AnalysisError
from ckptrace.core.meta import TraceMeta
from ckptrace.core.terminal import shown_label
from ckptrace.core.trace import Trace
from ckptrace.core.units import MIB

from . import Analysis, analyze_processes, analyze_trace
from .metrics import COUNT, METRICS as REGISTRY, POOL, compared
from . import machine_state
from .compare_config import DEFAULTS, MIN_SAMPLES, CompareConfig
from .compare_text import (JUDGED, MEMORY_VERDICT, NO_BASELINE, NOT_JUDGED, SAMPLES_NOTE, TOO_FEW,
                           auto_off_warning, explain, guard_warnings, guard_why, leg_warnings,
                           memory_sentence, request_warnings, short_warnings, ttft_said)
from .headline import headline
from .leg_checks import check_distinct, leg_warnings as leg_check_warnings
from .processes import process_label
from .summary import WAIT_WARN_SHARE
from .warmup import AUTO, Warmup, described, split

# The compared metrics, from the metric table (metrics.py): metric -> (sample unit, column or
# columns summed, unit).
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    m.name: (m.sample, m.columns, m.unit) for m in compared() if m.sample != "request"}
# Metrics of the state path: rows only when a leg recorded any of their sample unit.
RESTORE_METRICS = tuple(m.name for m in compared("restore"))
PROMPT_SAVE_METRICS = tuple(m.name for m in compared("prompt save"))
# Request metrics, from each leg's request file (`ckptrace drive --json`): metric -> (percentile
# of TTFT or None for throughput, unit). The statistic is that percentile itself (or tokens per
# second), bootstrapped over the arm's completed requests like any other metric.
REQUEST_METRICS: dict[str, tuple[int | None, str]] = {m.name: (m.percentile, m.unit) for m in compared("request")}
# Wall-clock metrics: they include run-queue wait, so a busy machine moves them (see "Busy machine").
WALL_METRICS = frozenset(m.name for m in compared() if m.wall)
# What the machine's state moves (machine_state.py): wall times, and on-CPU time of memory-bound
# work and the fault time taken from it; exact counts (checkpoint_faults) are not moved.
STATE_MOVED = frozenset(m.name for m in compared() if m.kind != COUNT)

LEG_COLUMNS = {"leg": "int64", "label": "str", "arm": pd.CategoricalDtype(["baseline", "candidate"]),
               "path": "str", "checkpoints": "int64", "prefill_iterations": "int64", "build_ids": "str",
               "lost_events": "int64", "pool_hits": "int64", "requests": "Int64",
               "warmup_iterations": "int64", "cold_checkpoints": "int64", "judged": "bool"}
METRIC_COLUMNS = {"metric": "str", "unit": "str", "sample": "str", "statistic": "str",
                  "baseline_value": "float64", "candidate_value": "float64", "change_pct": "float64",
                  "ci_low_pct": "float64", "ci_high_pct": "float64", "drift_pct": "float64", "verdict": "str",
                  "samples_baseline": "int64", "samples_candidate": "int64", "diff": "float64",
                  "diff_ci_low": "float64", "diff_ci_high": "float64", "drift_abs": "float64",
                  "baseline_median": "float64", "candidate_median": "float64",
                  "baseline_mean": "float64", "candidate_mean": "float64", "why": "str"}


def _trimmed_mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean of the middle 80% (10% cut from each end)."""
    n = x.shape[axis]
    k = int(n * 0.1)
    return np.take(np.sort(x, axis=axis), np.arange(k, n - k), axis=axis).mean(axis=axis)


# The statistic an arm is summarised by (see the module docstring for the choice).
STATISTICS = {"median": np.median, "mean": np.mean, "trimmed mean": _trimmed_mean}


@dataclass
class Comparison:
    baseline: str
    candidate: str
    legs: pd.DataFrame
    metrics: pd.DataFrame
    warnings: list[str]
    explanation: str
    samples: str = SAMPLES_NOTE
    seed: int = DEFAULTS.seed
    n_boot: int = DEFAULTS.n_boot
    min_effect_pct: float = DEFAULTS.min_effect_pct
    statistic: str = DEFAULTS.statistic
    pool: pd.DataFrame | None = None  # hits and misses against the baseline (when a leg had pool hits)
    memory: pd.DataFrame | None = None  # what the candidate costs in memory (_memory_rows)
    warmup: pd.DataFrame | None = None  # each arm's warm-up, reported apart (_warmup_rows)
    warmup_setting: int | str = DEFAULTS.warmup
    machine: dict | None = None  # the machine-state guard (_machine_doc)
    headline: dict | None = None  # the answer in one sentence and its figures (headline.py)
    ttft: pd.DataFrame | None = None  # each TTFT percentile's change split by the traced path (ttft.py)


def _rows_of(a: Analysis, source: str) -> pd.DataFrame:
    if source == "checkpoint":
        return a.checkpoints
    if source in ("restore", "prompt save"):
        t = a.restores if source == "restore" else a.prompt_saves
        return t if t is not None else pd.DataFrame(columns=["total_ns", "copy_ns"])
    return a.iterations.loc[(a.iterations["kind"] == "prefill").to_numpy()]


def _samples(a: Analysis, metric: str, rows: np.ndarray | None = None) -> np.ndarray:
    """A leg's samples of a metric (of the checkpoints in `rows` when given). A leg with any value
    not recorded gives none: not recorded is not zero, and the rest would be a biased part."""
    source, cols, _ = METRICS[metric]
    df = _rows_of(a, source)
    if rows is not None:
        df = df.loc[rows]
    values = df[list(cols)].astype("Float64").sum(axis=1, skipna=False)
    if values.isna().any():
        return np.empty(0)
    return values.to_numpy(dtype="float64")


def _part(w: Warmup, source: str, cold: bool = False) -> np.ndarray | None:
    """The rows of `source` (see _rows_of) in the warm-up (`cold`) or after it; None: every row
    (restores and prompt saves are not split)."""
    if source == "checkpoint":
        return w.cold if cold else w.warm
    if source == "prefill iteration":
        return w.warmup_iterations if cold else w.warm_iterations
    return None


def _not_recorded(a: Analysis, metric: str) -> bool:
    source, cols, _ = METRICS[metric]
    df = _rows_of(a, source)
    return bool(len(df) and df[list(cols)].isna().to_numpy().any())


def _boot(x: np.ndarray, rng: np.random.Generator, n_boot: int, stat, strata: np.ndarray | None = None
          ) -> np.ndarray:
    """`stat` of n_boot resamples of x, in blocks that keep the index matrix near 32 MB.

    With `strata` (a class per value, e.g. pool hit or miss), each class is resampled on its own
    and keeps its count: how many checkpoints hit is the pool's design (its warm-up), not chance,
    and resampling across classes would give replicates of a different pool."""
    out = np.empty(n_boot)
    block = max(1, 4_000_000 // len(x))
    groups = [np.flatnonzero(strata == v) for v in np.unique(strata)] if strata is not None else []
    for i in range(0, n_boot, block):
        k = min(block, n_boot - i)
        if len(groups) > 1:
            idx = np.concatenate([g[rng.integers(0, len(g), size=(k, len(g)))] for g in groups], axis=1)
        else:
            idx = rng.integers(0, len(x), size=(k, len(x)))
        out[i:i + k] = stat(x[idx], axis=1)
    return out


def _pct(cand, base):
    """100 * (cand - base) / base, with 0/0 = 0 and x/0 = +-inf, elementwise."""
    cand, base = np.asarray(cand, dtype="float64"), np.asarray(base, dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 100.0 * (cand - base) / base
    return np.where((base == 0) & (cand == base), 0.0, p)


def _interval(v: np.ndarray) -> tuple[float, float]:
    # "nearest" picks order statistics, so infinite replicates never turn into NaN.
    lo, hi = np.percentile(v, [2.5, 97.5], method="nearest")
    return float(lo), float(hi)


def _verdict(lo: float, hi: float, change: float, drift: float, floor: float = 0.0) -> str:
    if lo <= 0 <= hi:
        return "no change"
    if abs(change) <= max(0.0 if math.isnan(drift) else drift, floor):
        return "within drift"
    return "faster" if change < 0 else "slower"


def _metric_row(name: str, i: int, base_legs: list[np.ndarray], cand_legs: list[np.ndarray],
                seed: int, n_boot: int, min_effect_pct: float = 0.0, statistic: str = "median",
                strata: tuple[list, list] | None = None) -> dict:
    sample, _, unit = METRICS[name]
    return {"metric": name, "unit": unit, "sample": sample,
            **_change(base_legs, cand_legs, [seed, i], n_boot, min_effect_pct, statistic, strata)}


def _change(base_legs: list[np.ndarray], cand_legs: list[np.ndarray], seed, n_boot: int,
            min_effect_pct: float, statistic: str, strata: tuple[list, list] | None = None,
            stat=None, higher_is_faster: bool = False) -> dict:
    """The change of `statistic` from baseline to candidate, its interval, drift and verdict.

    `stat`: the statistic's function when it is not one of STATISTICS (fn(x) and fn(x, axis=1)
    over resamples); samples may then be rows of several values (2-D), which have no median or
    mean of their own (NaN). `higher_is_faster`: a rate, where a rise is "faster"."""
    stat = stat or STATISTICS[statistic]
    b, c = np.concatenate(base_legs), np.concatenate(cand_legs)
    nan = float("nan")

    def value(x, fn):
        return float(fn(x)) if len(x) and (x.ndim == 1 or fn is stat) else nan

    row = {"statistic": statistic, "samples_baseline": len(b), "samples_candidate": len(c),
           "baseline_median": value(b, np.median), "candidate_median": value(c, np.median),
           "baseline_mean": value(b, np.mean), "candidate_mean": value(c, np.mean),
           "baseline_value": value(b, stat), "candidate_value": value(c, stat)}
    if not len(b) or not len(c):  # e.g. no prefill iterations, or a figure not recorded, in one arm
        return {**row, "change_pct": nan, "ci_low_pct": nan, "ci_high_pct": nan, "drift_pct": nan,
                "verdict": "not measured", "diff": nan, "diff_ci_low": nan, "diff_ci_high": nan, "drift_abs": nan}
    bm, cm = row["baseline_value"], row["candidate_value"]
    rng = np.random.default_rng(seed)
    bs, cs = (np.concatenate(x) for x in strata) if strata is not None else (None, None)
    bb, cb = _boot(b, rng, n_boot, stat, bs), _boot(c, rng, n_boot, stat, cs)
    leg_values = [float(stat(x)) for x in base_legs if len(x)]
    drift_abs = max(leg_values) - min(leg_values) if len(leg_values) >= 2 else nan
    d_lo, d_hi = _interval(cb - bb)
    diff = cm - bm
    if bm != 0 or cm == 0:
        change = float(_pct(cm, bm))
        lo, hi = _interval(_pct(cb, bb))
        drift = 100.0 * drift_abs / abs(bm) if bm != 0 else (0.0 if drift_abs == 0 else nan)
        verdict = _verdict(lo, hi, -change if higher_is_faster else change, drift, min_effect_pct)
    else:  # baseline 0, candidate not: no percentage; judge the plain difference
        change = lo = hi = drift = nan
        verdict = _verdict(d_lo, d_hi, -diff if higher_is_faster else diff, drift_abs)
    return {**row, "change_pct": change, "ci_low_pct": lo, "ci_high_pct": hi, "drift_pct": drift,
            "verdict": verdict, "diff": diff, "diff_ci_low": d_lo, "diff_ci_high": d_hi, "drift_abs": drift_abs}

def _build_ids(meta: TraceMeta) -> list[str]:
    return sorted({o.build_id for o in meta.objects if o.build_id})


def _gaps(a: Analysis) -> tuple[str, ...]:
    """The metrics a leg did not record every value of."""
    return tuple(m for m in METRICS if _not_recorded(a, m))


def compare(traces: list, seed: int = DEFAULTS.seed, n_boot: int = DEFAULTS.n_boot,
            min_effect_pct: float = DEFAULTS.min_effect_pct, statistic: str = DEFAULTS.statistic,
            requests: list | None = None, warmup: int | str = DEFAULTS.warmup) -> Comparison:
    """Compare the legs (Trace or Analysis objects, in run order); see the module docstring.

    `warmup`: each thread's warm-up (analyzers/warmup.py: N prefill iterations, or "auto"), left
    out of the metrics and reported apart; a leg with nothing after it is left out, said in one line.

    `requests`: per leg, its request file's frame (ckptrace.core.requests_file.read_requests) or None;
    with any, the REQUEST_METRICS rows are added. A file none of whose requests ran while its
    leg was recorded is an AnalysisError (analyzers/requests.py)."""
    analyses, baseline, candidate = _labelled(traces)
    arms = ["baseline" if a.trace.label == baseline else "candidate" for a in analyses]
    warmup, warm, auto_off = _warm_parts(analyses, arms, warmup, baseline, candidate)
    cfg = CompareConfig(seed=seed, n_boot=n_boot, min_effect_pct=min_effect_pct, statistic=statistic, warmup=warmup)
    legs = _leg_table(analyses, arms, warm, requests)
    if requests is not None:
        if len(requests) != len(analyses):
            raise AnalysisError(f"{len(requests)} request files for {len(analyses)} traces: give one per trace")
        requests, outside = _requests_inside(analyses, requests)

    rows, leg_values = _trace_rows(analyses, arms, warm, cfg)
    has_requests = requests is not None and any(r is not None for r in requests)
    ttft_rows = None
    if has_requests:
        request_rows, ttft_rows = _request_rows(analyses, arms, requests, seed, n_boot, min_effect_pct)
        rows += request_rows
    metrics = pd.DataFrame(rows, columns=list(METRIC_COLUMNS)).astype(METRIC_COLUMNS)
    pooled = legs["pool_hits"].sum() > 0
    pool = (_pool_rows(analyses, arms, warm, seed, n_boot, min_effect_pct) if pooled
            else pd.DataFrame(columns=list(POOL_COLUMNS)).astype(POOL_COLUMNS))
    g = machine_state.guard(analyses)
    if not g.recorded:
        if _busy(analyses):
            _withhold_wall(metrics)
            _withhold_wall(pool)
    else:
        _guard_rows(metrics, g, arms, leg_values)
        _guard_rows(pool, g, arms, None)
    memory = _memory_rows(analyses, arms)
    phases = lambda busy: _phase_split(analyses, arms, warm, busy)  # noqa: E731
    explanation = " ".join(x for x in (explain(metrics, baseline, candidate, phases),
                                       memory_sentence(memory, metrics)) if x)
    warnings = (leg_check_warnings([a.trace.meta for a in analyses], arms, baseline, candidate)
                + leg_warnings(analyses, arms, g.recorded, [_gaps(a) for a in analyses])
                + auto_off + short_warnings(analyses, warm, warmup) + guard_warnings(g, metrics, arms))
    c = Comparison(baseline=baseline, candidate=candidate, legs=legs, metrics=metrics,
                   warnings=warnings + (request_warnings(analyses, requests, outside) if has_requests else []),
                   explanation=explanation + ttft_said(metrics, ttft_rows),
                   seed=seed, n_boot=n_boot, min_effect_pct=min_effect_pct, statistic=statistic,
                   pool=pool, memory=memory, warmup=_warmup_rows(analyses, arms, warm), warmup_setting=warmup,
                   machine=_machine_doc(g), ttft=ttft_rows)
    c.headline = headline(c, analyses, arms, warm)
    return c


def _labelled(traces: list) -> tuple[list[Analysis], str, str]:
    """The legs analysed, and their two labels (baseline, candidate); an AnalysisError for legs
    compare can't take (fewer than two, the same recording twice, one or three labels, no checkpoints)."""
    if len(traces) < 2:
        raise AnalysisError(f"compare needs at least two traces, a baseline and a candidate label "
                            f"(ideally A/B/A); got {len(traces)}")
    check_distinct([(t.path, t.meta) for t in (x.trace if isinstance(x, Analysis) else x for x in traces)])
    analyses = [t if isinstance(t, Analysis) else analyze_trace(t) for t in traces]
    labels = list(dict.fromkeys(a.trace.label for a in analyses))
    if len(labels) == 1:
        raise AnalysisError(f"all {len(analyses)} traces have the label {shown_label(labels[0])!r}: compare needs two labels, "
                            "baseline then candidate (set them with `ckptrace record --label`)")
    if len(labels) > 2:
        raise AnalysisError(f"the traces have {len(labels)} labels ({', '.join(repr(shown_label(x)) for x in labels)}): compare "
                            "takes exactly two, the baseline's first; compare them two labels at a time")
    for a in analyses:
        if not len(a.checkpoints):
            raise AnalysisError(f"{a.trace.path or a.trace.label}: no checkpoints in this trace, nothing to "
                                "compare (was the target making checkpoints while it was recorded?)")
    baseline, candidate = labels
    return analyses, baseline, candidate


def _warm_parts(analyses: list[Analysis], arms: list[str], warmup: int | str, baseline: str, candidate: str
                ) -> tuple[int | str, list[Warmup], list[str]]:
    """Each leg's warm-up split (the setting it ends with, the splits, the warning when auto found
    none); an AnalysisError when an arm has nothing after its warm-up."""
    warm = [split(a, warmup) for a in analyses]
    auto_off = []
    if warmup == AUTO and any(w.short for w in warm):
        # auto finds no steady state in a leg: like for like, no leg leaves a warm-up out
        auto_off = [auto_off_warning(analyses, warm)]
        warmup, warm = 0, [split(a, 0) for a in analyses]
    for arm, label in (("baseline", baseline), ("candidate", candidate)):
        if all(w.short for w, x in zip(warm, arms) if x == arm):
            raise AnalysisError(f"every {arm} leg ({label}) has no prefill iteration or checkpoint after its warm-up "
                                f"({described(warmup)}): nothing to judge; give a smaller --warmup or record longer legs")
    return warmup, warm, auto_off


def _leg_table(analyses: list[Analysis], arms: list[str], warm: list[Warmup], requests: list | None) -> pd.DataFrame:
    return pd.DataFrame({
        "leg": range(1, len(analyses) + 1),
        "label": [a.trace.label for a in analyses],
        "arm": arms,
        "path": [a.trace.path or "" for a in analyses],
        "checkpoints": [a.summary["checkpoints"] for a in analyses],
        "prefill_iterations": [a.summary["prefill_iterations"] for a in analyses],
        "build_ids": [",".join(_build_ids(a.trace.meta)) for a in analyses],
        "lost_events": [a.summary["lost_events"] for a in analyses],
        "pool_hits": [a.summary["pool_hits"] for a in analyses],
        "requests": [None if r is None else int(len(r)) for r in (requests or [None] * len(analyses))],
        "warmup_iterations": [int(w.warmup_iterations.sum()) for w in warm],
        "cold_checkpoints": [int(w.cold.sum()) for w in warm],
        "judged": [not w.short for w in warm],
    }).astype(LEG_COLUMNS)


def _trace_rows(analyses: list[Analysis], arms: list[str], warm: list[Warmup], cfg: CompareConfig
                ) -> tuple[list[dict], dict[str, list[float]]]:
    """One row per metric of the traces (METRICS; the state path's only where a leg has its rows),
    and each leg's statistic per metric (the machine-state guard's rank test)."""
    rows = []
    leg_values: dict[str, list[float]] = {}
    restored = any(a.restores is not None and len(a.restores) for a in analyses)
    saved = any(a.prompt_saves is not None and len(a.prompt_saves) for a in analyses)
    stat = STATISTICS[cfg.statistic]
    for i, name in enumerate(METRICS):  # a handful of metrics: the work is inside, vectorised
        if (name in RESTORE_METRICS and not restored) or (name in PROMPT_SAVE_METRICS and not saved):
            continue
        source = METRICS[name][0]
        per_leg = [np.empty(0) if w.short else _samples(a, name, _part(w, source)) for a, w in zip(analyses, warm)]
        leg_values[name] = [float(stat(x)) if len(x) else math.nan for x in per_leg]
        strata = None
        if source == "checkpoint":  # pool hits and misses resampled apart (see _boot)
            hits = [a.checkpoints["pool_hit"].to_numpy()[w.warm] if len(x) else np.empty(0, bool)
                    for a, w, x in zip(analyses, warm, per_leg)]
            strata = ([h for h, arm in zip(hits, arms) if arm == "baseline"],
                      [h for h, arm in zip(hits, arms) if arm == "candidate"])
        row = _metric_row(name, i, [x for x, arm in zip(per_leg, arms) if arm == "baseline"],
                          [x for x, arm in zip(per_leg, arms) if arm == "candidate"], cfg.seed, cfg.n_boot,
                          cfg.min_effect_pct, cfg.statistic, strata)
        if row["verdict"] == "not measured" and any(_not_recorded(a, name) for a in analyses):
            row["verdict"] = "not recorded"
        rows.append({**row, "why": ""})
    return rows, leg_values


def _phase_split(analyses: list[Analysis], arms: list[str], warm: list[Warmup], busy: bool
                 ) -> tuple[str, float, float, float]:
    """Which phase a checkpoint's mean change comes from: (phase, its change, the total change, the
    fault time's change), in ns per checkpoint over the warm checkpoints, on CPU when `busy`.
    Means add up (total = fill + copy + other), so they split the change between phases."""
    def mean_of(arm, col):  # over the warm checkpoints, as the metrics
        return float(np.mean(np.concatenate([a.checkpoints[col].to_numpy(dtype="float64", na_value=np.nan)[w.warm]
                                             for a, x, w in zip(analyses, arms, warm) if x == arm and not w.short])))

    cols = ({"fill": "fill_cpu_ns", "copy": "copy_cpu_ns", "total": "cpu_ns"} if busy
            else {"fill": "fill_ns", "copy": "copy_ns", "total": "total_ns"})
    delta = {p: mean_of("candidate", cols[p]) - mean_of("baseline", cols[p]) for p in cols}
    total = delta.pop("total")
    delta["other"] = total - delta["fill"] - delta["copy"]
    phase = max(delta, key=lambda p: abs(delta[p]) if np.sign(delta[p]) == np.sign(total) else -1)
    fault = mean_of("candidate", "fault_ns") - mean_of("baseline", "fault_ns")
    return phase, delta[phase], total, fault


def _busy(analyses: list[Analysis]) -> bool:
    """Any leg whose spans waited for a CPU more than WAIT_WARN_SHARE of their wall time."""
    return any(x is not None and x > WAIT_WARN_SHARE
               for a in analyses for x in (a.summary.get("wait_share"), a.summary.get("prefill_wait_share")))


def _withhold_wall(frame: pd.DataFrame) -> None:
    """Wall-time verdicts of a busy comparison become NOT_JUDGED (figures kept)."""
    wall = frame["metric"].isin(WALL_METRICS) & frame["verdict"].isin(JUDGED)
    frame.loc[wall, "verdict"] = NOT_JUDGED


MEMORY_METRICS = {"held_peak_mib": "peak_held_bytes", "rss_peak_mib": "peak_rss_bytes"}
MEMORY_COLUMNS = {"metric": "str", "baseline_value": "float64", "candidate_value": "float64",
                  "change_mib": "float64", "change_pct": "float64", "drift_mib": "float64", "verdict": "str",
                  "legs_mib": "object"}


def _memory_rows(analyses: list[Analysis], arms: list[str]) -> pd.DataFrame:
    """The memory a candidate costs: each leg's peak of checkpoint buffers held and of RSS (MiB),
    the arms' means and the change; single figures per leg (no samples to resample), with the
    spread of the baseline legs' figures as drift. A leg that did not record RSS leaves the row's
    arm NaN (not recorded), never 0."""
    rows = []
    for metric, key in MEMORY_METRICS.items():
        per_leg = [a.memory[key] / MIB if a.memory[key] is not None else math.nan for a in analyses]
        arm = {x: [v for v, y in zip(per_leg, arms) if y == x] for x in ("baseline", "candidate")}
        b, c = (float(np.mean(arm[x])) if arm[x] and not any(map(math.isnan, arm[x])) else math.nan
                for x in ("baseline", "candidate"))
        drift = max(arm["baseline"]) - min(arm["baseline"]) if len(arm["baseline"]) > 1 else math.nan
        rows.append({"metric": metric, "baseline_value": b, "candidate_value": c, "change_mib": c - b,
                     "change_pct": (c - b) / b * 100 if b else math.nan, "drift_mib": drift,
                     "verdict": MEMORY_VERDICT if math.isfinite(c - b) else "not recorded",
                     "legs_mib": [None if math.isnan(v) else v for v in per_leg]})
    return pd.DataFrame(rows, columns=list(MEMORY_COLUMNS)).astype(MEMORY_COLUMNS)


POOL_METRICS = POOL
POOL_COLUMNS = {"class": "str", "metric": "str", **{k: v for k, v in METRIC_COLUMNS.items()
                                                     if k not in ("metric", "unit", "sample")}}


# Pool classes: (name, pool hit, cold). Warm hits and misses keep their names ("hits", "misses").
POOL_CLASSES = (("hits", True, False), ("misses", False, False), ("cold hits", True, True),
                ("cold misses", False, True))


def _pool_rows(analyses: list[Analysis], arms: list[str], warm: list[Warmup], seed: int, n_boot: int,
               min_effect_pct: float) -> pd.DataFrame:
    """Pool hits and misses of each arm, warm and cold apart, each against the baseline's of the
    same class (see the module docstring)."""
    def legs_of(arm, hit, cold):
        out = {m: [] for m in POOL_METRICS}
        for a, x, w in zip(analyses, arms, warm):
            if x == arm and not w.short:
                rows = _part(w, "checkpoint", cold)
                if hit is not None:
                    rows = rows & (a.checkpoints["pool_hit"] == hit).to_numpy()
                for m in POOL_METRICS:
                    out[m].append(_samples(a, m, rows))
        return out

    base_hits = sum(int(a.checkpoints["pool_hit"].sum()) for a, x in zip(analyses, arms) if x == "baseline")
    rows = []
    for j, (cls, hit, cold) in enumerate(POOL_CLASSES):
        cand = legs_of("candidate", hit, cold)
        base = legs_of("baseline", hit if base_hits else None, cold)
        for k, m in enumerate(POOL_METRICS):
            nc, nb = sum(len(x) for x in cand[m]), sum(len(x) for x in base[m])
            if not nc:
                continue
            row = _change(base[m] or [np.empty(0)], cand[m], [seed, 100 + 10 * j + k], n_boot, min_effect_pct, "median")
            if not nb:
                row["verdict"] = NO_BASELINE
            elif min(nb, nc) < MIN_SAMPLES and row["verdict"] in JUDGED:
                row["verdict"] = TOO_FEW
            rows.append({"class": cls, "metric": m, **row, "why": ""})
    return pd.DataFrame(rows, columns=list(POOL_COLUMNS)).astype(POOL_COLUMNS)


WARMUP_COLUMNS = {"arm": "str", "legs": "int64", "warmup_iterations": "int64", "warmup_iteration_ns": "float64",
                  "warmup_iteration_cpu_ns": "float64", "steady_iteration_ns": "float64",
                  "cold_checkpoints": "int64", "cold_hits": "int64", "cold_total_ns": "float64",
                  "cold_total_cpu_ns": "float64"}


def _warmup_rows(analyses: list[Analysis], arms: list[str], warm: list[Warmup]) -> pd.DataFrame:
    """Each arm's warm-up, reported apart: its prefill iterations and cold checkpoints (means)."""
    def mean(frames, col):
        v = pd.concat([f[col] for f in frames]).astype("Float64") if frames else pd.Series([], dtype="Float64")
        return float(v.mean()) if len(v) and not v.isna().any() else math.nan

    rows = []
    for arm in ("baseline", "candidate"):
        mine = [(a, w) for a, w, x in zip(analyses, warm, arms) if x == arm]
        pre = [_rows_of(a, "prefill iteration") for a, _ in mine]
        it = [p.loc[w.warmup_iterations] for p, (_, w) in zip(pre, mine)]
        steady = [p.loc[w.warm_iterations] for p, (_, w) in zip(pre, mine)]
        ck = [a.checkpoints.loc[w.cold] for a, w in mine]
        rows.append({"arm": arm, "legs": len(mine), "warmup_iterations": sum(len(x) for x in it),
                     "warmup_iteration_ns": mean(it, "span_ns"), "warmup_iteration_cpu_ns": mean(it, "cpu_ns"),
                     "steady_iteration_ns": mean(steady, "span_ns"),
                     "cold_checkpoints": sum(len(x) for x in ck), "cold_hits": sum(int(x["pool_hit"].sum()) for x in ck),
                     "cold_total_ns": mean(ck, "total_ns"), "cold_total_cpu_ns": mean(ck, "cpu_ns")})
    return pd.DataFrame(rows, columns=list(WARMUP_COLUMNS)).astype(WARMUP_COLUMNS)


def _percentile(q: int):
    def stat(x: np.ndarray, axis=None):
        return np.percentile(x, q, axis=-1)  # linear, as drive's own p50/p90/p99
    return stat


def _request_rows(analyses: list[Analysis], arms: list[str], requests: list, seed: int, n_boot: int,
                  min_effect_pct: float) -> tuple[list[dict], pd.DataFrame]:
    """TTFT percentiles and throughput of the legs that have a request file (None: no file), and
    each TTFT percentile's change split by the traced path, whose two rules (ttft.py) may withhold
    its verdict."""
    from . import ttft
    from .requests import completed, throughput_samples, throughput_stat, ttft_samples_ms

    def arm_ms(arm):  # (TTFT, stall) in ms of the arm's completed requests
        legs = [completed(r) for r, x in zip(requests, arms) if x == arm and r is not None]
        return tuple(np.concatenate([f[c].to_numpy("float64") / 1e6 for f in legs]) if legs else np.empty(0)
                     for c in ("ttft_ns", "stall_ns"))

    base_ms, cand_ms = arm_ms("baseline"), arm_ms("candidate")
    rows, splits = [], []
    for k, (name, (q, unit)) in enumerate(REQUEST_METRICS.items()):
        per_leg = [None if r is None else (ttft_samples_ms(r) if q is not None else throughput_samples(r))
                   for r in requests]
        stat = _percentile(q) if q is not None else throughput_stat
        base = [x for x, arm in zip(per_leg, arms) if arm == "baseline" and x is not None]
        cand = [x for x, arm in zip(per_leg, arms) if arm == "candidate" and x is not None]
        empty = np.empty((0, 2)) if q is None else np.empty(0)
        row = _change(base or [empty], cand or [empty], [seed, 200 + k], n_boot, min_effect_pct,
                      f"p{q}" if q is not None else "tokens / s", stat=stat,
                      higher_is_faster=REGISTRY[name].higher_is_better)
        if row["verdict"] == "not measured" and (not base or not cand or any(
                x is not None and not len(x) for x in per_leg)):
            row["verdict"] = "not recorded"
        why = ""
        if q is not None and len(base_ms[0]) and len(cand_ms[0]):
            s = ttft.split(name, q, base_ms, cand_ms)
            splits.append(s)
            few = ttft.too_few(s)
            if few and row["verdict"] in JUDGED:
                row["verdict"], why = TOO_FEW, few
            elif row["verdict"] in ("faster", "slower") and ttft.unsupported(s):
                row["verdict"], why = NOT_JUDGED, ttft.unsupported(s)
        rows.append({"metric": name, "unit": unit, "sample": "request", **row, "why": why})
    return rows, ttft.table(splits)


def _requests_inside(analyses: list[Analysis], requests: list) -> tuple[list, list[int]]:
    """Each leg's requests less the completed ones whose TTFT window is not wholly inside its
    recording (analyze's rule: the trace did not see them), and how many that left out per leg.
    A file none of whose requests ran while its leg was recorded is an AnalysisError."""
    from .requests import request_table

    kept, outside = [], []
    for a, r in zip(analyses, requests):
        if r is None:
            kept.append(None)
            outside.append(0)
            continue
        t = request_table(r, a, source=f"the request file of {a.trace.path or a.trace.label}")  # same run?
        out = ((t["status"] == "ok") & t["ttft_ns"].notna() & ~t["in_recording"]).to_numpy()
        # each request's stall (checkpoints and restores inside its TTFT window): ttft.py's split
        kept.append(r.loc[~out].assign(stall_ns=t["stall_ns"].to_numpy("float64", na_value=np.nan)[~out]))
        outside.append(int(out.sum()))
    return kept, outside


def _guard_rows(frame: pd.DataFrame, g, arms: list[str], leg_values: dict | None) -> None:
    """The machine-state guard on judged rows of metrics the state moves (machine_state.py)."""
    if g.one_state or not len(frame):
        return
    n = arms.count("baseline"), arms.count("candidate")
    by_legs = machine_state.smallest_p(*n) < machine_state.ALPHA
    for i, r in frame.iterrows():
        name = r["metric"]
        if name not in STATE_MOVED or r["verdict"] not in JUDGED:
            continue
        sample = METRICS[name][0] if name in METRICS else "request"
        f = machine_state.factor(g, sample, wall=name in WALL_METRICS)
        if machine_state.beyond(r["ci_low_pct"], r["ci_high_pct"], f):
            continue  # larger than the state can explain
        if r["baseline_value"] == 0 and r["diff_ci_low"] > 0:
            continue  # from none to some (no percentage): no state of the machine makes work from none
        if by_legs and leg_values is not None and name in leg_values:
            v = leg_values[name]
            b = [x for x, arm in zip(v, arms) if arm == "baseline" and math.isfinite(x)]
            c = [x for x, arm in zip(v, arms) if arm == "candidate" and math.isfinite(x)]
            if machine_state.mann_whitney_p(b, c) < machine_state.ALPHA or r["verdict"] in ("no change", "within drift"):
                continue  # the interleaved legs say it, whatever each one's state
        frame.loc[i, "verdict"] = NOT_JUDGED
        frame.loc[i, "why"] = guard_why(f)


def _machine_doc(g) -> dict:
    return {"recorded": g.recorded, "one_state": g.one_state, "differences": g.differences,
            "not_recorded_legs": g.not_recorded, "legs": g.legs, "said": g.said()}


# The CI gate (`compare --fail-on`): which judged rows trip it.
FAIL_ON = {"slower": ("slower",), "faster": ("faster",), "any-change": ("faster", "slower")}


def gate(c: Comparison, fail_on: str, metrics: list[str] | None = None
         ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(rows whose verdict trips `fail_on`, named rows that could not be judged, named rows that
    were judged) among the comparison's metric rows named in `metrics` (None: all). A named metric
    the comparison does not have (a request metric without request files) is an AnalysisError."""
    m = c.metrics
    if metrics is not None:
        absent = [x for x in metrics if x not in set(m["metric"])]
        if absent:
            raise AnalysisError(f"--metrics names {', '.join(absent)}, which this comparison does not have"
                                + (" (request metrics need a request file per leg: NAME.requests.json beside "
                                   "each trace, or --requests)" if set(absent) & set(REQUEST_METRICS) else ""))
        m = m[m["metric"].isin(metrics)]
    tripped = m[m["verdict"].isin(FAIL_ON[fail_on])]
    judged = m["verdict"].isin(JUDGED)
    return tripped, m[~judged], m[judged]


def compare_per_process(traces: list, **kw) -> list[tuple[str, Comparison]]:
    """(process label, comparison) for each process label, over the legs (traces, or trace files
    read batch by batch) that recorded it, in order of first appearance; a label in only one leg
    can't be compared."""
    by_label: dict[str, list] = {}
    for t in traces:
        for info, sub in analyze_processes(t):
            by_label.setdefault(process_label(info), []).append(sub)
    out = []
    for label, legs in by_label.items():
        if len(legs) < 2:
            raise AnalysisError(f"process {shown_label(label)!r} is in only one leg: --per-process compares each process "
                                "label across legs (label them alike: record --pid PID=LABEL)")
        out.append((label, compare(legs, **kw)))
    return out
