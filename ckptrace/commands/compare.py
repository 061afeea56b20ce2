"""`ckptrace compare`: baseline against candidate over A/B/A legs, with bootstrap intervals and drift.

Also the CI gate: `--fail-on` exits GATE_EXIT when a named metric's verdict is the one given.
"""
from __future__ import annotations

import click

from ckptrace.analyzers.compare_config import DEFAULTS
from ckptrace.options import Finite, requests_options, warmup_option
from ckptrace.core.terminal import echo, printable, shown_label

# Exit statuses: 0 compared (gate passed), 1 an error (one line), 2 a usage error, GATE_EXIT the
# gate tripped, UNJUDGED_EXIT (--require-judged) a metric the gate looks at was not judged.
# Distinct, so a CI job can tell a regression from a gate that could not see from a broken step.
GATE_EXIT = 3
UNJUDGED_EXIT = 4


def metric_names() -> list[str]:
    from ckptrace.analyzers.metrics import compared

    return [m.name for m in compared()]


def split_metrics(ctx, param, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [x.strip() for x in value.split(",") if x.strip()]
    known = metric_names()
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise click.BadParameter(f"unknown metric {printable(', '.join(unknown)) or '(none given)'}; "
                                 f"choose from {', '.join(known)}", ctx, param)
    return names


@click.command("compare", epilog="""\b
Examples:
  ckptrace compare off1.parquet on.parquet off2.parquet
  ckptrace compare off1.parquet on.parquet off2.parquet --json
  ckptrace compare a1.parquet b1.parquet a2.parquet b2.parquet --seed 7
  ckptrace compare off1.parquet on.parquet off2.parquet --warmup 3
  # interleaved legs, 4 per arm: verdicts that need not rest on one machine state
  ckptrace compare a1.parquet b1.parquet a2.parquet b2.parquet a3.parquet b3.parquet \
      a4.parquet b4.parquet
  ckptrace compare off1.parquet on.parquet off2.parquet \\
      --requests off1.requests.json --requests on.requests.json --requests off2.requests.json
  ckptrace compare base.parquet cand.parquet base2.parquet --fail-on slower \\
      --metrics checkpoint_total_cpu_ns,ttft_p90_ms --format markdown > comment.md
  # legs that each recorded two servers (record --pid A=east --pid B=west)
  ckptrace compare off1.parquet on.parquet off2.parquet --per-process
  # ... and the load drove the east one: compare it, with its requests
  ckptrace compare off1.parquet on.parquet off2.parquet --requests-pid east

\b
Exit status: 0 compared (and the gate, if any, passed); 1 an error; 2 a
usage error; 3 --fail-on tripped (the table is printed first); 4 with
--require-judged, a metric the gate looks at was not judged (e.g. wall
times on a busy machine) and none tripped.
""")
@click.argument("traces", nargs=-1, metavar="TRACE TRACE [TRACE...]")
@click.option("--json", "as_json", is_flag=True, help="Print {baseline, candidate, legs, metrics, ...} as JSON "
                                                      "(the same as --format json).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default=None,
              help="text (default), json, or markdown: a table ready for a pull-request comment.")
@requests_options(
    "A leg's request file (`ckptrace drive --json -o FILE`), once per trace in the same "
    "order; - for a leg without one. Default: NAME.requests.json beside each NAME.parquet, where there is one. Adds "
    "ttft_p50_ms, ttft_p90_ms, ttft_p99_ms and throughput_tok_s.",
    "In legs of several processes, the one the requests went to (a request file carries no "
    "pid): that process alone is compared. Once (a process label is the same in every leg) "
    "or once per trace. Required for such legs with a request file.")
@click.option("--fail-on", "fail_on", type=click.Choice(["slower", "faster", "any-change"]), default=None,
              help="Exit 3 when a metric's verdict is slower / faster / either (for CI).")
@click.option("--metrics", "gate_metrics", callback=split_metrics, metavar="A,B",
              help="The metrics --fail-on looks at, comma-separated (default: every metric compared): "
                   + ", ".join(metric_names()) + ".")
@click.option("--require-judged", is_flag=True,
              help="Exit 4 when a metric --fail-on looks at could not be judged (not judged, not measured, "
                   "not recorded) and none tripped: a gate that saw nothing does not pass.")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True, help="Bootstrap seed (same seed, same output).")
@click.option("--resamples", "n_boot", type=click.IntRange(min=100), default=DEFAULTS.n_boot, show_default=True,
              help="Bootstrap resamples per arm and metric.")
@click.option("--min-effect", "min_effect", type=Finite(min=0, max=1e6), default=DEFAULTS.min_effect_pct, show_default=True,
              help="Changes up to this many percent read 'within drift' even when the baseline legs agree "
                   "more closely (two legs give one drift estimate).")
@warmup_option
@click.option("--per-process", is_flag=True,
              help="Compare each process apart: legs that recorded several processes are split by "
                   "process label (record's --pid PID=LABEL; NAME#RANK for --comm or unlabelled pids), "
                   "and each label is compared across the legs that hold it.")
def command(traces, as_json, fmt, request_files, requests_pid, fail_on, gate_metrics, require_judged, seed, n_boot,
            min_effect, warmup, per_process):
    """Compare baseline and candidate legs, given in run order (A/B/A).

    Legs are grouped by their label: the first label is the baseline, the second the candidate.
    The first line is the answer: what the candidate removes per checkpoint and per prefill
    iteration, its pool hit rate and its memory cost. Each metric gets both arms' means (after
    each thread's warm-up, --warmup; the warm-up is reported apart), the change in percent with
    a bootstrap 95% interval, and a verdict: "no change" when the interval includes 0, "within
    drift" when the spread between baseline legs (or --min-effect) could explain it, else
    "faster" or "slower". Legs with pool hits are also judged as hits and misses apart, warm and
    cold apart. When the legs did not run in one state of the machine (each trace's record of
    what else it was doing), wall times and on-CPU times of memory-bound spans read "not judged"
    unless the change is larger than that explains; 4 interleaved legs per arm let the legs'
    ranks judge them. Traces without that record fall back to: a leg waiting over 10% for a CPU
    makes the wall-time metrics read "not judged".

    With request files, time to first token p50/p90/p99 and throughput (tokens per second) are
    compared the same way, over each arm's completed requests inside its recording.
    """
    from ckptrace.analyzers.compare import gate

    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree: give one")
    if gate_metrics is not None and fail_on is None:
        raise click.UsageError("--metrics chooses what --fail-on looks at: give --fail-on too")
    if require_judged and fail_on is None:
        raise click.UsageError("--require-judged is about the metrics --fail-on looks at: give --fail-on too")
    fmt = "json" if as_json else (fmt or "text")
    if per_process:  # request files paired by name are not looked for: only given ones are refused
        _per_process(list(traces), fmt, request_files or requests_pid or None, fail_on, seed=seed, n_boot=n_boot,
                     min_effect_pct=min_effect, warmup=warmup)
        return
    from ckptrace.api import compare as compare_legs

    c = compare_legs(traces, requests=request_files, requests_pid=requests_pid, seed=seed, n_boot=n_boot,
                     min_effect_pct=min_effect, warmup=warmup).result
    tripped = unjudged = judged = None
    if fail_on:
        tripped, unjudged, judged = gate(c, fail_on, gate_metrics)
    if fmt == "json":
        from ckptrace.renderers.json import comparison_json, dumps

        click.echo(dumps(comparison_json(c)))
    elif fmt == "markdown":
        from ckptrace.renderers.markdown import comparison_markdown

        click.echo(comparison_markdown(c, fail_on, tripped, unjudged, judged))
    else:
        from ckptrace.renderers.text import compare_report

        echo(compare_report(c))
    if fail_on:
        _gate_lines(fail_on, tripped, unjudged, judged, require_judged)


def _per_process(legs, fmt: str, requests, fail_on, **kw) -> None:
    """--per-process: one comparison per process label (text sections, or {"processes": [...]})."""
    from ckptrace.api import compare_processes

    if requests is not None or fail_on or fmt == "markdown":
        raise click.UsageError("--per-process compares checkpoint and memory figures only: without "
                               "request files (--requests, --requests-pid), --fail-on or --format markdown")
    parts = [(label, c.result) for label, c in compare_processes(legs, **kw).items()]
    if fmt == "json":
        from ckptrace.renderers.json import comparison_json, dumps, versioned

        click.echo(dumps(versioned({"processes": [{"process": label, **comparison_json(c)} for label, c in parts]})))
    else:
        from ckptrace.renderers.text import compare_report

        echo("\n\n".join(f"== process {shown_label(label)}\n{compare_report(c)}" for label, c in parts))


def _gate_lines(fail_on: str, tripped, unjudged, judged, require_judged: bool) -> None:
    """One line on stderr for metrics the gate could not judge (which, why); one for a trip, then
    exit GATE_EXIT; else, with --require-judged and metrics not judged, exit UNJUDGED_EXIT."""
    from ckptrace.renderers.text import gate_said, unjudged_said

    said = f"ckptrace: compare: --fail-on {fail_on}"
    if len(unjudged):
        nothing = "" if len(judged) else " (it judged nothing)"
        click.echo(f"{said} did not judge {unjudged_said(unjudged)}{nothing}", err=True)
    if len(tripped):
        click.echo(f"{said} tripped: {gate_said(tripped)}", err=True)
        raise click.exceptions.Exit(GATE_EXIT)
    if len(unjudged) and require_judged:
        click.echo(f"{said}: --require-judged: {len(unjudged)} of {len(unjudged) + len(judged)} metric(s) not "
                   "judged", err=True)
        raise click.exceptions.Exit(UNJUDGED_EXIT)
