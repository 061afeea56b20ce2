"""Several processes in one recording (`record --pid A --pid B`, `--comm NAME`), and checkpoint
memory recorded from real processes, each against the workload's own truth file: its checkpoints,
the bytes its checkpoints and pool hold (buffer capacities) and its RSS (/proc/self/statm)."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from ckptrace.analyzers.processes import process_traces
from ckptrace.core.trace import read_trace
from ckptrace.core.units import MIB
from helpers import (CKPTRACE, assert_one_line_error, ckptrace, go, load_truth, started, truth_records,
                     waiting_workload)
from test_record import assert_matches_truth, checkpoints_vs_truth

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

PAGE = 4096  # glibc maps a buffer with one page more, for its chunk header
# RSS rows come every 1 MiB moved (--rss-step), read at checkpoints, iterations and munmaps (or
# per fault with --rss-per-fault); the kernel's per-CPU counters lag by up to a batch per CPU;
# the workload samples its RSS between iterations only.
RSS_SLACK = 4 * MIB
# Pool on, a new request every 3 prefills with the state growing 8 MiB a prefill: the first
# request's buffers stay pooled and serve every later one (docs/validation.md, the pool's memory cost).
POOLED = ["--iterations", "18", "--ckpt-mib", "40", "--grow-mib", "8", "--request-prefills", "3"]


def memory_truth(path) -> dict:
    """The workload's high-water marks: held = buffer capacities + a page each, as mapped."""
    rows = [r for r in truth_records(path) if r["type"] == "memory"]
    return {"held": max(r["held_bytes"] + PAGE * r["held_buffers"] for r in rows),
            "rss": max(r["rss_bytes"] for r in rows)}


def assert_memory_matches(memory: dict, truth: dict) -> None:
    assert memory["peak_held_bytes"] == truth["held"], (memory["peak_held_bytes"], truth["held"])
    assert abs(memory["peak_rss_bytes"] - truth["rss"]) <= RSS_SLACK, (memory["peak_rss_bytes"], truth["rss"])


def analyze_json(path) -> dict:
    p = ckptrace("analyze", "--json", path)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_two_pids_each_process_matches_its_own_truth(tmp_path, workload):
    """Two processes of the same binary (their uprobes share one inode) with different sizes and
    pool modes; the shorter one exits first and the recording goes on with the other."""
    ta, tb, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "two.parquet"
    with waiting_workload(workload, "--iterations", "6", "--ckpt-mib", "40", truth=ta) as a, \
            waiting_workload(workload, *POOLED, "--pool", "on", truth=tb) as b, \
            started([CKPTRACE, "record", "--quiet", "-o", out, "--pid", f"{a.pid}=alpha", "--pid", b.pid],
                    ready="ckptrace: tracing") as (rec, line):
        assert f"PID {a.pid} (" in line and f"PID {b.pid} (" in line and "RSS" in line
        go(a)
        assert a.wait(120) == 0
        # b starts once the recorder has seen a go: the order is an event, not a race on busy cores
        assert rec.stderr.readline().strip() == f"ckptrace: PID {a.pid} (ckpt-workload) exited; recording the others"
        go(b)
        assert b.wait(120) == 0
        _, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
    trace = read_trace(out)
    assert trace.meta.stop_reason == "target exited" and trace.meta.pid is None
    procs = {p.pid: p for p in trace.meta.processes}
    assert procs[a.pid].label == "alpha" and procs[b.pid].label == "ckpt-workload#2"
    assert procs[a.pid].comm == procs[b.pid].comm == "ckpt-workload"
    assert procs[a.pid].build_id and procs[a.pid].build_id == procs[b.pid].build_id
    assert procs[a.pid].exited_ns < procs[b.pid].exited_ns
    subs = {info.pid: sub for info, sub in process_traces(trace)}
    assert set(subs) == {a.pid, b.pid} and set(trace.events["pid"].unique()) == {a.pid, b.pid}
    for pid, truth in ((a.pid, ta), (b.pid, tb)):
        assert_matches_truth(checkpoints_vs_truth(subs[pid], load_truth(truth)))
    doc = analyze_json(out)
    entries = {p["pid"]: p for p in doc["processes"]}
    for pid, truth in ((a.pid, ta), (b.pid, tb)):
        summary = truth_records(truth)[-1]
        assert entries[pid]["summary"]["checkpoints"] == summary["checkpoints"]
        assert entries[pid]["summary"]["pool_hits"] == summary["pool_hits"]
        assert_memory_matches(entries[pid]["memory"], memory_truth(truth))
    text = ckptrace("analyze", out).stdout
    assert "2 processes" in text and "alpha" in text and "ckpt-workload#2" in text


def test_comm_waits_then_attaches_to_every_process_of_that_name(tmp_path, workload):
    """A name no other test uses (a symlink's name is the process's comm; the libraries are
    found through the real path): the recorder waits, says so, then takes both."""
    name = "ckw-" + uuid.uuid4().hex[:8]
    link = tmp_path / name
    os.symlink(workload, link)
    out = tmp_path / "comm.parquet"
    with started([CKPTRACE, "record", "--quiet", "-o", out, "--comm", name, "--hint-after", "0.5"],
                 ready="ckptrace: no process named") as (rec, hint):
        assert repr(name) in hint and "still waiting" in hint
        ta, tb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        with waiting_workload(link, "--iterations", "6", truth=ta) as a, \
                waiting_workload(link, "--iterations", "9", "--pool", "on", truth=tb) as b:
            line = rec.stderr.readline()
            assert line.startswith("ckptrace: tracing") and f"PID {a.pid} (" in line and f"PID {b.pid} (" in line, line
            go(a)
            go(b)
            assert a.wait(120) == 0 and b.wait(120) == 0
            _, err = rec.communicate(timeout=120)
            assert rec.returncode == 0, err
    trace = read_trace(out)
    labels = {p.pid: p.label for p in trace.meta.processes}
    first, second = sorted((a.pid, b.pid))
    assert labels == {first: f"{name}#1", second: f"{name}#2"}  # by pid: the order they started
    subs = {info.pid: sub for info, sub in process_traces(trace)}
    for pid, truth in ((a.pid, ta), (b.pid, tb)):
        assert_matches_truth(checkpoints_vs_truth(subs[pid], load_truth(truth)))


def test_pool_costs_memory_and_saves_fill(tmp_path, workload):
    """Pool-off against pool-on on the same work: compare shows the fill the pool saves beside the
    checkpoint memory it holds, each leg's peaks equal to the workload's own."""
    legs = []
    for pool in ("off", "on"):
        out, truth = tmp_path / f"{pool}.parquet", tmp_path / f"{pool}.jsonl"
        p = ckptrace("record", "--quiet", "--json", "-o", out, "--label", f"pool-{pool}", "--", workload, *POOLED,
                     "--pool", pool, "--truth", truth, timeout=180)
        assert p.returncode == 0, p.stderr
        (proc,) = json.loads(p.stdout)["processes"]
        assert proc["label"] == "ckpt-workload#1" and proc["pid"] == truth_records(truth)[-1]["pid"]
        assert_memory_matches(analyze_json(out)["memory"], memory_truth(truth))
        legs.append((out, memory_truth(truth)))
    p = ckptrace("compare", "--json", legs[0][0], legs[1][0])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    mem = {m["metric"]: m for m in doc["memory"]}
    held = mem["held_peak_mib"]
    assert held["verdict"] == "single figures"
    assert held["baseline_value"] * MIB == legs[0][1]["held"] and held["candidate_value"] * MIB == legs[1][1]["held"]
    assert held["change_mib"] > 100  # 6 buffers pooled against 2 in use: 288 against 112 MiB
    # The fill saved, in page faults: exact counts, where its CPU time moves with the machine's load
    # (a verdict on it read 'no change' once on a busy machine).
    faults = {m["metric"]: m for m in doc["metrics"]}["checkpoint_faults"]
    assert faults["verdict"] == "faster" and faults["change_pct"] < -30  # half the checkpoints hit
    assert "Time against memory: fill" in doc["explanation"] and "held checkpoint memory +" in doc["explanation"]


def tracepoints_of(pid: int) -> set[str]:
    """The tracepoints a process holds BPF programs on, as the kernel lists them."""
    p = subprocess.run(["bpftool", "-j", "perf", "list"], capture_output=True, text=True, check=True)
    return {e["tracepoint"] for e in json.loads(p.stdout) if e["pid"] == pid and e["fd_type"] == "tracepoint"}


@pytest.mark.parametrize("per_fault", [False, True], ids=["default", "rss-per-fault"])
def test_rss_without_a_program_per_fault_and_with_one(tmp_path, workload, per_fault):
    """At defaults no program runs per page fault (kmem:rss_stat is not attached, as the kernel's
    list of the recorder's perf events says): RSS is read from the process's counters at its
    checkpoints, iterations and munmaps, and its peak is still the workload's own (/proc/self/statm).
    --rss-per-fault attaches kmem:rss_stat and meets the same truth (a process already running:
    its counters at attach are the start)."""
    out, truth = tmp_path / "r.parquet", tmp_path / "r.jsonl"
    extra = ["--rss-per-fault"] if per_fault else []
    with waiting_workload(workload, *POOLED, "--pool", "off", truth=truth) as w, \
            started([CKPTRACE, "record", "--quiet", "-o", out, *extra, "--pid", w.pid],
                    ready="ckptrace: tracing") as (rec, line):
        assert "RSS (a row per 1 MiB moved, " + ("per fault)" if per_fault else "at checkpoints") in line, line
        held = tracepoints_of(rec.pid)
        assert "sys_enter_munmap" in held and ("rss_stat" in held) == per_fault, held
        go(w)
        assert w.wait(120) == 0
        _, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
    memory = analyze_json(out)["memory"]
    assert memory["rss_samples"] > 0
    assert_memory_matches(memory, memory_truth(truth))


def test_bad_multi_process_input(tmp_path):
    out = tmp_path / "x.parquet"
    assert_one_line_error(ckptrace("record", "-o", out, "--pid", "12x"), "--pid", code=2)
    assert_one_line_error(ckptrace("record", "-o", out, "--pid", "1", "--comm", "x"), "exactly one", code=2)
    name = "ckw-none-" + uuid.uuid4().hex[:5]
    line = assert_one_line_error(ckptrace("record", "-o", out, "--comm", name, "--duration", "0.5", "--quiet"))
    assert f"no process named {name!r} appeared in 0.5 s" in line
    assert_one_line_error(ckptrace("record", "-o", out, "--comm", "a/b"), "process name")
    assert not out.exists()


def test_a_pid_given_to_a_new_process_is_not_the_recorded_one(tmp_path, workload):
    """The recorded process exits and the kernel gives its pid to a new process (made so here,
    with clone3's set_tid, while the recorder is stopped and can't see the gap): the recorder
    knows its process by pid and start time, so it ends the recording ('target exited') instead
    of taking the newcomer for it."""
    import signal
    import subprocess

    from helpers import recorder, spawner, start_ticks, stopped, wait_until

    spawn = spawner(tmp_path)
    out = tmp_path / "r.parquet"
    with waiting_workload(workload, "--iterations", "3") as old:
        pid, ticks = old.pid, start_ticks(old.pid)
        with recorder(out, "--pid", pid) as rec:
            rec.send_signal(signal.SIGSTOP)
            wait_until(lambda: stopped(rec.pid), "the recorder to stop", watch=rec)
            old.kill()
            old.wait(60)
            with started([spawn, pid, workload, "--wait-signal"], ready="ready pid=") as (new, line):
                assert line.strip() == f"ready pid={pid}"  # the same pid, another process
                rec.send_signal(signal.SIGCONT)
                assert rec.wait(60) == 0, rec.stderr.read()
                assert new.poll() is None  # still waiting: it was never taken for the recorded one
                os.kill(pid, signal.SIGKILL)
    meta = read_trace(out).meta
    assert meta.stop_reason == "target exited"
    (proc,) = meta.processes
    assert proc.pid == pid and proc.start_ticks == ticks and proc.exited_ns is not None
