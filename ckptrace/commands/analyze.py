"""`ckptrace analyze`: per-checkpoint and per-iteration breakdown of one trace, as text, JSON or CSV."""
from __future__ import annotations

import click

from ckptrace.core.terminal import echo, printable
from ckptrace.options import requests_options


@click.command("analyze", epilog="""\b
Examples:
  ckptrace analyze off.parquet
  ckptrace analyze off.parquet --all
  ckptrace analyze off.parquet --json | jq '.summary.stats.checkpoint_fill_ns'
  ckptrace analyze off.parquet --csv out/
  ckptrace analyze off.parquet --parquet tables/ && duckdb -c "from 'tables/checkpoints.parquet'"
  ckptrace analyze off.parquet --requests off.requests.json
  ckptrace analyze both.parquet --requests east.requests.json --requests-pid east
""")
@click.argument("trace", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print {trace, checkpoints, iterations, summary} as JSON.")
@click.option("--csv", "csv_dir", metavar="DIR", help="Also write checkpoints.csv and iterations.csv into DIR.")
@click.option("--parquet", "parquet_dir", metavar="DIR",
              help="Also write every derived table as Parquet into DIR (checkpoints, iterations, restores, "
                   "evictions, prompt_saves, releases, summary, processes, gpu_copies; requests with --requests): for "
                   "DuckDB or pandas (docs/api.md, 'SQL over a trace').")
@requests_options(
    "Request file of the load that ran while TRACE was recorded (`ckptrace drive --json -o "
    "FILE`): split each request's time to first token into checkpoint, restore and the rest.",
    "The process the requests went to, by pid or process label (pid:N or label:NAME "
    "where one could be read as the other), in a trace of several processes (a request "
    "file carries no pid): only its spans count. Required there.",
    dest="requests_file", multiple=False)
@click.option("--all", "show_all", is_flag=True, help="List every checkpoint, not only the first --rows.")
@click.option("--rows", type=click.IntRange(min=0), default=20, show_default=True,
              help="Checkpoints listed before '... N more'.")
def command(trace, as_json, csv_dir, parquet_dir, requests_file, requests_pid, show_all, rows):
    """Per-checkpoint and per-iteration breakdown of one trace.

    Each checkpoint is split into fill (the resize's zero fill), copy (the state copy) and other;
    fault time is the part of fill and copy spent on page faults. Iterations are update_slots
    calls (or llama_decode calls when update_slots was not probed), prefill when they made a
    checkpoint or carried prompt tokens.

    With --requests, each request's TTFT window (send to first token, on the trace's clock) is
    split into the checkpoint time inside it (fill, copy, fault, on CPU, wait), restore time and
    the rest; a span that crosses the window's edge counts only for its part inside.
    """
    from ckptrace.api import open as open_trace
    from ckptrace.renderers.csv import write_csv
    from ckptrace.renderers.json import analysis_doc, write_json
    from ckptrace.renderers.text import analysis_report

    if requests_pid is not None and not requests_file:
        raise click.UsageError("--requests-pid says which process a request file's requests went to: "
                               "give --requests too")
    if csv_dir or parquet_dir:  # before anything is read or written: a table must not replace an input
        from ckptrace.core.output import not_an_input
        from ckptrace.renderers.csv import csv_paths
        from ckptrace.renderers.parquet import parquet_paths

        inputs = (trace, *([requests_file] if requests_file else []))
        for path in csv_paths(csv_dir, bool(requests_file)) if csv_dir else []:
            not_an_input(path, inputs, what="CSV files", option="--csv folder")
        for path in parquet_paths(parquet_dir, bool(requests_file)) if parquet_dir else []:
            not_an_input(path, inputs, what="Parquet files", option="--parquet folder")
    with open_trace(trace) as t:
        analysis = t.analysis
        requests = None
        if requests_file:
            requests = t.requests(requests_file, requests_pid)
            analysis.summary["requests"] = t.request_summary(requests_file, requests_pid)
        from ckptrace.analyzers.memory_limit import limit_warnings

        for w in limit_warnings(analysis):
            click.echo(f"ckptrace: warning: {printable(w)}", err=True)
        if csv_dir:
            paths = write_csv(analysis, csv_dir, requests)
            if not as_json:
                _wrote(paths)
        if parquet_dir:
            from ckptrace.renderers.parquet import write_parquet

            paths = write_parquet(t.tables(), parquet_dir, requests)
            if not as_json:
                _wrote(paths)
    if as_json:  # written a chunk of rows at a time: a long trace's tables never all as dicts
        doc = analysis_doc(analysis)
        if requests is not None:
            doc["requests"] = requests
        write_json(doc, lambda text: click.echo(text, nl=False))
        click.echo()
    else:
        echo(analysis_report(analysis, None if show_all else rows, requests))


def _wrote(paths) -> None:
    shown = [printable(p) for p in paths]
    click.echo(f"wrote {', '.join(shown[:-1])} and {shown[-1]}", err=True)
