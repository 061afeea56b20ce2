"""Traces written as they are recorded: a killed recorder leaves a cut-short trace that reads up to
its last flush; the kernel's per-thread map is pruned as threads exit and a full map is counted."""
from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ckptrace.core.meta import TraceMeta
from ckptrace.core.stream import StreamWriter
from ckptrace.core.trace import VERSION, event_schema, read_trace, to_batch, trace_columns, trace_schema
from helpers import (assert_one_line_error, ckptrace, launched_pid, load_truth, proc_status, record_with_truth,
                     recorder, wait_for_truth, wait_until, within_clock)
from test_analyzers import make_events, slots_rows


def stream_file(path, frames: list[pd.DataFrame]) -> list[int]:
    """A stream trace of `frames`, one batch each, as the recorder writes it; the file size after each."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        meta = TraceMeta(label="s", complete=False, cut_short="killed")
        w = StreamWriter(trace_schema(meta, pandas_attrs=False))
        w.start(fd, 0)
        sizes = [w.size]
        for i, df in enumerate(frames):
            w.append(to_batch(df, event_schema(trace_columns(meta))), {"lost_events": i, "events": 0})
            sizes.append(w.size)
    finally:
        os.close(fd)
    return sizes


def test_a_torn_last_batch_reads_up_to_the_one_before(tmp_path):
    """Cut anywhere inside the last batch (a recorder killed mid-write), the trace reads every
    earlier batch and says a half-written batch was dropped; cut inside the header, one line."""
    ev = make_events(slots_rows())
    frames = [ev.iloc[:3], ev.iloc[3:]]
    path = tmp_path / "s.parquet"
    sizes = stream_file(path, frames)
    whole = read_trace(path)
    assert len(whole.events) == len(ev) and whole.meta.complete is False
    assert "half-written" not in whole.meta.cut_short and whole.meta.lost_events == 1  # last batch's counters
    data = path.read_bytes()
    for cut in sorted({sizes[1] + 1, (sizes[1] + sizes[2]) // 2, sizes[2] - 1}):
        path.write_bytes(data[:cut])
        t = read_trace(path)
        assert len(t.events) == 3 and t.meta.complete is False, cut
        assert "half-written last batch was dropped" in t.meta.cut_short and t.meta.lost_events == 0
    p = ckptrace("analyze", path)
    assert p.returncode == 0 and "cut short" in p.stdout and "half-written" in p.stdout, p.stderr
    path.write_bytes(data[:sizes[0] // 2])
    assert_one_line_error(ckptrace("analyze", path), "header is unreadable")


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_kill_9_leaves_a_cut_short_trace_with_every_flushed_event(tmp_path, workload):
    """SIGKILL in the middle of a busy recording (launched, so every checkpoint is seen): the file
    at -o reads with analyze, says cut short, and holds every checkpoint the workload finished more
    than a second before the kill (flushes are half a second apart)."""
    out, truth = tmp_path / "live.parquet", tmp_path / "t.jsonl"
    with recorder(out, "--", workload, "--iterations", "1000000", "--ckpt-mib", "8", "--decode-us", "500",
                  "--gap-us", "10000", "--truth", truth) as rec:
        child = launched_pid(rec.start_line)
        wait_for_truth(truth, 12, watch=rec)
        twelfth_end = int(load_truth(truth)["checkpoint"].sort_values("end_ns")["end_ns"].iat[11])
        wait_until(lambda: time.monotonic_ns() > twelfth_end + 1_200_000_000, "12 checkpoints a second old")
        killed_ns = time.monotonic_ns()
        rec.kill()
        rec.wait(30)
    wait_until(lambda: not proc_status(child), "the launched command to die with its recorder")
    p = ckptrace("analyze", "--json", out)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)["summary"]
    assert not summary["complete"] and summary["reliability"].startswith("cut short: ")
    assert "cut short" in ckptrace("analyze", out).stdout
    t = read_trace(out)
    assert t.meta.complete is False and t.meta.stop_reason == "cut short" and t.meta.version == VERSION
    ck = t.events[t.events["kind"] == "checkpoint"].sort_values("start_ns")
    tr = load_truth(truth)["checkpoint"].sort_values("start_ns")
    before = tr[tr["end_ns"] < killed_ns - 1_000_000_000]
    assert len(before) >= 12 and len(ck) >= len(before)
    assert within_clock(ck["start_ns"].to_numpy()[:len(before)], before["start_ns"].to_numpy())
    assert (ck["bytes"].to_numpy()[:len(before)] == before["bytes"].to_numpy()).all()
    # Plain pyarrow reads the stream batch by batch, the metadata in its schema.
    reader = pa.ipc.open_stream(str(out))
    assert json.loads(reader.schema.metadata[b"ckptrace"])["complete"] is False
    rows = 0
    try:
        for batch in reader:
            rows += batch.num_rows
    except (OSError, pa.ArrowInvalid):
        pass  # killed mid-write: a half-written last batch (cut in a message header: ArrowInvalid)
    assert rows == len(t.events)


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_exited_threads_leave_the_kernel_map(tmp_path, workload):
    """480 threads that each live for one mmap: the map takes each in and frees it at exit, so it
    never holds more than the threads alive at once (8 churning + main; the kernel's peak gauge
    may overshoot by one when two CPUs add a thread at the same instant)."""
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "60", "--ckpt-mib", "8",
                                     "--thread-churn", "8"])
    m = r.trace.meta
    churned = int(r.truth["summary"]["churn_threads"].iat[0])
    assert churned == 480
    assert m.threads_seen >= churned + 1 and m.threads_pruned >= churned
    # All 8 are alive at once each iteration (the workload waits for the 8th's mmap), never more.
    assert 8 + 1 <= m.threads_peak <= 8 + 2 and m.map_full == 0 and m.max_threads == 8192
    mm = r.trace.events[(r.trace.events["kind"] == "mmap") & (r.trace.events["bytes"] == 1 << 16)]
    assert mm["tid"].nunique() >= churned  # each churning thread was seen


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_full_thread_map_is_counted_and_said(tmp_path, workload):
    """A map of 2 threads and 4 churning + main alive at once: threads past it are not seen, and
    that is counted in the metadata, said at the end and in analyze's reliability line."""
    out = tmp_path / "m.parquet"
    p = ckptrace("record", "--quiet", "--max-threads", "2", "-o", out, "--", workload, "--iterations", "9",
                 "--ckpt-mib", "8", "--thread-churn", "4")
    assert p.returncode == 0, p.stderr
    m = read_trace(out).meta
    assert m.map_full > 0 and m.max_threads == 2
    assert f"{m.map_full} thread events not seen: the per-thread map was full" in p.stderr
    a = ckptrace("analyze", out)
    assert a.returncode == 0 and "per-thread map was" in a.stdout.replace("\n  ", " ")


def filled_pipe() -> tuple[int, int]:
    """A pipe (read end, write end for a child's stderr), and a function filling it to the brim
    from a second, non-blocking description of its write end: the child's next write then blocks
    (its own description stays blocking) until the test reads."""
    import fcntl
    import os

    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    filler = os.open(f"/proc/self/fd/{w}", os.O_WRONLY | os.O_NONBLOCK)

    def fill():
        for chunk in (b"#" * 512, b"#"):
            while True:
                try:
                    os.write(filler, chunk)
                except BlockingIOError:
                    break
    return r, w, filler, fill


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_kill_while_the_finished_trace_is_written_leaves_the_stream_and_nothing_else(tmp_path, workload):
    """SIGKILL while the recorder writes the finished Parquet trace: -o is still the whole
    recording as a readable stream, and nothing else is in its folder (the new file has no name
    until it is complete). Synchronised on events, not time: the recorder's stderr is a pipe the
    test has filled, so its 'writing the finished trace' line, printed with the new file open,
    blocks it there; the kill comes once that file is seen among its descriptors."""
    import os
    import select
    import signal
    import subprocess

    from ckptrace.core.stream import is_stream
    from helpers import CKPTRACE, go, waiting_workload

    folder = (tmp_path / "out").resolve()
    folder.mkdir()
    out, truth = folder / "t.parquet", tmp_path / "t.jsonl"
    r, w, filler, fill = filled_pipe()
    with waiting_workload(workload, "--iterations", "24", "--ckpt-mib", "36", truth=truth) as wl:
        rec = subprocess.Popen([str(CKPTRACE), "record", "--quiet", "-o", str(out), "--pid", str(wl.pid)],
                               stderr=w)
        os.close(w)
        try:
            with os.fdopen(r, "rb", buffering=0) as err:
                line = b""

                def start_line() -> bool:
                    """Its first stderr line, as far as written; or the recorder has exited (the
                    test holds a write end, `filler`, so its pipe never reads EOF: a read blocks)."""
                    nonlocal line
                    exited = rec.poll() is not None
                    while not line.endswith(b"\n") and select.select([err], [], [], 0)[0]:
                        line += err.read(1) or b"\n"
                    return line.endswith(b"\n") or exited
                wait_until(start_line, "the recorder's start line", timeout_s=180)  # was unbounded: bcc compiles
                assert line.startswith(b"ckptrace: tracing"), (line, rec.poll())
                fill()
                go(wl)
                assert wl.wait(120) == 0

                def writing_file():
                    """The recorder's open file in the folder that is not -o (the trace being written)."""
                    try:
                        fds = os.listdir(f"/proc/{rec.pid}/fd")
                    except FileNotFoundError:  # it has exited and been reaped (watch= says how)
                        return None
                    for fd in fds:
                        p = f"/proc/{rec.pid}/fd/{fd}"
                        try:
                            if os.readlink(p).startswith(f"{folder}/") and os.stat(p).st_ino != out.stat().st_ino:
                                return p
                        except FileNotFoundError:
                            continue
                    return None
                wait_until(writing_file, "the recorder to open the finished trace's file (blocked on its line)",
                           watch=rec)
                assert rec.poll() is None
                rec.send_signal(signal.SIGKILL)
                assert rec.wait(60) == -signal.SIGKILL
        finally:
            os.close(filler)
            if rec.poll() is None:
                rec.kill()
                rec.wait(60)
    assert sorted(os.listdir(folder)) == [out.name]  # no temp file beside -o
    assert is_stream(out)
    t = read_trace(out)
    assert t.meta.complete is False
    ck = t.events[t.events["kind"] == "checkpoint"]
    assert len(ck) == len(load_truth(truth)["checkpoint"]) > 0  # flushed before the finishing pass
