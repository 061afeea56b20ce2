"""Baseline against candidate over A/B/A legs: bootstrap intervals of the change and drift-aware verdicts.

Rules:
- Legs come in run order and are grouped by label; the first label is the baseline, the second
  the candidate. A third label is an error.
- An arm's samples are the per-checkpoint values (per prefill iteration for
  `prefill_iteration_ns`) of all its legs, pooled.
- `change_pct = 100 * (candidate median - baseline median) / baseline median`. Its 95% interval
  is the 2.5th..97.5th percentile of the same change over `n_boot` bootstrap resamples of each
  arm (numpy Generator seeded from `seed` and the metric's position, so reruns are identical).
- When the baseline median is 0 (e.g. fill faults with a pool-on baseline) a percentage means
  nothing: `change_pct` and its interval are 0 when the candidate's median is 0 too, else None
  (NaN in the frame), and the verdict uses the interval of the plain difference of medians
  (`diff_ci_low`, `diff_ci_high`, in the metric's unit) and the drift in that unit.
- Drift, with >= 2 baseline legs: the largest difference between baseline legs' medians, in
  percent of the baseline median (`drift_pct`).
- Verdict: interval includes 0 -> "no change"; else |change| <= max(drift, min_effect_pct) ->
  "within drift"; else "faster" (change < 0) or "slower". The floor (default 20%) is there
  because two baseline legs give a single, often tiny, drift estimate, while whole runs of the same
  workload moved by up to 18% between legs on this project's shared 2-core VM (A/A/A, README). Every metric is a time or a fault count, so lower is faster.
  An arm with no samples (no prefill iteration, or fault time not measured in any of its legs:
  such legs are left out of checkpoint_fault_ns rather than counted as 0) -> "not measured".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ckptrace.errors import AnalysisError
from ckptrace.meta import TraceMeta
from ckptrace.trace import Trace

from . import Analysis, analyze_trace

# metric -> (sample unit, column or columns summed, unit)
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "checkpoint_fill_ns": ("checkpoint", ("fill_ns",), "ns"),
    "checkpoint_copy_ns": ("checkpoint", ("copy_ns",), "ns"),
    "checkpoint_fault_ns": ("checkpoint", ("fault_ns",), "ns"),
    "checkpoint_total_ns": ("checkpoint", ("total_ns",), "ns"),
    "prefill_iteration_ns": ("prefill iteration", ("span_ns",), "ns"),
    "checkpoint_faults": ("checkpoint", ("fill_faults", "copy_faults"), "faults"),
}
MIN_SAMPLES = 5
SAMPLES_NOTE = ("each arm's samples are the per-checkpoint values (per prefill iteration for "
                "prefill_iteration_ns) of all its legs, pooled")

LEG_COLUMNS = {"leg": "int64", "label": "str", "arm": pd.CategoricalDtype(["baseline", "candidate"]),
               "path": "str", "checkpoints": "int64", "prefill_iterations": "int64", "build_ids": "str",
               "lost_events": "int64"}
METRIC_COLUMNS = {"metric": "str", "unit": "str", "sample": "str", "baseline_median": "float64",
                  "candidate_median": "float64", "change_pct": "float64", "ci_low_pct": "float64",
                  "ci_high_pct": "float64", "drift_pct": "float64", "verdict": "str",
                  "samples_baseline": "int64", "samples_candidate": "int64", "diff_median": "float64",
                  "diff_ci_low": "float64", "diff_ci_high": "float64", "drift_abs": "float64"}


@dataclass
class Comparison:
    baseline: str
    candidate: str
    legs: pd.DataFrame
    metrics: pd.DataFrame
    warnings: list[str]
    explanation: str
    samples: str = SAMPLES_NOTE
    seed: int = 0
    n_boot: int = 2000
    min_effect_pct: float = 0.0


def _samples(a: Analysis, metric: str) -> np.ndarray:
    source, cols, _ = METRICS[metric]
    if metric == "checkpoint_fault_ns" and not a.summary.get("fault_time_measured", True):
        return np.empty(0)  # unmeasured is not zero: leave the leg out of this metric
    df = a.checkpoints if source == "checkpoint" else a.iterations.loc[a.iterations["kind"] == "prefill"]
    return df[list(cols)].sum(axis=1).to_numpy(dtype="float64")


def _boot_medians(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """Medians of n_boot resamples of x, in blocks that keep the index matrix near 32 MB."""
    out = np.empty(n_boot)
    block = max(1, 4_000_000 // len(x))
    for i in range(0, n_boot, block):
        k = min(block, n_boot - i)
        out[i:i + k] = np.median(x[rng.integers(0, len(x), size=(k, len(x)))], axis=1)
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
                seed: int, n_boot: int, min_effect_pct: float = 0.0) -> dict:
    sample, _, unit = METRICS[name]
    b, c = np.concatenate(base_legs), np.concatenate(cand_legs)
    row = {"metric": name, "unit": unit, "sample": sample, "samples_baseline": len(b), "samples_candidate": len(c)}
    nan = float("nan")
    if not len(b) or not len(c):  # e.g. no prefill iterations, or fault time not measured, in one arm
        return {**row, "baseline_median": nan if not len(b) else float(np.median(b)),
                "candidate_median": nan if not len(c) else float(np.median(c)), "change_pct": nan,
                "ci_low_pct": nan, "ci_high_pct": nan, "drift_pct": nan, "verdict": "not measured",
                "diff_median": nan, "diff_ci_low": nan, "diff_ci_high": nan, "drift_abs": nan}
    bm, cm = float(np.median(b)), float(np.median(c))
    rng = np.random.default_rng([seed, i])
    bb, cb = _boot_medians(b, rng, n_boot), _boot_medians(c, rng, n_boot)
    leg_medians = [float(np.median(x)) for x in base_legs if len(x)]
    drift_abs = max(leg_medians) - min(leg_medians) if len(leg_medians) >= 2 else nan
    d_lo, d_hi = _interval(cb - bb)
    diff = cm - bm
    if bm != 0 or cm == 0:
        change = float(_pct(cm, bm))
        lo, hi = _interval(_pct(cb, bb))
        drift = 100.0 * drift_abs / abs(bm) if bm != 0 else (0.0 if drift_abs == 0 else nan)
        verdict = _verdict(lo, hi, change, drift, min_effect_pct)
    else:  # baseline median 0, candidate's not: no percentage; judge the plain difference
        change = lo = hi = drift = nan
        verdict = _verdict(d_lo, d_hi, diff, drift_abs)
    return {**row, "baseline_median": bm, "candidate_median": cm, "change_pct": change, "ci_low_pct": lo,
            "ci_high_pct": hi, "drift_pct": drift, "verdict": verdict, "diff_median": diff,
            "diff_ci_low": d_lo, "diff_ci_high": d_hi, "drift_abs": drift_abs}


def _build_ids(meta: TraceMeta) -> list[str]:
    return sorted({o.build_id for o in meta.objects if o.build_id})


def _probe_points(meta: TraceMeta) -> frozenset:
    return frozenset(p.point for p in meta.probes)


def _leg_name(i: int, a: Analysis) -> str:
    return f"leg {i + 1} ({a.trace.label})"


def _warnings(analyses: list[Analysis], arms: list[str]) -> list[str]:
    out = []
    base = [(i, a) for i, (a, arm) in enumerate(zip(analyses, arms)) if arm == "baseline"]
    if len(base) < 2:
        out.append("only one baseline leg: drift can't be measured, so any change may be drift; "
                   "record A/B/A (baseline, candidate, baseline)")
    ids = {tuple(_build_ids(a.trace.meta)) for _, a in base}
    if len(ids) > 1:
        out.append("baseline legs were recorded from different builds (build-ids differ): "
                   "drift between them includes the build change")
    ref_i, ref = base[0]
    ref_points = _probe_points(ref.trace.meta)
    for i, a in enumerate(analyses):
        if i != ref_i and _probe_points(a.trace.meta) != ref_points:
            out.append(f"{_leg_name(i, a)} was recorded with a different probe set from "
                       f"{_leg_name(ref_i, ref)}: its phases may not be comparable")
    for i, a in enumerate(analyses):
        s = a.summary
        if s["checkpoints"] < MIN_SAMPLES:
            out.append(f"{_leg_name(i, a)} has {s['checkpoints']} checkpoints: too few for a trustworthy "
                       f"interval (want >= {MIN_SAMPLES} per leg)")
        if s["prefill_iterations"] < MIN_SAMPLES:
            out.append(f"{_leg_name(i, a)} has {s['prefill_iterations']} prefill iterations: too few for "
                       f"a trustworthy prefill_iteration_ns interval (want >= {MIN_SAMPLES} per leg)")
        if not s["reliable"]:
            out.append(f"{_leg_name(i, a)}: {s['reliability']}")
        if not s["fault_time_measured"]:
            out.append(f"{_leg_name(i, a)}: fault time was not measured, its checkpoint_fault_ns is 0")
    return out


def _signed_ms(ns: float) -> str:
    return f"{ns / 1e6:+.2f} ms"


def _explain(m: pd.DataFrame, analyses: list[Analysis], arms: list[str], baseline: str, candidate: str) -> str:
    r = m.set_index("metric")

    def said(metric):
        x = r.loc[metric]
        if math.isfinite(x["change_pct"]):
            return f"{x['change_pct']:+.1f}% ({x['verdict']})"
        if math.isfinite(x["diff_median"]):
            return f"{_signed_ms(x['diff_median'])} ({x['verdict']})"
        return "not measured (no samples in an arm)"

    head = (f"{candidate} against {baseline}: median checkpoint time {said('checkpoint_total_ns')}, "
            f"prefill iteration time {said('prefill_iteration_ns')}.")
    if r.loc["checkpoint_total_ns", "verdict"] not in ("faster", "slower"):
        return head + " No checkpoint phase moved beyond its interval and the baseline drift."

    # Means add up (total = fill + copy + other), so they split the change between phases.
    def mean_of(arm, col):
        return float(np.mean(np.concatenate([a.checkpoints[col].to_numpy(dtype="float64")
                                             for a, x in zip(analyses, arms) if x == arm])))

    delta = {p: mean_of("candidate", f"{p}_ns") - mean_of("baseline", f"{p}_ns") for p in ("fill", "copy", "other")}
    total = sum(delta.values())
    phase = max(delta, key=lambda p: abs(delta[p]) if np.sign(delta[p]) == np.sign(total) else -1)
    fault = mean_of("candidate", "fault_ns") - mean_of("baseline", "fault_ns")
    words = {"fill": "the fill (the resize's zero fill of fresh memory)", "copy": "the state copy",
             "other": "the rest of the checkpoint (neither fill nor copy)"}
    tail = (f" Most of it comes from {words[phase]}: {_signed_ms(delta[phase])} of {_signed_ms(total)} per checkpoint "
            f"on average, with fault time {_signed_ms(fault)}.")
    return head + tail


MIN_EFFECT_PCT = 20.0


def compare(traces: list, seed: int = 0, n_boot: int = 2000, min_effect_pct: float = MIN_EFFECT_PCT) -> Comparison:
    """Compare the legs (Trace or Analysis objects, in run order); see the module docstring."""
    if len(traces) < 2:
        raise AnalysisError(f"compare needs at least two traces, a baseline and a candidate label "
                            f"(ideally A/B/A); got {len(traces)}")
    analyses = [t if isinstance(t, Analysis) else analyze_trace(t) for t in traces]
    labels = list(dict.fromkeys(a.trace.label for a in analyses))
    if len(labels) == 1:
        raise AnalysisError(f"all {len(analyses)} traces have the label {labels[0]!r}: compare needs two labels, "
                            "baseline then candidate (set them with `ckptrace record --label`)")
    if len(labels) > 2:
        raise AnalysisError(f"the traces have {len(labels)} labels ({', '.join(map(repr, labels))}): compare "
                            "takes exactly two, the baseline's first; compare them two labels at a time")
    for a in analyses:
        if not len(a.checkpoints):
            raise AnalysisError(f"{a.trace.path or a.trace.label}: no checkpoints in this trace, nothing to "
                                "compare (was the target making checkpoints while it was recorded?)")
    baseline, candidate = labels
    arms = ["baseline" if a.trace.label == baseline else "candidate" for a in analyses]

    legs = pd.DataFrame({
        "leg": range(1, len(analyses) + 1),
        "label": [a.trace.label for a in analyses],
        "arm": arms,
        "path": [a.trace.path or "" for a in analyses],
        "checkpoints": [a.summary["checkpoints"] for a in analyses],
        "prefill_iterations": [a.summary["prefill_iterations"] for a in analyses],
        "build_ids": [",".join(_build_ids(a.trace.meta)) for a in analyses],
        "lost_events": [a.summary["lost_events"] for a in analyses],
    }).astype(LEG_COLUMNS)

    rows = []
    for i, name in enumerate(METRICS):  # six metrics: the work is inside, vectorised
        per_leg = [_samples(a, name) for a in analyses]
        rows.append(_metric_row(name, i, [x for x, arm in zip(per_leg, arms) if arm == "baseline"],
                                [x for x, arm in zip(per_leg, arms) if arm == "candidate"], seed, n_boot,
                                min_effect_pct))
    metrics = pd.DataFrame(rows, columns=list(METRIC_COLUMNS)).astype(METRIC_COLUMNS)
    return Comparison(baseline=baseline, candidate=candidate, legs=legs, metrics=metrics,
                      warnings=_warnings(analyses, arms),
                      explanation=_explain(metrics, analyses, arms, baseline, candidate),
                      seed=seed, n_boot=n_boot, min_effect_pct=min_effect_pct)
