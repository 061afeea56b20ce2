"""`ckptrace analyze`: per-checkpoint and per-iteration breakdown of one trace, as text, JSON or CSV."""
from __future__ import annotations

import click

from ckptrace.terminal import echo, printable
from ckptrace.trace import read_trace


@click.command("analyze", epilog="""\b
Examples:
  ckptrace analyze off.parquet
  ckptrace analyze off.parquet --all
  ckptrace analyze off.parquet --json | jq '.summary.stats.checkpoint_fill_ns'
  ckptrace analyze off.parquet --csv out/
""")
@click.argument("trace", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print {trace, checkpoints, iterations, summary} as JSON.")
@click.option("--csv", "csv_dir", metavar="DIR", help="Also write checkpoints.csv and iterations.csv into DIR.")
@click.option("--all", "show_all", is_flag=True, help="List every checkpoint, not only the first --rows.")
@click.option("--rows", type=click.IntRange(min=0), default=20, show_default=True,
              help="Checkpoints listed before '... N more'.")
def command(trace, as_json, csv_dir, show_all, rows):
    """Per-checkpoint and per-iteration breakdown of one trace.

    Each checkpoint is split into fill (the resize's zero fill), copy (the state copy) and other;
    fault time is the part of fill and copy spent on page faults. Iterations are update_slots
    calls (or llama_decode calls when update_slots was not probed), prefill when they made a
    checkpoint or carried prompt tokens.
    """
    from ckptrace.analyzers import analyze_trace
    from ckptrace.renderers.csv import write_csv
    from ckptrace.renderers.json import analysis_json, dumps
    from ckptrace.renderers.text import analysis_report

    analysis = analyze_trace(read_trace(trace))
    if csv_dir:
        paths = write_csv(analysis, csv_dir)
        if not as_json:
            click.echo(f"wrote {printable(paths[0])} and {printable(paths[1])}", err=True)
    if as_json:
        click.echo(dumps(analysis_json(analysis)))
    else:
        echo(analysis_report(analysis, None if show_all else rows))
