"""Ctrl-C and SIGTERM stop `record` cleanly at every instant: while it loads, resolves, compiles,
attaches, opens its output and before the first event, and while it records. Each stop is one
of two outcomes, and the test takes either: stopped before the output was opened (one line, the
shell's status for the signal, nothing written, the command never run) or after (a complete
trace at -o, stop_reason saying which signal). Never a traceback, a hang, a lost stop or a
command left running. And a FIFO output with nobody reading it is one line, not a recorder
blocked in open()."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from ckptrace.core.trace import read_trace
from helpers import CKPTRACE, assert_no_traceback, assert_one_line_error, ckptrace, proc_status, truth_count

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

# Seconds after the CLI took the stop signals over (its main started), then after the start line.
EARLY = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
LATE = (0.0, 0.3)
HANG_S = 120  # a stop that takes longer than this was lost


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` (/proc/PID/status SigCgt): ckptrace's main has run."""
    return bool(int(proc_status(pid).get("SigCgt", "0"), 16) & (1 << (sig - 1)))


def running_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (a path unique to one run)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def stop_at(tmp_path, workload, sig: int, delay: float, after_start_line: bool, i: int):
    out, truth = tmp_path / f"t{i}.parquet", tmp_path / f"t{i}.truth.jsonl"
    p = subprocess.Popen([CKPTRACE, "record", "-o", out, "--", workload, "--iterations", "1000000",
                          "--truth", truth], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if after_start_line:
            line = p.stderr.readline()
            assert line.startswith("ckptrace: tracing"), line
        else:
            t0 = time.monotonic()
            while not catches(p.pid, signal.SIGTERM):
                assert p.poll() is None and time.monotonic() - t0 < HANG_S
                time.sleep(0.002)
        time.sleep(delay)
        p.send_signal(sig)
        _, err = p.communicate(timeout=HANG_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    done = subprocess.CompletedProcess(p.args, p.returncode, "", err)
    assert_no_traceback(done)
    name = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[sig]
    assert not running_with(str(truth)), f"the command outlived the recorder: {err}"
    if done.returncode == 128 + sig:  # stopped before the output was opened
        assert_one_line_error(done, name)
        assert not out.exists(), err
        return "before"
    assert done.returncode == 0, err
    tr = read_trace(out)
    assert tr.meta.complete and tr.meta.stop_reason == name, err
    return "after"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_at_any_instant_is_clean(tmp_path, workload, sig):
    seen = [stop_at(tmp_path, workload, sig, d, False, i) for i, d in enumerate(EARLY)]
    seen += [stop_at(tmp_path, workload, sig, d, True, len(EARLY) + i) for i, d in enumerate(LATE)]
    assert seen[-len(LATE):] == ["after"] * len(LATE)  # once tracing, the trace is always written
    assert seen[0] == "before"  # at main's first instant nothing can have been opened


def test_a_fifo_nobody_reads_is_one_line(tmp_path, workload):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    truth = tmp_path / "t.jsonl"
    p = ckptrace("record", "-o", fifo, "--", workload, "--iterations", "3", "--truth", truth, timeout=HANG_S)
    assert_one_line_error(p, "no process reads")
    assert not truth.exists()  # the command never ran


def test_a_fifo_with_a_reader_gets_the_trace(tmp_path, workload):
    fifo, copy, truth = tmp_path / "fifo", tmp_path / "copy.parquet", tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    with open(copy, "wb") as sink:
        reader = subprocess.Popen(["cat", fifo], stdout=sink)
        try:
            p = ckptrace("record", "--quiet", "-o", fifo, "--", workload, "--iterations", "3", "--truth", truth,
                         timeout=HANG_S)
            assert p.returncode == 0, p.stderr
            assert reader.wait(60) == 0
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
    tr = read_trace(copy)
    assert tr.meta.complete and (tr.events["kind"] == "checkpoint").sum() == truth_count(truth) > 0


def test_a_stop_raised_inside_a_class_definition_is_still_a_stop():
    """A signal handler's raise can land in a lazy import's class body: Python 3.11 wraps what
    `__set_name__` raises in a RuntimeError (the run of 1340410's CI: a traceback, not one line)."""
    import signal as _signal

    from ckptrace.probes.stop import Interrupted, interruption

    class Descriptor:
        def __set_name__(self, owner, name):
            raise Interrupted(_signal.SIGINT, True)

    with pytest.raises(BaseException) as caught:
        type("Plan", (), {"field": Descriptor()})
    stop = interruption(caught.value)
    assert isinstance(stop, Interrupted) and stop.exit_code == 130
    assert interruption(RuntimeError("unrelated")) is None
