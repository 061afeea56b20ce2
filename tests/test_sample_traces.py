"""The committed sample traces, analyzed offline, against the workload truth recorded beside them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.compare import compare
from ckptrace.trace import read_trace

TRACES = Path(__file__).resolve().parent.parent / "samples" / "traces"
LEGS = ["1-pool-off", "2-pool-on", "3-pool-off"]


def truth(leg: str) -> dict[str, pd.DataFrame]:
    df = pd.read_json(TRACES / f"{leg}.truth.jsonl", lines=True)
    return {t: g.reset_index(drop=True) for t, g in df.groupby("type")}


@pytest.mark.parametrize("leg", LEGS)
def test_sample_trace_matches_its_workload(leg):
    a = analyze_trace(read_trace(TRACES / f"{leg}.parquet"))
    t = truth(leg)
    it, ck = a.iterations, a.checkpoints
    assert (it["kind"] == "prefill").sum() == (t["iteration"]["kind"] == "prefill").sum()
    assert (it["kind"].to_numpy() == t["iteration"].sort_values("start_ns")["kind"].to_numpy()).all()
    prefill = it[it["kind"] == "prefill"]
    truth_fill = t["checkpoint"]["fill_ns"].sum()
    assert abs(prefill["fill_ns"].sum() - truth_fill) <= 0.05 * truth_fill + 0.5e6
    assert ck["fill_faults"].sum() == t["checkpoint"]["fill_faults"].sum()
    # Every iteration's parts fit inside its span.
    assert (it["fill_ns"] + it["copy_ns"] <= it["span_ns"]).all()
    assert (it["fault_ns"] <= it["fill_ns"] + it["copy_ns"]).all()
    assert (ck["pool_hit"].to_numpy() == t["checkpoint"]["pool_hit"].astype(bool).to_numpy()).all()


def test_sample_abA_reads_faster_fill():
    c = compare([read_trace(TRACES / f"{leg}.parquet") for leg in LEGS])
    m = c.metrics.set_index("metric")
    assert (c.baseline, c.candidate) == ("pool-off", "pool-on")
    assert m.loc["checkpoint_fill_ns", "verdict"] == "faster"
    assert m.loc["checkpoint_fill_ns", "ci_high_pct"] < 0
    assert m.loc["checkpoint_faults", "verdict"] == "faster"
