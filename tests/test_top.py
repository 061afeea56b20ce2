"""`ckptrace top` (live/top.py, renderers/top.py, the fold in probes/fold.py): its figures
against `analyze` of a recording of the same seconds and the workload's own clocks, its frame on
a real terminal (a pty) in 80 columns of plain ANSI, `q` and Ctrl-C, and bad input."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time

import jsonschema
import numpy as np
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.memory import memory_summary
from ckptrace.core.trace import read_trace
from helpers import (CKPTRACE, assert_one_line_error, ckptrace, clock_tolerance, go, load_truth, recorder, started,
                     validate_json, wait_until, waiting_workload)

# The only escapes a frame may hold: home, clear to end of line, clear below, hide/show the cursor.
PLAIN_ANSI = {"\x1b[H", "\x1b[K", "\x1b[J", "\x1b[?25l", "\x1b[?25h"}
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def percentiles(values) -> tuple[float, float]:
    v = np.asarray(values, dtype="float64")
    p50, p99 = np.percentile(v, [50, 99])
    return float(p50), float(p99)


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_top_shows_what_analyze_of_a_recording_of_the_same_seconds_shows(tmp_path, workload):
    """The sample (pool on: hits and misses) recorded and watched by `top --once --json` at once,
    both attached before its first instruction of work: the same checkpoints, pool hits and held
    memory exactly; the fill's and copy's on-CPU p50/p99 and the wait's p50 within the clock's
    tolerance of analyze's (two probe sets on one process: each span differs by the other's
    handlers) and of the workload's own thread clock."""
    truth_file, trace = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    with waiting_workload(workload, "--iterations", "30", "--ckpt-mib", "40", "--pool", "on",
                          "--decode-us", "2000", truth=truth_file) as wl, \
            recorder(trace, "--pid", wl.pid) as rec, \
            started([CKPTRACE, "top", "--pid", wl.pid, "--once", "--json", "--interval", "600"],
                    ready="ckptrace: ", stdout=subprocess.PIPE) as (top, line):
        while line.startswith("ckptrace: compiling"):  # a cold program cache says so first
            line = top.stderr.readline()
        assert f"PID {wl.pid} (ckpt-workload, " in line and "one frame after 600 s" in line, line
        go(wl)
        assert wl.wait(120) == 0
        assert top.wait(120) == 0, top.stderr.read()  # it stops when its process has exited
        assert rec.wait(120) == 0, rec.stderr.read()
        doc = json.loads(top.stdout.read())
    validate_json("top", doc)  # docs/schemas/top.schema.json, schema_version included
    with pytest.raises(jsonschema.ValidationError):  # and the schema says something
        validate_json("top", {k: v for k, v in doc.items() if k != "lost_events"})
    (p,) = doc["processes"]
    assert p["pid"] == wl.pid and p["exited"] and doc["lost_events"] == 0

    recorded = read_trace(trace)
    ck = analyze_trace(recorded).checkpoints
    mem = memory_summary(recorded.events)
    truth = load_truth(truth_file)["checkpoint"]
    assert p["checkpoints"] == p["window"]["checkpoints"] == len(ck) == len(truth) > 0
    assert p["pool_hits"] == ck["pool_hit"].sum() == truth["pool_hit"].sum() > 0
    assert p["pool_hits"] < p["checkpoints"]  # misses too: fills with faults
    assert p["peak_held_bytes"] == mem["peak_held_bytes"] > 0
    assert p["held_bytes"] == mem["end_held_bytes"]
    w = p["window"]
    for col in ("fill_cpu_ns", "copy_cpu_ns"):
        assert w[col]["count"] == len(ck)
        for got, want, own in zip((w[col]["p50"], w[col]["p99"]), percentiles(ck[col]), percentiles(truth[col])):
            assert abs(got - want) <= clock_tolerance(want), (col, got, want)
            assert abs(got - own) <= clock_tolerance(own), (col, got, own)
    assert abs(w["wait_ns"]["p50"] - ck["wait_ns"].median()) <= clock_tolerance(ck["wait_ns"].median())
    # Fault time: each tool calibrates the resident time on its own, and fault_ns is measured only
    # where that is at most a third of the span's on-CPU time: two measurements of one checkpoint
    # differ by at most a third of its on-CPU time (plus the clocks' tolerance).
    measured = ck[ck["fault_source"].isin(["measured", "none"])]
    assert w["fault_ns"]["count"] == len(measured) > 0
    cpu = ck["fill_cpu_ns"] + ck["copy_cpu_ns"]
    for got, want in zip((w["fault_ns"]["p50"], w["fault_ns"]["p99"]), percentiles(measured["fault_ns"])):
        assert abs(got - want) <= clock_tolerance(want) + cpu.max() / 3, (got, want)
    assert w["fault_ns"]["p99"] > 0 and w["fault_ns"]["p50"] == 0  # hits fault nothing; most are hits


def test_the_fold_sums_on_cpu_fill_and_copy_as_analyze():
    """The fold top shares with serve (probes/fold.py), fed the recorded samples in batches cut
    anywhere: each checkpoint's fill and copy on-CPU time, exactly analyze's."""
    from ckptrace.probes.fold import ProcessFold
    from test_serve import SAMPLES, kernel_records

    for name in ("1-pool-off.parquet", "2-pool-on.parquet"):
        tr = read_trace(SAMPLES / name)
        ck = analyze_trace(tr).checkpoints
        rec, fault = kernel_records(tr.events)
        for cuts in (np.array([], int), np.arange(1, len(rec), 7)):
            fold, got = ProcessFold(), {"fill_cpu_ns": [], "copy_cpu_ns": [], "end_ns": []}
            for part_rec, part_fault in zip(np.split(rec, cuts), np.split(fault, cuts)):
                out = fold.fold(part_rec, part_fault, sched_recorded=True).checkpoints
                for c in got:
                    got[c].append(out[c])
            order = np.argsort(np.concatenate(got["end_ns"]), kind="stable")
            want = ck.sort_values("end_ns", kind="stable")
            for c in ("fill_cpu_ns", "copy_cpu_ns"):
                assert np.concatenate(got[c])[order].tolist() == want[c].astype("float64").tolist(), (name, c)


def test_the_fold_keeps_an_unknown_on_cpu_figure_unknown():
    """A fill or copy whose cpu_ns the probe found wrong (drain.CPU_UNKNOWN) leaves its
    checkpoint's on-CPU figure not recorded (-1), never a sum with 2**64 - 1 in it."""
    from ckptrace.probes import drain, fold
    from ckptrace.probes.fold import ProcessFold
    from test_serve import SAMPLES, kernel_records

    tr = read_trace(SAMPLES / "1-pool-off.parquet")
    rec, fault = kernel_records(tr.events)
    copies = np.flatnonzero(rec["kind"] == fold.K_COPY)
    rec["cpu_ns"][copies[0]] = drain.CPU_UNKNOWN
    out = ProcessFold().fold(rec, fault, sched_recorded=True).checkpoints
    ck = int(rec["ckpt"][copies[0]])
    at = np.flatnonzero(np.isin(out["end_ns"], rec["end_ns"][(rec["kind"] == fold.K_CHECKPOINT)
                                                            & (rec["ckpt"] == ck)]))
    assert len(at) == 1 and out["copy_cpu_ns"][at[0]] == -1
    assert (np.delete(out["copy_cpu_ns"], at) >= 0).all()
    # Without a growth probe the fill is derived (the checkpoint's less its copies'): unknown too.
    rec, fault = kernel_records(tr.events)
    cks = np.flatnonzero(rec["kind"] == fold.K_CHECKPOINT)
    rec["cpu_ns"][cks[0]] = drain.CPU_UNKNOWN
    out = ProcessFold(False).fold(rec, fault, sched_recorded=True).checkpoints
    at = np.flatnonzero(out["end_ns"] == rec["end_ns"][cks[0]])
    assert len(at) == 1 and out["fill_cpu_ns"][at[0]] == -1 and out["cpu_ns"][at[0]] == -1


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other side closed
        return b""


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
@pytest.mark.parametrize("how", ["q", "ctrl-c"])
def test_top_on_a_terminal_redraws_in_80_columns_of_plain_ansi_and_quits(tmp_path, workload, how):
    """On a pty: frames redrawn in place with only home/clear/cursor escapes, every line under 80
    columns, the process's row counting its checkpoints; `q` (read in cbreak mode) or Ctrl-C
    (SIGINT) quits at once with status 0, the cursor shown again and the terminal's mode restored."""
    import pty
    import termios

    primary, secondary = pty.openpty()
    mode_before = termios.tcgetattr(secondary)
    with waiting_workload(workload, "--iterations", "100000", "--ckpt-mib", "36", "--gap-us", "20000") as wl:
        go(wl)
        top = subprocess.Popen([str(CKPTRACE), "top", "--pid", str(wl.pid), "--interval", "0.5"],
                               stdin=secondary, stdout=secondary, stderr=secondary, start_new_session=True)
        seen = b""
        try:
            def a_row_with_checkpoints():
                nonlocal seen
                if select.select([primary], [], [], 0.5)[0]:
                    seen += _read(primary)
                text = ESCAPE.sub("", seen.decode(errors="replace"))
                return re.search(rf"^\s*{wl.pid} ckpt-workl\s+[1-9][\d.]*\s+\d+%\s", text, re.M)
            wait_until(a_row_with_checkpoints, "a frame with the workload's checkpoints", every_s=0, watch=top)
            t0 = time.monotonic()
            if how == "q":
                os.write(primary, b"q")
            else:
                top.send_signal(signal.SIGINT)
            assert top.wait(60) == 0
            quit_s = time.monotonic() - t0
            while select.select([primary], [], [], 1)[0] and (chunk := _read(primary)):
                seen += chunk  # (the test holds the terminal open: no EOF, a pause ends it)
            mode_after = termios.tcgetattr(secondary)
        finally:
            if top.poll() is None:
                top.kill()
                top.wait()
            os.close(primary)
            os.close(secondary)
    text = seen.decode()
    assert set(ESCAPE.findall(text)) <= PLAIN_ANSI, set(ESCAPE.findall(text)) - PLAIN_ANSI
    assert text.count("\x1b[H") >= 2  # redrawn in place, not scrolled
    assert text.rstrip().endswith("\x1b[?25h")  # the cursor shown again at the end
    lines = [ESCAPE.sub("", ln) for ln in re.split(r"\r?\n", text)]
    assert lines and all(len(ln) <= 79 for ln in lines), max(lines, key=len)
    assert any(ln.startswith("ckptrace top  ") for ln in lines)
    assert "Traceback" not in text
    assert mode_after == mode_before  # cbreak undone
    assert quit_s < 30  # a bound for a hang, not a speed


def test_bad_input_is_one_line():
    p = ckptrace("top")
    assert_one_line_error(p, "give --pid PID (one or more) or --comm NAME")
    p = ckptrace("top", "--pid", "1", "--comm", "x")
    assert_one_line_error(p, "give --pid PID")
    p = ckptrace("top", "--pid", "1", "--ringbuf-pages", "3")
    assert_one_line_error(p, "power of two")
    p = ckptrace("top", "--pid", "1", "--interval", "0")
    assert_one_line_error(p, "--interval")


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_pid_that_is_not_there_is_one_line():
    p = ckptrace("top", "--pid", str((1 << 22) - 3), "--once")
    assert_one_line_error(p, "PID")


def test_a_frame_holds_any_figures_and_names_in_79_columns_escaped():
    """The frame's text from extreme figures and a hostile process name: every line under 80
    columns, the name's escape sequence shown, never sent (core/terminal.py's printable)."""
    from ckptrace.renderers.top import frame_lines

    big = {"count": 1, "p50": 3.6e15, "p99": 9.9e17}
    none = {"count": 0, "p50": None, "p99": None}
    procs = [{"pid": (1 << 22) - 1, "comm": "\x1b[31m\u202eevil-server-with-a-long-name", "exited": False,
              "checkpoints": 10 ** 12, "pool_hits": 10 ** 12, "fresh_copies": 10 ** 12, "checkpoints_per_s": 123456.7,
              "window": {"checkpoints": 1, "fill_cpu_ns": big, "copy_cpu_ns": big, "fault_ns": none, "wait_ns": big},
              "held_bytes": 1 << 50},
             {"pid": 2, "comm": "x", "exited": True, "checkpoints": 0, "pool_hits": 0, "fresh_copies": 0, "checkpoints_per_s": 0.0,
              "window": {"checkpoints": 0, "fill_cpu_ns": none, "copy_cpu_ns": none, "fault_ns": none,
                         "wait_ns": none}, "held_bytes": 0}]
    doc = {"time": 1.8e9, "interval_s": 1.0, "once": False, "window_s": 86400.0, "lost_events": 10 ** 15,
           "processes": procs}
    lines = frame_lines(doc, ["ckptrace: note: \x1b]52;c;evil\x07 planted"])
    assert all(len(ln) <= 79 for ln in lines), max(lines, key=len)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[31m" in text and " exited " in text


def test_enclosing_in_numpy_is_the_asof_join_it_replaced():
    """core/rules.py's enclosing (numpy, so the live tools run without pandas) against the
    definition it replaced, pandas' backward as-of join by thread then the end check, on random
    spans with shared starts, several threads, and rows in no span."""
    import pandas as pd

    from ckptrace.core.rules import enclosing

    def asof(inner, outer):
        out = np.full(len(inner), -1, dtype="int64")
        if not len(inner) or not len(outer):
            return out
        left = pd.DataFrame({"pos": np.arange(len(inner)), "tid": inner["tid"], "start_ns": inner["start_ns"],
                             "end_ns": inner["end_ns"]})
        right = pd.DataFrame({"opos": np.arange(len(outer)), "tid": outer["tid"], "o_start": outer["start_ns"],
                              "o_end": outer["end_ns"]})
        m = pd.merge_asof(left.sort_values("start_ns", kind="stable"), right.sort_values("o_start", kind="stable"),
                          left_on="start_ns", right_on="o_start", by="tid", direction="backward")
        ok = (m["opos"].notna() & (m["end_ns"] <= m["o_end"])).to_numpy()
        out[m["pos"].to_numpy()[ok]] = m["opos"].to_numpy()[ok].astype("int64")
        return out

    rng = np.random.default_rng(3)
    for n_in, n_out in ((0, 5), (5, 0), (1, 1), (200, 40), (1000, 300)):
        def spans(n, width):
            start = rng.integers(0, 500, n) * 10  # coarse: many starts shared
            return pd.DataFrame({"tid": rng.integers(1, 5, n).astype("int32"), "start_ns": start,
                                 "end_ns": start + rng.integers(0, width, n)})
        inner, outer = spans(n_in, 30), spans(n_out, 200)
        want = asof(inner, outer)
        assert enclosing(inner, outer).tolist() == want.tolist()
        assert enclosing(inner.to_records(index=False), outer.to_records(index=False)).tolist() == want.tolist()
        assert n_in < 200 or (want >= 0).sum() > 20  # the case is not empty


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_once_counts_its_interval_from_the_attach_and_says_it_compiles(workload):
    """No program cache (every run compiles: seconds): `top --once` says it compiles, on a pipe
    too, and its one frame comes at least one interval after its probes were in, holding the
    checkpoints of that interval (the compile used to eat the interval: an empty frame)."""
    with waiting_workload(workload, "--iterations", "1000000", "--ckpt-mib", "40", "--gap-us", "20000") as wl:
        go(wl)
        p = ckptrace("top", "-p", wl.pid, "--once", "--json", "--interval", "2", env={"CKPTRACE_BPF_CACHE": "off"},
                     timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0].startswith("ckptrace: compiling the BPF program"), p.stderr
    doc = json.loads(p.stdout)
    (proc,) = doc["processes"]
    assert doc["monotonic_ns"] - proc["attached_ns"] >= 2 * 10**9
    assert proc["checkpoints"] > 0 and doc["window_s"] >= 2
