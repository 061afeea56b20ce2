"""`ckptrace record` on the real kernel, checked against the sample workload's own clock and faults."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.core.trace import VERSION, read_trace
from helpers import (CKPTRACE, NO_BCC, assert_one_line_error, ckptrace, clock_tolerance, go, launched_pid, load_truth,
                     proc_status, record_with_truth, recorder, signal_pending, started, truth_count, wait_for_truth,
                     wait_until, waiting_workload)

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]


def spans(events: pd.DataFrame, kind: str) -> pd.DataFrame:
    s = events[events["kind"] == kind].copy()
    s["dur_ns"] = s["end_ns"] - s["start_ns"]
    return s.set_index("ckpt") if kind in ("fill", "copy") else s


def checkpoints_vs_truth(trace, truth, draft: bool = False) -> pd.DataFrame:
    """One row per checkpoint: the recorder's figures beside the workload's own."""
    ev = trace.events
    ck = ev[(ev["kind"] == "checkpoint") & (ev["draft"] == draft)].reset_index(drop=True)
    fill, copy = spans(ev, "fill"), spans(ev, "copy")
    t = truth["checkpoint"]
    t = t[t["draft"] == draft].sort_values("start_ns").reset_index(drop=True)
    assert len(ck) == len(t), f"recorded {len(ck)} checkpoints, workload made {len(t)}"
    return pd.DataFrame({
        "tid": ck["tid"], "truth_tid": t["tid"],
        "bytes": ck["bytes"], "truth_bytes": t["bytes"],
        "fill_ns": ck["ckpt"].map(fill["dur_ns"]).fillna(0), "truth_fill_ns": t["fill_ns"],
        "copy_ns": ck["ckpt"].map(copy["dur_ns"]), "truth_copy_ns": t["copy_ns"],
        "fill_cpu_ns": ck["ckpt"].map(fill["cpu_ns"]).fillna(0).astype("int64"),
        "truth_fill_cpu_ns": t["fill_cpu_ns"].where(~t["pool_hit"].astype(bool), 0),
        "copy_cpu_ns": ck["ckpt"].map(copy["cpu_ns"]).astype("int64"), "truth_copy_cpu_ns": t["copy_cpu_ns"],
        "cpu_ns": ck["cpu_ns"].astype("int64"), "truth_cpu_ns": t["cpu_ns"],
        "fill_faults": ck["ckpt"].map(fill["faults"]).fillna(0), "truth_fill_faults": t["fill_faults"],
        "copy_faults": ck["ckpt"].map(copy["faults"]), "truth_copy_faults": t["copy_faults"],
        "has_fill": ck["ckpt"].isin(fill.index), "truth_pool_hit": t["pool_hit"].astype(bool),
        "start_ns": ck["start_ns"], "truth_start_ns": t["start_ns"],
    })


def assert_matches_truth(m: pd.DataFrame) -> None:
    assert (m["tid"] == m["truth_tid"]).all()
    assert (m["bytes"] == m["truth_bytes"]).all()
    # A checkpoint has a fill row exactly when the workload's resize had to grow.
    assert (m["has_fill"] == ~m["truth_pool_hit"]).all()
    # On the thread's CPU clock: on a busy machine wall time is mostly waiting for a CPU, and a
    # preemption between the workload's clock read and the probe would move a wall figure by a
    # time slice. Measured under load, recorder against workload: 5 to 50 us.
    for col in ("fill_cpu_ns", "copy_cpu_ns", "cpu_ns"):
        err = (m[col] - m[f"truth_{col}"]).abs()
        bad = m[err > clock_tolerance(m[f"truth_{col}"])]
        assert bad.empty, f"{col} off the workload's clock:\n{bad[[col, f'truth_{col}']].to_string()}"
    for col in ("fill_faults", "copy_faults"):
        err = (m[col] - m[f"truth_{col}"]).abs()
        assert (err <= 0.01 * m[f"truth_{col}"]).all(), m[[col, f"truth_{col}"]]


def test_fresh_buffers_match_the_workload(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "9", "--pool", "off"], "--label", "pool-off")
    m = checkpoints_vs_truth(r.trace, r.truth)
    assert len(m) == 6
    assert_matches_truth(m)
    # Every page of a fresh 48 MiB buffer faults in the fill, none in the copy.
    assert (m["fill_faults"] >= m["bytes"] // os.sysconf("SC_PAGE_SIZE")).all()  # 4 KiB here; 16 or 64 KiB on arm64
    assert (m["copy_faults"] == 0).all()
    # Each fill mmap()s its buffer: the mmap happens inside the fill phase.
    mm = r.trace.events[(r.trace.events["kind"] == "mmap") & (r.trace.events["phase"] == "fill")]
    assert len(mm) == len(m) and (mm["bytes"] >= m["bytes"].min()).all()
    assert r.trace.meta.label == "pool-off" and r.trace.meta.lost_events == 0
    assert r.summary["checkpoints"] == 6 and r.summary["exit_code"] == 0


def test_pooled_buffers_have_no_fill_faults_or_mmaps_after_warmup(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "15", "--pool", "on"])
    m = checkpoints_vs_truth(r.trace, r.truth)
    assert_matches_truth(m)
    warm = m.iloc[4:]  # slots * keep + slots, as the workload's own test uses
    assert len(warm) >= 4 and warm["truth_pool_hit"].all()
    assert (~warm["has_fill"]).all() and (warm["fill_faults"] == 0).all()
    ev = r.trace.events
    ck_ids = ev[ev["kind"] == "checkpoint"]["ckpt"].iloc[4:]
    churn = ev[ev["kind"].isin(["mmap", "munmap"]) & ev["ckpt"].isin(ck_ids)]
    assert churn.empty, churn


def test_growing_buffers_never_hit(tmp_path, workload):
    r = record_with_truth(
        tmp_path, [str(workload), "--iterations", "12", "--pool", "on", "--grow-mib", "8"])
    m = checkpoints_vs_truth(r.trace, r.truth)
    assert_matches_truth(m)
    assert m["has_fill"].all() and m["bytes"].is_monotonic_increasing


def test_other_threads_growing_vectors_are_not_checkpoints(tmp_path, workload):
    # Noise threads call the same _M_default_append and the same state copy outside update_tgt.
    r = record_with_truth(
        tmp_path, [str(workload), "--iterations", "9", "--noise-threads", "2", "--draft"])
    assert r.truth["summary"]["noise_calls"].iloc[0] > 0
    # Three busy threads on two cores: wall times are mostly waiting; on-CPU times still match.
    for draft in (False, True):
        assert_matches_truth(checkpoints_vs_truth(r.trace, r.truth, draft=draft))
    ev = r.trace.events
    phases = ev[ev["kind"].isin(["fill", "copy"])]
    assert (phases["ckpt"] > 0).all()
    assert set(phases["tid"]) == set(r.truth["checkpoint"]["tid"])


def test_static_non_pie_build(tmp_path, static_workload):
    r = record_with_truth(tmp_path, [str(static_workload), "--iterations", "6"])
    assert_matches_truth(checkpoints_vs_truth(r.trace, r.truth))


def test_launch_sees_from_the_first_instruction(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "6"])
    ev = r.trace.events
    it = ev[ev["kind"] == "iteration"]
    assert len(it) == len(r.truth["iteration"])  # none missed at the start
    # The dynamic loader mmap()s the three sample libraries before main(): we saw those too.
    before_main = ev[(ev["kind"] == "mmap") & (ev["start_ns"] < it["start_ns"].min())]
    assert len(before_main) >= 6
    assert r.trace.meta.mode == "launch" and r.trace.meta.partial_spans == 0


def test_iterations_and_batches(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "9", "--slots", "3"])
    ev = r.trace.events
    it = ev[ev["kind"] == "iteration"].reset_index(drop=True)
    t = r.truth["iteration"].sort_values("start_ns").reset_index(drop=True)
    assert (it["tokens"] == t["tokens"]).all()
    # Prompt tokens ask for no logits except each slot's last one.
    prefill = t["kind"] == "prefill"
    assert (it.loc[prefill, "prompt_tokens"] == t.loc[prefill, "tokens"] - 3).all()
    assert (it.loc[~prefill, "prompt_tokens"] == 0).all()
    # Each checkpoint belongs to the update_slots call that made it.
    ck = ev[ev["kind"] == "checkpoint"]
    per_iter = ck.groupby("iter").size().reindex(it["iter"], fill_value=0).to_numpy()
    assert (per_iter == t["checkpoints"].to_numpy()).all()


def test_fault_time_sampling(tmp_path, workload):
    # 1: every fault inside a checkpoint is timed, from the first instruction on.
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "6"], "--fault-sample", "1",
                          name="s1")
    fill = spans(r.trace.events, "fill")
    assert ((fill["fault_timed"] - fill["faults"]).abs() <= 0.01 * fill["faults"]).all(), fill
    # Timed service time is part of the fill and positive.
    assert ((fill["fault_timed_ns"] > 0) & (fill["fault_timed_ns"] < fill["dur_ns"])).all()
    # 8: faults are timed in one 0.25 s slice of every 8 (at 0, 2, 4 s...), so some fills are
    # timed and some not. An endless workload recorded for 4.5 s spans three timed slices however
    # fast this machine runs it.
    p = ckptrace("record", "--quiet", "--fault-sample", "8", "--duration", "4.5", "-o", tmp_path / "s8.parquet",
                 "--", workload, "--iterations", "1000000", "--decode-us", "500")
    assert p.returncode == 0, p.stderr
    trace = read_trace(tmp_path / "s8.parquet")
    assert trace.meta.stop_reason == "duration"
    fill = spans(trace.events, "fill")
    assert (fill["fault_timed"] <= fill["faults"]).all()
    # Some fills had faults timed and some had faults untimed. (Not "some fill timed whole": under
    # load one fill takes half a slice or more, and then hardly any fits inside one.)
    assert (fill["fault_timed"] > 0).any() and (fill["fault_timed"] < fill["faults"]).any()
    assert trace.meta.fault_slices_timed >= 2
    # The same quantity as with 1, sampled: a positive part of each fill it timed. (Not a ratio
    # of the two runs' means: that moves with the machine's load, 0.4 with two builds running.)
    timed = fill[fill["fault_timed"] > 0]
    assert ((timed["fault_timed_ns"] > 0) & (timed["fault_timed_ns"] < timed["dur_ns"])).all(), timed
    # 0: no per-fault program at all; counts are still exact.
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "3"], "--fault-sample", "0",
                          name="s0")
    fill = spans(r.trace.events, "fill")
    assert (fill["fault_timed"] == 0).all() and (fill["faults"] > 0).all()


def test_launched_command_exit_code_is_reported(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "3", "--exit-code", "3"], rc=3)
    assert r.summary["exit_code"] == 3 and r.trace.meta.exit_code == 3  # and record's own status (rc)
    assert "exit code 3" in r.proc.stderr


def test_attach_by_pid_until_the_target_exits(tmp_path, workload):
    truth = tmp_path / "live.truth.jsonl"
    with waiting_workload(workload, "--iterations", "9", truth=truth) as wl, \
            recorder(tmp_path / "live.parquet", "--pid", wl.pid) as rec:
        go(wl)
        assert wl.wait(60) == 0
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
    trace = read_trace(tmp_path / "live.parquet")
    assert trace.meta.mode == "attach" and trace.meta.stop_reason == "target exited"
    assert trace.meta.first_event_ns >= trace.meta.attach_ns
    assert_matches_truth(checkpoints_vs_truth(trace, load_truth(truth)))


def test_attach_mid_run_never_reports_a_partial_checkpoint(tmp_path, workload):
    mid = tmp_path / "mid.jsonl"
    with started([workload, "--iterations", "1000000", "--truth", mid]) as (wl, _):
        wait_for_truth(mid, 1, watch=wl)  # it has made a checkpoint: we attach mid-run
        with recorder(tmp_path / "live.parquet", "--pid", wl.pid) as rec:
            seen = truth_count(mid)
            wait_for_truth(mid, seen + 4, watch=wl)  # some whole checkpoints after the probes arrived
            wl.kill()  # and it dies mid-recording, most likely inside a checkpoint
            wl.wait(30)
            _, err = rec.communicate(timeout=60)
            assert rec.returncode == 0 and "Traceback" not in err, err
    trace = read_trace(tmp_path / "live.parquet")
    assert trace.meta.stop_reason == "target exited"
    truth = load_truth(tmp_path / "mid.jsonl")["checkpoint"]
    ev = trace.events
    ck = ev[ev["kind"] == "checkpoint"]
    assert len(ck) > 0 and ck["start_ns"].min() > truth["start_ns"].min()  # attached mid-run
    # Every recorded checkpoint is a whole one the workload made: same start, same CPU time, and
    # its fill and copy are both there unless it was a pool hit.
    # The workload writes its truth line after the checkpoint returns: the kill can fall between.
    ck = ck[ck["start_ns"] <= truth["start_ns"].max() + 1e6]
    t = truth.rename(columns={"start_ns": "truth_start_ns", "end_ns": "truth_end_ns"})
    joined = pd.merge_asof(ck.sort_values("start_ns"), t.sort_values("truth_start_ns"),
                           left_on="start_ns", right_on="truth_start_ns", direction="nearest")
    assert ((joined["start_ns"] - joined["truth_start_ns"]).abs() < 1e6).all()
    assert ((joined["cpu_ns_x"] - joined["cpu_ns_y"]).abs() <= clock_tolerance(joined["cpu_ns_y"])).all()
    # A fill or copy of the checkpoint the kill interrupted can be in the trace; its checkpoint
    # is not, and the analysis counts only whole checkpoints.
    all_ck = ev[ev["kind"] == "checkpoint"]["ckpt"]
    orphans = ev[ev["kind"].isin(["fill", "copy"]) & ~ev["ckpt"].isin(all_ck)]["ckpt"].unique()
    assert len(orphans) <= 1 and (orphans > all_ck.max()).all()
    assert len(orphans) <= trace.meta.open_at_stop.checkpoints
    assert sorted(analyze_trace(trace).checkpoints["ckpt"]) == sorted(all_ck)


def test_attach_inside_a_checkpoint_reports_only_whole_ones(tmp_path, workload):
    """The probes arrive while the first checkpoint (and its update_slots) is open, by construction:
    the workload pauses between that checkpoint's fill and copy until we have attached."""
    truth_path, trace_path = tmp_path / "t.jsonl", tmp_path / "in.parquet"
    with started([workload, "--pause-in-checkpoint", "--iterations", "6", "--truth", truth_path],
                 ready="paused in checkpoint") as (wl, _):
        with recorder(trace_path, "--pid", wl.pid) as rec:
            go(wl)
            assert wl.wait(60) == 0
            _, err = rec.communicate(timeout=60)
            assert rec.returncode == 0, err
    trace, truth = read_trace(trace_path), load_truth(truth_path)
    ev = trace.events
    # The open checkpoint's copy ran after the attach; its checkpoint and iteration were entered
    # before it. None of the three is in the trace: the copy is not a checkpoint's (none is open),
    # and the returns of the checkpoint, its create_checkpoint and its iteration (uprobes on their
    # return instructions) come without their entries: each is counted, never a row.
    first = truth["checkpoint"].iloc[0]
    assert not ((ev["start_ns"] <= first["end_ns"]) & (ev["end_ns"] >= first["copy_start_ns"])
                & ev["kind"].isin(["checkpoint", "copy", "iteration"])).any()
    assert trace.meta.partial_spans == 3
    # Every other checkpoint is whole and true: the one paused in is missing, the rest are there.
    t = truth["checkpoint"].iloc[1:].reset_index(drop=True)
    ck = ev[ev["kind"] == "checkpoint"].reset_index(drop=True)
    assert len(ck) == len(t) == len(truth["checkpoint"]) - 1
    assert (ck["tid"] == t["tid"]).all() and (ck["bytes"] == t["bytes"]).all()
    assert ((ck["start_ns"] <= t["start_ns"]) & (t["end_ns"] <= ck["end_ns"])).all()
    # The iteration that was open is missing (and its checkpoint's sibling has no iteration).
    assert (ev["kind"] == "iteration").sum() == len(truth["iteration"]) - 1
    assert (ck["iter"] == 0).sum() == (t["iter"] == truth["iteration"]["iter"].iloc[0]).sum()
    assert sorted(analyze_trace(trace).checkpoints["ckpt"]) == sorted(ck["ckpt"])


@pytest.mark.parametrize("sig,reason", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated"),
                                        (signal.SIGHUP, "hangup"), (signal.SIGQUIT, "quit")])
def test_stop_by_signal_keeps_what_was_recorded(tmp_path, workload, sig, reason):
    trace_path = tmp_path / "live.parquet"
    truth = tmp_path / "t.jsonl"
    with recorder(trace_path, "--", workload, "--iterations", "100000", "--decode-us", "500",
                  "--truth", truth) as rec:
        wait_for_truth(truth, 2, watch=rec)
        rec.send_signal(sig)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0 and "Traceback" not in err, err
    trace = read_trace(trace_path)
    assert trace.meta.stop_reason == reason
    assert trace.meta.complete and trace.meta.version == VERSION and trace_path.read_bytes()[:4] == b"PAR1"
    assert (trace.events["kind"] == "checkpoint").sum() >= 2
    # the command we started was stopped by our SIGTERM, not left behind (nor SIGKILLed)
    assert trace.meta.exit_code == -signal.SIGTERM


def test_a_hangup_that_takes_the_terminal_keeps_the_trace(tmp_path, workload):
    """An SSH session dropping: the terminal the status line is drawn on goes away (every write
    to it fails with EIO), then SIGHUP. The recording is still finished, whole."""
    import pty

    trace_path, truth = tmp_path / "live.parquet", tmp_path / "t.jsonl"
    master, slave = pty.openpty()
    rec = subprocess.Popen([CKPTRACE, "record", "-o", trace_path, "--", workload, "--iterations", "100000",
                            "--decode-us", "500", "--truth", truth], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = bytearray()

    def status_drawn() -> bool:
        while select.select([master], [], [], 0)[0]:
            try:
                seen.extend(os.read(master, 4096))
            except OSError:
                break
        return b"checkpoints" in seen  # the status line, as drawn on the terminal

    try:
        wait_for_truth(truth, 2, watch=rec)
        wait_until(status_drawn, "the status line on the recorder's terminal", watch=rec)
        os.close(master)  # the terminal is gone: the recorder's writes to it now fail
        master = None
        rec.send_signal(signal.SIGHUP)
        assert rec.wait(timeout=120) == 0
    finally:
        if master is not None:
            os.close(master)
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    trace = read_trace(trace_path)
    assert trace.meta.complete and trace.meta.stop_reason == "hangup", trace.meta.cut_short
    assert trace_path.read_bytes()[:4] == b"PAR1"
    assert (trace.events["kind"] == "checkpoint").sum() >= 2


def test_second_ctrl_c_while_stopping_keeps_the_trace(tmp_path, workload):
    """The second Ctrl-C arrives while the recorder is stopping, by construction: the launched
    command is SIGSTOPped, so the SIGTERM the first Ctrl-C makes the recorder send it stays pending
    (we see it pending) and the recorder waits for it to die until we SIGCONT it."""
    trace_path, truth = tmp_path / "live.parquet", tmp_path / "t.jsonl"
    with recorder(trace_path, "--", workload, "--iterations", "100000", "--decode-us", "500",
                  "--truth", truth) as rec:
        child = launched_pid(rec.start_line)
        wait_for_truth(truth, 1, watch=rec)
        os.kill(child, signal.SIGSTOP)
        wait_until(lambda: proc_status(child).get("State", "").startswith("T"), "the command to stop", watch=rec)
        rec.send_signal(signal.SIGINT)
        wait_until(lambda: signal_pending(child, signal.SIGTERM), "the recorder's SIGTERM to its command",
                   watch=rec)
        rec.send_signal(signal.SIGINT)  # while it waits for its command to die: it is stopping
        assert rec.poll() is None
        os.kill(child, signal.SIGCONT)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0 and "Traceback" not in err, err
    trace = read_trace(trace_path)
    assert trace.meta.stop_reason == "interrupted" and trace.meta.exit_code == -signal.SIGTERM
    assert (trace.events["kind"] == "checkpoint").sum() >= 1


@pytest.mark.parametrize("sigterm", ["default", "ignored"])
def test_a_killed_recorder_takes_its_command_with_it(tmp_path, workload, sigterm):
    """Also when the recorder inherited SIGTERM as ignored (nohup-like), which its command inherits."""
    ignore = (lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) if sigterm == "ignored" else None
    with started([CKPTRACE, "record", "--quiet", "-o", tmp_path / "k.parquet", "--", workload, "--iterations",
                  "1000000"], ready="ckptrace: tracing", preexec_fn=ignore) as (rec, line):
        child = launched_pid(line)
        assert proc_status(child)
        rec.kill()
        rec.wait(10)
    # it dies (PDEATHSIG) and init reaps it
    wait_until(lambda: not proc_status(child), "the launched command to die with its recorder")


def test_unwritable_output_is_refused_before_the_command_runs(tmp_path, workload):
    """The stream is created at -o before the command starts: a path no file can be made at is
    one line then, with nothing run and nothing recorded to lose."""
    truth = tmp_path / "t.jsonl"
    p = ckptrace("record", "--quiet", "-o", "/proc/ckptrace-test.parquet", "--", workload, "--iterations", "3",
                 "--truth", truth)
    assert_one_line_error(p, "cannot write the trace /proc/ckptrace-test.parquet: ")
    assert not truth.exists()  # the held command never ran


def test_duration(tmp_path, workload):
    """By construction: the target runs about 130 s once signalled (its compute spins on the
    clock, 0.5 s a 64-token ubatch: 67 prefills of 2 ubatches and 133 decodes of 1), longer than
    the 60 s this test waits for the recorder,
    and we ask for 1 s. A recorder that honours --duration stops first and leaves it running; one
    that did not would stop at the target's exit ("target exited"). (With 8 s, a recorder whose
    stop took longer than that on a loaded machine saw the target exit first.)"""
    out = tmp_path / "d.parquet"
    with waiting_workload(workload, "--iterations", "200", "--decode-us", "500000") as wl, \
            recorder(out, "--pid", wl.pid, "--duration", "1") as rec:
        go(wl)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        assert wl.poll() is None  # attaching never stops someone else's process
    meta = read_trace(out).meta
    assert meta.stop_reason == "duration"
    assert meta.stop_ns - meta.attach_ns >= 1e9  # not before the duration


def test_no_checkpoint_hint(tmp_path, workload):
    with waiting_workload(workload, "--iterations", "3") as wl:  # idle: never signalled
        p = ckptrace("record", "--quiet", "--pid", wl.pid, "--duration", "3", "--hint-after", "1",
                     "-o", tmp_path / "h.parquet", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "no checkpoint seen in 1 s" in p.stderr and "recurrent state or SWA" in p.stderr
    assert read_trace(tmp_path / "h.parquet").meta.stop_reason == "duration"


def rec(tmp_path, *args, **kw):
    return ckptrace("record", "--quiet", "-o", tmp_path / "x.parquet", *args, timeout=60, **kw)


def test_bad_inputs(tmp_path, workload):
    assert_one_line_error(rec(tmp_path, "--pid", "999999"), "no process with PID 999999")
    with started(["sleep", "30"]) as (sleeper, _):
        assert_one_line_error(rec(tmp_path, "--pid", sleeper.pid), "update_tgt")
    assert_one_line_error(rec(tmp_path, "--", "/no/such/command"), "command not found")
    assert_one_line_error(rec(tmp_path, "--", "true"), "update_tgt")
    assert_one_line_error(rec(tmp_path, "--", workload, env={"BCC_KERNEL_SOURCE": "/nonexistent"}),
                          "kernel headers")
    assert_one_line_error(rec(tmp_path, "--", workload, entry=NO_BCC), "bcc")
    assert not (tmp_path / "x.parquet").exists()
    p = ckptrace("record", "-o", tmp_path / "x.parquet")
    assert p.returncode == 2 and "exactly one of" in p.stderr


@pytest.mark.parametrize("args, needle", [
    (["--fault-sample", "3"], "--fault-sample"),
    (["--duration", "0"], "--duration"),
    (["--duration", "-1"], "--duration"),
    (["--ringbuf-pages", "3"], "--ringbuf-pages must be a power of two"),
    (["--ringbuf-pages", "0"], "--ringbuf-pages"),
    (["--hint-after", "0"], "--hint-after"),
    (["-o", "{tmp}/no/such/dir/x.parquet"], "no such directory"),
    (["-o", "{tmp}"], "is a directory"),
    (["--pid", "0"], "--pid"),
    (["--pid", "abc"], "--pid"),
    (["--pid", "1", "--"], ""),  # --pid and a command
    (["--bogus"], "--bogus"),
    (["-x"], "No such option '-x'"),  # refused, never taken for the command (perf's rule)
    (["-p", "abc"], "--pid"),  # -p is --pid
    (["-p", "1", "--"], ""),
])
def test_bad_options_are_refused_before_anything_runs(tmp_path, workload, args, needle):
    """Each refused with one line, nothing written and the command never started (its truth file,
    which it opens first thing, does not exist)."""
    truth = tmp_path / "t.jsonl"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "-o" not in args:
        args = ["-o", str(tmp_path / "x.parquet"), *args]
    if "--pid" not in args or args[-1] == "--":
        args = [*args, *([] if args[-1] == "--" else ["--"]), workload, "--iterations", "1", "--truth", truth]
    r = ckptrace("record", *args, timeout=60)
    assert_one_line_error(r, needle)
    assert not truth.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_full_ring_buffer_loses_events_and_counts_them(tmp_path, workload):
    """2000 fast iterations make about 13,000 events (136 bytes each in the ring): a 1-page ring
    (30 events) between two 50 ms drains must overflow unless the run took over 21 s; the default
    2 MiB ring (15,420 events) holds the whole run, so nothing can be lost there."""
    argv = [workload, "--iterations", "2000", "--decode-us", "0", "--ckpt-mib", "1"]
    small = record_with_truth(tmp_path, argv, "--ringbuf-pages", "1", name="small")
    whole = record_with_truth(tmp_path, argv, name="whole")
    for r in (small, whole):
        assert r.summary["lost_events"] == r.trace.meta.lost_events
    ev, truth = whole.trace.events, whole.truth
    assert whole.trace.meta.lost_events == 0
    assert (ev["kind"] == "iteration").sum() == len(truth["iteration"])
    assert (ev["kind"] == "checkpoint").sum() == len(truth["checkpoint"])
    # What the small ring missed, by the workload's own count, is at most what it says it lost.
    ev, truth = small.trace.events, small.truth
    missed = (len(truth["iteration"]) - (ev["kind"] == "iteration").sum()
              + 3 * len(truth["checkpoint"]) - ev["kind"].isin(["checkpoint", "fill", "copy"]).sum())
    assert 0 < missed <= small.trace.meta.lost_events
    assert f"{small.trace.meta.lost_events} events LOST" in small.proc.stderr
    out = ckptrace("analyze", small.path)
    assert out.returncode == 0 and f"WARNING: {small.trace.meta.lost_events} events were lost" in out.stdout


# --- promises about what a recording holds, and how it is written ------------------------------

TRACE_FORMAT_DOC = Path(__file__).resolve().parents[1] / "docs" / "trace-format.md"


def documented_trace_format() -> tuple[dict[str, str], list[str]]:
    """docs/trace-format.md's trace format: {column: dtype} from its table, and its metadata keys."""
    text = TRACE_FORMAT_DOC.read_text().split("## Trace format", 1)[1].split("\n## ", 1)[0]
    columns = {}
    for row in re.findall(r"^\| (`.+?`) \| (\w+) \|", text, re.M):
        for name in re.findall(r"`(\w+)`", row[0]):
            columns[name] = row[1]
    listed = text.split("Metadata keys:", 1)[1].split(".\n", 1)[0]
    keys = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", listed))  # not the values in brackets
    return columns, keys


def test_trace_format_as_other_readers_see_it(tmp_path, workload):
    """A real recording read with plain pandas and pyarrow, checked against docs/trace-format.md's tables."""
    import pyarrow.parquet as pq

    r = record_with_truth(tmp_path, [workload, "--iterations", "3"], "--label", "fmt")
    columns, keys = documented_trace_format()
    # The gpu_* columns and the gpu key are written only for a recording with a CUDA target.
    cuda_only = {c for c in columns if c.startswith("gpu_")}
    assert len(cuda_only) == 9 and "gpu" in keys
    columns = {c: t for c, t in columns.items() if c not in cuda_only}
    keys = [k for k in keys if k != "gpu"]
    assert len(columns) == 26 and "fault_timed_ns" in columns and "cpu_ns" in columns and len(keys) >= 30  # the parse found them
    df = pd.read_parquet(r.path)
    assert {c: str(df[c].dtype) for c in df.columns} == columns
    meta = df.attrs["ckptrace"]
    assert sorted(meta) == sorted(keys)  # every documented key, and no undocumented one
    assert meta["format"] == "ckptrace-trace" and meta["label"] == "fmt" and meta["mode"] == "launch"
    assert json.loads(pq.read_schema(r.path).metadata[b"ckptrace"]) == meta
    assert meta["events"] == len(df) and meta["lost_events"] == 0
    assert len(df[df["kind"] == "checkpoint"]) == len(r.truth["checkpoint"])


def test_mremap_is_a_row_of_its_own(tmp_path, workload):
    r = record_with_truth(tmp_path, [workload, "--iterations", "3", "--mremap"])
    ev, t = r.trace.events, r.truth["mremap"].iloc[0]
    rows = ev[ev["kind"] == "mremap"]
    assert len(rows) == 1, rows
    row = rows.iloc[0]
    assert (row["tid"], row["addr"], row["bytes"]) == (t["tid"], t["addr"], t["bytes"])
    assert row["old_addr"] != 0 and row["old_bytes"] == 1 << 20  # the workload grows a 1 MiB mapping
    assert t["start_ns"] <= row["start_ns"] <= row["end_ns"] <= t["end_ns"]
    # outside every checkpoint, and never counted as a checkpoint's mmap or munmap
    assert row["ckpt"] == 0 and row["phase"] == "none"
    ck = analyze_trace(r.trace).checkpoints
    assert ck["mmaps"].sum() == ev[(ev["kind"] == "mmap") & (ev["ckpt"] > 0)].shape[0]


def test_batches_over_256_tokens(tmp_path, workload):
    """A 400-token prefill batch (2 slots x 200): its token count is exact; prompt tokens are read
    from the first 256 entries of batch.logits (docs/metrics.md), where only slot 0's last token asks for
    logits."""
    r = record_with_truth(tmp_path, [workload, "--iterations", "3", "--slots", "2", "--prompt-tokens", "200"])
    it = r.trace.events[r.trace.events["kind"] == "iteration"].reset_index(drop=True)
    t = r.truth["iteration"].sort_values("start_ns").reset_index(drop=True)
    assert it["tokens"].tolist() == t["tokens"].tolist() == [400, 2, 2]
    assert it["prompt_tokens"].tolist() == [255, 0, 0]
    assert analyze_trace(r.trace).iterations["kind"].tolist() == ["prefill", "decode", "decode"]


def test_live_status_line_on_a_terminal(tmp_path, workload):
    """On a terminal (a pty), record redraws one status line with what it has seen so far: the
    checkpoints and the running median of their fill and copy (wall time), which agree with the
    workload's own clock over the same first checkpoints."""
    import pty

    primary, secondary = pty.openpty()
    truth = tmp_path / "t.jsonl"
    rec = subprocess.Popen([str(CKPTRACE), "record", "-o", str(tmp_path / "s.parquet"), "--", str(workload),
                            "--iterations", "100000", "--decode-us", "500", "--truth", str(truth)],
                           stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary)
    os.close(secondary)
    seen = b""
    line = rb"\r\s*[\d.]+ s  checkpoints (\d+)  fill ([\d.e+]+) copy ([\d.e+]+) ms p50  lost 0  iterations \d+"
    try:
        def status_with_checkpoints():
            nonlocal seen
            if select.select([primary], [], [], 0.5)[0]:  # never block past wait_until's bound
                seen += _read_pty(primary)
            return [m for m in re.finditer(line, seen) if int(m.group(1)) >= 10]
        wait_until(status_with_checkpoints, "a status line with 10 checkpoints and their medians", every_s=0,
                   watch=rec)
        rec.send_signal(signal.SIGINT)
        assert rec.wait(60) == 0
        while chunk := _read_pty(primary):
            seen += chunk
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
        os.close(primary)
    text = seen.decode()
    drawn = [s for s in re.split(r"[\r\n]", text) if " checkpoints " in s and "ckptrace:" not in s]
    assert drawn and all(len(s) <= 80 for s in drawn)
    # cleared before the last line, which says what was written
    assert "\r" + " " * 79 + "\r" in text
    assert text.rstrip().splitlines()[-1].startswith("ckptrace: wrote ")
    # The medians drawn with n checkpoints seen are those of the workload's first m (the recorder
    # launched it: it saw every one), m the checkpoints flushed by then (every 0.5 s): at most n,
    # at least n - 50 here. Each call's span lies inside the workload's wall bracket around it and
    # holds the call's on-CPU time, so its median lies between the workload's on-CPU and wall
    # medians (a preemption at the workload's clock reads widens only the bracket: a CI run under
    # load drew a 50.9 ms fill median where the workload's wall medians were 55.6 to 57.4 ms).
    # Within the clock's tolerance and the median's 1.5% bins.
    truth_ck = load_truth(truth)["checkpoint"]
    for m in re.finditer(line, seen):
        n = int(m.group(1))
        if n < 10:
            continue
        for got, col in ((float(m.group(2)) * 1e6, "fill"), (float(m.group(3)) * 1e6, "copy")):
            ks = range(max(1, n - 50), n + 1)
            lo = min(truth_ck[f"{col}_cpu_ns"].iloc[:k].median() for k in ks)
            hi = max(truth_ck[f"{col}_ns"].iloc[:k].median() for k in ks)
            assert lo - clock_tolerance(lo) - 0.01 * got <= got <= hi + clock_tolerance(hi) + 0.01 * got, \
                (n, col, got, lo, hi)


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other side is closed
        return b""


def test_no_status_line_when_not_a_terminal_or_quiet(tmp_path, workload):
    for quiet in ((), ("--quiet",)):
        p = ckptrace("record", *quiet, "-o", tmp_path / "q.parquet", "--", workload, "--iterations", "6")
        assert p.returncode == 0, p.stderr
        assert "\r" not in p.stderr and not re.search(r" s  checkpoints \d+  fill ", p.stderr), p.stderr


def test_the_trace_is_written_atomically(tmp_path, workload):
    """-o is never written through: when recording starts, the stream replaces the old file by a
    rename (a hard link to the old file keeps its bytes); it reads as a cut-short trace while
    recording (paused inside a checkpoint, by construction) and after the recorder is SIGKILLed;
    a finished recording replaces it with the complete trace and leaves nothing else behind."""
    out = tmp_path / "out.parquet"
    out.write_bytes(b"OLD")
    os.link(out, tmp_path / "old")
    with recorder(out, "--", workload, "--pause-in-checkpoint", "--iterations", "3") as rec:
        child = launched_pid(rec.start_line)
        wait_until(lambda: "paused in checkpoint" in rec.stderr.readline(), "the workload's pause", watch=rec)
        live = read_trace(out)
        assert live.meta.complete is False and live.meta.cut_short and live.meta.version == VERSION
        rec.kill()
        rec.wait(30)
    wait_until(lambda: not proc_status(child), "the launched command to die with its recorder")
    assert (tmp_path / "old").read_bytes() == b"OLD"
    assert read_trace(out).meta.complete is False
    with recorder(out, "--", workload, "--pause-in-checkpoint", "--iterations", "3") as rec:
        child = launched_pid(rec.start_line)
        wait_until(lambda: "paused in checkpoint" in rec.stderr.readline(), "the workload's pause", watch=rec)
        os.kill(child, signal.SIGUSR1)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
    done = read_trace(out)
    assert (done.events["kind"] == "checkpoint").sum() == 2  # launched: the paused one too
    assert done.meta.complete and done.meta.cut_short is None and out.read_bytes()[:4] == b"PAR1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "out.parquet"]
