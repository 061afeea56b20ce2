"""`ckptrace dashboard`: read traces, analyze each, compare when there are two labels, write one HTML file."""
from __future__ import annotations

from pathlib import Path

import click

from ckptrace.core.errors import AnalysisError, CkptraceError
from ckptrace.options import requests_options, warmup_option
from ckptrace.core.output import check_output, not_an_input
from ckptrace.core.terminal import printable


@click.command(epilog="""\b
Examples:
  ckptrace dashboard run.parquet -o report.html
  ckptrace dashboard off1.parquet on.parquet off2.parquet -o report.html
  ckptrace dashboard off.parquet on.parquet -o ab.html --title "32 slots"
  ckptrace dashboard off.parquet -o off.html --requests off.requests.json

\b
Traces are legs in run order, grouped by label: the first label is the
baseline, the second the candidate (as in `ckptrace compare`). With one
label there is no comparison panel. The file is self-contained: it loads
nothing from the network and opens from disk in any browser.
""")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=True))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="HTML file to write (replaced if it exists).")
@click.option("--title", default="ckptrace report", show_default=True, help="Heading shown in the report.")
@requests_options(
    "A leg's request file (`ckptrace drive --json -o FILE`), once per trace in the same order, "
    "- for a leg without one (default: NAME.requests.json beside each NAME.parquet, where there is one): adds a panel "
    "of each request's checkpoint time inside its time to first token, and TTFT rows to the "
    "comparison.",
    "In traces of several processes, the one the requests went to (a request file carries no "
    "pid): only its spans count in the requests panel, and the comparison compares it alone. "
    "Once (a process label is the same in every leg) or once per trace. Required for such "
    "traces with a request file.")
@warmup_option
def command(traces: tuple[Path, ...], output: Path, title: str, request_files: tuple[str, ...],
            requests_pid: tuple[str, ...], warmup) -> None:
    """Write a self-contained HTML report of one or more TRACE files."""
    from ckptrace.api import legs_with_requests
    from ckptrace.dashboards.report import write_dashboard
    from ckptrace.core.requests_file import lacking_requests, requests_path

    # A FIFO, a terminal or /dev/stdout is written into as it is; a file's name says what it holds.
    named_file = not output.exists() or output.is_file()
    if named_file and output.suffix.lower() not in (".html", ".htm"):
        raise CkptraceError(f"{printable(output)}: the report is HTML; give an -o path ending in .html")
    not_an_input(output, (*traces, *request_files, *(requests_path(t) for t in traces)), what="report")
    check_output(output, what="report")
    legs, requests, pids, _ = legs_with_requests(traces, request_files, requests_pid)
    for line in lacking_requests(traces, requests):
        click.echo(f"ckptrace: warning: {line}", err=True)
    analyses = [leg.analysis for leg in legs]
    tables = None
    if requests is not None:
        from ckptrace.analyzers.requests import request_table
        tables = [None if r is None else request_table(r, a, source=f"the request file of {printable(a.trace.path)}",
                                                       pid=pid)
                  for a, r, pid in zip(analyses, requests, pids)]
    comparison, notes = None, []
    if len({a.trace.label for a in analyses}) >= 2:
        from ckptrace.analyzers.compare import compare
        from ckptrace.analyzers.requests import process_analysis
        try:  # as `compare` does: a leg of several processes is the one its requests went to
            comparison = compare([process_analysis(a, pid) for a, pid in zip(analyses, pids)], requests=requests,
                                 warmup=warmup)
        except AnalysisError as e:
            # The traces are still worth seeing: draw them, and say why there is no comparison.
            notes.append(f"No comparison: {e}")
            click.echo(f"ckptrace: warning: no comparison: {printable(e)}", err=True)
    path = write_dashboard(analyses, comparison, output, title, notes=notes, requests=tables)
    click.echo(printable(path), err=not named_file)  # never mixed into a report sent to stdout
