"""`ckptrace record` on the real kernel, checked against the sample workload's own clock and faults."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from ckptrace.trace import read_trace
from helpers import (CKPTRACE, NO_BCC, assert_one_line_error, ckptrace, clock_tolerance, go, load_truth, record_with_truth,
                     recorder, started, waiting_workload)

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
        "fill_faults": ck["ckpt"].map(fill["faults"]).fillna(0), "truth_fill_faults": t["fill_faults"],
        "copy_faults": ck["ckpt"].map(copy["faults"]), "truth_copy_faults": t["copy_faults"],
        "has_fill": ck["ckpt"].isin(fill.index), "truth_pool_hit": t["pool_hit"].astype(bool),
        "start_ns": ck["start_ns"], "truth_start_ns": t["start_ns"],
    })


def assert_matches_truth(m: pd.DataFrame, timing: bool = True) -> None:
    assert (m["tid"] == m["truth_tid"]).all()
    assert (m["bytes"] == m["truth_bytes"]).all()
    # A checkpoint has a fill row exactly when the workload's resize had to grow.
    assert (m["has_fill"] == ~m["truth_pool_hit"]).all()
    for col in ("fill_ns", "copy_ns") if timing else ():
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
    assert (m["fill_faults"] >= m["bytes"] // 4096).all()
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
    # Three busy threads on two cores: the workload's clock reads around each call can be
    # preempted, so times are checked in the other tests; here counts, sizes and faults.
    for draft in (False, True):
        assert_matches_truth(checkpoints_vs_truth(r.trace, r.truth, draft=draft), timing=False)
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
    per_fault_1 = fill["fault_timed_ns"].sum() / fill["fault_timed"].sum()
    # 8: faults are timed in one 0.25 s slice of every 8, so some fills are timed and some not.
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "90", "--decode-us", "500"],
                          "--fault-sample", "8", name="s8")
    fill = spans(r.trace.events, "fill")
    assert (fill["fault_timed"] <= fill["faults"]).all()
    assert (fill["fault_timed"] == 0).any() and (fill["fault_timed"] == fill["faults"]).any()
    assert r.trace.meta.fault_slices_timed >= 2
    per_fault_8 = fill["fault_timed_ns"].sum() / fill["fault_timed"].sum()
    assert 0.5 < per_fault_8 / per_fault_1 < 2.0  # the same quantity, sampled
    # 0: no per-fault program at all; counts are still exact.
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "3"], "--fault-sample", "0",
                          name="s0")
    fill = spans(r.trace.events, "fill")
    assert (fill["fault_timed"] == 0).all() and (fill["faults"] > 0).all()


def test_launched_command_exit_code_is_reported(tmp_path, workload):
    r = record_with_truth(tmp_path, [str(workload), "--iterations", "3", "--exit-code", "3"])
    assert r.summary["exit_code"] == 3 and r.trace.meta.exit_code == 3
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
    wl = subprocess.Popen([str(workload), "--iterations", "1000000", "--truth", str(tmp_path / "mid.jsonl")],
                          stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.4)  # let it get going; we attach while checkpoints are being made
        with recorder(tmp_path / "live.parquet", "--pid", wl.pid) as rec:
            time.sleep(2.0)
            wl.kill()  # and it dies mid-recording, most likely inside a checkpoint
            wl.wait(30)
            _, err = rec.communicate(timeout=60)
            assert rec.returncode == 0 and "Traceback" not in err, err
    finally:
        wl.kill()
        wl.wait()
    trace = read_trace(tmp_path / "live.parquet")
    assert trace.meta.stop_reason == "target exited"
    truth = load_truth(tmp_path / "mid.jsonl")["checkpoint"]
    ev = trace.events
    ck = ev[ev["kind"] == "checkpoint"]
    assert len(ck) > 0 and ck["start_ns"].min() > truth["start_ns"].min()  # attached mid-run
    # Every recorded checkpoint is a whole one the workload made: same start, same length, and
    # its fill and copy are both there unless it was a pool hit.
    # The workload writes its truth line after the checkpoint returns: the kill can fall between.
    ck = ck[ck["start_ns"] <= truth["start_ns"].max() + 1e6]
    t = truth.rename(columns={"start_ns": "truth_start_ns", "end_ns": "truth_end_ns"})
    joined = pd.merge_asof(ck.sort_values("start_ns"), t.sort_values("truth_start_ns"),
                           left_on="start_ns", right_on="truth_start_ns", direction="nearest")
    assert ((joined["start_ns"] - joined["truth_start_ns"]).abs() < 1e6).all()
    dur = joined["end_ns"] - joined["start_ns"]
    truth_dur = joined["truth_end_ns"] - joined["truth_start_ns"]
    assert ((dur - truth_dur).abs() <= 0.05 * truth_dur + 0.5e6).all()
    # A fill or copy of the checkpoint the kill interrupted can be in the trace; its checkpoint
    # is not, and the analysis counts only whole checkpoints.
    all_ck = ev[ev["kind"] == "checkpoint"]["ckpt"]
    orphans = ev[ev["kind"].isin(["fill", "copy"]) & ~ev["ckpt"].isin(all_ck)]["ckpt"].unique()
    assert len(orphans) <= 1 and (orphans > all_ck.max()).all()
    assert len(orphans) <= trace.meta.open_at_stop.checkpoints
    from ckptrace.analyzers import analyze_trace

    assert sorted(analyze_trace(trace).checkpoints["ckpt"]) == sorted(all_ck)


@pytest.mark.parametrize("sig,reason", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated"),
                                        (signal.SIGHUP, "hangup"), (signal.SIGQUIT, "quit")])
def test_stop_by_signal_keeps_what_was_recorded(tmp_path, workload, sig, reason):
    trace_path = tmp_path / "live.parquet"
    with recorder(trace_path, "--", workload, "--iterations", "100000", "--decode-us", "500") as rec:
        time.sleep(2.0)
        rec.send_signal(sig)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0 and "Traceback" not in err, err
    trace = read_trace(trace_path)
    assert trace.meta.stop_reason == reason
    assert (trace.events["kind"] == "checkpoint").sum() > 0
    assert trace.meta.exit_code is not None  # the command we started was stopped, not left behind


def test_second_ctrl_c_while_stopping_keeps_the_trace(tmp_path, workload):
    trace_path = tmp_path / "live.parquet"
    with recorder(trace_path, "--", workload, "--iterations", "100000", "--decode-us", "500") as rec:
        time.sleep(1.5)
        rec.send_signal(signal.SIGINT)
        time.sleep(0.05)
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0 and "Traceback" not in err, err
    assert read_trace(trace_path).meta.stop_reason == "interrupted"


@pytest.mark.parametrize("sigterm", ["default", "ignored"])
def test_a_killed_recorder_takes_its_command_with_it(tmp_path, workload, sigterm):
    """Also when the recorder inherited SIGTERM as ignored (nohup-like), which its command inherits."""
    ignore = (lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) if sigterm == "ignored" else None
    with started([CKPTRACE, "record", "--quiet", "-o", tmp_path / "k.parquet", "--", workload, "--iterations",
                  "1000000"], ready="ckptrace: tracing", preexec_fn=ignore) as (rec, line):
        child = int(line.split("(pid ")[1].split(")")[0])
        rec.kill()
        rec.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists(), "the launched command outlived its recorder"


def test_unwritable_output_is_rescued(tmp_path, workload):
    p = ckptrace("record", "--quiet", "-o", "/proc/ckptrace-test.parquet", "--", workload, "--iterations", "3")
    last = p.stderr.strip().splitlines()[-1]  # it recorded first, so the error is the last line
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert last.startswith("ckptrace: error: cannot write the trace /proc/ckptrace-test.parquet: ")
    rescued = Path(last.split("saved to ")[1].strip())
    try:
        assert (read_trace(rescued).events["kind"] == "checkpoint").sum() == 2
    finally:
        rescued.unlink()


def test_duration(tmp_path, workload):
    with waiting_workload(workload, "--iterations", "100000") as wl:
        t0 = time.monotonic()
        p = ckptrace("record", "--quiet", "--pid", wl.pid, "--duration", "1", "-o", tmp_path / "d.parquet",
                     timeout=60)
        assert p.returncode == 0, p.stderr
        assert wl.poll() is None  # attaching never stops someone else's process
    assert read_trace(tmp_path / "d.parquet").meta.stop_reason == "duration"
    assert time.monotonic() - t0 < 30


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
