"""The committed sample traces, analyzed offline, against the workload truth recorded beside them."""
from __future__ import annotations

from pathlib import Path

import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.compare import compare
from ckptrace.core.trace import read_trace
from ckptrace.renderers.json import comparison_json
from helpers import assert_parts_fit, assert_pool_faster, load_truth, within_clock

TRACES = Path(__file__).resolve().parent.parent / "samples" / "traces"
LEGS = ["1-pool-off", "2-pool-on", "3-pool-off"]


@pytest.mark.parametrize("leg", LEGS)
def test_sample_trace_matches_its_workload(leg):
    a = analyze_trace(read_trace(TRACES / f"{leg}.parquet"))
    t = load_truth(TRACES / f"{leg}.truth.jsonl")
    it, ck = a.iterations, a.checkpoints
    assert (it["kind"] == "prefill").sum() == (t["iteration"]["kind"] == "prefill").sum()
    assert (it["kind"].to_numpy() == t["iteration"].sort_values("start_ns")["kind"].to_numpy()).all()
    prefill = it[it["kind"] == "prefill"]
    # On the thread's CPU clock: recorded while other jobs shared the cores, wall time is mostly
    # waiting, and a wait just outside a span (between the workload's clock read and the probe)
    # is in the workload's wall bracket but not in the span.
    truth_fill_cpu = t["checkpoint"].loc[~t["checkpoint"]["pool_hit"].astype(bool), "fill_cpu_ns"].sum()
    assert within_clock(ck["fill_cpu_ns"].sum(), truth_fill_cpu)
    assert prefill["fill_ns"].sum() <= t["checkpoint"]["fill_ns"].sum()  # spans inside the brackets
    assert ck["fill_faults"].sum() == t["checkpoint"]["fill_faults"].sum()
    assert_parts_fit(it, faults_measured=True)  # every faulting fill has a measured fault time
    assert (ck["pool_hit"].to_numpy() == t["checkpoint"]["pool_hit"].astype(bool).to_numpy()).all()


def test_sample_abA_reads_faster_fill():
    c = compare([read_trace(TRACES / f"{leg}.parquet") for leg in LEGS])
    m = c.metrics.set_index("metric")
    assert (c.baseline, c.candidate) == ("pool-off", "pool-on")
    assert_pool_faster(comparison_json(c))  # on page faults (exact counts)
    assert m.loc["checkpoint_fill_ns", "ci_high_pct"] < 0
    assert m.loc["checkpoint_faults", "verdict"] == "faster"
