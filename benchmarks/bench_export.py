"""Export cost: `ckptrace export` (perfetto and chrome) against `analyze` on the same large trace.

    .venv/bin/python benchmarks/bench_export.py              # the recorded sample, repeated to ~100k events
    .venv/bin/python benchmarks/bench_export.py --repeat 2000

The trace is the committed sample `1-pool-off` (229 recorded events: iterations, decodes,
checkpoints, fills, copies, mmaps, munmaps) repeated end to end, ids renumbered, so the mix and the
arguments are a real recording's. In one run, each step is timed on this process's CPU clock:
read + analyze, the timeline model, and each writer; the figures to quote are the ratios to analyze
and the microseconds per event, and the file sizes.
"""
from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ckptrace.analyzers import analyze_trace
from ckptrace.renderers.chrome import chrome_writer
from ckptrace.renderers.perfetto import perfetto_writer
from ckptrace.renderers.timeline import build_timeline
from ckptrace.core.trace import read_trace, write_trace

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "traces" / "1-pool-off.parquet"


def repeated_trace(path: Path, repeat: int) -> int:
    """Write the sample `repeat` times end to end into `path`; returns the number of events."""
    t = read_trace(SAMPLE)
    e = t.events
    span = int(e["end_ns"].max() - e["start_ns"].min()) + 1000
    step = int(max(e["ckpt"].max(), e["iter"].max())) + 1
    parts = []
    for i in range(repeat):
        x = e.copy()
        x["start_ns"] += i * span
        x["end_ns"] += i * span
        for c in ("ckpt", "iter"):
            x[c] = np.where(x[c] > 0, x[c] + i * step, 0)
        parts.append(x)
    big = pd.concat(parts, ignore_index=True)
    t.meta.stop_ns = int(big["end_ns"].max())
    write_trace(path, big, t.meta)
    return len(big)


def cpu() -> float:
    return time.process_time()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=500, help="copies of the 202-event sample (default 500)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckptrace-bench-export-") as tmp:
        path = Path(tmp) / "big.parquet"
        n = repeated_trace(path, a.repeat)
        t0 = cpu()
        analysis = analyze_trace(read_trace(path))
        t1 = cpu()
        timeline = build_timeline([analysis], [path])
        t2 = cpu()
        out = {}
        for name, writer in (("perfetto", perfetto_writer), ("chrome", chrome_writer)):
            f = io.BytesIO()
            s = cpu()
            writer(timeline)(f)
            out[name] = (cpu() - s, len(f.getvalue()))
    analyze_s, model_s = t1 - t0, t2 - t1
    report = {"events": n, "read_analyze_s": round(analyze_s, 3), "timeline_s": round(model_s, 3)}
    for name, (write_s, size) in out.items():
        total = model_s + write_s
        report[name] = {"write_s": round(write_s, 3), "export_over_analyze": round(total / analyze_s, 2),
                        "us_per_event": round(1e6 * total / n, 1), "bytes": size,
                        "bytes_per_event": round(size / n, 1)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
