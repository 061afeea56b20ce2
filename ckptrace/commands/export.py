"""`ckptrace export`: traces as a timeline for Perfetto (protobuf TrackEvents) or Chrome's Trace Event JSON."""
from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import click

from ckptrace.options import requests_options

from ckptrace.core.errors import CkptraceError
from ckptrace.core.output import check_output, not_an_input, write_output
from ckptrace.core.terminal import printable

FORMATS = ("perfetto", "chrome")


@click.command(epilog="""\b
Examples:
  ckptrace export run.parquet -o run.perfetto-trace
  ckptrace export off1.parquet on.parquet off2.parquet -o aba.perfetto-trace
  ckptrace export run.parquet -o run.json        # .json: Chrome's format
  ckptrace export run.parquet --requests run.requests.json -o run.perfetto-trace
  ckptrace export both.parquet --requests east.requests.json --requests-pid east -o both.perfetto-trace
  ckptrace export run.parquet -o /dev/stdout | gzip > run.perfetto-trace.gz

\b
Open a .perfetto-trace in the Perfetto UI (ui.perfetto.dev, "Open trace
file"; the trace stays in the browser). Each TRACE is one process track
(several processes where the trace holds several); each thread has its
iterations, checkpoints, fills, copies and mmap/munmap calls as nested
slices with their figures as arguments, plus counters (page faults, held
checkpoint memory) and a "ckptrace recording" track with the metadata.
Timestamps are CLOCK_MONOTONIC (clock id 3), as recorded: the file lines up
with a system trace taken at the same time.
""")
@click.argument("traces", nargs=-1, required=True, metavar="TRACE...")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="File to write (replaced if it exists; /dev/stdout and FIFOs are written into).")
@requests_options(
    "Request file (`ckptrace drive -o`) of each TRACE, repeated in TRACE order (- for a TRACE "
    "without one). Default: "
    "NAME.requests.json beside each NAME.parquet, where there is one. Draws each request's "
    "time to first token with its checkpoint/restore breakdown.",
    "In traces of several processes, the one the requests went to (a request file carries no "
    "pid): their lanes go under it and only its spans count. Once (a process label is the same "
    "in every leg) or once per trace. Required for such traces with a request file.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="perfetto: protobuf TrackEvents; chrome: Trace Event JSON (microseconds). "
                   "Default: chrome when -o ends in .json, else perfetto.")
def command(traces: tuple[str, ...], output: Path, request_files: tuple[str, ...], requests_pid: tuple[str, ...],
            fmt: str | None) -> None:
    """Write TRACE files as a timeline for Perfetto or Chrome's trace viewers."""
    from ckptrace.api import open as open_trace
    from ckptrace.renderers.timeline import build_timeline, process_count, recording_notes, slice_count
    from ckptrace.renderers.timeline_stream import stream_analysis, stream_timeline
    from ckptrace.core.requests_file import leg_requests, request_pid_choices, requests_path

    fmt = fmt or ("chrome" if output.suffix.lower() == ".json" else "perfetto")
    not_an_input(output, (*traces, *request_files, *(requests_path(t) for t in traces)), what="export")
    check_output(output, what="export")
    with ExitStack() as stack:
        opened = [stack.enter_context(open_trace(p)) for p in traces]
        if leg_requests(traces, request_files) is None:
            # Batch by batch, only the tables the timeline reads (issue 39: not analyze's whole analysis).
            analyses = [stream_analysis(t.file) for t in opened]
            request_pid_choices(traces, None, requests_pid)  # refused without a request file, as below
            # Every event a slice, made while the file is written: memory stays what the analysis keeps.
            timeline = stream_timeline([t.file for t in opened], analyses)
            stack.callback(timeline.close)
        else:  # the request split reads rows the batched analysis does not keep: each trace read whole
            analyses = [t.analysis for t in opened]
            for t in opened:
                t.events()
            timeline = build_timeline(analyses, traces, *_request_tables(analyses, traces, request_files,
                                                                         requests_pid))
        if fmt == "perfetto":
            from ckptrace.renderers.perfetto import perfetto_writer as writer
        else:
            from ckptrace.renderers.chrome import chrome_writer as writer
        path = write_output(output, writer(timeline), what="export")
    for note in recording_notes(timeline):
        click.echo(f"ckptrace: warning: {printable(note)}", err=True)
    click.echo(f"wrote {printable(path)}: {fmt}, {process_count(timeline)} process track(s), "
               f"{slice_count(timeline)} slices", err=True)


def _request_tables(analyses, traces: tuple[str, ...], given: tuple[str, ...], choices: tuple[str, ...]
                    ) -> tuple[list | None, list | None]:
    """Each leg's request table (analyze --requests' rows), None for a leg without a file, and the
    pid its requests went to (None: the leg's one process)."""
    from ckptrace.analyzers.requests import request_pids, request_table
    from ckptrace.core.requests_file import lacking_requests, leg_requests, request_pid_choices, requests_path

    frames = leg_requests(traces, given)
    choices = request_pid_choices(traces, frames, choices)
    if frames is None:
        return None, None
    for line in lacking_requests(traces, frames):
        click.echo(f"ckptrace: warning: {line}", err=True)
    pids = request_pids([a.trace for a in analyses], frames, choices)
    sources = given or tuple(str(requests_path(t)) for t in traces)
    return [None if f is None else request_table(f, a, source=printable(src), pid=pid)
            for f, a, src, pid in zip(frames, analyses, sources, pids)], pids
