"""`ckptrace whatif`: what a checkpoint-buffer pool would do, predicted from a pool-off recording."""
from __future__ import annotations

import dataclasses

import click

from ckptrace.core.terminal import echo, printable
from ckptrace.core.units import parse_bytes, parse_bytes_or_fraction
from ckptrace.options import requests_options


class _Size(click.ParamType):
    name = "BYTES"

    def __init__(self, fraction: bool = False):
        self.fraction = fraction
        self.name = "N|FRACTION" if fraction else "BYTES"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return parse_bytes_or_fraction(value) if self.fraction else parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _idle(text: str) -> int | None:
    """--trim-idle's SECONDS (or never) as ns."""
    if text.strip().lower() == "never":
        return None
    try:
        s = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds (or never)") from None
    if not 0 <= s <= 1e9:
        raise ValueError(f"{text!r}: seconds from 0 to 1e9 (or never)")
    return round(s * 1e9)


def _sweep(text: str) -> tuple[str, list]:
    """PARAM=V1,V2,... with each value as that option reads it."""
    from ckptrace.analyzers.whatif import SWEEPABLE

    param, eq, values = text.partition("=")
    param = param.strip()
    if not eq or param not in SWEEPABLE or not values.strip():
        raise click.BadParameter(f"{text!r}: write PARAM=V1,V2,... with PARAM one of {', '.join(SWEEPABLE)}",
                                 param_hint="--sweep")
    parse = {"cap-bytes": parse_bytes_or_fraction, "floor": parse_bytes, "trim-idle": _idle,
             "count": lambda v: int(v) if v.strip().isdigit() else (_ for _ in ()).throw(
                 ValueError(f"{v!r} is not a count"))}[param]
    try:
        return param, [parse(v) for v in values.split(",")]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sweep") from None


@click.command("whatif", epilog="""\b
Examples:
  ckptrace whatif off.parquet
  ckptrace whatif off.parquet --cap-bytes 1/64 --count 8
  ckptrace whatif off.parquet --cap-bytes 4GiB --evict none --trim-idle never
  ckptrace whatif off.parquet --sweep cap-bytes=0,256MiB,512MiB,1GiB,1/16
  ckptrace whatif off1.parquet off2.parquet --json | jq '.processes[].summary.hits'
  ckptrace whatif off.parquet --requests off.requests.json
""")
@click.argument("traces", nargs=-1, required=True, metavar="TRACE...")
@click.option("--policy", "policy_name", type=click.Choice(["pr201"]), default="pr201", show_default=True,
              help="The pool's rules to start from: pr201 is llama.cpp PR #201's (byte cap 1/16 of host memory, "
                   "64 buffers, a 32 MiB floor, the smallest smaller buffers displaced when full, best fit, a trim "
                   "after 1 s idle), which the sample pool-on builds run. The options below change one rule each.")
@click.option("--cap-bytes", type=_Size(fraction=True), metavar="N|FRACTION",
              help="Byte cap: bytes (48MiB, 4GiB) or a fraction of the host's memory as the trace recorded it "
                   "(1/16, 0.0625, 6.25%).")
@click.option("--count", type=click.IntRange(min=0), help="Count cap: buffers pooled at most.")
@click.option("--floor", type=_Size(), metavar="BYTES", help="Buffers smaller than this are not pooled.")
@click.option("--evict", type=click.Choice(["smallest", "none"]),
              help="A full pool displaces its smallest buffers smaller than the incoming one (smallest), or "
                   "declines (none).")
@click.option("--trim-idle", "trim_idle", metavar="SECONDS|never",
              help="Free everything pooled after the process has been idle this long (no update_slots call).")
@click.option("--fit", type=click.Choice(["best", "exact"]),
              help="A get takes the smallest pooled buffer at least as large (best: PR #201) or only one of "
                   "exactly the size (exact: the sample llama-server patch).")
@click.option("--sweep", "sweep_text", metavar="PARAM=V1,V2,...",
              help="Replay once per value of one rule (cap-bytes, count, floor, trim-idle): the cap-against-"
                   "saving curve. `ckptrace dashboard` draws the cap's.")
@requests_options(
    "Request file of each trace (`ckptrace drive --json -o FILE`), in order; - for none. Default: "
    "NAME.requests.json beside each NAME.parquet. Adds each request's predicted TTFT.",
    "In traces of several processes, the one the requests went to.")
@click.option("--json", "as_json", is_flag=True, help="Print every process's replay as JSON.")
@click.option("--all", "show_all", is_flag=True, help="List every change of the pool, not only the first --rows.")
@click.option("--rows", type=click.IntRange(min=0), default=20, show_default=True,
              help="Changes of the pool listed per process.")
def command(traces, policy_name, cap_bytes, count, floor, evict, trim_idle, fit, sweep_text, request_files,
            requests_pid, as_json, show_all, rows):
    """What a checkpoint-buffer pool would do, replayed on pool-off recordings.

    Each process's checkpoint buffers (mapped in a checkpoint's fill, returned by an munmap) are
    replayed in time order against the pool's rules: a checkpoint asks the pool for a buffer
    (hit: its fill and its faults are saved, and it costs what a measured hit costs; miss: it
    keeps its measured cost), a returned buffer is offered to it (kept, displacing smaller ones
    when full, or declined), and it is trimmed when the process is idle. Reported: hits and
    misses, pooled bytes over time and their high-water mark, displacements and trims, page
    faults and fill time saved (on CPU and wall), and with a request file each request's TTFT
    less what the hits save in its window (an estimate). A warning says when pooled bytes plus
    RSS would come near the process's cgroup memory limit, as the trace recorded it.
    """
    from ckptrace.analyzers.whatif import POLICIES
    from ckptrace.core.requests_file import leg_requests, request_pid_choices
    from ckptrace.renderers.json import dumps, versioned
    from ckptrace.renderers.whatif import whatif_json, whatif_report

    try:
        idle = None if trim_idle is None else _idle(trim_idle)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--trim-idle") from None
    changes = {k: v for k, v in (("cap", cap_bytes), ("count", count), ("floor", floor), ("evict", evict),
                                 ("fit", fit)) if v is not None}
    if trim_idle is not None:
        changes["trim_idle_ns"] = idle
    policy = dataclasses.replace(POLICIES[policy_name], **changes)
    sweep = _sweep(sweep_text) if sweep_text else None
    requests = leg_requests(traces, request_files)
    choices = request_pid_choices(traces, requests, requests_pid)

    results = []
    for i, path in enumerate(traces):
        results += _one_trace(path, policy, sweep, None if requests is None else requests[i],
                              choices[0] if len(choices) == 1 else (choices[i] if choices else None))
    for p in results:
        for w in p.warnings:
            click.echo(f"ckptrace: warning: {printable(w)}", err=True)
    if as_json:
        click.echo(dumps(versioned(whatif_json(results))))
    else:
        echo(whatif_report(results, None if show_all else rows))


def _one_trace(path, policy, sweep, requests, choice):
    from ckptrace.analyzers.requests import request_process, request_table
    from ckptrace.analyzers.memory_limit import limit_warning
    from ckptrace.analyzers.replay import predict
    from ckptrace.analyzers.whatif import sweep as run_sweep, ttft_saved
    from ckptrace.renderers.whatif import ProcessResult
    from ckptrace.core.trace import TraceFile as open_trace, read_trace, time_origin

    shown = printable(str(path))
    if requests is None:  # batch by batch: memory holds what the analysis keeps, not the trace
        with open_trace(path) as f:
            replays = predict(f, policy)
            first = None if time_origin(f.meta, None) else _first_start(replays)
            t0 = time_origin(f.meta, first)
        pid = None
    else:  # the request split reads rows the batched read does not keep (analyze --requests too)
        trace = read_trace(path)
        t0 = time_origin(trace.meta, trace.events)
        pid = request_process(trace, choice, source=shown)
        replays = predict(trace, policy)
    out = []
    for r in replays:
        if not len(r.input.gets):
            out.append(ProcessResult(shown, t0, None, r.pid, r.label))
            continue
        if requests is not None and (pid is None or pid == r.pid):
            r.requests = ttft_saved(r, r.input, request_table(requests, r.analysis, source=shown))
        p = ProcessResult(shown, t0, r, r.pid, r.label)
        w = limit_warning(f"{shown} pid {r.pid} ({printable(r.label)})", r)
        if w:
            p.warnings.append(w)
        if sweep is not None:
            p.sweep_param = sweep[0]
            p.sweep = run_sweep(r.input, policy, sweep[0], sweep[1], where=shown)
        out.append(p)
    return out


def _first_start(replays) -> int | None:
    """The trace's first start, from its batched read (KindRows keeps it), None without rows."""
    for r in replays:
        if r.analysis is not None and r.analysis.rows.start_ns is not None:
            return r.analysis.rows.start_ns
    return None
