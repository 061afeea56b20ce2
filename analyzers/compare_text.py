"""compare's words: the verdicts' names, the explanation, the warnings, the sentences on memory and
requests. The figures they speak of are analyzers/compare.py's; nothing here resamples or judges.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ckptrace.core.terminal import shown_label
from ckptrace.core.units import ms_signed

from . import machine_state
from .compare_config import MIN_SAMPLES
from .summary import WAIT_WARN_SHARE
from .ttft import explained_said
from .warmup import described
from .memory_limit import limit_warnings

if TYPE_CHECKING:
    import pandas as pd

    from . import Analysis
    from .warmup import Warmup

# The verdicts: judged (the interval and the drift say it), and why a row was not.
JUDGED = ("faster", "slower", "no change", "within drift")
NOT_JUDGED = "not judged"
NO_BASELINE = "no baseline"  # a class the baseline lacks: shown, not judged
TOO_FEW = "too few samples"  # an arm with fewer than MIN_SAMPLES of the class: shown, not judged
MEMORY_VERDICT = "single figures"  # one peak per leg: no interval, said as such
SAMPLES_NOTE = ("each arm's samples are the per-checkpoint values (per prefill iteration for "
                "prefill_iteration_ns) of all its legs, pooled")

# Why a metric the gate looks at was not judged, by its verdict.
UNJUDGED_WHY = {
    NOT_JUDGED: f"a leg waited over {WAIT_WARN_SHARE:.0%} of its wall time for a CPU, so wall times measure the load",
    "not measured": "an arm has no samples of it",
    "not recorded": "a leg's recording lacks the figure",
}


def leg_name(i: int, a: Analysis) -> str:
    return f"leg {i + 1} ({shown_label(a.trace.label)})"


def _probe_points(a: Analysis) -> frozenset:
    return frozenset(p.point for p in a.trace.meta.probes)


def _plural(items: list) -> str:
    return "s" if len(items) > 1 else ""


def leg_warnings(analyses: list[Analysis], arms: list[str], guard_recorded: bool, gaps: list[tuple[str, ...]]
                 ) -> list[str]:
    """What each leg lacks or did that makes its figures less sure; `gaps`: per leg, the metrics
    it did not record every value of."""
    out = []
    base = [(i, a) for i, (a, arm) in enumerate(zip(analyses, arms)) if arm == "baseline"]
    if len(base) < 2:
        out.append("only one baseline leg: drift can't be measured, so any change may be drift; "
                   "record A/B/A (baseline, candidate, baseline)")
    derived = [str(i + 1) for i, a in enumerate(analyses) if (a.checkpoints["fill_source"] == "derived").any()]
    if derived:
        out.append(f"leg{_plural(derived)} {', '.join(derived)}: fill derived, not measured (the "
                   "growth is inlined in that build: checkpoint total - copy), so fill compares totals less copies")
    ref_i, ref = base[0]
    for i, a in enumerate(analyses):
        if i != ref_i and _probe_points(a) != _probe_points(ref):
            out.append(f"{leg_name(i, a)} was recorded with a different probe set from "
                       f"{leg_name(ref_i, ref)}: its phases may not be comparable")
    missing: dict[tuple[str, ...], list[str]] = {}  # metrics not recorded -> legs
    for i, leg_gaps in enumerate(gaps):
        if leg_gaps:
            missing.setdefault(leg_gaps, []).append(str(i + 1))
    for leg_gaps, legs in missing.items():
        out.append(f"leg{_plural(legs)} {', '.join(legs)} did not record every value of "
                   f"{', '.join(leg_gaps)}: left out of {'those metrics' if len(leg_gaps) > 1 else 'it'} (not recorded is "
                   "not zero)")
    for i, a in enumerate(analyses):
        out += _leg_notes(i, a, guard_recorded)
    return out


def _leg_notes(i: int, a: Analysis, guard_recorded: bool) -> list[str]:
    out = []
    s = a.summary
    if s["checkpoints"] < MIN_SAMPLES:
        out.append(f"{leg_name(i, a)} has {s['checkpoints']} checkpoints: too few for a trustworthy "
                   f"interval (want >= {MIN_SAMPLES} per leg)")
    if s["prefill_iterations"] < MIN_SAMPLES:
        out.append(f"{leg_name(i, a)} has {s['prefill_iterations']} prefill iterations: too few for "
                   f"a trustworthy prefill_iteration_ns interval (want >= {MIN_SAMPLES} per leg)")
    if not s["reliable"]:
        out.append(f"{leg_name(i, a)}: {s['reliability']}")
    out += [f"{leg_name(i, a)}: {w}" for w in limit_warnings(a)]
    shares = [x for x in (s.get("wait_share"), s.get("prefill_wait_share")) if x is not None]
    if shares and max(shares) > WAIT_WARN_SHARE and not guard_recorded:  # else the machine-state guard says it
        out.append(f"{leg_name(i, a)} spent {max(shares) * 100:.0f}% of its spans' time waiting for a CPU: "
                   f"wall times measure the machine's load, so wall-time metrics read '{NOT_JUDGED}'; "
                   "read the on-CPU metrics (*_cpu_ns)")
    return out


def auto_off_warning(analyses: list[Analysis], warm: list[Warmup]) -> str:
    """--warmup auto found no steady state in a leg, so no leg had a warm-up set apart."""
    return (f"--warmup auto left nothing out: {', '.join(leg_name(i, analyses[i]) for i, w in enumerate(warm) if w.short)} "
            "made checkpoints in one prefill iteration only, so no leg has a warm-up set apart")


def short_warnings(analyses: list[Analysis], warm: list[Warmup], warmup) -> list[str]:
    return [f"{leg_name(i, a)} has {a.summary['prefill_iterations']} prefill iterations and "
            f"{a.summary['checkpoints']} checkpoints, none after its warm-up ({described(warmup)}): nothing "
            "judged on it" for i, (a, w) in enumerate(zip(analyses, warm)) if w.short]


def guard_why(factor: float) -> str:
    """Why the machine-state guard withheld a verdict (`factor`: what the states can explain)."""
    return ("the legs did not run in one state of the machine, and the change is within what "
            + ("that explains" if math.isfinite(factor) else "it can move without bound")
            + (f" (x{factor:.2f} either way)" if math.isfinite(factor) else ""))


def guard_warnings(g, metrics: pd.DataFrame, arms: list[str]) -> list[str]:
    out = []
    if g.recorded and not g.one_state:
        held = [m for m in metrics.loc[metrics["why"] != "", "metric"]]
        n = arms.count("baseline"), arms.count("candidate")
        out.append("wall times and on-CPU times of memory-bound spans are judged only where their change is larger "
                   f"than the states explain (on CPU x{machine_state.CPU_FACTOR:.2f} either way, wall times that times "
                   "the legs' spread of waiting for a CPU); exact counts are judged as usual"
                   + (f"; not judged: {', '.join(held)}" if held else "")
                   + "; " + machine_state.legs_needed(*n))
    return out


def request_warnings(analyses: list[Analysis], requests: list, outside: list[int]) -> list[str]:
    lacking = [str(i + 1) for i, r in enumerate(requests) if r is None]
    out = [f"{leg_name(i, analyses[i])}: {n} completed requests ran (partly) outside its recording: left out of "
           "the request metrics" for i, n in enumerate(outside) if n]
    if lacking:
        out.append(f"leg{_plural(lacking)} {', '.join(lacking)} {'have' if len(lacking) > 1 else 'has'} "
                   "no request file (NAME.requests.json beside the trace, or --requests): the request metrics "
                   "compare the other legs")
    for i, r in enumerate(requests):
        if r is not None and (r["status"] != "ok").any():
            out.append(f"{leg_name(i, analyses[i])}: {int((r['status'] != 'ok').sum())} of {len(r)} requests did not "
                       "complete: left out of the request metrics")
        if r is not None and r["predicted_tokens"].isna().any():
            out.append(f"{leg_name(i, analyses[i])}: its request file does not say how many tokens were generated "
                       "(written by an older drive): throughput not recorded for it")
    return out


# The phases a checkpoint's time splits into, as the explanation names them.
PHASE_WORDS = {"fill": "the fill (the resize's zero fill of fresh memory)", "copy": "the state copy",
               "other": "the rest of the checkpoint (neither fill nor copy)"}


def explain(m: pd.DataFrame, baseline: str, candidate: str, phases) -> str:
    """The comparison in two sentences: checkpoint and prefill iteration time, then which phase the
    change comes from. `phases(busy)`: (phase, its change, the total change, the fault time's
    change) per checkpoint on average, on CPU when `busy` (compare's _phase_split)."""
    r = m.set_index("metric")

    def said(metric):
        x = r.loc[metric]
        if math.isfinite(x["change_pct"]):
            return f"{x['change_pct']:+.1f}% ({x['verdict']})"
        if math.isfinite(x["diff"]):
            return f"{ms_signed(x['diff'])} ({x['verdict']})"
        return "not measured (no samples in an arm)"

    head = (f"{shown_label(candidate)} against {shown_label(baseline)}: {r.loc['checkpoint_total_ns', 'statistic']} checkpoint time "
            f"{said('checkpoint_total_ns')}, "
            f"prefill iteration time {said('prefill_iteration_ns')}.")
    # A busy comparison is explained on CPU, where the waiting is left out.
    busy = r.loc["checkpoint_total_ns", "verdict"] == NOT_JUDGED
    key = "checkpoint_total_cpu_ns" if busy else "checkpoint_total_ns"
    if busy:
        head += f" On CPU, checkpoint time {said(key)}."
    if r.loc[key, "verdict"] not in ("faster", "slower"):
        return head + " No checkpoint phase moved beyond its interval and the baseline drift."
    phase, change, total, fault = phases(busy)
    tail = (f" Most of it comes from {PHASE_WORDS[phase]}: {ms_signed(change)} of {ms_signed(total)} per checkpoint "
            f"on average{' on CPU' if busy else ''}, with fault time " + (ms_signed(fault) if math.isfinite(fault) else "not recorded") + ".")
    return head + tail


def memory_sentence(memory: pd.DataFrame | None, metrics: pd.DataFrame) -> str:
    """The time a candidate saves next to the memory it costs: 'Time against memory: fill -100.0%
    (faster), held checkpoint memory +288.0 MiB at peak (96.0 -> 384.0 MiB), RSS ...'."""
    if memory is None or not len(memory):
        return ""
    names = {"held_peak_mib": "held checkpoint memory", "rss_peak_mib": "RSS"}
    parts = [f"{names[r['metric']]} {r['change_mib']:+.1f} MiB at peak ({r['baseline_value']:.1f} -> "
             f"{r['candidate_value']:.1f} MiB)" for r in memory.to_dict("records") if r["verdict"] == MEMORY_VERDICT]
    if not parts:
        return ""
    m = metrics.set_index("metric")
    fill = "checkpoint_fill_cpu_ns" if m.loc["checkpoint_fill_ns", "verdict"] == NOT_JUDGED else "checkpoint_fill_ns"
    x = m.loc[fill]
    time = (f"fill{' on CPU' if fill.endswith('cpu_ns') else ''} {x['change_pct']:+.1f}% ({x['verdict']}), "
            if math.isfinite(x["change_pct"]) else "")
    return "Time against memory: " + time + ", ".join(parts) + "."


def ttft_said(m: pd.DataFrame, split: pd.DataFrame | None = None) -> str:
    """A sentence on what requests felt (TTFT p90 and what the traced path explains of it,
    throughput), when request files were given."""
    r = m.set_index("metric")
    if "ttft_p90_ms" not in r.index:
        return ""
    parts = []
    for name, what in (("ttft_p90_ms", "time to first token p90"), ("throughput_tok_s", "throughput")):
        x = r.loc[name]
        parts.append(f"{what} {x['change_pct']:+.1f}% ({x['verdict']})" if math.isfinite(x["change_pct"])
                     else f"{what} {x['verdict']}")
        s = split.set_index("metric") if split is not None and len(split) else None
        if s is not None and name in s.index:
            parts[-1] += ", " + explained_said(s.loc[name].to_dict())
    return " Requests: " + "; ".join(parts) + "."
