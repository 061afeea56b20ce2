"""`ckptrace compare`: baseline against candidate over A/B/A legs, with bootstrap intervals and drift."""
from __future__ import annotations

import json
import math

import click

from ckptrace.terminal import echo, printable
from ckptrace.trace import read_trace

from .analyze import wrap

NAMES = {"checkpoint_fill_ns": "ckpt fill ms", "checkpoint_copy_ns": "ckpt copy ms",
         "checkpoint_fault_ns": "ckpt fault ms", "checkpoint_total_ns": "ckpt total ms",
         "prefill_iteration_ns": "prefill iter ms", "checkpoint_faults": "ckpt faults"}


def _pct(x: float) -> str:
    if not math.isfinite(x):
        return "-" if math.isnan(x) else ("+inf%" if x > 0 else "-inf%")
    if abs(x) >= 10_000:
        return f"{x / 1000:+.0f}k%"
    return f"{x:+.1f}%" if abs(x) < 1000 else f"{x:+.0f}%"


def _value(x: float, unit: str) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}" if unit == "ns" else f"{x:.0f}"


def _arm_line(c, arm: str) -> str:
    legs = c.legs.loc[c.legs["arm"] == arm]
    nums = ", ".join(str(n) for n in legs["leg"].tolist())
    label = c.baseline if arm == "baseline" else c.candidate
    return (f"{arm} {printable(label)}: leg{'s' if len(legs) > 1 else ''} {nums} ({int(legs['checkpoints'].sum())} "
            f"checkpoints, {int(legs['prefill_iterations'].sum())} prefill iterations)")


def render(c) -> str:
    lines = [wrap(_arm_line(c, "baseline")), wrap(_arm_line(c, "candidate")),
             wrap(f"samples: {c.samples}; 95% bootstrap intervals of the change of medians "
                  f"({c.n_boot} resamples, seed {c.seed})"), ""]
    lines.append(f"{'metric':15} {'baseline':>8} {'candidate':>9} {'change':>7} {'95% interval':>16} "
                 f"{'drift':>6} verdict")
    notes = []
    for m in c.metrics.to_dict("records"):  # six rows
        interval = (f"[{_pct(m['ci_low_pct'])[:-1]}, {_pct(m['ci_high_pct'])[:-1]}]"
                    if math.isfinite(m["ci_low_pct"]) or math.isinf(m["ci_low_pct"]) else "-")
        name = NAMES.get(m["metric"], m["metric"])
        lines.append(f"{name:15} {_value(m['baseline_median'], m['unit']):>8} "
                     f"{_value(m['candidate_median'], m['unit']):>9} {_pct(m['change_pct']):>7} {interval:>16} "
                     f"{_pct(m['drift_pct']).lstrip('+'):>6} {m['verdict']}")
        if math.isnan(m["change_pct"]) and not math.isnan(m["diff_median"]):
            u = "ms" if m["unit"] == "ns" else m["unit"]
            notes.append(f"{name}: the baseline median is 0, so no percentage; the candidate's is "
                         f"{_value(m['diff_median'], m['unit'])} {u} higher, interval "
                         f"[{_value(m['diff_ci_low'], m['unit'])}, {_value(m['diff_ci_high'], m['unit'])}] {u}")
    lines += [wrap(n) for n in notes]
    lines += ["", wrap(c.explanation)]
    if c.warnings:
        lines.append("")
        lines += [wrap("warning: " + w) for w in c.warnings]
    return "\n".join(lines)


@click.command("compare", epilog="""\b
Examples:
  ckptrace compare off1.parquet on.parquet off2.parquet
  ckptrace compare off1.parquet on.parquet off2.parquet --json
  ckptrace compare a1.parquet b1.parquet a2.parquet b2.parquet --seed 7
""")
@click.argument("traces", nargs=-1, metavar="TRACE TRACE [TRACE...]")
@click.option("--json", "as_json", is_flag=True, help="Print {baseline, candidate, legs, metrics, ...} as JSON.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed (same seed, same output).")
@click.option("--resamples", "n_boot", type=click.IntRange(min=100), default=2000, show_default=True,
              help="Bootstrap resamples per arm and metric.")
@click.option("--min-effect", "min_effect", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Changes up to this many percent read 'within drift' even when the baseline legs agree "
                   "more closely (two legs give one drift estimate).")
def command(traces, as_json, seed, n_boot, min_effect):
    """Compare baseline and candidate legs, given in run order (A/B/A).

    Legs are grouped by their label: the first label is the baseline, the second the candidate.
    Each metric gets both arms' medians, the change in percent with a bootstrap 95% interval,
    and a verdict: "no change" when the interval includes 0, "within drift" when the spread
    between baseline legs (or --min-effect) could explain it, else "faster" or "slower".
    """
    from ckptrace.analyzers.compare import compare

    c = compare([read_trace(t) for t in traces], seed=seed, n_boot=n_boot, min_effect_pct=min_effect)
    if as_json:
        click.echo(json.dumps(c.to_dict(), allow_nan=False))
    else:
        echo(render(c))
