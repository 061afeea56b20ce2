"""Tracer overhead: the sample's own per-checkpoint time, untraced against `ckptrace record` against
a bpftrace peer, interleaved, on the wall clock and on the traced thread's CPU clock.

Each round runs the workload once per tool (untraced, `record`, bpftrace; the order rotating each
round), for each buffer mode: fresh 64 MiB buffers (`--pool off`: every checkpoint a fill and a
copy of fresh pages, 32,768 faults, the worst case) and pooled ones (`--pool on`). The workload
waits (`--wait-signal`) until the tool has attached to it by pid, so the tools start alike and
their start-up is not in the figure. Per run, the median of the workload's OWN per-checkpoint
clocks (its truth file): wall (`end_ns - start_ns`) and thread CPU (`cpu_ns`). A round's ratio is
the tool's median over the untraced run's of the same round and mode; reported: the median
ratio over rounds with its min and max, and the load average before and after.

The peer is bench_sidecar.py's: bpftrace with a uprobe and a uretprobe on every function
ckptrace probes (by mangled name, in the same objects), each span timed per thread into a
histogram, and the same tracepoints as ckptrace's `--rss-per-fault` (mmap, munmap, mremap,
kmem:rss_stat, exec, exit), filtered to the target's pid. Run as root:

    .venv/bin/python benchmarks/bench_overhead.py --rounds 12                         # record's defaults
    .venv/bin/python benchmarks/bench_overhead.py --rounds 12 --record-args=--rss-per-fault
    .venv/bin/python benchmarks/bench_overhead.py --rounds 12 --record-args='--fault-sample 1'
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from ckptrace.samples import workload_binary

# bench_sidecar.py beside this script: its folder is on sys.path when run
from bench_sidecar import ATTACH_TIMEOUT_S, bpftrace_script, drain, perf_events, wait_line
from bench_probe_cost import others_hooks

CKPTRACE = Path(sys.executable).with_name("ckptrace")
TOOLS = ("untraced", "record", "bpftrace")
CLOCKS = ("wall", "cpu")


def per_checkpoint_ms(truth: Path) -> dict[str, float]:
    """The median per-checkpoint wall and thread CPU time (ms) of a run, from its truth file."""
    df = pd.read_json(truth, lines=True)
    ck = df[(df["type"] == "checkpoint") & ~df["draft"].astype(bool)]
    return {"wall": float((ck["end_ns"] - ck["start_ns"]).median()) / 1e6, "cpu": float(ck["cpu_ns"].median()) / 1e6}


def attach(tool: str, pid: int, tmp: Path, record_args: list[str]) -> subprocess.Popen | None:
    """Start `tool` on process `pid`; return once its probes are all in."""
    if tool == "untraced":
        return None
    if tool == "record":
        proc = subprocess.Popen([str(CKPTRACE), "record", "--quiet", *record_args, "-o", str(tmp / "t.parquet"),
                                 "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_line(proc, "ckptrace: tracing")
        drain(proc.stderr)
        return proc
    script = tmp / "peer.bt"
    script.write_text(bpftrace_script(pid))
    proc = subprocess.Popen(["bpftrace", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    want = None
    for line in proc.stdout:
        if line.startswith("Attaching "):
            want = int(line.split()[1])
            break
    if want is None:
        raise RuntimeError(f"bpftrace never said what it attaches (status {proc.wait(60)})")
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while perf_events(proc.pid) < want:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"bpftrace did not attach its {want} probes")
        time.sleep(0.005)
    drain(proc.stdout)
    return proc


def run(tool: str, workload: list[str], truth: Path, tmp: Path, record_args: list[str]) -> dict[str, float]:
    wl = subprocess.Popen([*workload, "--wait-signal", "--truth", str(truth)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    tracer = None
    try:
        line = wl.stderr.readline()
        if not line.startswith("ready pid="):
            raise RuntimeError(f"the workload said {line!r}")
        tracer = attach(tool, wl.pid, tmp, record_args)
        wl.send_signal(signal.SIGUSR1)
        if wl.wait(600) != 0:
            raise RuntimeError(f"the workload exited {wl.returncode} under {tool}")
    finally:
        if wl.poll() is None:
            wl.kill()
            wl.wait()
        if tracer is not None:
            if tool == "bpftrace":
                tracer.send_signal(signal.SIGINT)
            try:
                tracer.wait(300)  # record stops by itself: its one target exited
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait()
    return per_checkpoint_ms(truth)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--ckpt-mib", type=int, default=64)
    ap.add_argument("--pool", choices=["off", "on", "both"], default="both",
                    help="off: fresh buffers (the worst case); on: pooled; both (default)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of " + ", ".join(TOOLS))
    ap.add_argument("--record-args", default="", help="more options for ckptrace record, e.g. --rss-per-fault")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tools = args.tools.split(",")
    if "untraced" not in tools or not set(tools) <= set(TOOLS):
        sys.exit(f"bench_overhead: --tools must name untraced and only {', '.join(TOOLS)}")
    if "bpftrace" in tools and not shutil.which("bpftrace"):
        sys.exit("bench_overhead: bpftrace is not installed (apt-get install bpftrace), or leave it out with --tools")
    record_args = shlex.split(args.record_args)
    modes = ["off", "on"] if args.pool == "both" else [args.pool]
    base = [str(workload_binary()), "--iterations", str(args.iterations), "--ckpt-mib", str(args.ckpt_mib),
            "--decode-us", "500"]
    load0 = os.getloadavg()
    others: dict[str, int] = {}
    got: dict[tuple[str, str], list[dict[str, float]]] = {(m, t): [] for m in modes for t in tools}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run("untraced", [*base, "--pool", "off"], tmp / "warm.jsonl", tmp, [])  # page cache, CPU frequency
        for i in range(args.rounds):
            others = others_hooks(others)
            order = tools[i % len(tools):] + tools[:i % len(tools)]
            for mode in modes:
                for tool in order:
                    got[(mode, tool)].append(run(tool, [*base, "--pool", mode], tmp / f"{i}-{mode}-{tool}.jsonl",
                                                 tmp, record_args))
                if not args.json:
                    base_ms = got[(mode, "untraced")][-1]
                    print(f"round {i} pool {mode}: " + "  ".join(
                        f"{t} {got[(mode, t)][-1]['wall']:.1f}/{got[(mode, t)][-1]['cpu']:.1f} ms"
                        + ("" if t == "untraced" else
                           f" ({got[(mode, t)][-1]['wall'] / base_ms['wall']:.3f}/"
                           f"{got[(mode, t)][-1]['cpu'] / base_ms['cpu']:.3f})")
                        for t in tools) + "  (wall/cpu)", flush=True)
    load1 = os.getloadavg()
    result = {"metric": "median per-checkpoint time of the workload's own clocks, traced / untraced per round",
              "rounds": args.rounds, "iterations": args.iterations, "ckpt_mib": args.ckpt_mib,
              "record_args": record_args, "loadavg_before": load0, "loadavg_after": load1,
              "others_hooks": others, "modes": {}}
    for mode in modes:
        entry = {"untraced_ms": {c: spread([r[c] for r in got[(mode, "untraced")]]) for c in CLOCKS}}
        for tool in (t for t in tools if t != "untraced"):
            entry[tool] = {c: spread([r[c] / u[c] for r, u in zip(got[(mode, tool)], got[(mode, "untraced")])])
                           for c in CLOCKS}
        result["modes"]["fresh" if mode == "off" else "pooled"] = entry
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if others:
        print("other processes' programs on tracepoints meanwhile (the most seen; every run paid them, "
              "the untraced too): " + ", ".join(f"{k} {v}" for k, v in sorted(others.items())))
    for name, entry in result["modes"].items():
        u = entry["untraced_ms"]
        print(f"{name} buffers, {args.rounds} rounds: untraced per checkpoint {u['wall']['median']:.1f} ms wall, "
              f"{u['cpu']['median']:.1f} ms CPU")
        for tool in (t for t in tools if t != "untraced"):
            print(f"  {tool:9s} " + "  ".join(
                f"{c} {entry[tool][c]['median']:.3f} [{entry[tool][c]['min']:.3f}, {entry[tool][c]['max']:.3f}]"
                for c in CLOCKS))


if __name__ == "__main__":
    main()
