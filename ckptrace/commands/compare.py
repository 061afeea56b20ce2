"""`ckptrace compare`: baseline against candidate over A/B/A legs, with bootstrap intervals and drift."""
from __future__ import annotations

import click

from ckptrace.terminal import echo
from ckptrace.trace import read_trace


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
    Each metric gets both arms' means, the change in percent with a bootstrap 95% interval,
    and a verdict: "no change" when the interval includes 0, "within drift" when the spread
    between baseline legs (or --min-effect) could explain it, else "faster" or "slower". Legs
    with pool hits are also judged as hits and misses apart. On a busy machine read the on-CPU
    metrics (*_cpu_ns): when a leg waited over 10% for a CPU, a warning says so and the
    wall-time metrics read "not judged".
    """
    from ckptrace.analyzers.compare import compare
    from ckptrace.renderers.json import comparison_json, dumps
    from ckptrace.renderers.text import compare_report

    c = compare([read_trace(t) for t in traces], seed=seed, n_boot=n_boot, min_effect_pct=min_effect)
    if as_json:
        click.echo(dumps(comparison_json(c)))
    else:
        echo(compare_report(c))
