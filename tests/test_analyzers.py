"""Checkpoint, iteration and summary tables on hand-built traces whose answers are known by construction."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers import (CHECKPOINT_COLUMNS, ITERATION_COLUMNS, KindRows, analyze_trace, checkpoint_table,
                                iteration_spans, iteration_table, summarize)
from ckptrace.core.errors import AnalysisError
from ckptrace.core.meta import OpenSpans, TraceMeta
from ckptrace.core.trace import Trace, normalize_events, read_trace, write_trace
from ckptrace.core.units import MIB
from helpers import assert_parts_fit

MS = 1_000_000
V2 = ("cpu_ns", "wait_ns", "nvcsw", "nivcsw", "fault_ns")  # trace format 2, nullable


def make_events(rows: list[dict]) -> pd.DataFrame:
    """Rows with only the fields that matter; the rest take their 'none' value (0, False, 'none')."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        if col in ("kind", "phase"):
            continue
        if col not in V2:  # trace format 2's columns stay NA where a row leaves them out: not recorded
            df[col] = df[col].fillna(False if col == "draft" else 0)
    ev = normalize_events(df)
    for col in V2:  # kept even by a trace.py that predates them
        if col in df.columns:
            ev[col] = df[col].astype("Int64").to_numpy()
    return ev


def slots_rows() -> list[dict]:
    """update_slots probed, trace format 2 (cpu_ns, wait_ns, fault_ns). tid 100: it 1 prefill with
    ckpt 1 (fill+copy, one mmap, fill fault time measured, copy without faults) and ckpt 2 (pool
    hit, copy faults not measured: estimated); it 2 decode; it 3 prefill with ckpt 3 (fill fault
    time not measured: estimated; copy measured; 2 mmaps, 1 munmap); a munmap in it 1 outside any
    checkpoint. tid 200: ckpt 4 with no boundary at all (unassigned), clocks not recorded."""
    return [
        dict(kind="iteration", tid=100, start_ns=0, end_ns=100 * MS, iter=1, tokens=512, prompt_tokens=511,
             cpu_ns=60 * MS, wait_ns=30 * MS),
        dict(kind="checkpoint", tid=100, start_ns=10 * MS, end_ns=40 * MS, ckpt=1, iter=1, bytes=32 * MIB,
             faults=8300, cpu_ns=20 * MS, wait_ns=8 * MS),
        dict(kind="fill", tid=100, start_ns=11 * MS, end_ns=35 * MS, ckpt=1, iter=1, bytes=32 * MIB,
             faults=8192, cpu_ns=17 * MS, wait_ns=6 * MS, fault_ns=8192 * 1600),
        dict(kind="copy", tid=100, start_ns=35 * MS, end_ns=39 * MS, ckpt=1, iter=1, bytes=32 * MIB,
             cpu_ns=3 * MS, wait_ns=MS, fault_ns=0),
        dict(kind="mmap", tid=100, start_ns=10 * MS + 500, end_ns=10 * MS + 900, ckpt=1, iter=1, bytes=32 * MIB),
        dict(kind="munmap", tid=100, start_ns=45 * MS, end_ns=45 * MS + 100, iter=1, bytes=32 * MIB),
        dict(kind="checkpoint", tid=100, start_ns=50 * MS, end_ns=56 * MS, ckpt=2, iter=1, bytes=32 * MIB,
             faults=10, cpu_ns=5 * MS, wait_ns=MS),
        dict(kind="copy", tid=100, start_ns=50 * MS + 500_000, end_ns=55 * MS + 500_000, ckpt=2, iter=1,
             bytes=32 * MIB, faults=10, cpu_ns=4 * MS, wait_ns=MS),
        dict(kind="decode", tid=100, start_ns=60 * MS, end_ns=99 * MS, iter=1, tokens=512, prompt_tokens=511),
        dict(kind="iteration", tid=100, start_ns=100 * MS, end_ns=110 * MS, iter=2, tokens=3, cpu_ns=9 * MS,
             wait_ns=0),
        dict(kind="decode", tid=100, start_ns=101 * MS, end_ns=109 * MS, iter=2, tokens=3),
        dict(kind="iteration", tid=100, start_ns=110 * MS, end_ns=200 * MS, iter=3, tokens=100, prompt_tokens=100,
             cpu_ns=80 * MS, wait_ns=5 * MS),
        dict(kind="checkpoint", tid=100, start_ns=120 * MS, end_ns=150 * MS, ckpt=3, iter=3, bytes=40 * MIB,
             faults=10300, cpu_ns=28 * MS, wait_ns=MS),
        dict(kind="fill", tid=100, start_ns=121 * MS, end_ns=141 * MS, ckpt=3, iter=3, bytes=40 * MIB,
             faults=8192, cpu_ns=19 * MS, wait_ns=MS),
        dict(kind="copy", tid=100, start_ns=141 * MS, end_ns=149 * MS, ckpt=3, iter=3, bytes=40 * MIB,
             faults=2048, cpu_ns=8 * MS, wait_ns=0, fault_ns=2048 * 1000),
        dict(kind="mmap", tid=100, start_ns=120 * MS + 100, end_ns=120 * MS + 200, ckpt=3, iter=3, bytes=40 * MIB),
        dict(kind="mmap", tid=100, start_ns=148 * MS, end_ns=148 * MS + 100, ckpt=3, iter=3, bytes=4096),
        dict(kind="munmap", tid=100, start_ns=149 * MS, end_ns=149 * MS + 100, ckpt=3, iter=3, bytes=4096),
        dict(kind="decode", tid=100, start_ns=160 * MS, end_ns=199 * MS, iter=3, tokens=100, prompt_tokens=100),
        dict(kind="checkpoint", tid=200, start_ns=300 * MS, end_ns=310 * MS, ckpt=4, bytes=32 * MIB, draft=True),
        dict(kind="copy", tid=200, start_ns=301 * MS, end_ns=309 * MS, ckpt=4, bytes=32 * MIB),
    ]


def decode_rows() -> list[dict]:
    """No update_slots probe (iter 0 everywhere). tid 300 decodes at [5,10], [20,22], [40,60] ms:
    iterations (2,10], (10,22], (22,60] starting at the thread's first event (a checkpoint at 2 ms).
    Checkpoint 1 in the first, an mmap in the second, checkpoint 2 in the third, checkpoint 3
    after the last decode (unassigned). Fill of ckpt 2 has no fault time: it takes the median ns per
    fault of the measured fills (ckpt 1's: 1000). No clocks: cpu_ns and wait_ns not recorded."""
    return [
        dict(kind="checkpoint", tid=300, start_ns=2 * MS, end_ns=4 * MS, ckpt=1, bytes=8 * MIB, faults=100),
        dict(kind="fill", tid=300, start_ns=2 * MS + 100, end_ns=3 * MS, ckpt=1, bytes=8 * MIB, faults=100,
             fault_ns=100_000),
        dict(kind="copy", tid=300, start_ns=3 * MS, end_ns=3 * MS + 500_000, ckpt=1, bytes=8 * MIB),
        dict(kind="decode", tid=300, start_ns=5 * MS, end_ns=10 * MS, tokens=64, prompt_tokens=63),
        dict(kind="mmap", tid=300, start_ns=12 * MS, end_ns=12 * MS + 100, bytes=4096),
        dict(kind="decode", tid=300, start_ns=20 * MS, end_ns=22 * MS, tokens=1),
        dict(kind="checkpoint", tid=300, start_ns=25 * MS, end_ns=35 * MS, ckpt=2, bytes=8 * MIB, faults=300),
        dict(kind="fill", tid=300, start_ns=26 * MS, end_ns=30 * MS, ckpt=2, bytes=8 * MIB, faults=300),
        dict(kind="copy", tid=300, start_ns=30 * MS, end_ns=34 * MS, ckpt=2, bytes=8 * MIB),
        dict(kind="decode", tid=300, start_ns=40 * MS, end_ns=60 * MS, tokens=1),
        dict(kind="checkpoint", tid=300, start_ns=70 * MS, end_ns=71 * MS, ckpt=3, bytes=8 * MIB),
        dict(kind="copy", tid=300, start_ns=70 * MS + 100_000, end_ns=70 * MS + 900_000, ckpt=3, bytes=8 * MIB),
    ]


META = TraceMeta(label="pool-off", pid=4242, fault_sample_every=1)


@pytest.fixture
def slots_trace():
    return Trace(events=make_events(slots_rows()), meta=META, path="slots.parquet")


def ck_table(ev: pd.DataFrame) -> pd.DataFrame:
    return checkpoint_table(ev, iteration_spans(ev))


def it_table(ev: pd.DataFrame, ck: pd.DataFrame) -> pd.DataFrame:
    return iteration_table(ev, iteration_spans(ev), ck)


def unassigned(ck: pd.DataFrame) -> pd.DataFrame:
    return ck.loc[ck["iter"] == 0]


def by_ckpt(t: pd.DataFrame) -> pd.DataFrame:
    return t.set_index("ckpt")


def test_checkpoint_table_known_answer(slots_trace):
    ck = ck_table(slots_trace.events)
    assert list(ck.columns) == list(CHECKPOINT_COLUMNS)
    assert dict(ck.dtypes) == CHECKPOINT_COLUMNS
    assert ck["ckpt"].tolist() == [1, 2, 3, 4]  # sorted by start
    c = by_ckpt(ck)
    assert c.loc[1, ["fill_ns", "copy_ns", "total_ns", "other_ns"]].tolist() == [24 * MS, 4 * MS, 30 * MS, 2 * MS]
    assert c.loc[1, "fill_fault_ns"] == 8192 * 1600  # measured
    assert c.loc[1, ["cpu_ns", "wait_ns", "fill_cpu_ns", "fill_wait_ns", "copy_cpu_ns", "copy_wait_ns"]].tolist() == \
        [20 * MS, 8 * MS, 17 * MS, 6 * MS, 3 * MS, MS]
    assert c.loc[:, "fault_source"].tolist() == ["measured", "estimated", "estimated", "none"]
    assert c.loc[1, ["mmaps", "munmaps"]].tolist() == [1, 0]  # the munmap outside the checkpoint is not its
    assert c.loc[1, ["fill_faults", "copy_faults", "faults"]].tolist() == [8192, 0, 8300]
    # ckpt 2: pool hit (no fill: 0 on and off CPU, recorded); its copy's fault time was not
    # measured, so it takes the copies' median ns per fault (ckpt 3's copy: 1000).
    assert bool(c.loc[2, "pool_hit"]) and c.loc[2, "fill_ns"] == 0
    assert c.loc[2, ["fill_cpu_ns", "fill_wait_ns", "fill_fault_ns"]].tolist() == [0, 0, 0]
    assert c.loc[2, "copy_fault_ns"] == 10 * 1000
    # ckpt 3: fill estimated from the fills' median (ckpt 1's 1600 ns per fault), copy measured.
    assert c.loc[3, "fill_fault_ns"] == 8192 * 1600
    assert c.loc[3, "copy_fault_ns"] == 2048 * 1000
    assert c.loc[3, "fault_ns"] == 8192 * 1600 + 2048 * 1000
    # ckpt 4: a copy without faults costs no fault time; its clocks were not recorded: NA, not 0.
    assert c.loc[4, "fault_ns"] == 0
    assert c.loc[[4], ["cpu_ns", "wait_ns", "copy_cpu_ns", "fill_cpu_ns"]].isna().all(axis=None)
    assert c.loc[3, ["mmaps", "munmaps"]].tolist() == [2, 1]
    assert not c.loc[[1, 3], "pool_hit"].any()
    assert c.loc[:, "iter"].tolist() == [1, 1, 3, 0]
    assert bool(c.loc[4, "draft"]) and c.loc[4, "tid"] == 200
    assert unassigned(ck)["ckpt"].tolist() == [4]


def test_iteration_table_known_answer(slots_trace):
    ck = ck_table(slots_trace.events)
    it = it_table(slots_trace.events, ck)
    assert list(it.columns) == list(ITERATION_COLUMNS) and dict(it.dtypes) == ITERATION_COLUMNS
    assert it["iter"].tolist() == [1, 2, 3]  # decode rows of tid 100 made no iterations of their own
    assert it["kind"].tolist() == ["prefill", "decode", "prefill"]
    assert it["boundary"].astype(str).tolist() == ["update_slots"] * 3
    i = it.set_index("iter")
    assert i.loc[1, ["fill_ns", "copy_ns", "checkpoints", "bytes"]].tolist() == [24 * MS, 9 * MS, 2, 64 * MIB]
    assert i.loc[1, "other_ns"] == 100 * MS - 24 * MS - 9 * MS
    assert i.loc[1, ["mmaps", "munmaps"]].tolist() == [1, 1]  # the munmap outside a checkpoint counts here
    assert i.loc[3, ["mmaps", "munmaps", "faults"]].tolist() == [2, 1, 10300]
    assert i.loc[1, "fault_ns"] == 8192 * 1600 + 10 * 1000
    assert i.loc[1, ["cpu_ns", "wait_ns", "fill_cpu_ns", "copy_cpu_ns", "fill_wait_ns", "copy_wait_ns"]].tolist() == \
        [60 * MS, 30 * MS, 17 * MS, 3 * MS + 4 * MS, 6 * MS, 2 * MS]
    assert i.loc[2, ["checkpoints", "fill_ns", "prompt_tokens", "fault_ns", "fill_cpu_ns"]].tolist() == [0, 0, 0, 0, 0]
    assert_parts_fit(it)


def test_decode_boundaries_without_update_slots():
    ev = make_events(decode_rows())
    ck = ck_table(ev)
    it = it_table(ev, ck)
    assert it["boundary"].astype(str).tolist() == ["decode"] * 3
    assert it["start_ns"].tolist() == [2 * MS, 10 * MS, 22 * MS]
    assert it["end_ns"].tolist() == [10 * MS, 22 * MS, 60 * MS]
    assert it["iter"].tolist() == [1, 2, 3]  # no kernel ids in the trace: fresh ids from 1
    assert it["kind"].tolist() == ["prefill", "decode", "prefill"]  # it 3: prefill by its checkpoint alone
    assert it["checkpoints"].tolist() == [1, 0, 1]
    assert it["mmaps"].tolist() == [0, 1, 0]
    assert by_ckpt(ck)["iter"].tolist() == [1, 3, 0]
    assert unassigned(ck)["ckpt"].tolist() == [3]
    # ckpt 2's fill fault time was not measured: the fills' median (100_000 ns / 100 faults) applies.
    assert by_ckpt(ck).loc[2, "fill_fault_ns"] == 300 * 1000
    assert by_ckpt(ck)["fault_source"].tolist() == ["measured", "estimated", "none"]
    # No clocks in this trace: NA everywhere, never 0 (decode boundaries never carry them).
    assert ck["cpu_ns"].isna().all() and ck["fill_wait_ns"].isna().all() and it["cpu_ns"].isna().all()
    assert_parts_fit(it)
    assert (it["other_ns"] >= 0).all()


def fills(rates: list, faults: int = 1000) -> list[dict]:
    """One checkpoint per rate: a 10 ms fill with `faults` faults costing `rate` ns each (None: not
    measured), then a copy without faults."""
    rows = []
    for k, rate in enumerate(rates):
        t = 20 * MS * k
        rows += [dict(kind="checkpoint", tid=1, start_ns=t, end_ns=t + 15 * MS, ckpt=k + 1, faults=faults),
                 dict(kind="fill", tid=1, start_ns=t + MS, end_ns=t + 11 * MS, ckpt=k + 1, faults=faults,
                      fault_ns=None if rate is None else rate * faults),
                 dict(kind="copy", tid=1, start_ns=t + 11 * MS, end_ns=t + 14 * MS, ckpt=k + 1, fault_ns=0)]
    return rows


def test_fault_estimate_is_the_median_of_measured_spans_of_its_kind():
    # A slow warm-up fill (20 us per fault) must not set the estimate: the median (1500) does,
    # where a mean would give 5200.
    ck = ck_table(make_events(fills([20_000, 1_400, 1_500, 1_600, 1_500, None])))
    assert ck["fault_source"].tolist() == ["measured"] * 5 + ["estimated"]
    assert ck["fill_fault_ns"].tolist()[-1] == 1000 * 1500
    # Copies are a kind of their own: none was measured with faults, so a copy with faults is
    # not recorded rather than estimated from fills.
    rows = fills([1_500, None])
    rows[-1].update(faults=5, fault_ns=None)
    ck = ck_table(make_events(rows))
    assert ck["fault_source"].tolist() == ["measured", "not recorded"]
    assert ck.loc[1, "fill_fault_ns"] == 1000 * 1500 and pd.isna(ck.loc[1, "copy_fault_ns"])
    assert pd.isna(ck.loc[1, "fault_ns"])


def test_fault_estimate_is_never_clamped():
    # 1000 faults at the measured 20 us each: 20 ms of faults in a 10 ms fill. Shown as such, and said.
    ck = ck_table(make_events(fills([20_000, None])))
    assert ck.loc[1, "fill_fault_ns"] == 20 * MS > ck.loc[1, "fill_ns"]
    s = summarize(ck, it_table(make_events(fills([20_000, None])), ck), TraceMeta())
    assert any("exceed" in n and "not clamped" in n for n in s["notes"])


def test_an_update_that_copied_nothing_is_not_a_checkpoint():
    # llama-server calls update_dft after update_tgt; without a draft model it returns at once.
    rows = [dict(kind="checkpoint", tid=1, start_ns=0, end_ns=10 * MS, ckpt=1, bytes=MIB),
            dict(kind="fill", tid=1, start_ns=MS, end_ns=5 * MS, ckpt=1, bytes=MIB),
            dict(kind="copy", tid=1, start_ns=5 * MS, end_ns=9 * MS, ckpt=1, bytes=MIB),
            dict(kind="checkpoint", tid=1, start_ns=10 * MS + 10, end_ns=10 * MS + 900, ckpt=2, draft=True)]
    ck = ck_table(make_events(rows))
    assert ck["ckpt"].tolist() == [1] and not ck["pool_hit"].any()


@pytest.mark.parametrize("empty", [(1,), (4,), (2,), (1, 3), (1, 2, 4)])
def test_updates_that_copied_nothing_leave_the_others_their_parts(empty):
    # Left out first, last, in the middle, or several: each kept checkpoint keeps its own fill,
    # copy and syscalls (the table finds them by position among the checkpoints kept).
    rows = []
    for c in range(1, 5):
        t = c * 100 * MS
        rows.append(dict(kind="checkpoint", tid=1, start_ns=t, end_ns=t + 50 * MS, ckpt=c, bytes=MIB))
        if c not in empty:
            rows += [dict(kind="fill", tid=1, start_ns=t + MS, end_ns=t + (1 + c) * MS, ckpt=c, bytes=MIB),
                     dict(kind="copy", tid=1, start_ns=t + 20 * MS, end_ns=t + (20 + 2 * c) * MS, ckpt=c, bytes=MIB)]
        rows += [dict(kind="mmap", tid=1, start_ns=t + MS + k, end_ns=t + MS + k + 1, ckpt=c) for k in range(c)]
    ck = ck_table(make_events(rows))
    kept = [c for c in range(1, 5) if c not in empty]
    assert ck["ckpt"].tolist() == kept
    assert ck["fill_ns"].tolist() == [c * MS for c in kept] and ck["copy_ns"].tolist() == [2 * c * MS for c in kept]
    assert ck["mmaps"].tolist() == kept


def test_nothing_measured_reports_fault_time_not_recorded():
    rows = [r for r in decode_rows()]
    for r in rows:
        r.pop("fault_ns", None)
    ev = make_events(rows)
    ck = ck_table(ev)
    assert by_ckpt(ck)["fault_source"].tolist() == ["not recorded", "not recorded", "none"]
    assert ck["fault_ns"].isna().tolist() == [True, True, False] and (ck["fill_ns"] > 0).any()
    it = it_table(ev, ck)
    s = summarize(ck, it, TraceMeta())
    assert s["fault_sources"] == {"none": 1, "measured": 0, "estimated": 0, "not recorded": 2}
    assert s["stats"]["checkpoint_fault_ns"] == {"count": 1, "not_recorded": 2, "mean": None, "median": None,
                                                 "p90": None, "p99": None}
    assert any("not recorded" in n for n in s["notes"])
    assert any("on-CPU time and run-queue wait not recorded" in n for n in s["notes"])


def test_summary_figures(slots_trace):
    a = analyze_trace(slots_trace)
    s = a.summary
    assert s["checkpoints"] == 4 and s["pool_hits"] == 2  # ckpt 2 and 4 have no fill
    assert s["pool_hit_rate"] == 0.5
    assert s["prefill_iterations"] == 2 and s["decode_iterations"] == 1
    fills = [24 * MS, 0, 20 * MS, 0]
    assert s["stats"]["checkpoint_fill_ns"]["median"] == np.median(fills)
    assert s["stats"]["checkpoint_fill_ns"]["mean"] == np.mean(fills)
    assert s["stats"]["checkpoint_total_ns"]["count"] == 4
    assert s["stats"]["prefill_iteration_ns"]["median"] == np.median([100 * MS, 90 * MS])
    # checkpoints 1-3 lie in prefill iterations: (30 + 6 + 30) ms of (100 + 90) ms.
    assert s["checkpoint_share_of_prefill"] == pytest.approx(66 / 190)
    assert s["faults_per_mib"] == pytest.approx((8300 + 10 + 10300) / (32 + 32 + 40 + 32))
    assert s["ns_per_mib"] == pytest.approx((30 + 6 + 30 + 10) * MS / (32 + 32 + 40 + 32))
    assert s["unassigned_checkpoints"] == 1
    assert s["reliable"] is True and s["fault_sources"] == {"none": 1, "measured": 1, "estimated": 2,
                                                            "not recorded": 0}
    # Clocks: ckpt 4 was not recorded, so checkpoint on-CPU figures have counts only.
    assert s["stats"]["checkpoint_total_cpu_ns"]["not_recorded"] == 1
    assert s["stats"]["checkpoint_total_cpu_ns"]["median"] is None
    assert s["stats"]["prefill_iteration_cpu_ns"]["median"] == np.median([60 * MS, 80 * MS])
    assert s["wait_share"] == pytest.approx((8 + 1 + 1) / (30 + 6 + 30))  # over recorded checkpoints
    assert s["prefill_wait_share"] == pytest.approx((30 + 5) / (100 + 90))
    # Both shares are above 10%: the summary says to read the on-CPU figures.
    assert any(n.startswith("checkpoints spent 15%") and "*_cpu_ns" in n for n in s["notes"])
    assert any(n.startswith("prefill iterations spent 18%") for n in s["notes"])


@pytest.mark.parametrize("meta, words", [
    (TraceMeta(lost_events=12), "12 events were lost"),
    (TraceMeta(partial_spans=1, open_at_stop=OpenSpans(checkpoints=2)), "3 spans were cut off"),
    (TraceMeta(open_at_stop=OpenSpans(checkpoints=1, iterations=1)), "2 spans were cut off"),
])
def test_summary_reliability(slots_trace, meta, words):
    a = analyze_trace(slots_trace)
    s = summarize(a.checkpoints, a.iterations, meta)
    assert s["reliable"] is False and words in s["reliability"]


def test_empty_trace_keeps_columns():
    ev = make_events([dict(kind="decode", tid=1, start_ns=0, end_ns=10, tokens=1)])
    ck = ck_table(ev)
    assert len(ck) == 0 and dict(ck.dtypes) == CHECKPOINT_COLUMNS
    it = it_table(ev, ck)
    assert len(it) == 1 and it["kind"].tolist() == ["decode"]
    none = it_table(make_events([dict(kind="mmap", tid=1, start_ns=0, end_ns=10)]), ck)
    assert len(none) == 0 and dict(none.dtypes) == ITERATION_COLUMNS
    s = summarize(ck, it, TraceMeta())
    assert s["checkpoints"] == 0 and s["pool_hit_rate"] is None
    assert s["stats"]["checkpoint_fill_ns"]["median"] is None


def test_duplicate_checkpoint_ids_are_an_error():
    rows = [dict(kind="checkpoint", tid=1, start_ns=0, end_ns=10, ckpt=7),
            dict(kind="checkpoint", tid=1, start_ns=20, end_ns=30, ckpt=7)]
    with pytest.raises(AnalysisError, match="checkpoint id 7"):
        ck_table(make_events(rows))


def test_kernel_id_outside_its_iteration_is_unassigned():
    # A checkpoint naming iteration 1 but lying after it (e.g. its iteration row was a different
    # call after lost events): it must not be counted inside iteration 1's span.
    rows = [dict(kind="iteration", tid=1, start_ns=0, end_ns=100, iter=1),
            dict(kind="checkpoint", tid=1, start_ns=150, end_ns=400, ckpt=1, iter=1),
            dict(kind="fill", tid=1, start_ns=160, end_ns=390, ckpt=1, iter=1),
            dict(kind="copy", tid=1, start_ns=390, end_ns=399, ckpt=1, iter=1)]
    ev = make_events(rows)
    ck = ck_table(ev)
    assert ck["iter"].tolist() == [0]
    it = it_table(ev, ck)
    assert it["fill_ns"].tolist() == [0]
    assert_parts_fit(it)


def test_tables_do_not_depend_on_id_values_or_row_order():
    # Ids with gaps and out of order, rows shuffled: the same tables, ids aside (the tables take
    # fast paths for consecutive ids and rows in order, and must agree with the general ones).
    ck_ids, it_ids = {1: 90, 2: 40, 3: 70, 4: 10}, {1: 500, 2: 30, 3: 31}
    rows = [{**r, "ckpt": ck_ids.get(r.get("ckpt", 0), 0), "iter": it_ids.get(r.get("iter", 0), 0)}
            for r in slots_rows()]
    rows = [rows[i] for i in np.random.default_rng(18).permutation(len(rows))]
    ev, ev2 = make_events(slots_rows()), make_events(rows)
    ck, ck2 = ck_table(ev), ck_table(ev2)
    it, it2 = it_table(ev, ck), it_table(ev2, ck2)
    back = lambda ids: {v: k for k, v in ids.items()} | {0: 0}  # noqa: E731
    ck2["ckpt"], ck2["iter"] = ck2["ckpt"].map(back(ck_ids)), ck2["iter"].map(back(it_ids))
    it2["iter"] = it2["iter"].map(back(it_ids))
    pd.testing.assert_frame_equal(ck2, ck)
    pd.testing.assert_frame_equal(it2, it)


def test_tables_take_writes_without_changing_the_rows():
    # The tables share the rows' arrays where a column is the rows' own (no copy of millions of
    # rows): writing into a table must work, and change neither the rows nor the spans.
    rows = KindRows.from_frame(make_events(slots_rows()))
    before = {g: f.copy() for g, f in rows.frames.items()}
    spans = iteration_spans(rows)
    spans_before = spans.copy()
    ck = checkpoint_table(rows, spans)
    it = iteration_table(rows, spans, ck)
    ck.loc[0, ["ckpt", "tid", "start_ns", "bytes", "draft", "cpu_ns"]] = [9, 9, 9, 9, True, 9]
    it.loc[0, ["iter", "tid", "end_ns", "cpu_ns", "tokens", "span_faults"]] = [9, 9, 9, 9, 9, 9]
    it["start_ns"] += 1
    for g, f in rows.frames.items():
        pd.testing.assert_frame_equal(f, before[g])
    pd.testing.assert_frame_equal(spans, spans_before)
    assert ck.loc[0, "tid"] == 9 and it.loc[0, "tokens"] == 9
