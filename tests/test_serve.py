"""`ckptrace serve` scraped by a real Prometheus: the series hold what the workload's truth and
`analyze` of a trace recorded over the same run say; bad --listen values are one line."""
from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.memory import memory_summary
from ckptrace.exporters.prometheus import HISTOGRAMS, LABELS, series_names
from ckptrace.core.trace import read_trace
from helpers import (CKPTRACE, assert_one_line_error, ckptrace, clock_tolerance, go, load_truth, recorder, started,
                     wait_until, waiting_workload)
from prometheus import Prometheus, prometheus_available

needs_prometheus = pytest.mark.skipif(not prometheus_available(), reason="Debian package prometheus not installed "
                                      "(scripts/setup.sh test installs it)")


def build_id(path) -> str:
    """The ELF's GNU build-id as binutils reads it (independent of ckptrace's reader)."""
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def serving(*pids, extra=()):
    """`ckptrace serve` on an ephemeral port, its probes attached (its ready line printed)."""
    args = [CKPTRACE, "serve", "--listen", "127.0.0.1:0", *extra]
    for pid in pids:
        args += ["--pid", pid]
    return started(args, ready="ckptrace: serving http://127.0.0.1:")


@pytest.mark.parametrize("_", [None], ids=["two-processes"])
@needs_prometheus
@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_prometheus_scrapes_what_the_truth_and_analyze_of_the_same_run_say(tmp_path, workload, _):
    """A (pool on: hits and misses) is recorded and served at once; B (pool off) only served.
    Both exit while Prometheus scrapes every 0.5 s: each one's series keep their final values,
    then end, and serve stops by itself."""
    ta, tb, trace = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "a.parquet"
    with waiting_workload(workload, "--iterations", "30", "--ckpt-mib", "40", "--pool", "on",
                          "--decode-us", "2000", truth=ta) as a, \
            waiting_workload(workload, "--iterations", "12", "--ckpt-mib", "36", "--pool", "off",
                             "--decode-us", "2000", truth=tb) as b, \
            recorder(trace, "--pid", a.pid) as rec, \
            serving(a.pid, b.pid) as (srv, line):
        port = int(re.search(r"127\.0\.0\.1:(\d+)/metrics", line).group(1))
        target = f"127.0.0.1:{port}"
        with Prometheus([target], interval_s=0.5) as prom:
            wait_until(lambda: prom.health(target) == "up", "the exporter's target up", timeout_s=60, every_s=0.2,
                       watch=[srv, prom.proc])
            t_up = time.time()
            before = prom.query("ckptrace_checkpoints_total")
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as r:
                exposed = {m.group(1) for m in re.finditer(r"^(ckptrace_\w+?)(?:\{|\s)", r.read().decode(), re.M)}
            assert exposed == series_names()
            assert {dict(k)["pid"]: v for k, v in before.items()} == {str(a.pid): 0, str(b.pid): 0}
            go(a)
            go(b)
            assert a.wait(120) == 0 and b.wait(120) == 0
            assert rec.wait(120) == 0, rec.stderr.read()
            last = {p: f'last_over_time({{__name__="%s",pid="{p}"}}[1h])' for p in (a.pid, b.pid)}
            for proc, truth in ((a, ta), (b, tb)):
                n = len(load_truth(truth)["checkpoint"])
                wait_until(lambda: prom.value(last[proc.pid] % "ckptrace_checkpoints_total") == n,
                           f"Prometheus holding PID {proc.pid}'s {n} checkpoints", timeout_s=60, every_s=0.2,
                           watch=prom.proc)  # not srv: it stops by itself once both have exited
                # Its series end: the exporter served them once more, then dropped them.
                wait_until(lambda: prom.value(f'ckptrace_checkpoints_total{{pid="{proc.pid}"}}') is None,
                           f"PID {proc.pid}'s series to end", timeout_s=60, every_s=0.2, watch=prom.proc)
            assert srv.wait(60) == 0
            err = srv.stderr.read()
            assert "Traceback" not in err and err.count("exited; its series end") == 2, err
            got = {p: {name: prom.value(q % name) for name in
                       ["ckptrace_checkpoints_total", "ckptrace_pool_hits_total", "ckptrace_checkpoint_faults_total",
                        "ckptrace_restores_total",
                        "ckptrace_checkpoint_memory_peak_bytes", "ckptrace_checkpoint_memory_held_bytes"]
                       + [f"ckptrace_{h}_{s}" for h in HISTOGRAMS for s in ("sum", "count")]}
                   for p, q in last.items()}
            lost = prom.value("last_over_time(ckptrace_lost_events_total[1h])")
            labels = {dict(k)["pid"]: dict(k) for k in prom.query(last[a.pid] % "ckptrace_checkpoints_total")}
            for expr in grafana_exprs():  # the dashboard's queries parse and give series over the run
                assert prom.query_range(as_query(expr), t_up, time.time()), expr

    # A: the workload's own account and analyze of the trace recorded beside the exporter.
    recorded = read_trace(trace)
    ga, ck, mem = got[a.pid], analyze_trace(recorded).checkpoints, memory_summary(recorded.events)
    truth = load_truth(ta)["checkpoint"]
    n = len(truth)
    assert ga["ckptrace_checkpoints_total"] == n == len(ck)
    assert ga["ckptrace_pool_hits_total"] == truth["pool_hit"].sum() == ck["pool_hit"].sum() > 0
    assert ga["ckptrace_checkpoint_faults_total"] == ck["faults"].sum()
    assert ga["ckptrace_checkpoint_bytes_sum"] == truth["bytes"].sum() == ck["bytes"].sum()
    assert lost == 0 == recorded.meta.lost_events and ga["ckptrace_restores_total"] == 0
    for h, col in (("fill", "fill_ns"), ("copy", "copy_ns"), ("cpu", "cpu_ns"), ("", "total_ns")):
        name = f"ckptrace_checkpoint_{h + '_' if h else ''}seconds"
        assert ga[f"{name}_count"] == n, name
        # Two probe sets on one process: each span differs by the other's handlers (microseconds).
        assert abs(ga[f"{name}_sum"] * 1e9 - ck[col].sum()) <= clock_tolerance(ck[col].sum()), name
    # Fault time: measured where faults were (the misses), a part of the fill and copy time.
    assert 0 < ga["ckptrace_checkpoint_fault_seconds_count"] <= n
    assert ga["ckptrace_checkpoint_fault_seconds_sum"] <= ga["ckptrace_checkpoint_fill_seconds_sum"] + \
        ga["ckptrace_checkpoint_copy_seconds_sum"]
    # Held checkpoint memory as analyze reads it; at least one fresh buffer of a checkpoint's size.
    assert ga["ckptrace_checkpoint_memory_peak_bytes"] == mem["peak_held_bytes"] >= truth["bytes"].max()
    assert ga["ckptrace_checkpoint_memory_held_bytes"] == mem["end_held_bytes"]

    # B: pool off, served alone: every checkpoint a miss, with its faults.
    gb, truth_b = got[b.pid], load_truth(tb)["checkpoint"]
    assert gb["ckptrace_checkpoints_total"] == len(truth_b) == gb["ckptrace_checkpoint_fill_seconds_count"]
    assert gb["ckptrace_pool_hits_total"] == 0 == truth_b["pool_hit"].sum()
    assert gb["ckptrace_checkpoint_bytes_sum"] == truth_b["bytes"].sum()
    truth_faults = (truth_b["fill_faults"] + truth_b["copy_faults"]).sum()
    assert abs(gb["ckptrace_checkpoint_faults_total"] - truth_faults) <= 0.01 * truth_faults
    assert gb["ckptrace_checkpoint_fill_seconds_sum"] * 1e9 <= truth_b["end_ns"].sum() - truth_b["start_ns"].sum()

    for proc in (a, b):
        assert labels.get(str(proc.pid), {}).get("label", "ckpt-workload") == "ckpt-workload"
    assert labels[str(a.pid)]["build_id"] == build_id(workload)


@pytest.mark.parametrize("listen, needle", [
    ("127.0.0.1:80", "port 80 is a privileged port"),
    ("127.0.0.1:70000", "out of range"),
    ("127.0.0.1", "give ADDRESS:PORT"),
    ("nowhere.example:9464", "is not an IP address"),
    ("999.1.1.1:9464", "is not an IP address"),
])
def test_bad_listen_is_one_line_before_anything_starts(listen, needle):
    assert_one_line_error(ckptrace("serve", "--pid", "1", "--listen", listen), needle)


def test_no_pid_is_one_line():
    assert_one_line_error(ckptrace("serve"), "give --pid")


@pytest.mark.parametrize("args, needle", [
    (["--pid", "2"], "is a kernel thread"),
    (["--pid", "4194304"], "no process with PID 4194304"),  # above the kernel's pid_max limit
    (["--comm", "a/b"], "--comm takes a process name"),
    (["--pid", "1", "--comm", "x"], "give --pid PID (one or more) or --comm NAME"),
])
def test_bad_targets_are_one_line_before_anything_starts(args, needle):
    assert_one_line_error(ckptrace("serve", "--listen", "127.0.0.1:0", *args), needle)


def test_port_in_use_or_an_address_not_here_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert_one_line_error(ckptrace("serve", "--pid", "1", "--listen", f"127.0.0.1:{port}"),
                              f"cannot listen on 127.0.0.1:{port}: the port is in use")
    # 192.0.2.0/24 is TEST-NET-1: documentation only, never a local address.
    assert_one_line_error(ckptrace("serve", "--pid", "1", "--listen", "192.0.2.1:9464"),
                          "cannot listen on 192.0.2.1:9464: the address is not one of this machine's")


GRAFANA = sorted((Path(__file__).resolve().parents[1] / "dashboards" / "grafana").glob("*.json"))


def grafana_exprs() -> list[str]:
    """Every PromQL expression of every panel of the shipped Grafana dashboards."""
    exprs = []
    for path in GRAFANA:
        for panel in json.loads(path.read_text())["panels"]:
            exprs += [t["expr"] for t in panel.get("targets", [])]
    return exprs


def as_query(expr: str) -> str:
    """A dashboard expression with Grafana's variables set as a user's 'All' would."""
    return expr.replace("$__rate_interval", "1m").replace('=~"$label"', '=~".*"').replace('=~"$pid"', '=~".*"')


def test_grafana_dashboard_queries_only_served_series_and_labels():
    """Valid JSON; every panel has queries; every series and label they name is one serve
    serves; every series serve serves is on the dashboard. (The real Prometheus test evaluates
    each expression too.)"""
    assert GRAFANA, "no dashboard under dashboards/grafana/"
    served = series_names()
    used = set()
    for path in GRAFANA:
        dash = json.loads(path.read_text())
        assert dash["title"] and dash["uid"]
        for panel in dash["panels"]:
            if panel["type"] != "row":
                assert panel.get("targets"), panel["title"]
    for expr in grafana_exprs():
        names = set(re.findall(r"\bckptrace_[a-z_]+\b", expr))
        assert names and names <= served, (expr, names - served)
        used |= names
        labels = {lb.strip() for grp in re.findall(r"by \(([^)]*)\)", expr) for lb in grp.split(",")}
        labels |= set(re.findall(r"[{,]\s*([a-z_]+)\s*=~?", expr))
        assert labels <= {*LABELS, "le"}, (expr, labels)
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in served}
    assert {re.sub(r"_(bucket|sum|count)$", "", n) for n in used} == families


def next_line(proc, timeout_s: float = 60) -> str:
    """The next stderr line of a started() process (a bound for a hung test, not a speed)."""
    ready, _, _ = select.select([proc.stderr], [], [], timeout_s)
    assert ready, f"no line from {proc.args[:3]} in {timeout_s} s"
    return proc.stderr.readline()


def scraped(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def scraped_or_none(url: str) -> str:
    """A scrape, or "" once the exporter has stopped listening."""
    try:
        return scraped(url)
    except OSError:
        return ""


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_comm_waits_says_so_then_serves_each_new_process(tmp_path, workload):
    """--comm with nothing of that name yet: a note after --hint-after; a process started later
    is attached and served; it exits, its final values are served, and serve goes on waiting."""
    name = f"ckw-{os.getpid() % 100000}"  # a name only this test's process has (comm: the exec'd name)
    exe = tmp_path / name
    exe.symlink_to(workload)  # libraries by $ORIGIN, which the loader takes from the real path
    truth = tmp_path / "t.jsonl"
    with started([CKPTRACE, "serve", "--comm", name, "--hint-after", "1", "--listen", "127.0.0.1:0"],
                 ready="ckptrace: serving http://127.0.0.1:") as (srv, line):
        url = re.search(r"(http://\S+/metrics)", line).group(1)
        assert f"every process named {name!r}" in line
        assert f"no process named {name!r} in 1 s" in next_line(srv)
        assert "ckptrace_checkpoints_total{" not in scraped(url)
        with waiting_workload(exe, "--iterations", "9", "--ckpt-mib", "36", truth=truth) as wl:
            assert next_line(srv).startswith(f"ckptrace: serving PID {wl.pid} ({name}, ")
            go(wl)
            assert wl.wait(120) == 0
        n = len(load_truth(truth)["checkpoint"])
        want = re.compile(rf'^ckptrace_checkpoints_total\{{[^}}]*pid="{wl.pid}"[^}}]*\}} {n}\.0$', re.M)
        wait_until(lambda: want.search(scraped_or_none(url)), f"the final {n} checkpoints served", every_s=0.1,
                   watch=srv)
        assert next_line(srv).startswith(f"ckptrace: PID {wl.pid} exited")
        wait_until(lambda: f'pid="{wl.pid}"' not in scraped(url), "its series to end", every_s=0.1, watch=srv)
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(60) == 0
        rest = srv.stderr.read()
        assert "Traceback" not in rest and "ckptrace: stopped (SIGTERM)" in rest, rest


SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"


def kernel_records(events) -> "np.ndarray":
    """A trace's events as the kernel's records (the fields serve's fold reads), and fault_ns (-1: NA),
    in the ring buffer's order: each row is written when its span ends (a trace is sorted by start)."""
    events = events.sort_values("end_ns", kind="stable")
    fields = {"start_ns": "u8", "end_ns": "u8", "ckpt": "u8", "bytes": "u8", "addr": "u8", "faults": "u8",
              "cpu_ns": "u8", "wait_ns": "u8", "tid": "u4", "kind": "u4", "phase": "u4", "pid": "u4",
              "old_addr": "u8", "old_bytes": "u8"}
    rec = np.zeros(len(events), dtype=list(fields.items()))
    for f in fields:
        col = events[f]
        if f in ("kind", "phase"):
            rec[f] = col.cat.codes.to_numpy()
        else:
            rec[f] = col.to_numpy(dtype="int64", na_value=0)
    return rec, events["fault_ns"].to_numpy(dtype="int64", na_value=-1)


@pytest.mark.parametrize("trace", ["1-pool-off.parquet", "2-pool-on.parquet"])
def test_fold_in_any_batches_equals_analyze(trace):
    """serve's fold, fed a recorded trace in batches cut anywhere (inside checkpoints too), gives
    analyze's own counts and sums: its numpy definitions, the carry across batches, held memory."""
    from ckptrace.exporters.prometheus import CheckpointMetrics
    from ckptrace.live.session import LiveBatch

    tr = read_trace(SAMPLES / trace)
    ck = analyze_trace(tr).checkpoints
    mem = memory_summary(tr.events)
    rec, fault = kernel_records(tr.events)
    rng = np.random.default_rng(7)
    for cuts in (np.array([], int), np.arange(1, len(rec)), np.sort(rng.choice(len(rec), 25, replace=False))):
        m = CheckpointMetrics()
        m.add(1, "x", "")
        for part_rec, part_fault in zip(np.split(rec, cuts), np.split(fault, cuts)):
            m.fold(1, LiveBatch(part_rec, part_fault, sched_recorded=True))
        got = {s.name: s.value for fam in m.collect() for s in fam.samples if s.labels.get("pid") == "1"}
        assert got["ckptrace_checkpoints_total"] == len(ck) > 0
        assert got["ckptrace_pool_hits_total"] == ck["pool_hit"].sum()
        assert got["ckptrace_checkpoint_faults_total"] == ck["faults"].sum()
        for name, col in (("fill", "fill_ns"), ("copy", "copy_ns"), ("cpu", "cpu_ns"), ("wait", "wait_ns")):
            assert got[f"ckptrace_checkpoint_{name}_seconds_sum"] == pytest.approx(ck[col].sum() / 1e9, rel=1e-9)
        measured = ck[ck["fault_source"].isin(["measured", "none"])]
        assert got["ckptrace_checkpoint_fault_seconds_count"] == len(measured)
        assert got["ckptrace_checkpoint_fault_seconds_sum"] == pytest.approx(measured["fault_ns"].sum() / 1e9, rel=1e-9)
        assert got["ckptrace_checkpoint_bytes_sum"] == ck["bytes"].sum()
        assert got["ckptrace_checkpoint_memory_peak_bytes"] == mem["peak_held_bytes"]
        assert got["ckptrace_checkpoint_memory_held_bytes"] == mem["end_held_bytes"]


def final_scrapes(url: str, want: dict[int, int], watch=()) -> dict[int, str]:
    """For each pid, the scrape that holds its final values: its checkpoint count reached its n
    (one scrape is one snapshot, so every series of that pid in it is final too). One polling
    loop for all: each process is served once after it exits, then gone. `watch`: serve, as
    wait_until's (a serve that has exited answers no scrape: its status and last line say why)."""
    found: dict[int, str] = {}

    def poll():
        text = scraped_or_none(url)
        for pid, n in want.items():
            if pid not in found and re.search(
                    rf'^ckptrace_checkpoints_total\{{[^}}]*pid="{pid}"[^}}]*\}} {n}\.0$', text, re.M):
                found[pid] = text
        return len(found) == len(want)
    wait_until(poll, f"the final checkpoint counts {want} served", every_s=0.05, watch=watch)
    return found


def series_value(text: str, name: str, pid: int) -> float:
    m = re.search(rf'^{name}\{{[^}}]*pid="{pid}"[^}}]*\}} (\S+)$', text, re.M)
    assert m, (name, pid)
    return float(m.group(1))


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_upstream_builds_restores_and_a_derived_fill(tmp_path):
    """One serve, two builds of the upstream generation: one with restores (load_tgt copying state
    back), one with its vector growth inlined (no fill probe: analyze's derived fill). Each
    process's final scrape against its own truth."""
    from ckptrace.samples import workload_binary

    tu, ti = tmp_path / "u.jsonl", tmp_path / "i.jsonl"
    with waiting_workload(workload_binary(variant="upstream"), "--iterations", "9", "--slots", "2",
                          "--restore-every", "1", truth=tu) as u, \
            waiting_workload(workload_binary(variant="inlined"), "--iterations", "9", "--slots", "2",
                             "--pool", "on", truth=ti) as i, \
            serving(u.pid, i.pid) as (srv, line):
        url = re.search(r"(http://\S+/metrics)", line).group(1)
        go(u)
        go(i)
        assert u.wait(120) == 0 and i.wait(120) == 0
        truth_u, truth_i = load_truth(tu), load_truth(ti)
        final = final_scrapes(url, {u.pid: len(truth_u["checkpoint"]), i.pid: len(truth_i["checkpoint"])},
                              watch=srv)
        text_u, text_i = final[u.pid], final[i.pid]
        # Scraping on until both are gone: each exited process is served once more, then dropped,
        # and serve stops by itself (its socket closes: an empty scrape).
        wait_until(lambda: srv.poll() is not None or not re.search(rf'pid="({u.pid}|{i.pid})"', scraped_or_none(url)),
                   "both processes' series to end", every_s=0.05)
        assert srv.wait(60) == 0
    restores = truth_u["restore"]
    assert series_value(text_u, "ckptrace_restores_total", u.pid) == len(restores) > 0
    assert series_value(text_u, "ckptrace_pool_hits_total", u.pid) == truth_u["checkpoint"]["pool_hit"].sum()
    ck = truth_i["checkpoint"]
    assert series_value(text_i, "ckptrace_pool_hits_total", i.pid) == ck["pool_hit"].sum() > 0
    assert series_value(text_i, "ckptrace_checkpoint_fill_seconds_count", i.pid) == len(ck)
    # A derived fill has no fault time of its own: no checkpoint's fault time is observed.
    assert series_value(text_i, "ckptrace_checkpoint_fault_seconds_count", i.pid) == 0
    assert series_value(text_i, "ckptrace_restores_total", i.pid) == 0


# Stops one process (its pid in armed[2]) right after its first uprobe perf_event_open returns:
# at that moment it is attaching its first process, one uprobe in.
STOP_AT_FIRST_UPROBE = r"""
BPF_ARRAY(armed, u32, 3);  /* [0]: tid whose uprobe perf_event_open is in flight, [1]: fired, [2]: the pid */

static __always_inline int ours(void)
{
    u32 k = 2;
    u32 *pid = armed.lookup(&k);
    return pid && *pid && *pid == bpf_get_current_pid_tgid() >> 32;
}

TRACEPOINT_PROBE(syscalls, sys_enter_perf_event_open)
{
    u32 type = 0, k = 0, tid = (u32)bpf_get_current_pid_tgid();
    if (!ours())
        return 0;
    bpf_probe_read_user(&type, sizeof(type), (void *)args->attr_uptr);
    if (type == UPROBE_TYPE)
        armed.update(&k, &tid);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_perf_event_open)
{
    u32 k0 = 0, k1 = 1, tid = (u32)bpf_get_current_pid_tgid();
    u32 *t = armed.lookup(&k0), *fired = armed.lookup(&k1);
    if (!t || !fired || *t != tid || *fired || args->ret < 0 || !ours())
        return 0;
    *fired = 1;
    bpf_send_signal(19 /* SIGSTOP */);
    return 0;
}
"""


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_process_that_exits_while_being_attached_is_a_note_and_the_others_are_served(tmp_path, workload):
    """serve --pid A --pid B; A exits while serve is attaching it (serve is stopped by a BPF
    program of the test right after A's first uprobe, A is killed and reaped, serve goes on):
    one note, B attached and served to its truth, serve stops by itself when B is done."""
    from bcc import BPF

    from helpers import stopped

    uprobe_type = int(Path("/sys/bus/event_source/devices/uprobe/type").read_text())
    stopper = BPF(text=STOP_AT_FIRST_UPROBE.encode(), cflags=[f"-DUPROBE_TYPE={uprobe_type}"])
    tb = tmp_path / "b.jsonl"
    try:
        with waiting_workload(workload, "--iterations", "3", "--ckpt-mib", "36") as a, \
                waiting_workload(workload, "--iterations", "6", "--ckpt-mib", "36", truth=tb) as b, \
                started(["sh", "-c", 'kill -STOP $$; exec "$@"', "sh", CKPTRACE, "serve", "--listen",
                         "127.0.0.1:0", "--pid", a.pid, "--pid", b.pid]) as (srv, _):
            # serve's pid is known before it runs (sh stops itself, then execs it): no race
            wait_until(lambda: stopped(srv.pid), "the shell to stop before it runs serve", watch=srv)
            stopper[b"armed"][ctypes.c_int(2)] = ctypes.c_uint32(srv.pid)
            srv.send_signal(signal.SIGCONT)
            wait_until(lambda: stopped(srv.pid), "serve to stop at its first uprobe", watch=srv)
            assert srv.poll() is None
            a.kill()
            a.wait(60)
            srv.send_signal(signal.SIGCONT)
            note = next_line(srv)
            assert note.startswith(f"ckptrace: note: not serving PID {a.pid}: PID {a.pid} exited"), note
            line = next_line(srv)
            assert line.startswith("ckptrace: serving http://127.0.0.1:") and f"PID {b.pid} " in line, line
            assert f"PID {a.pid} " not in line
            url = re.search(r"(http://\S+/metrics)", line).group(1)
            go(b)
            assert b.wait(120) == 0
            final = final_scrapes(url, {b.pid: len(load_truth(tb)["checkpoint"])}, watch=srv)[b.pid]
            assert f'pid="{a.pid}"' not in final
            # served once more after it exited, then gone; then serve stops by itself
            wait_until(lambda: srv.poll() is not None or f'pid="{b.pid}"' not in scraped_or_none(url),
                       "B's series to end", every_s=0.05)
            assert srv.wait(60) == 0
            assert "Traceback" not in srv.stderr.read()
    finally:
        stopper.cleanup()


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_pid_reused_by_a_new_process_of_the_name_is_a_new_process(tmp_path, workload):
    """serve --comm NAME: a served process exits and the kernel gives its pid to a new process of
    the same name (clone3's set_tid, while serve is stopped and can't see the gap). serve knows a
    process by pid and start time: the old one's series end, the new one is attached and served
    from zero, to its own truth."""
    from helpers import spawner, stopped

    spawn = spawner(tmp_path)
    name = f"ckr-{os.getpid() % 100000}"
    exe = tmp_path / name
    exe.symlink_to(workload)
    t1, t2 = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    with started([CKPTRACE, "serve", "--comm", name, "--listen", "127.0.0.1:0"],
                 ready="ckptrace: serving http://127.0.0.1:") as (srv, line):
        url = re.search(r"(http://\S+/metrics)", line).group(1)
        with waiting_workload(exe, "--iterations", "3", "--ckpt-mib", "36", truth=t1) as old:
            pid = old.pid
            assert next_line(srv).startswith(f"ckptrace: serving PID {pid} ({name}, ")
            srv.send_signal(signal.SIGSTOP)
            wait_until(lambda: stopped(srv.pid), "serve to stop", watch=srv)
            go(old)
            assert old.wait(120) == 0
        with started([spawn, pid, exe, "--wait-signal", "--iterations", "5", "--ckpt-mib", "36", "--truth", t2],
                     ready="ready pid=") as (new, ready):
            assert ready.strip() == f"ready pid={pid}"  # the same pid, another process
            srv.send_signal(signal.SIGCONT)
            assert next_line(srv).startswith(f"ckptrace: PID {pid} exited")
            assert next_line(srv).startswith(f"ckptrace: serving PID {pid} ({name}, ")
            os.kill(pid, signal.SIGUSR1)
            assert new.wait(120) == 0
        n1, n2 = len(load_truth(t1)["checkpoint"]), len(load_truth(t2)["checkpoint"])
        assert n1 != n2
        final_scrapes(url, {pid: n2}, watch=srv)  # the new process's own count, not added to the old one's
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(60) == 0
        assert "Traceback" not in srv.stderr.read()
