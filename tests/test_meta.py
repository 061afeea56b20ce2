"""The metadata schema: v1 traces read, every field round-trips, bad shapes are one-line errors."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ckptrace.core.errors import TraceFormatError
from ckptrace.core.meta import (FaultTime, GpuInfo, MachineState, ObjectInfo, OpenSpans, ProbeInfo, ProcessInfo,
                                ProcessMemory, ProfileInfo, SchedCounters, TraceMeta)
from ckptrace.core.trace import read_meta, read_trace, write_trace
from helpers import assert_one_line_error, ckptrace
from test_analyzers import make_events, slots_rows

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"


def full_meta() -> TraceMeta:
    """Every field set to a value other than its default."""
    return TraceMeta(
        label="pool-off", tool_version="0.1.0", mode="launch", command=["w", "--pool", "off"], pid=7,
        exit_code=3, executable="/bin/w", objects=[ObjectInfo("/bin/w", "ab" * 20)],
        probes=[ProbeInfo("update_tgt", "f()", "/bin/w", 4096, 4096, "ab" * 20)],
        missing_optional=["update_dft"], kernel="6.18", arch="aarch64", page_size=65536, host="h", host_memory_bytes=1 << 34, clock="CLOCK_MONOTONIC",
        start_time="2026-11-29T00:00:00.000+00:00", attach_ns=10, stop_ns=30, first_event_ns=20,
        stop_reason="duration", lost_events=1, partial_spans=2, abandoned_spans=3,
        open_at_stop=OpenSpans(4, 5), attach_retries=6, fault_sample_every=8, fault_slices_timed=9,
        fault_time_definition="d", events=11, sched_counters=SchedCounters(True, "how"),
        fault_time=FaultTime("m", "d", {"fill": [[4096, 100]]}, 0.5, 1.5),
        processes=[ProcessInfo(7, "pool-off", "w", "/bin/w", "ab" * 20, "p", 25, 99,
                               ProcessMemory(1 << 28, 1 << 29, "/pod", 2, 1 << 32, "memory.max of /pod", 24))],
        complete=False, cut_short="c", map_full=12, max_threads=13, threads_seen=14, threads_pruned=15,
        threads_peak=16,
        profile=ProfileInfo("11434", "g", ["update_tgt", "fill"], ["prompt_save"], {"update_tgt": "11434"}),
        gpu=GpuInfo(["/lib/libcudart.so.12"], ["cudaMemcpyAsync"], ["exceptions:page_fault_user"], 1, 2, False),
        machine=MachineState(True, "n", 5.0, 2, 5, 0.5, 0.25, 0.75, 1.0, 0.01, 0.2, 0.1, 0.05, 2500.0, 2600.0, 3),
        extra={"from_a_newer_writer": {"x": [1]}})


def test_every_field_round_trips_through_a_file(tmp_path):
    meta = full_meta()
    unset = [f.name for f in dataclasses.fields(TraceMeta)
             if f.name not in ("format", "version", "min_reader_version")
             and getattr(meta, f.name) == getattr(TraceMeta(), f.name)]
    assert unset == ["clock"]  # the one field whose only value is its default
    write_trace(tmp_path / "t.parquet", make_events(slots_rows()), meta)
    back = read_trace(tmp_path / "t.parquet").meta
    assert back.format == "ckptrace-trace" and back.version >= 1
    assert dataclasses.replace(back, format=None, version=None, min_reader_version=None) == meta
    # Plain pandas sees the same JSON, unknown keys included.
    import pandas as pd
    attrs = pd.read_parquet(tmp_path / "t.parquet").attrs["ckptrace"]
    assert attrs == back.to_json() and attrs["from_a_newer_writer"] == {"x": [1]}


@pytest.mark.parametrize("name", ["1-pool-off", "2-pool-on", "3-pool-off"])
def test_committed_traces_read_with_every_key_typed(name):
    path = SAMPLES / f"{name}.parquet"
    raw = json.loads(pq.read_schema(path).metadata[b"ckptrace"])
    meta = read_meta(path)
    from ckptrace.core.columns import VERSION

    assert meta.version == VERSION and meta.extra == {}  # the current recorder writes only known keys
    written = meta.to_json()
    assert {k: v for k, v in written.items() if k in raw} == raw
    # Fields it did not write read as their defaults ("not recorded"); older versions: the v1 test below.
    assert all(v == getattr(TraceMeta(), k) for k, v in written.items() if k not in raw)
    assert meta.probes[0].point == "update_tgt" and all(o.build_id for o in meta.objects)
    assert meta.open_at_stop == OpenSpans(0, 0) and meta.lost_events == 0
    assert meta.sched_counters.recorded and meta.fault_time.method == "cpu-minus-resident"


def test_a_version_1_trace_reads_its_metadata_with_the_new_fields_not_recorded(tmp_path):
    def as_v1(m):
        m.update(version=1, min_reader_version=1)
        del m["sched_counters"], m["fault_time"]
    meta = read_meta(rewrite_meta(SAMPLES / "1-pool-off.parquet", tmp_path / "v1.parquet", as_v1))
    assert meta.version == 1 and meta.extra == {}
    assert meta.sched_counters is None and meta.fault_time is None


def rewrite_meta(src: Path, dst: Path, change) -> Path:
    t = pq.read_table(src)
    md = dict(t.schema.metadata)
    meta = json.loads(md[b"ckptrace"])
    change(meta)
    md[b"ckptrace"] = json.dumps(meta).encode()
    pq.write_table(t.replace_schema_metadata(md), dst)
    return dst


@pytest.mark.parametrize("change, words", [
    (lambda m: m.update(lost_events="many"), "metadata.lost_events should be an integer, not str"),
    (lambda m: m.update(lost_events=True), "metadata.lost_events should be an integer, not bool"),
    (lambda m: m.update(objects={"path": "x"}), "metadata.objects should be a list, not dict"),
    (lambda m: m["probes"][1].pop("symbol"), "metadata.probes[1] lacks symbol"),
    (lambda m: m["probes"].__setitem__(0, 5), "metadata.probes[0] should be an object, not int"),
    (lambda m: m.update(open_at_stop=2), "metadata.open_at_stop should be an object, not int"),
    (lambda m: m.update(command="w --pool"), "metadata.command should be a list, not str"),
    (lambda m: m.update(label=None), "metadata.label should be a string, not null"),
])
def test_hostile_metadata_is_one_line_naming_the_field(tmp_path, change, words):
    bad = rewrite_meta(SAMPLES / "1-pool-off.parquet", tmp_path / "bad.parquet", change)
    with pytest.raises(TraceFormatError, match=r"bad\.parquet: " + words.replace("[", r"\[").replace("]", r"\]")):
        read_trace(bad)
    r = ckptrace("analyze", bad)
    assert_one_line_error(r, words, code=1)
    assert r.stdout == ""


def test_unknown_keys_are_kept(tmp_path):
    odd = rewrite_meta(SAMPLES / "2-pool-on.parquet", tmp_path / "odd.parquet",
                       lambda m: m.update(gpu_counters={"recorded": False, "note": "n"}))
    meta = read_meta(odd)
    assert meta.extra == {"gpu_counters": {"recorded": False, "note": "n"}}
    write_trace(tmp_path / "again.parquet", read_trace(odd).events, meta)
    assert read_meta(tmp_path / "again.parquet").extra == meta.extra
