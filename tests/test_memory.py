"""Checkpoint memory (analyzers/memory.py): buffers held from their mmap to their munmap, releases,
RSS; on hand-built events whose answer is known by construction and on the sample traces against
the workload's own truth."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ckptrace.analyzers.memory import held_series, memory_summary, releases, rss_series
from ckptrace.renderers.json import memory_json
from ckptrace.core.trace import normalize_events, read_trace
from ckptrace.core.units import MIB

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"
PAGE = 4096


def ev(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in df.columns:
        if col not in ("kind", "phase"):
            df[col] = df[col].fillna(0)
    return normalize_events(df)


def mm(t, addr, size, phase="fill", pid=1, kind="mmap", tid=None):
    return dict(kind=kind, pid=pid, tid=tid or pid, start_ns=t, end_ns=t + 10, addr=addr, bytes=size, phase=phase)


def test_held_follows_mmaps_in_checkpoints_to_their_munmaps():
    A, B = 0x7f0000000000, 0x7f1000000000
    events = ev([
        mm(100, 0x1000, 8 * MIB, phase="none"),            # not a checkpoint buffer
        mm(200, A, 48 * MIB),                               # buffer 1, in a fill
        mm(300, B, 48 * MIB, phase="checkpoint"),           # buffer 2
        mm(400, 0x1000, 8 * MIB, phase="iteration", kind="munmap"),  # not a buffer: no release
        mm(500, A, 48 * MIB, phase="checkpoint", kind="munmap"),     # eviction of buffer 1
        mm(600, B + 16 * MIB, 16 * MIB, phase="none", kind="munmap"),  # trims the middle of buffer 2
        mm(700, B, 48 * MIB, phase="none", kind="munmap"),           # the rest of buffer 2
        mm(250, A, 48 * MIB, pid=2),                        # another process: its own series
    ])
    held = held_series(events)
    assert list(held.columns) == ["t_ns", "pid", "held_bytes"]
    one = held.loc[held["pid"] == 1]
    assert one["held_bytes"].tolist() == [48 * MIB, 96 * MIB, 48 * MIB, 32 * MIB, 0]
    assert one["t_ns"].tolist() == [210, 310, 500, 600, 700]  # mapped at the mmap's return, gone at munmap entry
    assert held.loc[held["pid"] == 2, "held_bytes"].tolist() == [48 * MIB]
    rel = releases(events)
    assert rel["bytes"].tolist() == [48 * MIB, 16 * MIB, 32 * MIB]
    assert rel["phase"].tolist() == ["checkpoint", "none", "none"]
    m = memory_summary(events)
    assert m["peak_held_bytes"] == 144 * MIB  # both processes' buffers at 310 ns
    assert m["peak_held_ns"] == 310 and m["end_held_bytes"] == 48 * MIB
    assert m["buffers_mapped"] == 3 and m["released_bytes"] == 96 * MIB
    assert m["peak_rss_bytes"] is None and m["rss_samples"] == 0  # not recorded, not 0
    json.dumps(memory_json(m))  # the --json form: plain values only


def test_mremap_resizes_a_buffer_and_rss_rows_are_read():
    events = ev([
        mm(100, 0x5000, 4 * MIB),
        mm(200, 0x5000, 8 * MIB, kind="mremap", phase="none"),
        mm(300, 0x9000_0000, 8 * MIB, kind="mremap", phase="none"),  # not a buffer
        dict(kind="rss", pid=1, tid=1, start_ns=150, end_ns=150, bytes=100 * MIB),
        dict(kind="rss", pid=1, tid=1, start_ns=250, end_ns=250, bytes=120 * MIB),
    ])
    assert held_series(events)["held_bytes"].tolist() == [4 * MIB, 8 * MIB]
    assert rss_series(events)["rss_bytes"].tolist() == [100 * MIB, 120 * MIB]
    assert memory_summary(events)["peak_rss_bytes"] == 120 * MIB


def test_vectorised_replay_equals_the_row_by_row_rule():
    """memory.py replays a process's rows on address segments, without a Python step per row:
    on random rows (partial munmaps, mappings placed over buffers, buffers mapped over buffers,
    mremaps) it gives HeldBuffers' answer (serve's rule) for every row: held changed, bytes
    freed, held after. An mremap that starts inside a range, never at one's start, is a no-op
    there too; one that may start at a live range goes row by row."""
    import numpy as np

    from ckptrace.analyzers.memory import KIND_NAMES, MREMAP, HeldBuffers, _replay, _replay_segments

    rng = np.random.default_rng(11)
    vectorised = with_mremap = 0
    for trial in range(300):
        n = int(rng.integers(1, 80))
        kind = rng.choice(3, size=n, p=[0.5, 0.5, 0.0] if trial % 3 == 0 else [0.45, 0.45, 0.1])
        buffer = (kind == 0) & (rng.random(n) < 0.6)
        unit = PAGE * int(rng.choice([1, 2]))
        addr = (rng.integers(0, 12, size=n) * unit).astype("uint64")
        inside = trial % 3 == 1  # every mremap starts mid-page: at no row's start or end
        addr[kind == MREMAP] += np.uint64(PAGE // 2 if inside else 0)
        nbytes = rng.integers(1, 5, size=n).astype("int64") * unit
        # every other trial with mremaps: their old range recorded (a move or a resize from there)
        recorded = (kind == MREMAP) & (trial % 2 == 0)
        old_addr = np.where(recorded, rng.integers(1, 13, size=n) * unit, 0).astype("uint64")
        old_bytes = np.where(recorded, rng.integers(1, 5, size=n) * unit, 0).astype("int64")
        ref = HeldBuffers()
        want = [(*ref.step(KIND_NAMES[k], "fill" if b else "none", a, m, oa, ob), ref.held)
                for k, b, a, m, oa, ob in zip(kind.tolist(), buffer.tolist(), addr.tolist(), nbytes.tolist(),
                                              old_addr.tolist(), old_bytes.tolist())]
        fast = _replay_segments(kind, buffer, addr, nbytes, old_addr, old_bytes)
        if inside and not recorded.any():
            assert fast is not None
        got = fast if fast is not None else _replay(kind, buffer, addr, nbytes, old_addr, old_bytes)
        vectorised += fast is not None
        with_mremap += fast is not None and bool((kind == MREMAP).any())
        assert [(bool(c), int(f), int(h)) for c, f, h in zip(*got)] == [(c, f, h) for c, f, h in want], trial
    assert vectorised > 150 and with_mremap > 30


def test_rows_of_one_segment_each_replay_as_the_row_by_row_rule(monkeypatch):
    """Where every row maps or unmaps one of a few fixed ranges, whole (pool-off: each munmap
    returns one mmap's range), the replay takes its shortcut (a row is a segment of its own) and
    still gives HeldBuffers' answer for every row; a munmap over two ranges takes the general way."""
    import numpy as np

    from ckptrace.analyzers import memory
    from ckptrace.analyzers.memory import KIND_NAMES, HeldBuffers, _segments

    shortcut, real = [], memory._one_segment_each

    def counted(*args):
        shortcut.append(1)
        return real(*args)

    monkeypatch.setattr(memory, "_one_segment_each", counted)
    rng = np.random.default_rng(5)
    for trial in range(100):
        n = int(rng.integers(2, 60))
        kind = rng.choice(2, size=n)
        buffer = (kind == 0) & (rng.random(n) < 0.7)
        addr = (rng.integers(0, 6, size=n) * 4 * PAGE).astype("uint64")
        nbytes = np.full(n, 2 * PAGE, "int64")
        if trial % 2:  # a range of its own size at each start: still one segment per row
            nbytes = (addr // np.uint64(4 * PAGE) % np.uint64(3) + np.uint64(1)).astype("int64") * PAGE
        if trial % 10 == 9:  # one munmap over two ranges: not one segment per row
            kind[0], buffer[0], addr[0], nbytes[0] = 1, False, 0, 8 * PAGE
            addr[1] = 4 * PAGE
        ref = HeldBuffers()
        want = [(*ref.step(KIND_NAMES[k], "fill" if b else "none", a, m), ref.held)
                for k, b, a, m in zip(kind.tolist(), buffer.tolist(), addr.tolist(), nbytes.tolist())]
        before = len(shortcut)
        got = _segments(buffer, addr, nbytes)
        assert (len(shortcut) > before) == (trial % 10 != 9), trial
        assert [(bool(c), int(f), int(h)) for c, f, h in zip(*got)] == want, trial


def test_rows_out_of_time_order_replay_as_in_order():
    """The replay reads rows in place when they are already in (process, time) order; rows stored
    out of that order (one process or several, interleaved) give the same series and releases."""
    A, B = 0x7f0000000000, 0x7f1000000000
    rows = [mm(100, A, 8 * MIB), mm(200, A, 8 * MIB, kind="munmap"), mm(300, B, 4 * MIB, phase="create"),
            mm(400, B, 4 * MIB, kind="munmap", phase="none"), mm(150, A, 2 * MIB, pid=2),
            mm(250, A, 2 * MIB, pid=2, kind="munmap")]
    for subset in (rows[:4], rows):
        in_order = ev(sorted(subset, key=lambda r: (r["pid"], r["start_ns"])))
        shuffled = ev(subset[::-1])
        pd.testing.assert_frame_equal(held_series(shuffled), held_series(in_order))
        pd.testing.assert_frame_equal(releases(shuffled), releases(in_order))
    assert held_series(ev(rows[::-1]))["t_ns"].tolist() == [110, 160, 200, 250, 310, 400]


def test_empty_trace_has_empty_typed_series():
    events = ev([dict(kind="checkpoint", tid=1, start_ns=1, end_ns=2, ckpt=1)])
    assert held_series(events).empty and list(held_series(events).columns) == ["t_ns", "pid", "held_bytes"]
    assert memory_summary(events)["peak_held_bytes"] == 0


def test_sample_traces_hold_what_the_workload_held():
    """The workload keeps one checkpoint per slot (`keep` 1): with the pool on or off it holds
    slots x one buffer at most, each the checkpoint's bytes plus glibc's chunk header, rounded up to
    a page. Pool-off maps and unmaps one buffer per checkpoint; pool-on maps one per slot, once,
    and returns them when it trims at exit."""
    for name in ("1-pool-off", "2-pool-on", "3-pool-off"):
        truth = [json.loads(x) for x in (SAMPLES / f"{name}.truth.jsonl").read_text().splitlines()]
        summary = truth[-1]
        misses = sum(1 for t in truth if t["type"] == "checkpoint" and not t["pool_hit"])
        trace = read_trace(SAMPLES / f"{name}.parquet")
        assert (trace.events["pid"] == summary["pid"]).all()  # a version 2 trace: its meta.pid
        m = memory_summary(trace.events)
        buffer = summary["ckpt_bytes_first"] + PAGE  # one page for the chunk header
        assert m["buffers_mapped"] == misses
        assert m["peak_held_bytes"] == summary["slots"] * summary["keep"] * buffer, name
        assert m["end_held_bytes"] == 0 and m["released_bytes"] == misses * buffer


def two_servers(a: str, b: str, label: str):
    """One leg holding two processes, `east` (sample trace a) and `west` (sample trace b), as a
    recording of two servers would: one pid per row, one `processes` entry each."""
    import dataclasses

    from ckptrace.core.meta import ProcessInfo
    from ckptrace.core.trace import Trace

    ta, tb = read_trace(SAMPLES / f"{a}.parquet"), read_trace(SAMPLES / f"{b}.parquet")
    eb = tb.events.copy()
    eb["pid"] = ta.meta.pid + 1
    for col in ("ckpt", "iter"):  # ids are unique across a recording's processes
        eb[col] = eb[col].where(eb[col] == 0, eb[col] + 1_000_000)
    events = pd.concat([ta.events, eb], ignore_index=True).sort_values("start_ns", kind="stable")
    procs = [ProcessInfo(ta.meta.pid, "east", "llama-server", ta.meta.executable),
             ProcessInfo(ta.meta.pid + 1, "west", "llama-server", tb.meta.executable)]
    meta = dataclasses.replace(ta.meta, pid=None, label=label, processes=procs)
    return Trace(events=normalize_events(events.reset_index(drop=True)), meta=meta, path=f"{label}.parquet")


def test_each_process_of_a_leg_is_analysed_compared_and_drawn_apart():
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.compare import compare_per_process
    from ckptrace.dashboards.report import build_panels
    from ckptrace.renderers.text import analysis_report

    off1, on, off2 = (two_servers("1-pool-off", "3-pool-off", "off"), two_servers("2-pool-on", "1-pool-off", "on"),
                      two_servers("3-pool-off", "1-pool-off", "off"))
    a = analyze_trace(on)
    by_label = {p["label"]: p for p in a.processes}
    alone = {n: analyze_trace(read_trace(SAMPLES / f"{n}.parquet")) for n in ("2-pool-on", "1-pool-off")}
    for label, name in (("east", "2-pool-on"), ("west", "1-pool-off")):
        assert by_label[label]["summary"]["checkpoints"] == alone[name].summary["checkpoints"]
        assert by_label[label]["summary"]["pool_hits"] == alone[name].summary["pool_hits"]
        assert by_label[label]["memory"]["peak_held_bytes"] == alone[name].memory["peak_held_bytes"]
    text = analysis_report(a)
    assert "2 processes" in text and " east " in text and " west " in text
    parts = dict(compare_per_process([off1, on, off2], n_boot=200))
    assert list(parts) == ["east", "west"]
    east = {m["metric"]: m for m in parts["east"].metrics.to_dict("records")}
    assert east["checkpoint_fill_cpu_ns"]["verdict"] == "faster"  # east's candidate had the pool
    west_hits = parts["west"].legs["pool_hits"].tolist()
    assert west_hits == [0, 0, 0]  # west was pool-off in every leg
    panels = dict(build_panels([analyze_trace(t) for t in (off1, on, off2)]))
    assert panels["processes"].figure is not None
    names = {tr.name for tr in panels["memory"].figure.data}
    assert {"1: off: east", "1: off: west", "2: on: east", "2: on: west"} <= names


MOVED_BUFFER = Path(__file__).resolve().with_name("moved_buffer.cpp")


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_buffer_moved_by_mremap_is_held_at_its_new_range_only(tmp_path):
    """A real program (built here) maps a checkpoint buffer of 8 MiB, moves it with mremap to
    another place grown to 12 MiB, then unmaps it there: held memory is 8, then 12 (the old range
    no longer counts), then 0; serve's fold of the same events says the same."""
    import subprocess

    from ckptrace.exporters.prometheus import CheckpointMetrics
    from ckptrace.live.session import LiveBatch
    from helpers import ckptrace
    from test_serve import kernel_records

    prog, truth, out = tmp_path / "moved-buffer", tmp_path / "t.json", tmp_path / "m.parquet"
    subprocess.run(["g++", "-O1", "-g", "-o", prog, MOVED_BUFFER], check=True)
    p = ckptrace("record", "--quiet", "-o", out, "--", prog, truth)
    assert p.returncode == 0, p.stderr
    t = json.loads(truth.read_text())
    tr = read_trace(out)
    ev = tr.events[tr.events["pid"] == tr.meta.pid]
    row = ev[ev["kind"] == "mremap"].iloc[0]
    assert (row["old_addr"], row["old_bytes"], row["addr"], row["bytes"]) == (t["mapped"], 8 * MIB, t["moved_to"], 12 * MIB)
    assert row["phase"] == "none" and row["start_ns"] >= t["moved_ns"]
    held = held_series(ev)
    assert held["held_bytes"].tolist() == [8 * MIB, 12 * MIB, 0]
    assert held["t_ns"].iat[1] == row["end_ns"] and held["t_ns"].iat[2] >= t["unmap_ns"]
    m = memory_summary(ev)
    assert (m["peak_held_bytes"], m["end_held_bytes"], m["released_bytes"]) == (12 * MIB, 0, 12 * MIB)
    metrics = CheckpointMetrics()
    metrics.add(1, "x", "")
    rec, fault = kernel_records(ev)
    metrics.fold(1, LiveBatch(rec, fault, sched_recorded=True))
    got = {s.name: s.value for fam in metrics.collect() for s in fam.samples if s.labels.get("pid") == "1"}
    assert got["ckptrace_checkpoint_memory_peak_bytes"] == 12 * MIB
    assert got["ckptrace_checkpoint_memory_held_bytes"] == 0
    a = ckptrace("analyze", "--json", out)
    assert a.returncode == 0 and json.loads(a.stdout)["memory"]["end_held_bytes"] == 0, a.stderr
