"""Do compare's verdicts hold? A small A/B/A (pool-off/on/off) and an A/A/A, repeated, with the real recorder.

Each repetition records, with `ckptrace record` on the sample workload (`--iterations 10`): an
A/B/A (pool-off, pool-on, pool-off: the pool-on leg is a mixture of warm-up misses and hits) and
an A/A/A (pool-off three times, labelled A, B, A). Every recording is kept, then compared under
each statistic compare offers (`analyzers.compare.STATISTICS`), so they are judged on the same
legs. Wanted: the pool's fill (and total) verdict identical in every A/B/A, and no A/A/A metric
ever "faster" or "slower". Run as root (about 10 s per leg here, so 20 repetitions take ~20 min):

    .venv/bin/python benchmarks/bench_verdicts.py --reps 20 --out /tmp/verdicts
    .venv/bin/python benchmarks/bench_verdicts.py --analyze /tmp/verdicts   # judge kept recordings again
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

from ckptrace.analyzers.metrics import METRICS, POOL, compared
from ckptrace.samples import workload_binary

ABA = [("pool-off", "off"), ("pool-on", "on"), ("pool-off", "off")]
AAA = [("A", "off"), ("B", "off"), ("A", "off")]
POOL_METRICS = POOL  # the metric table's (analyzers/metrics.py)
WALL = tuple(m.name for m in compared() if m.wall)


def record(path: Path, label: str, pool: str, iterations: int) -> None:
    argv = [sys.executable, "-m", "ckptrace", "record", "--quiet", "--label", label, "-o", str(path), "--",
            str(workload_binary()), "--pool", pool, "--iterations", str(iterations)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def record_all(out: Path, reps: int, iterations: int) -> None:
    for r in range(reps):
        for name, legs in (("aba", ABA), ("aaa", AAA)):
            for i, (label, pool) in enumerate(legs, 1):
                path = out / f"{r:02d}-{name}-{i}.parquet"
                if not path.exists():  # a rerun resumes
                    record(path, label, pool, iterations)
        print(f"recorded repetition {r + 1}/{reps}", file=sys.stderr, flush=True)


def judge(out: Path) -> dict:
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.compare import STATISTICS, compare
    from ckptrace.trace import read_trace

    reps = sorted({p.name[:2] for p in out.glob("*-aba-3.parquet")} & {p.name[:2] for p in out.glob("*-aaa-3.parquet")})
    legs = {(r, n): [analyze_trace(read_trace(out / f"{r}-{n}-{i}.parquet")) for i in (1, 2, 3)]
            for r in reps for n in ("aba", "aaa")}
    hit_rates = [a.summary["pool_hit_rate"] for r in reps for a in legs[(r, "aba")][1:2]]
    result = {"repetitions": len(reps), "pool_on_hit_rates": sorted(hit_rates), "statistics": {}}
    for stat in STATISTICS:
        aba = collections.defaultdict(collections.Counter)
        aaa = collections.Counter()
        aaa_reps = aaa_reps_cpu = 0
        for r in reps:
            c = compare(legs[(r, "aba")], statistic=stat).metrics.set_index("metric")
            for m in POOL_METRICS:
                aba[m][c.loc[m, "verdict"]] += 1
            a = compare(legs[(r, "aaa")], statistic=stat).metrics
            moved = a.loc[a["verdict"].isin(["faster", "slower"]), "metric"].tolist()
            aaa.update(moved)
            aaa_reps += bool(moved)
            aaa_reps_cpu += any(m not in WALL for m in moved)  # on CPU, faults, fault time
        result["statistics"][stat] = {"aba": {m: dict(v) for m, v in aba.items()},
                                      "aaa_reps_with_a_move": aaa_reps, "aaa_reps_with_a_move_off_wall": aaa_reps_cpu,
                                      "aaa_moves": dict(aaa)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--out", type=Path, help="keep the recordings here (resumes a partial run)")
    ap.add_argument("--analyze", type=Path, metavar="DIR", help="only judge the recordings kept in DIR")
    args = ap.parse_args()
    out = args.analyze or args.out
    if out is None:
        ap.error("give --out DIR (recordings are kept for --analyze)")
    if not args.analyze:
        out.mkdir(parents=True, exist_ok=True)
        record_all(out, args.reps, args.iterations)
    res = judge(out)
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
