"""Analyzer throughput and memory: `analyze` of large synthetic trace files (analyze_file: the
batched read, then the tables and summary), at 1M and 10M events by default.

    .venv/bin/python benchmarks/bench_analyzer.py                 # 1M, then 10M events
    .venv/bin/python benchmarks/bench_analyzer.py --events 1M
    .venv/bin/python benchmarks/bench_analyzer.py --whole         # the whole-frame path: read_trace + analyze_trace
    .venv/bin/python benchmarks/bench_analyzer.py --repeat 5      # five analyses of each trace

Each trace is generated in a child process, and analysed --repeat times (3 by default), each in a
fresh child of its own, so a peak RSS (ru_maxrss) is that reader's and analyzer's alone,
interpreter and libraries included. Wall time suffers when other work shares the cores, CPU time
(user + system) much less: both are reported, each run's and their median (the figure the goal
is read against; the first run after a trace is written is often the slowest, as fresh memory
costs more then on a VM). Mix per group of 13 events: one prefill iteration (iteration, checkpoint,
fill, copy, mmap, munmap, decode; 1 in 10 checkpoints is a pool hit without fill) and three decode
iterations (iteration, decode). Goal at 10M events: >= 5M events/s and <= 150 bytes of peak RSS
per event.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

MS = 1_000_000
GROUP = 13


def parse_count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def synthetic_events(n: int, seed: int = 0) -> pd.DataFrame:
    """About n events (exactly n after trimming) in trace format v1, built column-wise."""
    rng = np.random.default_rng(seed)
    g = n // (GROUP - 1) + 2  # pool hits drop a fill row
    t = np.arange(g, dtype="int64") * 100 * MS
    ids = np.arange(g, dtype="int64")
    it0 = 4 * ids + 1
    hit = rng.random(g) < 0.1
    jit = rng.integers(0, MS, size=g)
    fill_faults = np.where(hit, 0, 8192 + rng.integers(0, 64, size=g))
    timed = fill_faults // 8  # --fault-sample 8
    z = np.zeros(g, dtype="int64")

    # (kind, tid, start, end, ckpt, iter, bytes, faults, timed, timed_ns, tokens, prompt, phase)
    blocks = [
        ("iteration", t, t + 60 * MS, z, it0, z, fill_faults + 40, z, z, z + 512, z + 511, "none"),
        ("checkpoint", t + 10 * MS, t + 40 * MS + jit, ids + 1, it0, z + (36 << 20), fill_faults + 30, z, z, z, z,
         "iteration"),
        ("fill", t + 11 * MS, t + 35 * MS + jit, ids + 1, it0, z + (36 << 20), fill_faults, timed, timed * 1600, z,
         z, "checkpoint"),
        ("copy", t + 35 * MS + jit, t + 39 * MS + jit, ids + 1, it0, z + (36 << 20), z + 20, z + 2, z + 3000, z, z,
         "checkpoint"),
        ("mmap", t + 10 * MS + 500, t + 10 * MS + 900, ids + 1, it0, z + (36 << 20), z, z, z, z, z, "checkpoint"),
        ("munmap", t + 39 * MS + jit + 100, t + 39 * MS + jit + 900, ids + 1, it0, z + (36 << 20), z, z, z, z, z,
         "checkpoint"),
        ("decode", t + 45 * MS, t + 59 * MS, z, it0, z, z + 5, z, z, z + 512, z + 511, "iteration"),
    ]
    for k in range(3):
        s = t + (60 + 12 * k) * MS
        blocks += [("iteration", s, s + 10 * MS, z, it0 + k + 1, z, z + 2, z, z, z + 1, z, "none"),
                   ("decode", s + MS, s + 9 * MS, z, it0 + k + 1, z, z + 1, z, z, z + 1, z, "iteration")]
    cols = ["start_ns", "end_ns", "ckpt", "iter", "bytes", "faults", "fault_timed", "fault_timed_ns", "tokens",
            "prompt_tokens"]
    parts = []
    for kind, *arrays, phase in blocks:
        keep = ~hit if kind == "fill" else np.ones(g, dtype=bool)
        d = {c: a[keep] for c, a in zip(cols, arrays)}
        parts.append(pd.DataFrame({"kind": kind, "tid": np.int32(4242), **d, "phase": phase}))
    ev = pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable").head(n)
    return ev.reset_index(drop=True)


def generate(path: str, n: int) -> None:
    from ckptrace.core.meta import TraceMeta
    from ckptrace.core.trace import write_trace
    write_trace(path, synthetic_events(n), TraceMeta(label="bench", fault_sample_every=8))


def measure(path: str, whole: bool = False) -> dict:
    from ckptrace.analyzers import KindRows, analyze_rows
    from ckptrace.core.heap import keep_freed_memory
    from ckptrace.core.trace import Trace, read_meta, read_trace

    keep_freed_memory()  # as the commands that read traces do (ckptrace/cli.py)

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    # Wall time suffers when other work shares the cores; CPU time much less so: report both.
    c0, t0 = cpu(), time.perf_counter()
    if whole:
        trace = read_trace(path)
        rows = KindRows.from_frame(trace.events)
    else:
        trace = Trace(events=None, meta=read_meta(path), path=path)
        rows = KindRows.from_file(path)
    c1, t1 = cpu(), time.perf_counter()
    rss_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    a = analyze_rows(trace, rows)
    c2, t2 = cpu(), time.perf_counter()
    n = rows.rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"path": "whole" if whole else "batched", "events": n, "checkpoints": len(a.checkpoints),
            "iterations": len(a.iterations),
            "read_s": round(t1 - t0, 3), "analyze_s": round(t2 - t1, 3), "total_s": round(t2 - t0, 3),
            "events_per_s": round(n / (t2 - t0)), "analyze_events_per_s": round(n / (t2 - t1)),
            "cpu_s": round(c2 - c0, 3), "events_per_cpu_s": round(n / (c2 - c0)),
            "read_cpu_s": round(c1 - c0, 3), "analyze_cpu_s": round(c2 - c1, 3),
            "peak_rss_after_read_mib": round(rss_read, 1), "peak_rss_mib": round(peak / (1 << 20), 1),
            "peak_bytes_per_event": round(peak / n, 1),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "file_mib": round(os.path.getsize(path) / (1 << 20), 1), "cpus": os.cpu_count()}


def report(r: dict) -> None:
    print(f"{r['events']:,} events ({r['checkpoints']:,} checkpoints, {r['iterations']:,} iterations), "
          f"file {r['file_mib']} MiB, {r['cpus']} CPUs")
    print(f"{r['path']} read {r['read_s']} s + analysis {r['analyze_s']} s = {r['total_s']} s: "
          f"{r['events_per_s'] / 1e6:.2f}M events/s (analysis alone {r['analyze_events_per_s'] / 1e6:.2f}M/s)")
    print(f"CPU time {r['cpu_s']} s (read {r['read_cpu_s']}, analyze {r['analyze_cpu_s']}): "
          f"{r['events_per_cpu_s'] / 1e6:.2f}M events per CPU-second; load average {r['loadavg_1m']}")
    print(f"peak RSS {r['peak_rss_mib']} MiB, {r['peak_bytes_per_event']} bytes per event "
          f"(after reading {r['peak_rss_after_read_mib']} MiB)", flush=True)


def summary(runs: list[dict]) -> dict:
    """The median of each figure over the runs (peak bytes per event: the largest)."""
    med = {k: float(np.median([r[k] for r in runs])) for k in ("total_s", "cpu_s", "events_per_s", "events_per_cpu_s")}
    return {**runs[0], **med, "runs": len(runs), "peak_bytes_per_event": max(r["peak_bytes_per_event"] for r in runs),
            "events_per_s_each": [r["events_per_s"] for r in runs],
            "events_per_cpu_s_each": [r["events_per_cpu_s"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="1M,10M", help="events in each synthetic trace, comma-separated (e.g. 1M,10M)")
    ap.add_argument("--trace", help="reuse or keep the generated trace at this path (one --events size)")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON, a line per size")
    ap.add_argument("--whole", action="store_true", help="read the whole trace first (read_trace), as before batches")
    ap.add_argument("--repeat", type=int, default=3, help="analyses of each trace, each in a fresh process (default 3)")
    args = ap.parse_args()
    sizes = [parse_count(x) for x in args.events.split(",")]
    if args.trace and len(sizes) > 1:
        ap.error("--trace takes one --events size")
    if args.generate_only:
        generate(args.trace, sizes[0])
        return
    if args.measure_only:
        print(json.dumps(measure(args.trace, args.whole)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = args.trace or str(Path(tmp) / f"bench-{n}.parquet")
            if not os.path.exists(path):
                g0 = time.perf_counter()
                subprocess.run([sys.executable, __file__, "--events", str(n), "--trace", path, "--generate-only"],
                               check=True)
                print(f"generated {n} events in {time.perf_counter() - g0:.1f} s: {path}", file=sys.stderr)
            runs = []
            for _ in range(max(args.repeat, 1)):
                out = subprocess.run([sys.executable, __file__, "--events", str(n), "--trace", path, "--measure-only",
                                      *(["--whole"] if args.whole else [])], check=True, capture_output=True, text=True)
                runs.append(json.loads(out.stdout))
                if not args.json:
                    report(runs[-1])
            if args.json:
                print(json.dumps(summary(runs)))
            elif len(runs) > 1:
                m = summary(runs)
                print(f"median of {len(runs)}: {m['total_s']:.3f} s, {m['events_per_s'] / 1e6:.2f}M events/s, "
                      f"{m['events_per_cpu_s'] / 1e6:.2f}M events per CPU-second; largest peak "
                      f"{m['peak_bytes_per_event']} bytes per event", flush=True)
            if not args.trace:
                os.unlink(path)


if __name__ == "__main__":
    main()
