"""Exporter cost: `ckptrace serve`'s own CPU (% of one core) and its slowdown of the sample workload.

Each pair runs the workload (fresh 40 MiB buffers, pool off: every checkpoint a fill with its
faults and mmaps, the most events per checkpoint) once alone and once with `ckptrace serve
--pid` attached, alternating which goes first, while this script scrapes /metrics every
--scrape-s seconds (Prometheus' default is 15 s; 1 s is the harsher case). Reported:
- the exporter's resident memory (VmRSS) once attached and when the workload ends;
- slowdown: the ratio of the workload's own median per-checkpoint time on its thread CPU clock,
  served / alone (as bench_overhead.py does for `record`), per pair and the median;
- the exporter's CPU: its threads' on-CPU time (/proc/PID/task/*/schedstat) while idle (attached, the
  workload waiting) and while the workload runs, as % of one core, and per checkpoint after the
  first --warmup ones (they pay the one-time fault-time calibration of their size, reported
  apart); then the figure at --rate checkpoints per second (idle + rate x per checkpoint).
The exporter's CPU is all the user-space work of the per-event path (ring buffer drain, pandas
batch, the analyzer's checkpoint table, the collector, HTTP): the most in-kernel histograms
could save (the probes run in the target either way). Run as root:

    nice -n 10 .venv/bin/python benchmarks/bench_serve.py --pairs 4
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd

from ckptrace.samples import workload_binary

def cpu_s(pid: int) -> float:
    """On-CPU seconds of a process, all its threads, in ns resolution (schedstat's first field;
    /proc/PID/stat's utime + stime count 10 ms ticks, too coarse for a process under 1%)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that just ended
    return total / 1e9


def per_checkpoint_cpu_ms(truth: Path) -> tuple[float, int]:
    df = pd.read_json(truth, lines=True)
    ck = df[(df["type"] == "checkpoint") & ~df["draft"].astype(bool)]
    return float(ck["cpu_ns"].median()) / 1e6, len(ck)


def waiting(argv: list[str]) -> subprocess.Popen:
    p = subprocess.Popen(argv + ["--wait-signal"], stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().startswith("ready pid="), "workload did not start"
    return p


def run_alone(wl: list[str], truth: Path) -> tuple[float, int]:
    p = waiting([*wl, "--truth", str(truth)])
    p.send_signal(signal.SIGUSR1)
    assert p.wait() == 0
    p.stderr.close()
    return per_checkpoint_cpu_ms(truth)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def checkpoints_done(truth: Path) -> int:
    try:
        return truth.read_text().count('"type":"checkpoint"')
    except FileNotFoundError:
        return 0


def run_served(wl: list[str], truth: Path, idle_s: float, scrape_s: float, warmup: int) -> dict:
    p = waiting([*wl, "--truth", str(truth)])
    srv = subprocess.Popen([sys.executable, "-m", "ckptrace", "serve", "--pid", str(p.pid),
                            "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stderr.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert m, f"serve did not start: {line}{srv.stderr.read()}"
        url = m.group(1)
        stop = threading.Event()

        def scrape():
            while not stop.wait(scrape_s):
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
        th = threading.Thread(target=scrape, daemon=True)
        th.start()
        c0, t0, rss0 = cpu_s(srv.pid), time.monotonic(), rss_mib(srv.pid)
        time.sleep(idle_s)  # the idle cost: drain loop and scrapes, no events
        c1, t1 = cpu_s(srv.pid), time.monotonic()
        p.send_signal(signal.SIGUSR1)
        # From the warm-up'th checkpoint on: the first ones pay the one-time resident calibration
        # of their size (fault time), reported apart.
        while checkpoints_done(truth) < warmup and p.poll() is None:
            time.sleep(0.01)
        c_warm, t_warm, n_warm = cpu_s(srv.pid), time.monotonic(), checkpoints_done(truth)
        assert p.wait() == 0
        c2, t2, rss2 = cpu_s(srv.pid), time.monotonic(), rss_mib(srv.pid)
        stop.set()
        th.join()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
        srv.send_signal(signal.SIGTERM)
        srv.wait(120)
        srv.stderr.close()
    ms, n = per_checkpoint_cpu_ms(truth)
    idle = (c1 - c0) / (t1 - t0)
    return {"ms": ms, "checkpoints": n, "idle_cpu_pct": 100 * idle,
            "busy_cpu_pct": 100 * (c2 - c_warm) / (t2 - t_warm), "rate": (n - n_warm) / (t2 - t_warm),
            "cpu_ms_per_checkpoint": 1000 * ((c2 - c_warm) - idle * (t2 - t_warm)) / (n - n_warm),
            "warmup_cpu_ms": 1000 * ((c_warm - c1) - idle * (t_warm - t1)), "warmup_checkpoints": n_warm,
            "rss_start_mib": rss0, "rss_end_mib": rss2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--ckpt-mib", type=int, default=40)
    ap.add_argument("--decode-us", type=int, default=2000)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=10, help="checkpoints before the per-checkpoint CPU is measured")
    ap.add_argument("--rate", type=float, default=10.0, help="checkpoints per second to state the CPU at")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    wl = [str(workload_binary()), "--iterations", str(args.iterations), "--ckpt-mib", str(args.ckpt_mib),
          "--pool", "off", "--decode-us", str(args.decode_us)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run_alone(wl, tmp / "warm.jsonl")  # page cache, CPU frequency
        for i in range(args.pairs):
            got = {}
            for served in ((False, True) if i % 2 == 0 else (True, False)):
                truth = tmp / f"{i}-{served}.jsonl"
                got[served] = (run_served(wl, truth, args.idle_s, args.scrape_s, args.warmup) if served
                               else {"ms": run_alone(wl, truth)[0]})
            row = {"pair": i, "alone_ms": got[False]["ms"], "served_ms": got[True]["ms"],
                   "ratio": got[True]["ms"] / got[False]["ms"], **{k: v for k, v in got[True].items() if k != "ms"}}
            rows.append(row)
            if not args.json:
                print(f"pair {i}: alone {row['alone_ms']:.2f} ms  served {row['served_ms']:.2f} ms  ratio "
                      f"{row['ratio']:.3f}  exporter idle {row['idle_cpu_pct']:.2f}%  busy {row['busy_cpu_pct']:.2f}% "
                      f"at {row['rate']:.1f} ckpt/s ({row['cpu_ms_per_checkpoint']:.2f} ms CPU per checkpoint; "
                      f"first {row['warmup_checkpoints']}: {row['warmup_cpu_ms']:.0f} ms); exporter RSS "
                      f"{row['rss_start_mib']:.0f} -> {row['rss_end_mib']:.0f} MiB",
                      flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("ratio", "idle_cpu_pct", "busy_cpu_pct", "rate", "cpu_ms_per_checkpoint", "warmup_cpu_ms")}
    at_rate = med["idle_cpu_pct"] + args.rate * med["cpu_ms_per_checkpoint"] / 10
    result = {"pairs": rows, "median": med, "ratio_min": min(r["ratio"] for r in rows),
              "ratio_max": max(r["ratio"] for r in rows), "scrape_s": args.scrape_s,
              f"cpu_pct_at_{args.rate:g}_per_s": at_rate,
              "workload": {"ckpt_mib": args.ckpt_mib, "iterations": args.iterations, "pool": "off"}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"slowdown (served / alone, thread CPU per checkpoint, median of {len(rows)} pairs): "
              f"{med['ratio']:.3f}  [min {result['ratio_min']:.3f}, max {result['ratio_max']:.3f}]")
        print(f"exporter CPU: idle {med['idle_cpu_pct']:.2f}% of a core, {med['cpu_ms_per_checkpoint']:.2f} ms "
              f"per checkpoint; at {args.rate:g} checkpoints/s: {at_rate:.2f}% of a core "
              f"(scraped every {args.scrape_s:g} s); the first {args.warmup} checkpoints: "
              f"{med['warmup_cpu_ms']:.0f} ms (one-time calibration of their size)")


if __name__ == "__main__":
    main()
