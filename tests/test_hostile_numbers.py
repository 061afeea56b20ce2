"""Arithmetic that can't lie (issue 22, class 3): a figure that would not fit in 64 bits, or spans
that can't be what they claim, is refused in one line by every command that reads the trace,
never printed wrong; a figure at the limit is printed exactly.

Each hostile trace is written with ckptrace.core.trace.write_trace and run through the real CLI
(helpers.ckptrace): analyze, analyze --json, compare, dashboard, export. Each case comes with
its control, the same trace shape within range, whose figures must be exact.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckptrace.core.meta import TraceMeta
from ckptrace.core.trace import normalize_events, write_trace
from helpers import assert_one_line_error, ckptrace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
NS_MAX = 1 << 62
STATE = 1 << 48  # the largest bytes a row may hold (validate.RANGES)


def write(path: Path, rows: pd.DataFrame | list[dict], label: str = "pool-off") -> Path:
    """A trace of these rows (the rest of each row its 'none' value), label `label` (compare's baseline)."""
    df = pd.DataFrame(rows)
    ev = normalize_events(df.fillna({c: 0 for c in df.columns if c not in ("kind", "fault_ns")}))
    if "fault_ns" in df.columns:
        ev["fault_ns"] = df["fault_ns"].astype("Int64").to_numpy()
    write_trace(path, ev, TraceMeta(label=label, pid=4242))
    return path


def big_state(n: int) -> pd.DataFrame:
    """One thread, one prefill iteration holding n checkpoints of STATE bytes, each with its copy."""
    i = np.arange(n, dtype="int64")
    start = 10 + 1000 * i
    ck = pd.DataFrame({"kind": "checkpoint", "start_ns": start, "end_ns": start + 500, "ckpt": i + 1})
    cp = pd.DataFrame({"kind": "copy", "start_ns": start + 10, "end_ns": start + 400, "ckpt": i + 1})
    it = pd.DataFrame({"kind": ["iteration"], "start_ns": [0], "end_ns": [1000 * n + 10], "ckpt": [0]})
    rows = pd.concat([it, ck, cp]).sort_values("start_ns", kind="stable")
    return rows.assign(tid=100, pid=4242, iter=1, bytes=np.where(rows["kind"] == "iteration", 0, STATE),
                       prompt_tokens=np.where(rows["kind"] == "iteration", 512, 0))


def long_spans(threads: int) -> list[dict]:
    """Each thread: one prefill iteration of 2^62 ns (the longest a trace holds), a checkpoint
    of 2^62 - 2 ns inside, and its copy of 2^62 - 4 ns inside that."""
    rows = []
    for t in range(threads):
        tid = 100 + t
        rows += [dict(kind="iteration", tid=tid, start_ns=0, end_ns=NS_MAX, iter=t + 1, prompt_tokens=512),
                 dict(kind="checkpoint", tid=tid, start_ns=1, end_ns=NS_MAX - 1, ckpt=t + 1, iter=t + 1, bytes=4096),
                 dict(kind="copy", tid=tid, start_ns=2, end_ns=NS_MAX - 2, ckpt=t + 1, iter=t + 1, bytes=4096)]
    return rows


def two_checkpoints(second_tid: int) -> list[dict]:
    """Checkpoints [10, 50] ns on tid 100 and [40, 80] ns on `second_tid` (overlapping on one
    thread when that is 100), each with its copy, in the iterations of their threads."""
    rows = [dict(kind="iteration", tid=100, start_ns=0, end_ns=1000, iter=1, prompt_tokens=8),
            dict(kind="checkpoint", tid=100, start_ns=10, end_ns=50, ckpt=1, iter=1, bytes=4096),
            dict(kind="copy", tid=100, start_ns=20, end_ns=30, ckpt=1, iter=1, bytes=4096),
            dict(kind="checkpoint", tid=second_tid, start_ns=40, end_ns=80, ckpt=2, iter=1, bytes=4096),
            dict(kind="copy", tid=second_tid, start_ns=60, end_ns=70, ckpt=2, iter=1, bytes=4096)]
    if second_tid != 100:
        rows[3]["iter"] = rows[4]["iter"] = 2
        rows.insert(3, dict(kind="iteration", tid=second_tid, start_ns=35, end_ns=90, iter=2, prompt_tokens=8))
    return rows


def fill_and_copy(copy_start: int) -> list[dict]:
    """Checkpoint [10, 100] ns with a fill [20, 60] and a copy [copy_start, 90]: they overlap
    when the copy starts before 60."""
    return [dict(kind="iteration", tid=100, start_ns=0, end_ns=1000, iter=1, prompt_tokens=8),
            dict(kind="checkpoint", tid=100, start_ns=10, end_ns=100, ckpt=1, iter=1, bytes=4096, faults=3),
            dict(kind="fill", tid=100, start_ns=20, end_ns=60, ckpt=1, iter=1, bytes=4096, faults=2),
            dict(kind="copy", tid=100, start_ns=copy_start, end_ns=90, ckpt=1, iter=1, bytes=4096, faults=1)]


COMMANDS = ["analyze", "analyze --json", "compare", "dashboard", "export", "whatif"]


def run(command: str, trace: Path, tmp_path: Path):
    """`ckptrace COMMAND` of one trace (compare: against the sample pool-on leg); its output
    file, if it writes one."""
    out = {"dashboard": tmp_path / f"{trace.stem}.html",
           "export": tmp_path / f"{trace.stem}.perfetto-trace"}.get(command)
    args = {"analyze": ["analyze", trace], "analyze --json": ["analyze", "--json", trace],
            "compare": ["compare", trace, SAMPLES / "2-pool-on.parquet"],
            "dashboard": ["dashboard", trace, "-o", out], "export": ["export", trace, "-o", out],
            "whatif": ["whatif", trace, "--cap-bytes", "1GiB"]}[command]
    return ckptrace(*args), out


def refused(command: str, trace: Path, tmp_path: Path, *needles: str) -> str:
    """The command fails with one `ckptrace: error:` line naming the trace and `needles`, and
    prints or writes nothing else."""
    p, out = run(command, trace, tmp_path)
    line = assert_one_line_error(p, f"{trace}: ", *needles)
    assert p.stdout == "", p.stdout
    assert out is None or not out.exists()
    return line


def accepted(command: str, trace: Path, tmp_path: Path):
    """The command succeeds; analyze --json's document, analyze's text, else None."""
    p, out = run(command, trace, tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert out is None or out.stat().st_size > 0
    return json.loads(p.stdout) if command == "analyze --json" else p.stdout if command == "analyze" else None


@pytest.mark.parametrize("command", COMMANDS)
def test_state_bytes_adding_past_2_62_are_refused_and_at_2_62_exact(tmp_path, command):
    """40,000 checkpoints of 2^48 bytes add up to 2^65.3: the int64 sum wrapped to "state copied:
    -6854767804416.0 MiB". 16,384 of them add up to 2^62 exactly: printed exactly."""
    at_limit = accepted(command, write(tmp_path / "limit.parquet", big_state(16_384)), tmp_path)
    if command == "analyze --json":
        assert at_limit["summary"]["checkpoint_bytes"] == 1 << 62
        assert [it["bytes"] for it in at_limit["iterations"]] == [1 << 62]
        assert at_limit["summary"]["checkpoints"] == 16_384
    elif command == "analyze":
        assert "state copied: 4398046511104.0 MiB" in at_limit  # 2^62 / 2^20
    refused(command, write(tmp_path / "big.parquet", big_state(40_000)), tmp_path,
            f"the checkpoints' bytes add up to {40_000 * STATE} over 40000 rows, past 2^62")


@pytest.mark.parametrize("command", COMMANDS)
def test_spans_of_2_62_ns_on_several_threads_are_refused_and_on_one_exact(tmp_path, command):
    """Three threads each with a 2^62 ns prefill iteration: their sum wrapped (a checkpoint share
    of prefill time past 100% or below 0%). One thread: every figure exact."""
    one = accepted(command, write(tmp_path / "one.parquet", long_spans(1)), tmp_path)
    if command == "analyze --json":
        (ck,), (it,) = one["checkpoints"], one["iterations"]
        assert (ck["total_ns"], ck["copy_ns"], ck["other_ns"]) == (NS_MAX - 2, NS_MAX - 4, 2)
        assert (it["span_ns"], it["copy_ns"], it["other_ns"]) == (NS_MAX, NS_MAX - 4, 4)
        assert one["summary"]["checkpoint_share_of_prefill"] == (NS_MAX - 2) / NS_MAX
    elif command == "analyze":
        assert "checkpoint share of prefill time: 100.0%" in one
    refused(command, write(tmp_path / "three.parquet", long_spans(3)), tmp_path,
            f"the fill and copy rows' times (end_ns - start_ns) add up to {3 * (NS_MAX - 4)} over 3 rows, past 2^62")


@pytest.mark.parametrize("command", COMMANDS)
def test_checkpoints_overlapping_on_one_thread_are_refused(tmp_path, command):
    """Two checkpoints overlapping in time are fine on two threads, refused on one: their sums
    would count the same nanoseconds twice."""
    apart = accepted(command, write(tmp_path / "apart.parquet", two_checkpoints(101)), tmp_path)
    if command == "analyze --json":
        assert [(c["tid"], c["total_ns"], c["copy_ns"]) for c in apart["checkpoints"]] == [(100, 40, 10), (101, 40, 10)]
    refused(command, write(tmp_path / "overlap.parquet", two_checkpoints(100)), tmp_path,
            "1 checkpoints overlap an earlier one on their thread (first: row 3, checkpoint 2 tid 100 40..80 ns, "
            "overlapping row 1, checkpoint 1 10..50 ns)")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fill_overlapping_the_copy_of_its_checkpoint_is_refused(tmp_path, command):
    """A fill and a copy of one checkpoint touching are fine (fill + copy + other = total);
    overlapping, refused: fill + copy would exceed the checkpoint."""
    touching = accepted(command, write(tmp_path / "touching.parquet", fill_and_copy(60)), tmp_path)
    if command == "analyze --json":
        (ck,) = touching["checkpoints"]
        assert (ck["total_ns"], ck["fill_ns"], ck["copy_ns"], ck["other_ns"]) == (90, 40, 30, 20)
    refused(command, write(tmp_path / "overlap.parquet", fill_and_copy(50)), tmp_path,
            "1 fills and copies overlap another of their checkpoint (first: row 3, copy of checkpoint 1 tid 100 "
            "50..90 ns, overlapping row 2, fill 20..60 ns)")


@pytest.mark.parametrize("case", ["fill and fill", "copy and copy", "two copies inside the fill"])
def test_parts_overlapping_another_of_their_checkpoint_are_refused_whole_and_batched(tmp_path, case):
    """Any two fills or copies of one checkpoint that overlap, found by read_trace (export's read)
    and by the batched read (analyze's), naming the same first bad row."""
    from ckptrace.analyzers import analyze_file
    from ckptrace.core.errors import TraceFormatError
    from ckptrace.core.trace import read_trace

    rows = fill_and_copy(60)
    if case == "fill and fill":
        rows.insert(3, dict(kind="fill", tid=100, start_ns=30, end_ns=40, ckpt=1, iter=1, bytes=1))
        want = "first: row 3, fill of checkpoint 1 tid 100 30..40 ns, overlapping row 2, fill 20..60 ns"
    elif case == "copy and copy":
        rows.append(dict(kind="copy", tid=100, start_ns=85, end_ns=95, ckpt=1, iter=1, bytes=1))
        want = "first: row 4, copy of checkpoint 1 tid 100 85..95 ns, overlapping row 3, copy 60..90 ns"
    else:  # a long fill and two copies inside it: the first bad row (row 3) is not the fill's neighbour in time
        rows[2] = dict(kind="fill", tid=100, start_ns=11, end_ns=60, ckpt=1, iter=1, bytes=1)
        rows[3] = dict(kind="copy", tid=100, start_ns=40, end_ns=50, ckpt=1, iter=1, bytes=1)
        rows.append(dict(kind="copy", tid=100, start_ns=20, end_ns=30, ckpt=1, iter=1, bytes=1))
        want = "2 fills and copies overlap another of their checkpoint (first: row 3, copy of checkpoint 1 tid 100 " \
               "40..50 ns, overlapping row 2, fill 11..60 ns)"
    path = write(tmp_path / "t.parquet", rows)
    for read in (read_trace, lambda p: analyze_file(p, batch_rows=2)):
        with pytest.raises(TraceFormatError, match="overlap another of their checkpoint") as e:
            read(path)
        assert want in str(e.value), str(e.value)


def test_a_part_outside_its_checkpoint_names_its_row_thread_and_times(tmp_path):
    """Already refused before (tests/test_hostile.py); now naming the first bad row, as the other
    span checks do, in the batched read (analyze) and the whole read (export)."""
    rows = fill_and_copy(60)
    rows[3]["end_ns"] = 190
    path = write(tmp_path / "t.parquet", rows)
    for command in ("analyze", "export"):
        refused(command, path, tmp_path, "a copy of checkpoint 1 lies outside its checkpoint (1 such rows), first at "
                "row 3: copy tid 100 60..190 ns, its checkpoint row 1 10..100 ns")


@pytest.mark.parametrize("command", ["analyze", "analyze --json"])
def test_an_estimated_fault_time_past_2_62_is_refused(tmp_path, command):
    """A fill without measured fault time gets faults x the median ns per fault of the measured
    ones: 2^30 faults x 2^62 ns is a float of 2^92, which int64 read as -2^63."""
    def rows(faults: int) -> list[dict]:
        return [dict(kind="iteration", tid=100, start_ns=0, end_ns=1000, iter=1, prompt_tokens=8),
                dict(kind="checkpoint", tid=100, start_ns=10, end_ns=100, ckpt=1, iter=1, bytes=64, faults=1),
                dict(kind="fill", tid=100, start_ns=20, end_ns=60, ckpt=1, iter=1, bytes=64, faults=1,
                     fault_ns=1 << 40),
                dict(kind="copy", tid=100, start_ns=60, end_ns=90, ckpt=1, iter=1, bytes=64, fault_ns=0),
                dict(kind="checkpoint", tid=100, start_ns=200, end_ns=300, ckpt=2, iter=1, bytes=64, faults=faults),
                dict(kind="fill", tid=100, start_ns=210, end_ns=260, ckpt=2, iter=1, bytes=64, faults=faults,
                     fault_ns=None),
                dict(kind="copy", tid=100, start_ns=260, end_ns=290, ckpt=2, iter=1, bytes=64, fault_ns=0)]

    ok = accepted(command, write(tmp_path / "ok.parquet", rows(1 << 12)), tmp_path)
    if command == "analyze --json":
        assert [c["fill_fault_ns"] for c in ok["checkpoints"]] == [1 << 40, 1 << 52]  # 2^12 x 2^40, exact
        assert [c["fault_source"] for c in ok["checkpoints"]] == ["measured", "estimated"]
    refused(command, write(tmp_path / "big.parquet", rows(1 << 30)), tmp_path,
            "the estimated fault time of a fill (1073741824 faults x 1.09951e+12 ns per fault) would be 1.18059e+21, "
            "past 2^62")


@pytest.mark.parametrize("command", ["analyze", "analyze --json"])
def test_checkpoint_buffers_held_past_2_62_bytes_are_refused(tmp_path, command):
    """32,769 buffers of 2^48 bytes mapped and never unmapped hold 2^63 + 2^48 bytes: the held
    series' int64 sum wrapped negative. 16,384 hold 2^62: exact."""
    def rows(n: int) -> pd.DataFrame:
        i = np.arange(n, dtype="int64")
        return pd.DataFrame({"kind": "mmap", "phase": "checkpoint", "tid": 100, "start_ns": 10 * i,
                             "end_ns": 10 * i + 5, "bytes": STATE, "addr": (i.astype("uint64") + 1) << np.uint64(48)})

    ok = accepted(command, write(tmp_path / "ok.parquet", rows(16_384)), tmp_path)
    if command == "analyze --json":
        m = ok["memory"]
        assert (m["peak_held_bytes"], m["end_held_bytes"], m["buffer_bytes_mapped"]) == (1 << 62,) * 3
    refused(command, write(tmp_path / "big.parquet", rows(32_769)), tmp_path,
            f"the checkpoint buffers' mmap and mremap bytes add up to {32_769 * STATE} over 32769 rows, past 2^62")


def test_counts_past_2_30_are_refused_so_their_sums_fit(tmp_path):
    """ROWS_MAX (2^32) x COUNT_MAX (2^30) = 2^62: a sum of counts over any rows fits in int64."""
    from ckptrace.core.errors import TraceFormatError
    from ckptrace.core.trace import read_trace

    rows = fill_and_copy(60)
    rows[2]["faults"] = 1 << 30
    assert int(read_trace(write(tmp_path / "ok.parquet", rows)).events["faults"].max()) == 1 << 30
    rows[2]["faults"] = (1 << 30) + 1
    with pytest.raises(TraceFormatError, match=r"column faults holds 1073741825, outside 0\.\.1073741824"):
        read_trace(write(tmp_path / "big.parquet", rows))


def test_more_rows_than_rows_max_are_refused_before_decoding(tmp_path, monkeypatch):
    """No real trace reaches ROWS_MAX (2^32 rows would need over a TiB of memory to read); with
    it lowered, the check shows: one line, before any row is decoded."""
    import ckptrace.core.validate as validate
    from ckptrace.core.errors import TraceFormatError
    from ckptrace.core.trace import read_trace

    path = write(tmp_path / "t.parquet", fill_and_copy(60))
    monkeypatch.setattr(validate, "ROWS_MAX", 3)
    with pytest.raises(TraceFormatError, match=r"4 events, more than the 3 a trace may hold"):
        read_trace(path)


def test_bound_decides_exactly_at_2_62_whatever_the_float_rounding():
    """sums.bound: a column's magnitudes adding up to 2^62 pass, one more refuses, exactly (a
    float64 sum can't tell 2^62 from 2^62 + 1); exact_sum and exact_abs_sum are Python-int exact."""
    from ckptrace.analyzers.sums import SUM_MAX, SumOutOfRange, bound, checked_sum, exact_abs_sum, exact_sum

    at = np.full(4, 1 << 60, dtype="int64")
    assert checked_sum(at, "x") == SUM_MAX
    with pytest.raises(SumOutOfRange, match=r"^x add up to 4611686018427387905 over 5 rows, past 2\^62"):
        bound("x", np.append(at, 1))
    with pytest.raises(SumOutOfRange, match=r"^y add up to a magnitude of 9223372036854775808 over 1 rows"):
        bound("y", np.array([-(1 << 63)], dtype="int64"))  # |INT64_MIN|, as a wrapped sum would leave it
    assert checked_sum(pd.array([3, None, 4], dtype="Int64"), "z") == 7  # NA counts 0
    rng = np.random.default_rng(22)
    for _ in range(100):
        v = rng.integers(-(1 << 62), 1 << 62, size=int(rng.integers(1, 40)), dtype="int64")
        assert exact_sum(v) == sum(int(x) for x in v) and exact_abs_sum(v) == sum(abs(int(x)) for x in v)
        fits = exact_abs_sum(v) <= SUM_MAX
        try:
            bound("v", v)
            assert fits
        except SumOutOfRange:
            assert not fits
