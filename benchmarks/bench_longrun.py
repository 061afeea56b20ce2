"""Recorder memory and CPU over a long recording: the sample workload making ~10 checkpoints a second.

`ckptrace record` launches the workload (one slot, a checkpoint every iteration, `--gap-us` between
iterations) for `--minutes`; every `--every` seconds this samples the recorder's resident memory
(VmRSS) and its CPU time (utime + stime of the recorder process; the workload is another process)
from /proc. After a warm-up (`--warmup` s: BPF compiled, probes in, first flushes), it fits a line
to RSS over time and reports the slope per hour and per recorded event, and the recorder's CPU as a
share of one core. At the end it stops the recorder with SIGINT (a clean stop: the stream becomes
the finished Parquet trace) and reports how long that took and the recorder's RSS meanwhile. Run as root, niced:

    nice -n 10 .venv/bin/python benchmarks/bench_longrun.py --minutes 10
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ckptrace.samples import workload_binary

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid: int) -> tuple[int, float]:
    """(VmRSS bytes, CPU seconds: utime + stime) of one process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(ln.split()[1]) << 10 for ln in f if ln.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=10.0, help="checkpoints per second asked of the workload")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the fit")
    ap.add_argument("--ckpt-mib", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    gap_us = int(1e6 / args.rate)
    wl = [str(workload_binary()), "--iterations", "1000000", "--slots", "1", "--decode-per-prefill", "0",
          "--ckpt-mib", str(args.ckpt_mib), "--pool", "on", "--decode-us", "200", "--gap-us", str(gap_us)]
    with tempfile.TemporaryDirectory(prefix="ckptrace-longrun-") as tmp:
        out = Path(tmp) / "long.parquet"
        rec = subprocess.Popen([sys.executable, "-m", "ckptrace", "record", "--quiet", "--json", "-o", str(out),
                                "--", *wl], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = rec.stderr.readline()
        if not ready.startswith("ckptrace: tracing"):
            rec.kill()
            sys.exit(f"record did not start: {ready.strip()} {rec.stderr.read().strip()}")
        t0 = time.monotonic()
        samples = []
        while (now := time.monotonic()) - t0 < args.minutes * 60:
            if rec.poll() is not None:
                sys.exit(f"record stopped early: {rec.stderr.read().strip()}")
            rss, cpu = sample(rec.pid)
            samples.append((now - t0, rss, cpu, out.stat().st_size))
            time.sleep(args.every)
        stop0 = time.monotonic()
        rec.send_signal(signal.SIGINT)
        stop_rss, stop_cpu = [], [sample(rec.pid)[1]]  # while the stream becomes the finished trace
        while rec.poll() is None:
            try:
                rss_now, cpu_now = sample(rec.pid)
            except (OSError, StopIteration, ValueError, IndexError):
                break  # exited meanwhile
            stop_rss.append(rss_now)
            stop_cpu.append(cpu_now)
            time.sleep(0.2)
        stdout, stderr = rec.communicate(timeout=600)
        stop_s = time.monotonic() - stop0
        if rec.returncode != 0:
            sys.exit(f"record failed: {stderr.strip()}")
        result = json.loads(stdout)
        trace_bytes = out.stat().st_size

    t, rss, cpu, stream_bytes = (np.array(c, dtype="float64") for c in zip(*samples))
    steady = t >= args.warmup
    slope_per_s = float(np.polyfit(t[steady], rss[steady], 1)[0])
    recorded_s = float(t[-1])
    events_per_s = result["events"] / recorded_s
    cpu_share = float((cpu[steady][-1] - cpu[steady][0]) / (t[steady][-1] - t[steady][0]))
    report = {
        "minutes": round(recorded_s / 60, 2),
        "checkpoints": result["checkpoints"],
        "checkpoints_per_s": round(result["checkpoints"] / recorded_s, 2),
        "events": result["events"],
        "events_per_s": round(events_per_s, 1),
        "lost_events": result["lost_events"],
        "rss_first_mib": round(rss[steady][0] / 2**20, 1),
        "rss_last_mib": round(rss[-1] / 2**20, 1),
        "rss_max_mib": round(rss.max() / 2**20, 1),
        "rss_slope_mib_per_hour": round(slope_per_s * 3600 / 2**20, 2),
        "rss_slope_bytes_per_event": round(slope_per_s / events_per_s, 3),
        "cpu_percent_of_a_core": round(100 * cpu_share, 2),
        "stream_bytes_per_event": round(float(stream_bytes[-1]) / result["events"], 1),
        "trace_bytes_per_event": round(trace_bytes / result["events"], 1),
        "clean_stop_s": round(stop_s, 1),
        "clean_stop_cpu_s": round(stop_cpu[-1] - stop_cpu[0], 1),  # up to the last sample before exit
        "rss_max_while_stopping_mib": round(max(stop_rss, default=0) / 2**20, 1),
        "samples": len(samples),
    }
    if args.json:
        print(json.dumps(report))
        return
    for k, v in report.items():
        print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
