"""Synthetic traces shaped like the sample workload's, for dashboard tests and size checks.

They exercise the renderer without a recorder; the numbers are made up (a seeded generator)
and mean nothing about any real run. `python -m ckptrace.dashboards.synthetic` writes a
dashboard of a large synthetic A/B/A and prints its size.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ckptrace.core.meta import ObjectInfo, ProbeInfo, TraceMeta
from ckptrace.core.trace import Trace, normalize_events
from ckptrace.core.units import MIB



def synthetic_trace(label: str, *, checkpoints: int = 60, per_iteration: int = 2, pool: bool = False,
                    seed: int = 1, tid: int = 4242, bytes_per_checkpoint: int = 36 * MIB) -> Trace:
    """A trace of prefill iterations holding `per_iteration` checkpoints each, plus decode iterations.

    Pool off: every fill faults in the whole buffer. Pool on: after the first iteration's
    checkpoints the buffers are reused, so fill is absent (a pool hit) and copies barely fault.
    """
    rng = np.random.default_rng(seed)
    build_id = ("b0" if pool else "a0") * 20  # legs of one arm come from one build
    n_pre = max(1, -(-checkpoints // per_iteration))
    n_ck = checkpoints
    pages = bytes_per_checkpoint // 4096
    # Iterations alternate prefill, decode; ids are update_slots call numbers starting at 1.
    kinds = np.tile(np.array(["prefill", "decode"]), n_pre)
    n_it = len(kinds)
    it_id = np.arange(1, n_it + 1, dtype="int64")
    pre_idx = np.flatnonzero(kinds == "prefill")
    ck_iter_pos = np.repeat(pre_idx, per_iteration)[:n_ck]
    hit = np.zeros(n_ck, dtype=bool)
    if pool:
        hit[per_iteration:] = True
    fill_faults = np.where(hit, 0, pages).astype("int64")
    fill_ns = np.where(hit, 0, rng.normal(24e6, 2e6, n_ck).clip(5e6)).astype("int64")
    copy_ns = rng.normal(6e6, 0.5e6, n_ck).clip(1e6).astype("int64")
    copy_faults = np.where(hit, rng.integers(0, 4, n_ck), rng.integers(0, 40, n_ck)).astype("int64")
    fill_fault_ns = (fill_faults * rng.normal(2200, 150, n_ck).clip(500)).astype("int64").clip(0, fill_ns)
    copy_fault_ns = (copy_faults * 2200).astype("int64").clip(0, copy_ns)
    gap = rng.integers(20_000, 200_000, n_ck)
    ck_total = fill_ns + copy_ns + 2 * gap

    # Lay iterations out in time: compute before the checkpoints, then the checkpoints in order.
    compute = np.where(kinds == "prefill", rng.normal(90e6, 8e6, n_it), rng.normal(12e6, 1e6, n_it))
    compute = compute.clip(1e6).astype("int64")
    ck_sum = np.bincount(ck_iter_pos, weights=ck_total, minlength=n_it).astype("int64")
    span = compute + ck_sum + 50_000
    t0 = 1_000_000_000_000
    it_start = t0 + np.concatenate([[0], np.cumsum(span + 300_000)[:-1]])
    it_end = it_start + span
    # Checkpoint start: iteration start + compute + the totals of earlier checkpoints there.
    before = pd.Series(ck_total).groupby(ck_iter_pos).cumsum().to_numpy() - ck_total
    ck_start = it_start[ck_iter_pos] + compute[ck_iter_pos] + before
    ck_end = ck_start + ck_total
    ck_id = np.arange(1, n_ck + 1, dtype="int64")
    fill_start = ck_start + gap
    copy_start = fill_start + fill_ns

    def rows(kind, start, end, **cols):
        n = len(start)
        wall = np.asarray(end) - np.asarray(start)
        wait = (wall * rng.uniform(0.01, 0.08, n)).astype("int64")  # a lightly loaded machine
        d = {"kind": [kind] * n, "tid": np.full(n, tid, "int32"), "start_ns": start, "end_ns": end,
             "cpu_ns": pd.array(wall - wait, dtype="Int64"), "wait_ns": pd.array(wait, dtype="Int64")}
        d.update(cols)
        return pd.DataFrame(d)

    ev = [
        rows("iteration", it_start, it_end, iter=it_id,
             tokens=np.where(kinds == "prefill", 64, 1).astype("int32"),
             prompt_tokens=np.where(kinds == "prefill", 63, 0).astype("int32")),
        rows("decode", it_start, it_start + compute, iter=it_id, phase="iteration",
             tokens=np.where(kinds == "prefill", 64, 1).astype("int32"),
             prompt_tokens=np.where(kinds == "prefill", 63, 0).astype("int32")),
        rows("checkpoint", ck_start, ck_end, ckpt=ck_id, iter=it_id[ck_iter_pos],
             bytes=np.full(n_ck, bytes_per_checkpoint), faults=fill_faults + copy_faults, phase="iteration"),
        rows("fill", fill_start[~hit], copy_start[~hit], ckpt=ck_id[~hit], iter=it_id[ck_iter_pos][~hit],
             bytes=np.full((~hit).sum(), bytes_per_checkpoint), faults=fill_faults[~hit],
             fault_ns=pd.array(fill_fault_ns[~hit], dtype="Int64"), phase="checkpoint"),
        rows("copy", copy_start, copy_start + copy_ns, ckpt=ck_id, iter=it_id[ck_iter_pos],
             bytes=np.full(n_ck, bytes_per_checkpoint), faults=copy_faults,
             fault_ns=pd.array(copy_fault_ns, dtype="Int64"), phase="checkpoint"),
        rows("mmap", fill_start[~hit], fill_start[~hit] + 5_000, ckpt=ck_id[~hit],
             iter=it_id[ck_iter_pos][~hit], bytes=np.full((~hit).sum(), bytes_per_checkpoint),
             phase="fill"),
    ]
    ev = pd.concat(ev, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)
    nullable = ("cpu_ns", "wait_ns", "fault_ns")  # trace format 2: NA = not recorded, left as it is
    ev = ev.fillna({c: 0 for c in ev.columns if c not in ("kind", "phase", *nullable)} | {"phase": "none"})
    events = normalize_events(ev)
    for c in nullable:  # kept even by a trace.py that predates them
        events[c] = ev[c].astype("Int64").to_numpy()
    stop = int(it_end[-1]) + 1_000_000
    lib = "/opt/sample/libsample-common.so"
    meta = TraceMeta(
        tool_version="synthetic", label=label, mode="launch",
        command=["ckpt-workload", "--pool", "on" if pool else "off"], pid=1000 + seed, exit_code=0,
        executable="/opt/sample/ckpt-workload", objects=[ObjectInfo(lib, build_id)],
        probes=[ProbeInfo(p, p, lib, 0x1000 * (i + 1), 0x1000 * (i + 1), build_id)
                for i, p in enumerate(["update_tgt", "resize_grow", "state_copy", "update_slots", "llama_decode"])],
        kernel="6.18.0-synthetic", host="synthetic", start_time="2026-11-29T00:00:00Z",
        attach_ns=t0 - 1_000_000, stop_ns=stop, first_event_ns=t0, stop_reason="target exited",
        fault_sample_every=1, fault_time_definition="synthetic", events=len(events),
    )
    return Trace(events=events, meta=meta, path=f"{label}.parquet")


def synthetic_aba(checkpoints: int = 60, per_iteration: int = 2, labels=("pool-off", "pool-on")):
    """Three traces in run order: baseline, candidate, baseline."""
    base, cand = labels
    return [
        synthetic_trace(base, checkpoints=checkpoints, per_iteration=per_iteration, pool=False, seed=1),
        synthetic_trace(cand, checkpoints=checkpoints, per_iteration=per_iteration, pool=True, seed=2),
        synthetic_trace(base, checkpoints=checkpoints, per_iteration=per_iteration, pool=False, seed=3),
    ]


def main(argv=None) -> None:
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.compare import compare
    from ckptrace.dashboards.report import write_dashboard

    ap = argparse.ArgumentParser(description="Write a dashboard of a synthetic A/B/A and print its size.")
    ap.add_argument("--checkpoints", type=int, default=100_000, help="checkpoints over all three legs")
    ap.add_argument("-o", "--output", type=Path, default=Path("synthetic-report.html"))
    a = ap.parse_args(argv)
    traces = synthetic_aba(checkpoints=max(1, a.checkpoints // 3))
    analyses = [analyze_trace(t) for t in traces]
    path = write_dashboard(analyses, compare(analyses), a.output, "synthetic A/B/A (made-up numbers, not a recording)")
    print(f"{path}: {path.stat().st_size / 1e6:.2f} MB, {sum(len(x.checkpoints) for x in analyses)} checkpoints")


if __name__ == "__main__":
    main()
