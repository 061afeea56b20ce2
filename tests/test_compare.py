"""`compare` and `ckptrace compare` on synthetic legs drawn from known distributions."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.compare import METRICS, compare
from ckptrace.errors import AnalysisError, TraceFormatError
from ckptrace.meta import ObjectInfo, ProbeInfo, TraceMeta
from ckptrace.renderers.json import comparison_json
from ckptrace.trace import read_trace, write_trace
from helpers import assert_one_line_error, assert_parts_fit, ckptrace
from test_analyzers import MIB, MS, make_events


def leg_events(seed: int, n: int = 40, fill_ms: float = 24.0, copy_ms: float = 6.0, other_ms: float = 1.0,
               spread: float = 0.05, pool_hit: bool = False) -> pd.DataFrame:
    """n prefill iterations (update_slots), one checkpoint each, then a decode iteration.
    Fill, copy and other are lognormal around the given ms; fill faults = fill_ns / 3000."""
    rng = np.random.default_rng(seed)
    fill = np.zeros(n) if pool_hit else fill_ms * MS * rng.lognormal(0, spread, n)
    copy = copy_ms * MS * rng.lognormal(0, spread, n)
    other = other_ms * MS * rng.lognormal(0, spread, n)
    fill, copy, other = (np.rint(x).astype("int64") for x in (fill, copy, other))
    rows = []
    t = 0
    for k in range(n):
        ck0 = t + 2 * MS
        fill_end = ck0 + other[k] // 2 + fill[k]
        ck_end = fill_end + copy[k] + other[k] - other[k] // 2
        faults = int(fill[k] // 3000)
        rows += [dict(kind="iteration", tid=9, start_ns=t, end_ns=ck_end + 20 * MS, iter=2 * k + 1, tokens=256,
                      prompt_tokens=255),
                 dict(kind="checkpoint", tid=9, start_ns=ck0, end_ns=ck_end, ckpt=k + 1, iter=2 * k + 1,
                      bytes=36 * MIB, faults=faults + 3)]
        if not pool_hit:
            rows.append(dict(kind="fill", tid=9, start_ns=ck0 + other[k] // 2, end_ns=fill_end, ckpt=k + 1,
                             iter=2 * k + 1, bytes=36 * MIB, faults=faults, fault_timed=faults,
                             fault_timed_ns=faults * 1500))
        rows += [dict(kind="copy", tid=9, start_ns=fill_end, end_ns=fill_end + copy[k], ckpt=k + 1,
                      iter=2 * k + 1, bytes=36 * MIB, faults=3, fault_timed=3, fault_timed_ns=3 * 1500),
                 dict(kind="iteration", tid=9, start_ns=ck_end + 25 * MS, end_ns=ck_end + 30 * MS,
                      iter=2 * k + 2, tokens=1)]
        t = ck_end + 40 * MS
    return make_events(rows)


def leg(tmp_path, name: str, label: str, build: str = "aaaa", points=("update_tgt", "fill", "copy"),
        **kw) -> Path:
    p = tmp_path / f"{name}.parquet"
    meta = TraceMeta(label=label, objects=[ObjectInfo("/lib/libx.so", build)],
                     probes=[ProbeInfo(x, x, "/lib/libx.so", 0x1000, 0x1000, build) for x in points])
    write_trace(p, leg_events(**kw), meta)
    return p


def metric(c, name):
    return c.metrics.set_index("metric").loc[name]


def test_pooled_candidate_is_faster_in_aba(tmp_path):
    paths = [leg(tmp_path, "off1", "pool-off", seed=1),
             leg(tmp_path, "on", "pool-on", build="bbbb", seed=2, fill_ms=2.4),
             leg(tmp_path, "off2", "pool-off", seed=3)]
    c = compare([read_trace(p) for p in paths])
    assert (c.baseline, c.candidate) == ("pool-off", "pool-on")
    assert c.legs["arm"].astype(str).tolist() == ["baseline", "candidate", "baseline"]
    assert c.legs["checkpoints"].tolist() == [40, 40, 40]
    fill = metric(c, "checkpoint_fill_ns")
    assert fill["verdict"] == "faster" and fill["ci_high_pct"] < 0
    assert fill["change_pct"] == pytest.approx(-90, abs=3)  # 10x smaller by construction
    assert fill["samples_baseline"] == 80 and fill["samples_candidate"] == 40
    assert fill["drift_pct"] < 10  # legs of one distribution with 5% spread
    assert metric(c, "checkpoint_total_ns")["verdict"] == "faster"
    assert metric(c, "checkpoint_faults")["verdict"] == "faster"
    # The copy did not change: same distribution in every leg.
    assert metric(c, "checkpoint_copy_ns")["verdict"] in ("no change", "within drift")
    assert "fill" in c.explanation and "pool-on against pool-off" in c.explanation
    assert not any("build" in w for w in c.warnings)  # a candidate from another build is expected
    assert set(c.metrics["metric"]) == set(METRICS)


def test_same_distribution_reads_no_change_or_within_drift(tmp_path):
    paths = [leg(tmp_path, "a1", "A", seed=11), leg(tmp_path, "b", "B", seed=12), leg(tmp_path, "a2", "A", seed=13)]
    c = compare([read_trace(p) for p in paths])
    assert set(c.metrics["verdict"]) <= {"no change", "within drift"}


def test_change_smaller_than_drift_reads_within_drift(tmp_path):
    # The two A legs differ by 20% in fill (drift); B sits 8% below the pooled A median.
    paths = [leg(tmp_path, "a1", "A", seed=21, fill_ms=20.0, spread=0.01),
             leg(tmp_path, "b", "B", seed=22, fill_ms=20.0, spread=0.01),
             leg(tmp_path, "a2", "A", seed=23, fill_ms=24.0, spread=0.01)]
    c = compare([read_trace(p) for p in paths])
    fill = metric(c, "checkpoint_fill_ns")
    assert fill["drift_pct"] > abs(fill["change_pct"])
    assert fill["verdict"] == "within drift"
    assert not (fill["ci_low_pct"] <= 0 <= fill["ci_high_pct"])  # the interval alone would have said faster


def test_same_seed_same_output_and_seed_matters(tmp_path):
    paths = [leg(tmp_path, "off1", "off", seed=1, n=12), leg(tmp_path, "on", "on", seed=2, n=12, fill_ms=20),
             leg(tmp_path, "off2", "off", seed=3, n=12)]
    traces = [read_trace(p) for p in paths]
    one, two = comparison_json(compare(traces, seed=5)), comparison_json(compare(traces, seed=5))
    assert json.dumps(one) == json.dumps(two)
    other = comparison_json(compare(traces, seed=6))
    assert [m["ci_low_pct"] for m in one["metrics"]] != [m["ci_low_pct"] for m in other["metrics"]]


def test_zero_baseline_median_is_handled(tmp_path):
    # Pool-on as the baseline: its fill and fill faults are all 0.
    paths = [leg(tmp_path, "on1", "pool-on", seed=1, pool_hit=True), leg(tmp_path, "off", "pool-off", seed=2),
             leg(tmp_path, "on2", "pool-on", seed=3, pool_hit=True)]
    c = compare([read_trace(p) for p in paths])
    fill = metric(c, "checkpoint_fill_ns")
    assert fill["baseline_median"] == 0 and np.isnan(fill["change_pct"])
    assert fill["verdict"] == "slower" and fill["diff_ci_low"] > 0
    d = comparison_json(c)
    m = {x["metric"]: x for x in d["metrics"]}
    assert m["checkpoint_fill_ns"]["change_pct"] is None
    json.dumps(d, allow_nan=False)  # strict JSON
    # Zero against zero: a 0% change, no change.
    same = compare([read_trace(paths[0]), read_trace(leg(tmp_path, "on3", "other", seed=4, pool_hit=True))])
    z = metric(same, "checkpoint_fill_ns")
    assert z["change_pct"] == 0 and z["verdict"] == "no change"


def test_warnings(tmp_path):
    paths = [leg(tmp_path, "off1", "off", seed=1, n=3),
             leg(tmp_path, "on", "on", seed=2, points=("update_tgt", "copy")),
             leg(tmp_path, "off2", "off", seed=3, build="cccc")]
    traces = [read_trace(p) for p in paths]
    traces[2].meta.lost_events = 7
    w = "\n".join(compare(traces).warnings)
    assert "different builds" in w
    assert "leg 2 (on) was recorded with a different probe set" in w
    assert "leg 1 (off) has 3 checkpoints" in w
    assert "leg 3 (off): 7 events were lost" in w
    single = "\n".join(compare(traces[:2]).warnings)
    assert "only one baseline leg" in single


def test_every_iteration_fits_its_span(tmp_path):
    a = analyze_trace(read_trace(leg(tmp_path, "x", "x", seed=4)))
    assert_parts_fit(a.iterations)
    assert a.summary["prefill_iterations"] == 40 and a.summary["decode_iterations"] == 40


def test_bad_input(tmp_path):
    p = leg(tmp_path, "off1", "off", seed=1)
    with pytest.raises(AnalysisError, match="at least two traces"):
        compare([read_trace(p)])
    with pytest.raises(AnalysisError, match="two labels"):
        compare([read_trace(p), read_trace(p)])
    empty = tmp_path / "empty.parquet"
    write_trace(empty, make_events([dict(kind="decode", tid=1, start_ns=0, end_ns=5)]), TraceMeta(label="on"))
    with pytest.raises(AnalysisError, match="no checkpoints"):
        compare([read_trace(p), read_trace(empty)])
    three = [read_trace(leg(tmp_path, n, n, seed=i)) for i, n in enumerate("abc")]
    with pytest.raises(AnalysisError, match="3 labels"):
        compare(three)


def test_cli_json_contract(tmp_path):
    paths = [leg(tmp_path, "off1", "pool-off", seed=1), leg(tmp_path, "on", "pool-on", seed=2, fill_ms=2.4),
             leg(tmp_path, "off2", "pool-off", seed=3)]
    r = ckptrace("compare", *paths, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["baseline"], d["candidate"]) == ("pool-off", "pool-on")
    assert [x["arm"] for x in d["legs"]] == ["baseline", "candidate", "baseline"]
    for m in d["metrics"]:
        assert {"metric", "baseline_median", "candidate_median", "change_pct", "ci_low_pct", "ci_high_pct",
                "verdict"} <= set(m)
    assert {m["metric"]: m["verdict"] for m in d["metrics"]}["checkpoint_fill_ns"] == "faster"
    text = ckptrace("compare", *paths).stdout
    assert max(map(len, text.splitlines())) <= 80
    assert "faster" in text and "pooled" in text


def test_cli_bad_input_subprocess(tmp_path):
    p = leg(tmp_path, "off1", "off", seed=1)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"\x00garbage")
    future = tmp_path / "future.parquet"
    write_trace(future, leg_events(1), TraceMeta(label="on"))
    # Rewrite the metadata as a newer recorder would: needs a reader of version 99.
    import pyarrow.parquet as pq
    t = pq.read_table(future)
    md = dict(t.schema.metadata)
    meta = json.loads(md[b"ckptrace"])
    meta["version"] = meta["min_reader_version"] = 99
    md[b"ckptrace"] = json.dumps(meta).encode()
    pq.write_table(t.replace_schema_metadata(md), future)
    with pytest.raises(TraceFormatError, match="upgrade ckptrace"):
        read_trace(future)
    cases = {"single": [p], "garbage": [p, junk], "future": [p, future], "same label": [p, p]}
    for name, args in cases.items():
        assert_one_line_error(ckptrace("compare", *args))
