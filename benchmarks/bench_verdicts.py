"""Do compare's verdicts hold while the machine's load changes between legs?

Each repetition records, with `ckptrace record` on the sample workload: an A/B/A (pool-off,
pool-on, pool-off) and an A/A/A (pool-off three times, labelled A, B, A), while a background job
(a memory-bound loop on one core: numpy filling and copying 64 MiB, the kind of neighbour that
moves a zero fill's on-CPU time too) runs during some legs and not others. Even repetitions run
it during legs 1 and 3, odd ones during leg 2, so the load always differs between the arms.
Every recording is kept, with the schedule, then judged under each statistic compare offers
(`analyzers.compare.STATISTICS`). Wanted: no A/A/A metric ever "faster" or "slower"; every A/B/A
"faster" on the fill. Run as root (about 8 s per leg here, so 20 repetitions take ~20 min):

    .venv/bin/python benchmarks/bench_verdicts.py --reps 20 --out /tmp/verdicts
    .venv/bin/python benchmarks/bench_verdicts.py --analyze /tmp/verdicts   # judge kept recordings again

A benchmark, not a test: it takes minutes and judges verdicts on a machine whose load it changes.
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

from ckptrace.analyzers.metrics import METRICS, compared
from ckptrace.samples import workload_binary

ABA = [("pool-off", "off"), ("pool-on", "on"), ("pool-off", "off")]
AAA = [("A", "off"), ("B", "off"), ("A", "off")]
# The A/B/A verdicts counted (names from the metric table, analyzers/metrics.py).
POOL_METRICS = ("checkpoint_fill_ns", "checkpoint_total_ns", "prefill_iteration_ns", "checkpoint_fill_cpu_ns",
                "checkpoint_total_cpu_ns")
WALL = tuple(m.name for m in compared() if m.wall)
HOG = ("import numpy as np\na = np.empty(1 << 26, np.uint8); b = np.empty_like(a)\n"
       "while True:\n    a.fill(1); b[:] = a\n")


def background_on(rep: int, leg: int) -> bool:
    """Even repetitions: the background job runs during legs 1 and 3; odd ones: during leg 2."""
    return (leg % 2 == 1) == (rep % 2 == 0)


def record(path: Path, label: str, pool: str, iterations: int, background: bool) -> dict:
    hog = subprocess.Popen([sys.executable, "-c", HOG]) if background else None
    try:
        if hog:
            time.sleep(1.0)  # let it reach its loop
        argv = [sys.executable, "-m", "ckptrace", "record", "--quiet", "--label", label, "-o", str(path), "--",
                str(workload_binary()), "--pool", pool, "--iterations", str(iterations)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    return {"path": path.name, "label": label, "pool": pool, "background": background}


def record_all(out: Path, reps: int, iterations: int) -> None:
    schedule_path = out / "schedule.json"
    schedule = json.loads(schedule_path.read_text()) if schedule_path.exists() else {}
    for r in range(reps):
        for name, legs in (("aba", ABA), ("aaa", AAA)):
            for i, (label, pool) in enumerate(legs, 1):
                path = out / f"{r:02d}-{name}-{i}.parquet"
                if not path.exists():  # a rerun resumes
                    schedule[path.name] = record(path, label, pool, iterations, background_on(r, i))
                    schedule_path.write_text(json.dumps(schedule, indent=1))
        print(f"recorded repetition {r + 1}/{reps}", file=sys.stderr, flush=True)


def judge(out: Path, warmup="auto") -> dict:
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.compare import STATISTICS, compare
    from ckptrace.core.trace import read_trace

    reps = sorted({p.name[:2] for p in out.glob("*-aba-3.parquet")} & {p.name[:2] for p in out.glob("*-aaa-3.parquet")})
    legs = {(r, n): [analyze_trace(read_trace(out / f"{r}-{n}-{i}.parquet")) for i in (1, 2, 3)]
            for r in reps for n in ("aba", "aaa")}
    hit_rates = [a.summary["pool_hit_rate"] for r in reps for a in legs[(r, "aba")][1:2]]
    others = [a.trace.meta.machine.others_cores for x in legs.values() for a in x
              if a.trace.meta.machine is not None and a.trace.meta.machine.others_cores is not None]
    result = {"repetitions": len(reps), "pool_on_hit_rates": sorted(hit_rates),
              "others_cores_range": [min(others), max(others)] if others else None, "statistics": {}}
    for stat in STATISTICS:
        aba = collections.defaultdict(collections.Counter)
        aaa = collections.Counter()
        aaa_verdicts = collections.defaultdict(collections.Counter)
        aaa_reps = aaa_reps_cpu = 0
        aaa_max_change = collections.defaultdict(float)
        for r in reps:
            c = compare(legs[(r, "aba")], statistic=stat, warmup=warmup).metrics.set_index("metric")
            for m in POOL_METRICS:
                aba[m][c.loc[m, "verdict"]] += 1
            a = compare(legs[(r, "aaa")], statistic=stat, warmup=warmup).metrics
            for row in a.to_dict("records"):
                aaa_verdicts[row["metric"]][row["verdict"]] += 1
                aaa_max_change[row["metric"]] = max(aaa_max_change[row["metric"]], abs(row["change_pct"] or 0))
            moved = a.loc[a["verdict"].isin(["faster", "slower"]), "metric"].tolist()
            aaa.update(moved)
            aaa_reps += bool(moved)
            aaa_reps_cpu += any(m not in WALL for m in moved)  # on CPU, faults, fault time
        result["statistics"][stat] = {"aba": {m: dict(v) for m, v in aba.items()},
                                      "aaa_reps_with_a_move": aaa_reps, "aaa_reps_with_a_move_off_wall": aaa_reps_cpu,
                                      "aaa_moves": dict(aaa), "aaa_verdicts": {m: dict(v) for m, v in aaa_verdicts.items()},
                                      "aaa_largest_change_pct": {m: round(v, 1) for m, v in aaa_max_change.items()}}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--out", type=Path, help="keep the recordings here (resumes a partial run)")
    ap.add_argument("--analyze", type=Path, metavar="DIR", help="only judge the recordings kept in DIR")
    ap.add_argument("--warmup", default="auto", help="compare's --warmup (N or auto)")
    args = ap.parse_args()
    out = args.analyze or args.out
    if out is None:
        ap.error("give --out DIR (recordings are kept for --analyze)")
    if not args.analyze:
        out.mkdir(parents=True, exist_ok=True)
        record_all(out, args.reps, args.iterations)
    res = judge(out, args.warmup if args.warmup == "auto" else int(args.warmup))
    print(json.dumps(res, indent=1))
    n = res["repetitions"]
    for stat, r in res["statistics"].items():
        verdicts = "; ".join(f"{METRICS[m].heading}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["aba"][m].items()))
                             for m in POOL_METRICS)
        print(f"{stat}: A/B/A {verdicts}; A/A/A with a faster/slower metric: {r['aaa_reps_with_a_move']} of "
              f"{n} (other than wall times: {r['aaa_reps_with_a_move_off_wall']}; per metric {r['aaa_moves']})",
              file=sys.stderr)


if __name__ == "__main__":
    main()
