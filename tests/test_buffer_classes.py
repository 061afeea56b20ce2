"""Fresh or reused: the variants llama.cpp PR #201 discusses, recorded under the real kernel from
the sample workload (`--fill zero|none|touch|half`, the pool, growth); every checkpoint's buffer
class (core/rules.py) and copy faults held to the workload's own account, exact counts."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from helpers import ckptrace, record_with_truth

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

# variant: the workload's options (48 MiB checkpoints, 2 slots, a prefill every third iteration)
VARIANTS = {
    "zero": ["--pool", "off", "--iterations", "9"],  # llama.cpp as it is: resize() zero-fills fresh pages
    "none": ["--pool", "off", "--iterations", "9", "--fill", "none"],  # the fill dropped
    "touch": ["--pool", "off", "--iterations", "9", "--fill", "touch"],  # pre-touched pages, no fill
    "half": ["--pool", "off", "--iterations", "9", "--fill", "half"],  # half its pages touched first
    "pool": ["--pool", "on", "--iterations", "15"],  # PR #201's pool: hits after the warm-up
    "growth": ["--pool", "on", "--iterations", "12", "--grow-mib", "8"],  # the pool's buffers too small
}
# The classes each variant must show (the workload's own account says which checkpoint is which).
EXPECTED = {"zero": {"grown"}, "none": {"fresh"}, "touch": {"touched"}, "half": {"partial"},
            "pool": {"grown", "reused"}, "growth": {"grown"}}


def classes_vs_truth(r) -> pd.DataFrame:
    """Each checkpoint's class and counts beside the workload's own, matched in start order."""
    ck = analyze_trace(r.trace).checkpoints.sort_values("start_ns", ignore_index=True)
    t = r.truth["checkpoint"].sort_values("start_ns", ignore_index=True)
    assert len(ck) == len(t), f"recorded {len(ck)} checkpoints, workload made {len(t)}"
    assert (ck["tid"].to_numpy() == t["tid"].to_numpy()).all()
    return pd.DataFrame({"buffer": ck["buffer"].astype(str), "truth_buffer": t["buffer"],
                         "pool_hit": ck["pool_hit"], "copy_faults": ck["copy_faults"],
                         "truth_copy_faults": t["copy_faults"], "fill_faults": ck["fill_faults"],
                         "truth_fill_faults": t["fill_faults"], "bytes": ck["bytes"], "truth_bytes": t["bytes"],
                         "fresh_bytes": ck["fresh_bytes"]})


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, workload):
    d = tmp_path_factory.mktemp("buffers")
    out = {v: record_with_truth(d, [str(workload), *argv], "--label", v, name=v) for v, argv in VARIANTS.items()}
    # A second leg of llama.cpp as it is, after the others: A/B/A for compare.
    out["zero2"] = record_with_truth(d, [str(workload), *VARIANTS["zero"]], "--label", "zero", name="zero2")
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_checkpoint_reads_as_the_workload_made_it(recordings, variant):
    m = classes_vs_truth(recordings[variant])
    shown = m.to_string()
    assert (m["buffer"] == m["truth_buffer"]).all(), shown
    assert set(m["buffer"]) == EXPECTED[variant], shown
    # Exact counts: the recorder reads the thread's fault counter at the copy's entry and at its
    # return instruction, the workload getrusage(RUSAGE_THREAD) right around the same call. One
    # fault apart, once per process: the first probed instruction the kernel steps out of line
    # (here the copy's `ret`) faults in its `[uprobes]` page just after the probe read the counter
    # (docs/kernel-facts.md); the workload counts it, the copy did not take it.
    stray = m["truth_copy_faults"] - m["copy_faults"]
    assert stray.isin([0, 1]).all() and stray.iloc[1:].eq(0).all(), shown
    assert (m["bytes"] == m["truth_bytes"]).all(), shown
    # A pool hit is a reused, resident buffer and nothing else.
    assert (m["pool_hit"] == (m["truth_buffer"] == "reused")).all(), shown
    # Bytes copied into fresh pages: all of a fresh buffer's, a page a copy fault of a partial one,
    # none where the destination was resident (a stray fault of the tracer's first probe hit aside).
    want = {"fresh": m["truth_bytes"], "partial": (m["truth_copy_faults"] - stray) * os.sysconf("SC_PAGE_SIZE")}
    expected = sum((m["truth_buffer"] == k) * v for k, v in want.items())
    assert (m["fresh_bytes"] == expected).all(), shown
    s = recordings[variant].trace
    summary = analyze_trace(s).summary
    assert summary["pool_hits"] == int((m["truth_buffer"] == "reused").sum())
    assert summary["buffers"] == {c: int((m["truth_buffer"] == c).sum()) for c in summary["buffers"]}


def test_no_fill_faults_every_page_in_the_copy(recordings):
    m = classes_vs_truth(recordings["none"])
    # The fill is gone and nothing replaced it: the copy faults each page of the fresh buffer
    # (its first page holds malloc's header, resident already).
    assert (m["fill_faults"] == 0).all() and (m["truth_fill_faults"] == 0).all()
    assert (m["copy_faults"] >= m["bytes"] // 4096).all() and (m["fresh_bytes"] == m["bytes"]).all()
    assert not m["pool_hit"].any()


def test_analyze_names_fresh_pages_per_checkpoint_and_in_total(recordings):
    r = recordings["none"]
    p = ckptrace("analyze", r.path)
    assert p.returncode == 0, p.stderr
    n = len(r.truth["checkpoint"])
    mib = r.truth["checkpoint"]["bytes"].sum() / 2**20
    assert f"{n} checkpoints (0 pool hits," in p.stdout
    assert f"buffers: fresh {n}" in p.stdout
    assert (f"{n} of {n} checkpoints copied into pages not yet resident ({mib:.1f} MiB faulted in by the copy): on "
            "a CUDA context that copy is the slow pageable path") in " ".join(p.stdout.split())
    rows = [line.split() for line in p.stdout.splitlines() if line.split()[-1:] == ["fresh"]]
    assert len(rows) == n
    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert doc["schema_version"] == 2
    assert doc["summary"]["fresh_copy_checkpoints"] == n
    assert doc["summary"]["fresh_copy_bytes"] == int(r.truth["checkpoint"]["bytes"].sum())
    assert {c["buffer"] for c in doc["checkpoints"]} == {"fresh"}


def test_compare_says_the_fill_moved_into_the_copy(recordings):
    r = recordings
    off2 = r["zero2"]
    p = ckptrace("compare", r["zero"].path, r["none"].path, off2.path)
    assert p.returncode == 0, p.stderr
    head = " ".join(p.stdout.split("\n\n")[0].split())  # the headline, first
    assert "the fill was not pooled away but moved into the copy: fill removed, but the copy now faults in 48.0 MiB " \
           "of fresh pages per checkpoint" in head, p.stdout
    assert "not a pool hit" in head and "on a CUDA context this is the slow pageable path (llama.cpp PR #201)" in head
    assert "the copy's fault time rose by" in head
    assert "0% of its checkpoints after warm-up hit the pool (0 of" in head, head
    n = len(r["none"].truth["checkpoint"])
    assert f"leg 2 (none) {n} of {n} checkpoints, {n * 48:.1f} MiB" in " ".join(p.stdout.split())
    doc = json.loads(ckptrace("compare", "--json", r["zero"].path, r["none"].path, off2.path).stdout)
    moved = doc["headline"]["moved"]
    assert moved["fresh_bytes"] == moved["checkpoints"] * 48 * 2**20 and doc["headline"]["hit_rate"]["warm_hits"] == 0
    assert moved["candidate_copy_fault_ms"] > moved["baseline_copy_fault_ms"] == 0


def test_the_pool_still_reads_as_hits(recordings):
    p = ckptrace("compare", "--json", recordings["zero"].path, recordings["pool"].path, recordings["zero2"].path)
    assert p.returncode == 0, p.stderr
    h = json.loads(p.stdout)["headline"]
    truth = recordings["pool"].truth["checkpoint"]
    assert h["moved"] is None and h["fresh_copies"] == []
    assert h["hit_rate"]["hits"] == int((truth["buffer"] == "reused").sum()) > 0
    assert h["hit_rate"]["warm_hits"] == h["hit_rate"]["warm_checkpoints"]
