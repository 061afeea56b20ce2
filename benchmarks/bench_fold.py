"""The exporter's per-batch cost: `ckptrace serve`'s fold of one drained batch into its series.

No kernel: the events of a recorded trace (the pool-off sample by default: every checkpoint a fill
with its faults and mmaps) are cut into batches of --per-batch checkpoints, as the drain loop
hands them over every 0.5 s, in the record layout the fold reads (live/session.py's numpy records:
the fields it uses, the kernel's integer codes), and CheckpointMetrics.fold is timed over them,
--repeat times; reported: the median CPU time per batch and per checkpoint (time.process_time:
on-CPU, not wall). Compares two ckptrace versions when run from each checkout:

    .venv/bin/python benchmarks/bench_fold.py --repeat 200 --per-batch 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from ckptrace.exporters.prometheus import CheckpointMetrics
from ckptrace.core.trace import KINDS, PHASES, read_trace

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "traces" / "1-pool-off.parquet"
FIELDS = {"kind": "u1", "phase": "u1", "pid": "i4", "tid": "i4", "ckpt": "i8", "iter": "i8", "start_ns": "i8",
          "end_ns": "i8", "bytes": "i8", "addr": "u8", "faults": "i8", "cpu_ns": "i8", "wait_ns": "i8",
          "old_addr": "u8", "old_bytes": "i8"}


class Batch:  # live/session.py's LiveBatch, as the fold reads it
    def __init__(self, events, fault_ns):
        self.events, self.fault_ns, self.sched_recorded = events, fault_ns, True


def batches(path: Path, per_batch: int) -> list[Batch]:
    ev = read_trace(path).events
    rec = np.zeros(len(ev), dtype=list(FIELDS.items()))
    for f in FIELDS:
        if f == "kind":
            rec[f] = ev["kind"].cat.codes.to_numpy()
        elif f == "phase":
            rec[f] = ev["phase"].cat.codes.to_numpy()
        else:
            rec[f] = ev[f].to_numpy(dtype=FIELDS[f], na_value=0)
    fault = ev["fault_ns"].to_numpy("int64", na_value=-1)
    order = np.argsort(rec["end_ns"], kind="stable")  # the kernel's order: a row is written at its return
    rec, fault = rec[order], fault[order]
    # Cut after every per_batch-th checkpoint row (its fills, copies and mmaps come before it).
    ends = np.flatnonzero(rec["kind"] == KINDS.index("checkpoint"))[per_batch - 1::per_batch] + 1
    cuts = [0, *ends.tolist(), len(rec)]
    return [Batch(rec[a:b], fault[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=SAMPLE)
    ap.add_argument("--per-batch", type=int, default=5, help="checkpoints per drained batch")
    ap.add_argument("--repeat", type=int, default=100)
    args = ap.parse_args()
    assert len(PHASES) < 256 and len(KINDS) < 256
    bs = batches(args.trace, args.per_batch)
    pid = int(bs[0].events["pid"][0])
    times, checkpoints = [], 0
    for i in range(args.repeat):
        m = CheckpointMetrics()
        m.add(pid, "bench", "")
        t0 = time.process_time()
        for b in bs:
            m.fold(pid, b)
        times.append((time.process_time() - t0) / len(bs))
        if i == 0:
            fam = next(f for f in m.collect() if f.name == "ckptrace_checkpoints")
            checkpoints = int(sum(x.value for x in fam.samples if x.name.endswith("_total")))
    per = statistics.median(times)
    print(json.dumps({"batches": len(bs), "checkpoints": checkpoints, "per_batch_us": per * 1e6,
                      "per_checkpoint_us": per * len(bs) / checkpoints * 1e6}))


if __name__ == "__main__":
    main()
