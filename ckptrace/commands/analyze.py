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
  ckptrace analyze off.parquet --requests off.requests.json
  ckptrace analyze both.parquet --requests east.requests.json --requests-pid east
""")
@click.argument("trace", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print {trace, checkpoints, iterations, summary} as JSON.")
@click.option("--csv", "csv_dir", metavar="DIR", help="Also write checkpoints.csv and iterations.csv into DIR.")
@click.option("--requests", "requests_file", metavar="FILE",
              help="Request file of the load that ran while TRACE was recorded (`ckptrace drive --json -o "
                   "FILE`): split each request's time to first token into checkpoint, restore and the rest.")
@click.option("--requests-pid", "requests_pid", metavar="PID|LABEL",
              help="The process the requests went to, by pid or process label (pid:N or label:NAME "
                   "where one could be read as the other), in a trace of several processes (a request "
                   "file carries no pid): only its spans count. Required there.")
@click.option("--all", "show_all", is_flag=True, help="List every checkpoint, not only the first --rows.")
@click.option("--rows", type=click.IntRange(min=0), default=20, show_default=True,
              help="Checkpoints listed before '... N more'.")
def command(trace, as_json, csv_dir, requests_file, requests_pid, show_all, rows):
    """Per-checkpoint and per-iteration breakdown of one trace.

    Each checkpoint is split into fill (the resize's zero fill), copy (the state copy) and other;
    fault time is the part of fill and copy spent on page faults. Iterations are update_slots
    calls (or llama_decode calls when update_slots was not probed), prefill when they made a
    checkpoint or carried prompt tokens.

    With --requests, each request's TTFT window (send to first token, on the trace's clock) is
    split into the checkpoint time inside it (fill, copy, fault, on CPU, wait), restore time and
    the rest; a span that crosses the window's edge counts only for its part inside.
    """
    from ckptrace.analyzers import analyze_file, analyze_trace
    from ckptrace.renderers.csv import write_csv
    from ckptrace.renderers.json import analysis_doc, write_json
    from ckptrace.renderers.text import analysis_report

    if requests_pid is not None and not requests_file:
        raise click.UsageError("--requests-pid says which process a request file's requests went to: "
                               "give --requests too")
    if csv_dir:  # before anything is read or written: a CSV must not replace the trace or request file
        from ckptrace.output import not_an_input
        from ckptrace.renderers.csv import csv_paths

        for path in csv_paths(csv_dir, bool(requests_file)):
            not_an_input(path, (trace, *([requests_file] if requests_file else [])), what="CSV files",
                         option="--csv folder")
    # The request split reads restore rows and spans the batched read does not keep.
    analysis = analyze_trace(read_trace(trace)) if requests_file else analyze_file(trace)
    requests = None
    if requests_file:
        from ckptrace.analyzers.requests import request_process, request_summary, request_table
        from ckptrace.requests_file import read_requests

        pid = request_process(analysis.trace, requests_pid)
        requests = request_table(read_requests(requests_file), analysis, source=printable(requests_file), pid=pid)
        analysis.summary["requests"] = request_summary(requests, analysis.trace, pid=pid)
    from ckptrace.analyzers.whatif import limit_warnings

    for w in limit_warnings(analysis):
        click.echo(f"ckptrace: warning: {printable(w)}", err=True)
    if csv_dir:
        paths = write_csv(analysis, csv_dir, requests)
        if not as_json:
            shown = [printable(p) for p in paths]
            click.echo(f"wrote {', '.join(shown[:-1])} and {shown[-1]}", err=True)
    if as_json:  # written a chunk of rows at a time: a long trace's tables never all as dicts
        doc = analysis_doc(analysis)
        if requests is not None:
            doc["requests"] = requests
        write_json(doc, lambda text: click.echo(text, nl=False))
        click.echo()
    else:
        echo(analysis_report(analysis, None if show_all else rows, requests))
