"""`ckptrace analyze`: report, JSON contract and CSV on hand-built traces, in-process and as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ckptrace.cli import cli
from ckptrace.errors import TraceFormatError
from ckptrace.meta import TraceMeta
from ckptrace.trace import write_trace
from test_analyzers import MIB, MS, META, decode_rows, make_events, slots_rows

CKPTRACE = Path(sys.executable).with_name("ckptrace")
CONTRACT = ["start_ns", "end_ns", "tid", "bytes", "fill_ns", "copy_ns", "fault_ns", "fill_faults",
            "copy_faults", "mmaps", "munmaps", "pool_hit"]
ITER_CONTRACT = ["start_ns", "end_ns", "kind", "fill_ns", "copy_ns", "fault_ns", "other_ns", "checkpoints",
                 "bytes", "faults"]


@pytest.fixture
def slots_path(tmp_path):
    p = tmp_path / "slots.parquet"
    write_trace(p, make_events(slots_rows()), META)
    return p


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)


def test_json_contract(slots_path):
    r = run("analyze", slots_path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc) >= {"trace", "checkpoints", "iterations", "summary"}
    assert doc["trace"]["label"] == "pool-off" and doc["trace"]["pid"] == 4242
    cks = doc["checkpoints"]
    assert len(cks) == 4
    for c in cks:
        assert set(CONTRACT) <= set(c)
        for k in CONTRACT:
            assert type(c[k]) is (bool if k == "pool_hit" else int), k
    first = cks[0]
    assert (first["start_ns"], first["end_ns"], first["fill_ns"], first["copy_ns"]) == (10 * MS, 40 * MS, 24 * MS, 4 * MS)
    assert (first["fill_faults"], first["mmaps"], first["pool_hit"]) == (8192, 1, False)
    assert [c["pool_hit"] for c in cks] == [False, True, False, True]
    its = doc["iterations"]
    assert [i["kind"] for i in its] == ["prefill", "decode", "prefill"]
    for i in its:
        assert set(ITER_CONTRACT) <= set(i)
        assert i["fill_ns"] + i["copy_ns"] <= i["end_ns"] - i["start_ns"]
    assert doc["summary"]["pool_hit_rate"] == 0.5


def test_report_fits_80_columns_and_truncates(tmp_path):
    # 30 checkpoints, one per decode-bounded iteration.
    rows = []
    for k in range(30):
        t = k * 100 * MS
        rows += [dict(kind="checkpoint", tid=7, start_ns=t + MS, end_ns=t + 20 * MS, ckpt=k + 1, bytes=33 * MIB),
                 dict(kind="fill", tid=7, start_ns=t + 2 * MS, end_ns=t + 15 * MS, ckpt=k + 1, bytes=33 * MIB),
                 dict(kind="copy", tid=7, start_ns=t + 15 * MS, end_ns=t + 19 * MS, ckpt=k + 1, bytes=33 * MIB),
                 dict(kind="decode", tid=7, start_ns=t + 30 * MS, end_ns=t + 90 * MS, tokens=64, prompt_tokens=63)]
    p = tmp_path / "many.parquet"
    write_trace(p, make_events(rows), TraceMeta(label="many"))
    r = run("analyze", p)
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert max(map(len, lines)) <= 80
    assert "... 10 more (--all shows every row)" in lines
    assert "30 checkpoints" in r.output and "30 prefill" in r.output
    none = run("analyze", p, "--rows", "0")
    assert none.exit_code == 0 and "... 30 more" in none.output
    full = run("analyze", p, "--all")
    assert "more (--all" not in full.output
    assert sum(1 for ln in full.output.splitlines() if ln.strip().endswith((" no", " yes"))) == 30


def test_report_content(slots_path):
    out = run("analyze", slots_path).output
    assert "label pool-off" in out and "pid 4242" in out and "lost events 0" in out
    assert "pool hit rate: 50% (2 of 4)" in out
    assert "reliability: ok" in out
    assert max(map(len, out.splitlines())) <= 80


def test_csv(slots_path, tmp_path):
    d = tmp_path / "out"
    r = run("analyze", slots_path, "--csv", d)
    assert r.exit_code == 0
    ck = pd.read_csv(d / "checkpoints.csv")
    it = pd.read_csv(d / "iterations.csv")
    assert ck["ckpt"].tolist() == [1, 2, 3, 4] and it["iter"].tolist() == [1, 2, 3]
    assert ck.loc[0, "fill_ns"] == 24 * MS


def test_lost_events_flagged(tmp_path):
    p = tmp_path / "lossy.parquet"
    write_trace(p, make_events(decode_rows()), TraceMeta(label="lossy", lost_events=5))
    out = run("analyze", p).output
    assert "reliability: WARNING: 5 events were lost" in out
    doc = json.loads(run("analyze", p, "--json").output)
    assert doc["summary"]["reliable"] is False and doc["summary"]["lost_events"] == 5


def test_bad_input_in_process(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(TraceFormatError, match="not a ckptrace trace"):
        run("analyze", junk)


def test_subprocess_json_and_errors(slots_path, tmp_path):
    assert CKPTRACE.exists(), f"{CKPTRACE} missing: pip install -e . into the venv"
    r = subprocess.run([CKPTRACE, "analyze", str(slots_path), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["checkpoints"]) == 4
    junk = tmp_path / "junk.parquet"
    junk.write_text("garbage\n")
    r = subprocess.run([CKPTRACE, "analyze", str(junk)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.startswith("ckptrace: error: ") and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([CKPTRACE, "analyze", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Examples:" in r.stdout


def _record(workload, tmp_path, name: str, pool: str, *extra) -> tuple[Path, list[dict]]:
    out, truth = tmp_path / f"{name}.parquet", tmp_path / f"{name}.jsonl"
    r = subprocess.run([CKPTRACE, "record", "-o", out, "--label", f"pool-{pool}", "--quiet", "--",
                        workload, "--pool", pool, "--truth", truth, *extra],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return out, [json.loads(line) for line in truth.read_text().splitlines() if line.strip()]


@pytest.mark.ebpf
def test_recorded_workload_matches_its_truth(require_root_ebpf, workload, tmp_path):
    """End to end on the real kernel: the analyzer's figures against the workload's own clock."""
    legs = {}
    for name, pool in (("off1", "off"), ("on", "on"), ("off2", "off")):
        path, truth = _record(workload, tmp_path, name, pool, "--iterations", "15")
        legs[name] = path
        doc = json.loads(subprocess.run([CKPTRACE, "analyze", path, "--json"], capture_output=True,
                                        text=True, timeout=120, check=True).stdout)
        t_ck = [t for t in truth if t["type"] == "checkpoint"]
        t_it = [t for t in truth if t["type"] == "iteration"]
        its = doc["iterations"]
        assert sum(i["kind"] == "prefill" for i in its) == sum(t["kind"] == "prefill" for t in t_it)
        assert len(doc["checkpoints"]) == len(t_ck)
        assert sum(c["pool_hit"] for c in doc["checkpoints"]) == sum(t["pool_hit"] for t in t_ck)
        truth_fill = sum(t["fill_ns"] for t in t_ck)
        ours_fill = sum(i["fill_ns"] for i in its if i["kind"] == "prefill")
        assert ours_fill == pytest.approx(truth_fill, rel=0.05, abs=1_000_000)
        assert sum(c["fill_faults"] for c in doc["checkpoints"]) == sum(t["fill_faults"] for t in t_ck)
        for i in its:
            assert i["fill_ns"] + i["copy_ns"] <= i["end_ns"] - i["start_ns"]
    r = subprocess.run([CKPTRACE, "compare", legs["off1"], legs["on"], legs["off2"], "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = {x["metric"]: x for x in json.loads(r.stdout)["metrics"]}
    assert m["checkpoint_fill_ns"]["verdict"] == "faster" and m["checkpoint_fill_ns"]["ci_high_pct"] < 0
