"""Fault time at default settings, on the real kernel, while other processes keep both cores busy:
checked against the sample workload's resident-memory reference (the same zeroing on pages
already resident, timed on its thread CPU clock, outside every probe)."""
from __future__ import annotations

import pandas as pd
import pytest

from ckptrace.probes import fault_time
from test_cpu_time import busy_cores  # noqa: F401  (fixture)
from helpers import record_with_truth

WORKLOADS = {
    "fresh": ["--iterations", "9", "--pool", "off"],
    "growing": ["--iterations", "9", "--pool", "on", "--grow-mib", "8", "--ckpt-mib", "40"],
    "three-slots-draft": ["--iterations", "6", "--slots", "3", "--ckpt-mib", "36", "--draft"],
    "large": ["--iterations", "7", "--slots", "1", "--ckpt-mib", "160"],
}


def fills_vs_reference(trace, truth) -> pd.DataFrame:
    ev = trace.events
    t = truth["checkpoint"].sort_values("start_ns").reset_index(drop=True)
    ck = ev[ev["kind"] == "checkpoint"].sort_values("start_ns").reset_index(drop=True)
    assert len(ck) == len(t)
    t["ckpt"] = ck["ckpt"]
    t["ckpt_fault_ns"] = ck["fault_ns"]
    fill = ev[ev["kind"] == "fill"].merge(t, on="ckpt", suffixes=("", "_truth"))
    return pd.DataFrame({"faults": fill["faults"], "fault_ns": fill["fault_ns"],
                         "ckpt_fault_ns": fill["ckpt_fault_ns"],
                         "reference_ns": fill["fill_cpu_ns"] - fill["resident_fill_cpu_ns"]})


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.ebpf
def test_fill_fault_time_matches_the_resident_reference(tmp_path, workload, require_root_ebpf,
                                                        busy_cores, name):  # noqa: F811
    r = record_with_truth(tmp_path, [str(workload), *WORKLOADS[name]])
    trace, truth = r.trace, r.truth
    assert trace.meta.fault_time.method == fault_time.METHOD
    m = fills_vs_reference(trace, truth)
    faulting = m[m["faults"] > 0]
    assert len(faulting) >= 3, m
    # Every fill with faults, and its checkpoint, has a measured fault time; no estimate needed.
    assert faulting["fault_ns"].notna().all() and faulting["ckpt_fault_ns"].notna().all(), m
    ratio = faulting["fault_ns"].astype("int64") / faulting["reference_ns"]
    assert 0.75 <= ratio.median() <= 1.25, m.assign(ratio=ratio).to_string()
    # The copies here land on pages the fill already made: no faults, no fault time.
    ev = trace.events
    copies = ev[ev["kind"] == "copy"]
    assert (copies["faults"] == 0).all() and (copies["fault_ns"] == 0).all()
    assert ev[ev["kind"].isin(["mmap", "munmap"])]["fault_ns"].isna().all()


def test_few_faults_in_a_long_span_are_not_measured_but_left_to_the_estimate():
    ev = pd.DataFrame({
        "kind": pd.Categorical(["fill", "fill", "copy", "checkpoint", "checkpoint"]),
        "ckpt": [1, 2, 2, 1, 2], "bytes": [1 << 20, 1 << 20, 1 << 20, 0, 0],
        "faults": [256, 3, 0, 256, 3], "cpu_ns": pd.array([600_000, 60_000, 50_000, 700_000, 120_000], "Int64"),
    })
    cal = {"fill": [[1 << 20, 50_000]], "copy": [[1 << 20, 45_000]]}
    got = fault_time.span_fault_ns(ev, cal)
    assert got[0] == 550_000 and got[3] == 550_000  # fault-bound: cpu - resident, and its checkpoint
    assert pd.isna(got[1]) and pd.isna(got[4])  # 3 faults in 60 us: mostly calibration, not measured
    assert got[2] == 0  # no fault, no fault time
    # Sizes between calibrated ones interpolate; past the largest, time grows with size.
    two = [[1 << 20, 100], [4 << 20, 400]]
    assert list(fault_time.resident_ns(two, pd.Series([2 << 20, 8 << 20]).to_numpy())) == [200, 800]
