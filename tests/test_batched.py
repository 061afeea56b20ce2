"""The batched analysis (analyze_file: the trace read a batch at a time, only the rows and columns
the analysis reads) against the whole-frame one (analyze_trace(read_trace)): every number equal,
on the sample traces and on a synthetic trace of many row groups; the batch reader's checks."""
from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from ckptrace.core import trace as tracemod
from ckptrace.analyzers import analyze_file, analyze_trace
from ckptrace.dashboards.synthetic import synthetic_trace
from ckptrace.core.errors import TraceFormatError
from ckptrace.renderers.json import analysis_json, dumps
from ckptrace.core.trace import iter_batches, read_between, read_trace, write_trace
from tests.helpers import ckptrace

SAMPLES = sorted((tracemod.Path(__file__).parent.parent / "samples" / "traces").glob("*.parquet"))


def mixed_events() -> pd.DataFrame:
    """Two processes of a thread each: one with update_slots rows, one with llama_decode
    boundaries only (its iterations come from decode rows); munmaps; on-CPU time and fault time
    missing on some rows (not recorded, estimated)."""
    a = synthetic_trace("a", checkpoints=300, seed=1).events.assign(pid=np.int32(1000))
    b = synthetic_trace("b", checkpoints=300, seed=2, tid=777).events.assign(pid=np.int32(2000))
    b = b.loc[b["kind"] != "iteration"].copy()
    b["ckpt"] = np.where(b["ckpt"] > 0, b["ckpt"] + 100_000, 0)
    b[["start_ns", "end_ns"]] += 3_000_333
    mm = pd.concat([a, b]).query("kind == 'mmap'").copy()
    mm["kind"] = "munmap"
    mm[["start_ns", "end_ns"]] += 1_000
    ev = pd.concat([a, b, mm], ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)
    rng = np.random.default_rng(7)
    ev.loc[rng.random(len(ev)) < 0.05, "cpu_ns"] = pd.NA
    ev.loc[rng.random(len(ev)) < 0.2, "fault_ns"] = pd.NA
    return ev


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tracemod.Path:
    path = tmp_path_factory.mktemp("batched") / "mixed.parquet"
    meta = synthetic_trace("mixed", checkpoints=1).meta
    meta.attach_ns = meta.first_event_ns = None  # the time origin then comes from the rows
    meta.pid = 1000  # the first process; the second has rows only
    old = tracemod.ROW_GROUP_ROWS
    tracemod.ROW_GROUP_ROWS = 500
    try:
        write_trace(path, mixed_events(), meta)
    finally:
        tracemod.ROW_GROUP_ROWS = old
    assert pq.ParquetFile(path).metadata.num_row_groups > 5
    return path


def whole_json(path) -> str:
    return dumps(analysis_json(analyze_trace(read_trace(path))))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_samples_batched_equal_whole(path):
    want = whole_json(path)
    for rows in (97, 1 << 18):
        assert dumps(analysis_json(analyze_file(path, batch_rows=rows))) == want


def test_many_row_groups_batched_equal_whole(mixed):
    want = whole_json(mixed)
    doc = analysis_json(analyze_file(mixed, batch_rows=333))
    assert dumps(doc) == want
    # Both boundary kinds, measured and estimated fault time, and NA clocks are exercised.
    assert {r["boundary"] for r in doc["iterations"]} == {"update_slots", "decode"}
    assert {"measured", "estimated"} <= {r["fault_source"] for r in doc["checkpoints"]}
    assert any(r["cpu_ns"] is None for r in doc["checkpoints"])
    assert sum(r["munmaps"] for r in doc["iterations"]) > 0
    assert [p["pid"] for p in doc["processes"]] == [1000, 2000]
    assert doc["memory"]["released_bytes"] > 0


def test_cli_analyze_json_batched_equal_whole(mixed):
    p = ckptrace("analyze", "--json", mixed)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == whole_json(mixed)
    text = ckptrace("analyze", mixed)
    assert text.returncode == 0 and "duration" in text.stdout


def test_iter_batches_are_read_trace(mixed):
    whole = read_trace(mixed).events
    batches = list(iter_batches(mixed, batch_rows=700))
    assert len(batches) > 1 and max(map(len, batches)) <= 700
    pd.testing.assert_frame_equal(pd.concat(batches, ignore_index=True), whole)
    some = pd.concat(iter_batches(mixed, ["kind", "start_ns", "cpu_ns"]), ignore_index=True)
    pd.testing.assert_frame_equal(some, whole[["kind", "start_ns", "cpu_ns"]])
    t0, t1 = int(whole["start_ns"].iloc[900]), int(whole["end_ns"].iloc[1000])
    inside = whole.loc[(whole["start_ns"] >= t0) & (whole["end_ns"] <= t1)].reset_index(drop=True)
    pd.testing.assert_frame_equal(read_between(mixed, t0, t1), inside)


def _damaged(tmp_path, name, change) -> tracemod.Path:
    ev = mixed_events()
    change(ev)
    path = tmp_path / f"{name}.parquet"
    old = tracemod.ROW_GROUP_ROWS
    tracemod.ROW_GROUP_ROWS = 500
    try:
        write_trace(path, ev, synthetic_trace("x", checkpoints=1).meta)
    finally:
        tracemod.ROW_GROUP_ROWS = old
    return path


def _last(ev, kind) -> int:
    """The index of the last row of `kind`: far from the first batch."""
    return int(ev.index[(ev["kind"] == kind).to_numpy()][-1])


def _reversed(ev):
    ev.loc[len(ev) - 10, "end_ns"] = 5


def _duplicate_iteration(ev):
    ev.loc[_last(ev, "iteration"), "iter"] = int(ev.loc[ev["kind"] == "iteration", "iter"].iloc[0])


def _duplicate_checkpoint(ev):
    ev.loc[_last(ev, "checkpoint"), "ckpt"] = int(ev.loc[ev["kind"] == "checkpoint", "ckpt"].iloc[0])


def _fill_outside(ev):
    ev.loc[_last(ev, "fill"), "end_ns"] += 10**12


@pytest.mark.parametrize("change", [_reversed, _duplicate_iteration, _duplicate_checkpoint, _fill_outside])
def test_damage_in_a_late_batch_reads_as_read_trace_says(tmp_path, change):
    path = _damaged(tmp_path, change.__name__, change)
    with pytest.raises(TraceFormatError) as whole:
        read_trace(path)
    with pytest.raises(TraceFormatError) as batched:
        analyze_file(path, batch_rows=256)
    assert str(batched.value) == str(whole.value)
    with pytest.raises(TraceFormatError) as plain:
        list(iter_batches(path, batch_rows=256))
    assert str(plain.value) == str(whole.value)


def test_per_process_comparison_of_files_equals_the_whole_frames(tmp_path):
    """compare --per-process reads each leg batch by batch and analyses its processes' rows in
    turn: the same comparisons as of the whole frames split by process."""
    from ckptrace.analyzers.compare import compare_per_process
    from ckptrace.renderers.json import comparison_json
    from tests.test_memory import two_servers

    legs = [two_servers(a, b, label) for a, b, label in (("1-pool-off", "3-pool-off", "off"),
                                                          ("2-pool-on", "1-pool-off", "on"),
                                                          ("3-pool-off", "1-pool-off", "off"))]
    paths = []
    for i, leg in enumerate(legs):
        paths.append(tmp_path / f"{i}.parquet")
        write_trace(paths[-1], leg.events, leg.meta)
    whole = compare_per_process([read_trace(p) for p in paths], n_boot=200)
    batched = compare_per_process(paths, n_boot=200)
    assert [label for label, _ in batched] == ["east", "west"]
    assert [(label, dumps(comparison_json(c))) for label, c in batched] == \
        [(label, dumps(comparison_json(c))) for label, c in whole]


def test_json_written_in_chunks_is_the_same_text(mixed, monkeypatch):
    """analyze --json writes each table a chunk of rows at a time (write_json): the same text as
    the document built whole, here with chunks of 7 rows (tables of hundreds)."""
    from ckptrace.renderers import json as json_renderer

    a = analyze_file(mixed)
    want = dumps(analysis_json(a))
    monkeypatch.setattr(json_renderer, "CHUNK_ROWS", 7)
    parts: list[str] = []
    json_renderer.write_json(json_renderer.analysis_doc(a), parts.append)
    assert len(parts) > 100 and "".join(parts) == want
    out = ckptrace("analyze", str(mixed), "--json")
    assert out.stdout == want + "\n"


def test_fill_outside_its_checkpoint_found_where_ids_rise(tmp_path):
    """One process: checkpoint ids rise through the trace, so check_ids finds each fill's checkpoint
    by binary search; the error is read_trace's."""
    ev = synthetic_trace("a", checkpoints=300, seed=1).events
    ids = ev.loc[ev["kind"] == "checkpoint", "ckpt"].to_numpy()
    assert (np.diff(ids) > 0).all()
    path = tmp_path / "outside.parquet"
    _fill_outside(ev)
    write_trace(path, ev, synthetic_trace("x", checkpoints=1).meta)
    with pytest.raises(TraceFormatError) as whole:
        read_trace(path)
    with pytest.raises(TraceFormatError) as batched:
        analyze_file(path, batch_rows=256)
    assert "lies outside its checkpoint (1 such rows)" in str(whole.value)
    assert str(batched.value) == str(whole.value)


def test_read_ahead_keeps_order_raises_in_place_and_stops_its_thread():
    def items(fail_at=None):
        for i in range(5):
            if i == fail_at:
                raise OSError("damaged page")
            yield i

    assert list(tracemod.read_ahead(items())) == list(range(5))
    got = []
    with pytest.raises(OSError, match="damaged page"):
        for i in tracemod.read_ahead(items(fail_at=3)):
            got.append(i)
    assert got == [0, 1, 2]
    reader = tracemod.read_ahead(items())
    assert next(reader) == 0
    reader.close()  # a caller stopping early: the thread ends with it
    assert not [t for t in threading.enumerate() if t.name.startswith("ckptrace-read")]


def test_traces_are_written_delta_encoded(tmp_path):
    """Integer columns delta-encoded (a smaller file, cheaper to decode), ids and names as dictionaries."""
    path = tmp_path / "enc.parquet"
    write_trace(path, synthetic_trace("a", checkpoints=50, seed=1).events, synthetic_trace("x", checkpoints=1).meta)
    group = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    for name in ("start_ns", "end_ns", "ckpt", "iter", "bytes", "faults", "cpu_ns"):
        assert "DELTA_BINARY_PACKED" in encodings[name], (name, encodings[name])
    for name in ("kind", "phase", "tid", "pid"):
        assert "RLE_DICTIONARY" in encodings[name], (name, encodings[name])
