"""Tracer overhead: the sample's own per-checkpoint time, untraced against recorded, interleaved.

Each pair runs the workload once untraced and once under `ckptrace record`, alternating which goes
first (A/B then B/A), and takes the median of the workload's OWN per-checkpoint clock in each run:
its thread CPU clock by default (`--clock cpu`: what the probes cost the traced thread, unmoved
by other jobs taking the cores), or its wall clock (`--clock wall`: truth `end_ns - start_ns`). The ratio of the traced median to the untraced median is
reported per pair, then the median ratio with its min..max spread. Run as root:

    .venv/bin/python benchmarks/bench_overhead.py --pairs 6                    # record's defaults
    .venv/bin/python benchmarks/bench_overhead.py --pairs 6 --fault-sample 1   # + legacy interval
    .venv/bin/python benchmarks/bench_overhead.py --pairs 6 --rss-step 0       # without RSS rows
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ckptrace.samples import workload_binary


def per_checkpoint_ms(truth: Path, metric: str, clock: str) -> float:
    df = pd.read_json(truth, lines=True)
    ck = df[(df["type"] == "checkpoint") & ~df["draft"].astype(bool)]
    prefix = "" if metric == "total" else f"{metric}_"
    if clock == "cpu":
        col = ck[f"{prefix}cpu_ns"]
    else:
        col = (ck["end_ns"] - ck["start_ns"]) if metric == "total" else ck[f"{metric}_ns"]
    return float(col.median()) / 1e6


def run(workload_argv: list[str], truth: Path, traced: bool, fault_sample: str, tmp: Path,
        rss_step: str = "1") -> None:
    argv = [*workload_argv, "--truth", str(truth)]
    if traced:
        argv = [sys.executable, "-m", "ckptrace", "record", "--quiet", "--fault-sample", fault_sample,
                "--rss-step", rss_step, "-o", str(tmp / "bench.parquet"), "--", *argv]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--ckpt-mib", type=int, default=64)
    ap.add_argument("--pool", choices=["on", "off"], default="off")
    ap.add_argument("--fault-sample", default="0")
    ap.add_argument("--rss-step", default="1", help="record's --rss-step (MiB; 0 = no RSS rows)")
    ap.add_argument("--metric", choices=["total", "fill", "copy"], default="total")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    wl = [str(workload_binary()), "--iterations", str(args.iterations), "--ckpt-mib", str(args.ckpt_mib),
          "--pool", args.pool, "--decode-us", "500"]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run(wl, tmp / "warm.jsonl", False, args.fault_sample, tmp)  # page cache, CPU frequency
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {}
            for traced in order:
                truth = tmp / f"{i}-{traced}.jsonl"
                run(wl, truth, traced, args.fault_sample, tmp, args.rss_step)
                got[traced] = per_checkpoint_ms(truth, args.metric, args.clock)
            rows.append({"pair": i, "untraced_ms": got[False], "traced_ms": got[True],
                         "ratio": got[True] / got[False]})
            if not args.json:
                print(f"pair {i}: untraced {got[False]:8.2f} ms  traced {got[True]:8.2f} ms  "
                      f"ratio {got[True] / got[False]:.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    result = {"metric": f"median per-checkpoint {args.metric} time ({args.clock} clock)", "pairs": rows,
              "fault_sample": args.fault_sample, "rss_step": args.rss_step, "ckpt_mib": args.ckpt_mib, "pool": args.pool,
              "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"overhead ratio (traced / untraced, median of {len(rows)} pairs): "
              f"{result['ratio_median']:.3f}  [min {result['ratio_min']:.3f}, max {result['ratio_max']:.3f}]")


if __name__ == "__main__":
    main()
