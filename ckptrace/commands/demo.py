"""`ckptrace demo`: the main job: record the sample A/B/A, check it, analyze, compare, dashboard."""
from __future__ import annotations

import json
from pathlib import Path

import click
import pandas as pd

LEGS = [("pool-off", "off"), ("pool-on", "on"), ("pool-off", "off")]


def truth_check(trace, truth_path: Path) -> str:
    """One line: the recording beside the workload's own clock and getrusage, so nobody has to
    take the tracer's word for it."""
    t = pd.read_json(truth_path, lines=True)
    t = t[(t["type"] == "checkpoint") & ~t["draft"].astype(bool)]
    ev = trace.events
    fills = ev[ev["kind"] == "fill"]
    rec_fill_ms = (fills["end_ns"] - fills["start_ns"]).sum() / 1e6
    return (f"checkpoints {int((ev['kind'] == 'checkpoint').sum())} (workload: {len(t)}), "
            f"fill faults {int(fills['faults'].sum())} (getrusage: {int(t['fill_faults'].sum())}), "
            f"fill {rec_fill_ms:.1f} ms (workload clock: {t['fill_ns'].sum() / 1e6:.1f} ms)")


@click.command(epilog="""\b
Examples:
  ckptrace demo                       # sample workload, results in ./ckptrace-demo/
  ckptrace demo --out /tmp/demo --iterations 60
  ckptrace demo --json                # machine-readable summary on stdout
""")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("ckptrace-demo"),
              show_default=True, help="Folder for the traces, ground truth and report.html.")
@click.option("--iterations", type=click.IntRange(min=3), default=45, show_default=True,
              help="update_slots() calls per leg of the sample workload.")
@click.option("--ckpt-mib", type=click.IntRange(min=1), default=64, show_default=True,
              help="Checkpoint size of the sample workload (stay above glibc's 32 MiB mmap threshold).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of the text report.")
def command(out_dir: Path, iterations: int, ckpt_mib: int, as_json: bool):
    """Record the sample workload pool-off, pool-on, pool-off (A/B/A) and report what the pool did.

    Builds the sample if needed, records each leg with the probes in place from its first
    instruction, checks each recording against the workload's own clock and fault counts, then
    analyzes, compares and writes a self-contained dashboard. Needs root.
    """
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.compare import compare
    from ckptrace.commands.compare import render
    from ckptrace.dashboards.report import write_dashboard
    from ckptrace.probes.recorder import RecordOptions, record
    from ckptrace.samples import workload_binary
    from ckptrace.trace import read_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    workload = workload_binary()
    say = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    say(f"ckptrace demo: sample workload {workload}")
    traces, checks = [], []
    for i, (label, pool) in enumerate(LEGS, 1):
        path = out_dir / f"{i}-{label}.parquet"
        truth = out_dir / f"{i}-{label}.truth.jsonl"
        say(f"leg {i}/3: {label}")
        record(RecordOptions(output=path, label=label, status=False),
               command=[str(workload), "--pool", pool, "--iterations", str(iterations),
                        "--ckpt-mib", str(ckpt_mib), "--truth", str(truth)])
        trace = read_trace(path)
        checks.append(truth_check(trace, truth))
        say(f"  check: {checks[-1]}")
        traces.append(trace)

    analyses = [analyze_trace(t) for t in traces]
    comparison = compare(analyses)
    report = write_dashboard(analyses, comparison, out_dir / "report.html",
                             title="ckptrace demo: sample workload, pool-off / pool-on / pool-off",
                             notes=[f"leg {i}: {c}" for i, c in enumerate(checks, 1)])
    if as_json:
        click.echo(json.dumps({"traces": [t.path for t in traces], "checks": checks,
                               "comparison": comparison.to_dict(), "report": str(report)}, default=str))
        return
    click.echo("")
    click.echo(render(comparison))
    click.echo(f"\nreport: {report.resolve()}")
