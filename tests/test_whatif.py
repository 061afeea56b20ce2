"""`ckptrace whatif`: a pool policy predicted from a pool-off recording, checked against the real pool.

Each case records the sample workload twice, pool off and pool on, the same load; the prediction
comes from the pool-off trace only, and is held to what the pool-on run did: the pool's own
account in the workload's truth file (its gets and hits, displacements, declines, the most bytes
it held, its trims), the pool-on trace (the buffers it mapped, the memory it held) and the fill
on-CPU times both recordings measured. The pool's rules in the workload are llama.cpp PR #201's
(samples/workload/common.cpp); --pool-cap-mib, --pool-count and --pool-trim-idle-ms set other
caps so a binding cap can be checked without holding gigabytes.
"""
from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.whatif import GET_COLUMNS, Policy, ReplayInput, simulate
from ckptrace.core.trace import read_trace
from ckptrace.core.units import MIB
from helpers import assert_one_line_error, ckptrace, go, record_with_truth, recorder, waiting_workload

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"
FAST = ["--decode-per-prefill", "0", "--decode-us", "200"]
# The workload's pool trims when idle only with --pool-trim-idle-ms (else at exit): the policy it
# runs is PR #201's without the idle trim, which a slow gap between iterations on a busy machine
# (its truth lines are written there) would otherwise set off in the replay.
NO_IDLE_TRIM = ["--trim-idle", "never"]


def record_pair(tmp_path: Path, workload, args: list, on_args: list = ()) -> dict:
    """The same load pool-off and pool-on (with `on_args` too), each with the workload's truth."""
    legs = {}
    for leg in ("off", "on"):
        extra = list(on_args) if leg == "on" else []
        legs[leg] = record_with_truth(tmp_path, [workload, "--pool", leg, *args, *extra], "--label", f"pool-{leg}",
                                      name=leg)
        assert legs[leg].trace.meta.lost_events == 0
    return legs


def whatif(path, *args) -> dict:
    p = ckptrace("whatif", path, "--json", *args)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    doc = json.loads(p.stdout)
    (proc,) = doc["processes"]
    return proc


def summary_truth(rec) -> dict:
    return rec.truth["summary"].iloc[0].to_dict()


def misses_recorded(rec) -> int:
    """Checkpoints of a recording whose fill mapped a fresh buffer."""
    return int((analyze_trace(rec.trace).checkpoints["mmaps"] > 0).sum())


def fill_cpu(rec) -> int:
    return int(analyze_trace(rec.trace).checkpoints["fill_cpu_ns"].sum())


def within(pred, real, share) -> bool:
    return abs(pred - real) <= share * abs(real)


# --- the prediction against the real pool -----------------------------------------------------

@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_prediction_matches_the_pool_on_run(tmp_path, workload):
    """The acceptance case: PR #201's policy, the workload's default 48 MiB checkpoints, 2 slots,
    80 checkpoints. Hits exact, the pool's high-water mark and the held memory within 1%, the fill
    time saved on CPU within 10% (the misses' on-CPU time moves with the machine's load between the
    two runs, the hits' cancels: 78 hits against 2 misses keep that well inside), faults within 0.1%."""
    legs = record_pair(tmp_path, workload, ["--iterations", "40", *FAST])
    pred = whatif(legs["off"].path, *NO_IDLE_TRIM)
    s, truth = pred["summary"], summary_truth(legs["on"])
    assert s["policy"] == "pr201" and s["cap_bytes"] == legs["off"].trace.meta.host_memory_bytes // 16
    assert s["cap_bytes"] == truth["pool_byte_cap"]  # the workload's own sysconf / 16
    assert s["gets"] == misses_recorded(legs["off"]) == truth["pool_gets"] == 80
    assert s["hits"] == truth["pool_get_hits"] == s["gets"] - misses_recorded(legs["on"])
    assert s["evictions"] == truth["pool_evicted"] == 0
    assert within(s["pooled_hwm_bytes"], truth["pool_bytes_hwm"], 0.01), (s["pooled_hwm_bytes"], truth)
    on_memory = analyze_trace(legs["on"].trace).memory
    assert within(s["held_hwm_bytes"], on_memory["peak_held_bytes"], 0.01), (s["held_hwm_bytes"], on_memory)
    measured = fill_cpu(legs["off"]) - fill_cpu(legs["on"])
    assert within(s["fill_cpu_saved_ns"], measured, 0.10), (s["fill_cpu_saved_ns"], measured)
    truth_saved = int(legs["off"].truth["checkpoint"]["fill_cpu_ns"].sum() - legs["on"].truth["checkpoint"]["fill_cpu_ns"].sum())
    assert within(s["fill_cpu_saved_ns"], truth_saved, 0.10), (s["fill_cpu_saved_ns"], truth_saved)
    faults = (analyze_trace(legs["off"].trace).checkpoints["fill_faults"].sum()
              - analyze_trace(legs["on"].trace).checkpoints["fill_faults"].sum())
    assert within(s["faults_avoided"], faults, 0.001), (s["faults_avoided"], faults)
    # every predicted hit is a checkpoint the pool-on run did not map a buffer for, in order
    hit = [o["outcome"] == "hit" for o in pred["outcomes"]]
    on_ck = analyze_trace(legs["on"].trace).checkpoints.sort_values("start_ns")
    assert hit == (on_ck["mmaps"] == 0).tolist()


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_growing_checkpoints_never_hit_and_the_cap_bounds_the_pool(tmp_path, workload):
    """The review's first case: a checkpoint that grows each prefill (48 MiB, +8 MiB) never fits a
    buffer freed before it: 0 hits, and the pool fills with buffers no later request can use until
    its byte cap (256 MiB here, on both sides) displaces the smallest."""
    legs = record_pair(tmp_path, workload, ["--iterations", "12", "--grow-mib", "8", *FAST],
                       on_args=["--pool-cap-mib", "256"])
    s, truth = whatif(legs["off"].path, "--cap-bytes", "256MiB", *NO_IDLE_TRIM)["summary"], summary_truth(legs["on"])
    assert s["hits"] == truth["pool_get_hits"] == 0 and s["gets"] == 24
    assert s["evictions"] == truth["pool_evicted"] > 0
    declined = s["declined_floor"] + s["declined_cap"] + s["declined_full"]
    assert declined == truth["pool_declined"]
    assert s["pooled_hwm_bytes"] == truth["pool_bytes_hwm"] <= 256 * MIB
    on_memory = analyze_trace(legs["on"].trace).memory
    assert within(s["held_hwm_bytes"], on_memory["peak_held_bytes"], 0.01), (s["held_hwm_bytes"], on_memory)
    # the cap is what bounds it: at every cap the pool holds at most the cap, and more with more cap
    p = ckptrace("whatif", legs["off"].path, "--json", *NO_IDLE_TRIM, "--sweep", "cap-bytes=64MiB,128MiB,256MiB,1GiB")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["processes"][0]["sweep"]["rows"]
    assert [r["hits"] for r in rows] == [0, 0, 0, 0]
    assert all(r["pooled_hwm_bytes"] <= r["cap_bytes"] for r in rows)
    assert [r["pooled_hwm_bytes"] for r in rows] == sorted(r["pooled_hwm_bytes"] for r in rows)
    assert rows[-1]["pooled_hwm_bytes"] > 256 * MIB  # uncapped by 1 GiB it holds more: the cap bound it


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_full_pool_of_small_buffers_displaces_the_smallest(tmp_path, workload):
    """The review's second case: a pool full of small buffers (count cap 2 here) offered a larger
    one displaces its smallest, and only a smaller one: an equal one is declined. Each request
    makes a 40 MiB then an 80 MiB checkpoint per slot; at the next request the slot's two go to
    the pool and the 40 MiB one gets the smallest buffer at least as large (best fit)."""
    args = ["--iterations", "8", "--keep", "2", "--ckpt-mib", "40", "--grow-mib", "40", "--request-prefills", "2",
            *FAST]
    legs = record_pair(tmp_path, workload, args, on_args=["--pool-count", "2"])
    s, truth = whatif(legs["off"].path, "--count", "2", *NO_IDLE_TRIM)["summary"], summary_truth(legs["on"])
    assert s["hits"] == truth["pool_get_hits"] > 0
    assert s["evictions"] == truth["pool_evicted"] > 0
    assert s["declined_full"] == truth["pool_declined"] > 0
    assert s["pooled_hwm_bytes"] == truth["pool_bytes_hwm"] and s["pooled_hwm_buffers"] == 2
    # the pre-review pool declined when full: nothing displaced, no more hits
    none = whatif(legs["off"].path, "--count", "2", "--evict", "none", *NO_IDLE_TRIM)["summary"]
    assert none["evictions"] == 0 and none["declined_full"] > s["declined_full"] and none["hits"] <= s["hits"]


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_an_idle_trim_returns_everything(tmp_path, workload):
    """The review's third case: idle 0.5 s between iterations, the pool trimmed after 0.2 s of it
    (the workload's --pool-trim-idle-ms; llama-server trims after 1 s). Two checkpoints a slot per
    request: a new request puts four buffers and takes back two, so two stay pooled into the
    gap, and the trim frees them; the next checkpoints then miss."""
    args = ["--iterations", "8", "--keep", "2", "--request-prefills", "2", "--gap-us", "500000", *FAST]
    legs = record_pair(tmp_path, workload, args, on_args=["--pool-trim-idle-ms", "200"])
    pred = whatif(legs["off"].path, "--trim-idle", "0.2")
    s, truth = pred["summary"], summary_truth(legs["on"])
    assert s["trims"] == truth["pool_trims"] == 3
    assert s["trimmed_bytes"] == truth["pool_trimmed_bytes"]
    assert s["hits"] == truth["pool_get_hits"] == s["gets"] - misses_recorded(legs["on"])
    assert s["pooled_hwm_bytes"] == truth["pool_bytes_hwm"]
    # after each trim nothing is pooled and the held memory is the recording's own
    held = pd.DataFrame(pred["held"]).set_index("t_ns")
    for e in pred["pooled"]:
        if e["event"] == "trim":
            assert e["pooled_bytes"] == 0 and e["extra_bytes"] == 0
            assert held.loc[e["t_ns"], "predicted_bytes"] == held.loc[e["t_ns"], "recorded_bytes"]
    # the pool-on run's trims are its munmaps outside any checkpoint before the exit: the same bytes
    on = analyze_trace(legs["on"].trace)
    last = int(on.iterations["end_ns"].max())
    trims = on.memory["releases"]
    trims = trims[(trims["phase"] == "none") & (trims["t_ns"] < last)]
    mapped = sum(e["bytes"] for e in pred["pooled"] if e["event"] == "trim")  # pool sizes
    assert len(trims) == 2 * s["trims"] and int(trims["bytes"].sum()) == mapped + 4096 * len(trims)
    # never trimmed, the same load would hit more
    never = whatif(legs["off"].path, "--trim-idle", "never")["summary"]
    assert never["trims"] == 0 and never["hits"] > s["hits"]


# --- the cgroup memory limit ------------------------------------------------------------------

def _memory_hierarchy() -> tuple[Path, str] | None:
    """(folder to make a child cgroup in, limit file) of the hierarchy with the memory controller:
    cgroup v2's root when it offers `memory`, else a v1 memory mount."""
    from ckptrace.probes.process_memory import memory_cgroup, mounts

    found = memory_cgroup(Path("/proc/self/cgroup").read_text(), mounts())
    if found is None:
        return None
    version, _, point, _ = found
    if version == 2:
        if "memory" not in (point / "cgroup.subtree_control").read_text().split():
            return None
        return point, "memory.max"
    return point, "memory.limit_in_bytes"


@contextmanager
def memory_cgroup(limit: int):
    """A child cgroup with a memory limit, removed on the way out (its processes must be gone)."""
    where = _memory_hierarchy()
    if where is None:
        pytest.skip("no cgroup hierarchy with the memory controller to make a child in")
    point, name = where
    cg = point / f"ckptrace-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / name).write_text(str(limit))
        yield cg
    finally:
        cg.rmdir()


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_a_trace_recorded_under_a_small_memory_limit_warns(tmp_path, workload):
    """A 1 GiB cgroup limit on a host whose 1/16 is more: growing checkpoints (the review's case)
    fill a PR #201 pool with buffers nobody reuses, up to a cap read from host memory. The pool-off
    run fits; the prediction would pass 90% of the limit: whatif, analyze and compare say so. The
    limit, the host's memory and the RSS are in the trace's metadata."""
    limit = 1 << 30
    trace = tmp_path / "cg.parquet"
    args = ["--pool", "off", "--iterations", "10", "--grow-mib", "8", *FAST]
    with memory_cgroup(limit) as cg:
        with waiting_workload(workload, *args) as proc:
            (cg / "cgroup.procs").write_text(str(proc.pid))
            with recorder(trace, "--pid", proc.pid, "--label", "pool-off") as rec:
                go(proc)
                assert proc.wait(120) == 0
                rec.wait(120)
            assert rec.returncode == 0
    meta = read_trace(trace).meta
    assert meta.host_memory_bytes == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    (info,) = meta.processes
    assert info.memory.limit_bytes == limit and info.memory.limit_from.endswith(cg.name)
    assert info.memory.rss_peak_bytes > 200 * MIB  # two 120 MiB states and two checkpoints, at least

    p = ckptrace("whatif", trace, "--rows", "0")
    assert p.returncode == 0, p.stderr
    assert "ckptrace: warning:" in p.stderr and "cgroup memory limit" in p.stderr, p.stderr
    assert "OOM" in p.stderr and "does not look at that limit" in p.stderr
    quiet = ckptrace("whatif", trace, "--rows", "0", "--cap-bytes", "64MiB")  # a cap that fits: no warning
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    a = ckptrace("analyze", trace)
    assert a.returncode == 0 and "ckptrace: warning:" in a.stderr and "WARNING:" in a.stdout, a.stderr
    c = ckptrace("compare", trace, SAMPLES / "2-pool-on.parquet", "--json")
    assert c.returncode == 0, c.stderr
    assert any("cgroup memory limit" in w for w in json.loads(c.stdout)["warnings"])


# --- the command itself (no recording) -------------------------------------------------------

def test_whatif_on_a_sample_trace_and_its_json(tmp_path):
    """A recorded sample with a byte cap in bytes."""
    p = ckptrace("whatif", SAMPLES / "1-pool-off.parquet", "--cap-bytes", "1GiB")
    assert p.returncode == 0, p.stderr
    assert "18 hits, 2 misses" in p.stdout and "pooled at most 96.0 MiB in 2 buffers" in p.stdout
    doc = whatif(SAMPLES / "1-pool-off.parquet", "--cap-bytes", "1GiB")
    s = doc["summary"]
    hits = [o for o in doc["outcomes"] if o["outcome"] == "hit"]
    assert s["hits"] == len(hits) and s["faults_avoided"] == sum(o["fill_faults"] for o in hits)
    assert s["fill_cpu_saved_ns"] == sum(o["fill_cpu_ns"] for o in hits)  # a hit costs 0: none measured
    # the pool-on leg of the same sample: its 18 reused buffers are said, the rest replayed
    on = whatif(SAMPLES / "2-pool-on.parquet", "--cap-bytes", "1GiB")["summary"]
    assert on["reused_buffers"] == 18 and on["gets"] == 2


@pytest.mark.parametrize("args, needle", [
    ([], "does not record the host's memory"),
    (["--cap-bytes", "lots"], "neither a size"),
    (["--cap-bytes", "2/1"], "outside (0, 1]"),
    (["--cap-bytes", "1GiB", "--trim-idle", "soon"], "not a number of seconds"),
    (["--cap-bytes", "1GiB", "--sweep", "colour=1,2"], "PARAM one of"),
    (["--cap-bytes", "1GiB", "--sweep", "count=1,x"], "not a count"),
    (["--cap-bytes", "1GiB", "--floor", "-3"], "out of range"),
])
def test_bad_input_is_one_line(args, needle, tmp_path):
    trace = SAMPLES / "1-pool-off.parquet"
    if not args:  # a trace recorded before ckptrace kept the host's memory
        import pyarrow.parquet as pq

        t = pq.read_table(trace)
        md = dict(t.schema.metadata)
        meta = json.loads(md[b"ckptrace"])
        meta["host_memory_bytes"] = None
        md[b"ckptrace"] = json.dumps(meta).encode()
        trace = tmp_path / "old.parquet"
        pq.write_table(t.replace_schema_metadata(md), trace)
    assert_one_line_error(ckptrace("whatif", trace, *args), needle)


def test_help_has_examples():
    p = ckptrace("whatif", "--help")
    assert p.returncode == 0 and "Examples:" in p.stdout and "--sweep cap-bytes=" in p.stdout


# --- the rules alone, on buffers made up here -------------------------------------------------

def made_up(events: list[tuple[str, int]]) -> ReplayInput:
    """A process whose checkpoints do `events` in order: ("get", MiB) maps a buffer of that size
    (its fill 10 ms, 256 faults a MiB), ("put", k) returns the k-th buffer got."""
    gets, rel = [], []
    for t, (what, v) in enumerate(events):
        if what == "get":
            gets.append({"t_ns": t, "seq": t, "ckpt": len(gets) + 1, "bytes": v * MIB, "mapped": v * MIB + 4096,
                         "draft": False, "fill_cpu_ns": 10_000_000, "fill_ns": 10_000_000, "fill_faults": 256 * v,
                         "fill_start_ns": t})
        else:
            rel.append({"t_ns": t, "seq": t, "get": v, "how": "put", "grower": 0})
    empty = pd.DataFrame({"t_ns": np.zeros(0, "int64")})
    return ReplayInput(pid=1, label="made up", gets=pd.DataFrame(gets).astype(GET_COLUMNS),
                       releases=pd.DataFrame(rel, columns=["t_ns", "seq", "get", "how", "grower"]),
                       trims_at={}, activity=np.zeros((0, 2), "int64"), end_ns=len(events), exited=False,
                       held_off=empty.assign(held_bytes=np.zeros(0, "int64")),
                       rss_off=empty.assign(rss_bytes=np.zeros(0, "int64")),
                       hit_cost={"cpu_ns": 0, "ns": 0, "faults": 0}, hit_cost_source="none", no_buffer=0, reused=0,
                       host_memory=None, memory=None, fill_cpu_recorded=True)


def test_the_reviews_full_pool_of_64_small_buffers_takes_a_200_mib_one():
    """llama.cpp PR #201's review: a pool of 64 small buffers refused a 200 MiB one before the
    eviction rule; with it, the smallest goes, and a buffer no larger than any pooled one is
    still declined."""
    events = [("get", 40)] * 65 + [("get", 200)]  # 66 checkpoints alive at once, all misses
    events += [("put", i) for i in range(64)]  # the pool full: 64 buffers of 40 MiB
    events += [("put", 65), ("put", 64)]  # 200 MiB displaces a 40; then a 40 displaces nothing: declined
    s = simulate(made_up(events), Policy(cap=8 << 30)).summary
    assert s["accepted"] == 65 and s["evictions"] == 1 and s["evicted_bytes"] == 40 * MIB
    assert s["declined_full"] == 1 and s["pooled_hwm_buffers"] == 64
    assert s["pooled_end_bytes"] == 63 * 40 * MIB + 200 * MIB
    old = simulate(made_up(events), Policy(cap=8 << 30, evict="none")).summary
    assert old["evictions"] == 0 and old["declined_full"] == 2 and old["pooled_end_bytes"] == 64 * 40 * MIB


def test_the_reviews_40_growing_checkpoints_get_0_hits():
    """40 checkpoints, each larger than the last and freed before the next: 0 hits of 40; the
    pool holds every earlier one (the review's 4,440 MiB in 40 buffers) until a cap binds."""
    sizes = [40 + 3 * k for k in range(40)]
    events = []
    for k, size in enumerate(sizes):
        if k:
            events.append(("put", k - 1))
        events.append(("get", size))
    events.append(("put", 39))
    r = simulate(made_up(events), Policy(cap=64 << 30)).summary
    assert r["hits"] == 0 and r["gets"] == 40
    assert r["pooled_hwm_bytes"] == sum(sizes) * MIB and r["pooled_hwm_buffers"] == 40
    capped = simulate(made_up(events), Policy(cap=1 << 30)).summary
    assert capped["hits"] == 0 and capped["pooled_hwm_bytes"] <= 1 << 30 and capped["evictions"] > 0


def test_floor_cap_and_exact_fit():
    events = [("get", 30), ("get", 48), ("get", 64), ("put", 0), ("put", 1), ("put", 2), ("get", 48), ("get", 40)]
    s = simulate(made_up(events), Policy(cap=100 * MIB)).summary
    assert s["declined_floor"] == 1  # 30 MiB: below the 32 MiB floor
    assert s["evictions"] == 1 and s["evicted_bytes"] == 48 * MIB  # 48 + 64 > 100 MiB: the 48 goes for the 64
    assert s["hits"] == 1 and s["misses"] == 4  # 48 MiB takes the 64 MiB buffer; 40 MiB finds none
    assert simulate(made_up(events), Policy(cap=63 * MIB)).summary["declined_cap"] == 1  # 64 MiB > the cap
    exact = simulate(made_up(events), Policy(cap=1 << 30, fit="exact")).summary
    best = simulate(made_up(events), Policy(cap=1 << 30)).summary
    assert best["hits"] == 2 and exact["hits"] == 1  # 40 MiB takes the 64 MiB buffer only with best fit


def test_the_cgroup_v2_limit_is_the_smallest_on_the_way_up(tmp_path):
    """The file layout of cgroup v2 (this machine's memory controller is on v1, which the
    recorded test above reads): a child without a limit under a parent with 4 GiB, under a
    root with none; and a bind mount of a subtree (a container's view) read from its own root."""
    from ckptrace.probes.process_memory import memory_cgroup, smallest_limit

    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (tmp_path / "kubepods" / "memory.max").write_text("max\n")
    (pod / "memory.max").write_text(f"{4 << 30}\n")
    (pod / "app").mkdir()
    (pod / "app" / "memory.max").write_text("max\n")
    mounts = [("/", str(tmp_path), "cgroup2", "rw")]
    found = memory_cgroup("0::/kubepods/pod1/app\n", mounts)
    assert found == (2, "/kubepods/pod1/app", tmp_path, "/")
    assert smallest_limit(tmp_path, "/", "/kubepods/pod1/app", 2) == (4 << 30, "memory.max of /kubepods/pod1")
    # seen from inside the pod: the mount's root is the pod's folder
    assert smallest_limit(pod, "/kubepods/pod1", "/kubepods/pod1/app", 2) == (4 << 30, "memory.max of /kubepods/pod1")
    assert smallest_limit(tmp_path, "/", "/kubepods", 2) is None  # "max" all the way up
    # no memory controller offered: no hierarchy to read
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    assert memory_cgroup("0::/kubepods/pod1/app\n", mounts) is None


def test_ttft_saved_is_the_hits_fill_inside_each_window(tmp_path):
    """A request file beside a sample trace (windows made here: the first and second halves of
    its checkpoints, and one ending inside a fill): each request's saving is the part of the hits'
    fills inside its window, summed by a plain loop over the trace's own fill rows."""
    from ckptrace.core.loadgen import RESULT_COLUMNS
    from ckptrace.core.requests_file import write_requests

    trace = read_trace(SAMPLES / "1-pool-off.parquet")
    ev = trace.events
    fills = ev[ev["kind"] == "fill"].sort_values("start_ns")
    lo, hi = int(ev["start_ns"].min()), int(ev["end_ns"].max())
    mid = int(fills["start_ns"].iloc[10]) + 1_000_000  # 1 ms into the 11th fill
    windows = [(lo, mid), (mid, hi), (int(fills["start_ns"].iloc[2]), int(fills["end_ns"].iloc[3]))]
    rows = pd.DataFrame([{"request": i, "client": 0, "prompt_tokens": 64, "start_unix_ns": 1, "start_ns": a,
                          "ttft_ns": b - a, "total_ns": b - a, "status": "ok", "predicted_tokens": 4}
                         for i, (a, b) in enumerate(windows)]).astype(RESULT_COLUMNS)
    write_requests(tmp_path / "off.requests.json", rows)
    (tmp_path / "off.parquet").write_bytes((SAMPLES / "1-pool-off.parquet").read_bytes())
    doc = whatif(tmp_path / "off.parquet", "--cap-bytes", "1GiB")
    hit = {o["ckpt"] for o in doc["outcomes"] if o["outcome"] == "hit"}
    hit_fills = fills[fills["ckpt"].isin(hit)]
    for (a, b), r in zip(windows, doc["requests"]["rows"]):
        inside = sum(max(0, min(int(e), b) - max(int(s), a)) for s, e in zip(hit_fills["start_ns"], hit_fills["end_ns"]))
        assert abs(r["saved_ns"] - inside) <= 1, (r, inside)  # rounded to the ns
        assert r["predicted_ttft_ns"] == r["ttft_ns"] - r["saved_ns"]
    assert doc["requests"]["summary"]["with_breakdown"] == 3


def test_the_replay_holds_less_than_a_kib_per_buffer():
    """Issue 39: at 10M events the simulator kept a tuple per event and per change of the pool
    (about 1.4 KB per buffer traced at its peak, here 1.40); with arrays it is about 0.74 KB.
    Python's own allocator count (tracemalloc, numpy's buffers included): the same on every run."""
    import tracemalloc

    events = [e for i in range(50_000) for e in (("get", 40), ("put", i))]
    inp = made_up(events)
    tracemalloc.start()
    try:
        r = simulate(inp, Policy(cap=8 << 30))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.summary["accepted"] == 50_000
    assert peak / 50_000 < 1024, peak / 50_000


def test_a_trim_idle_sweep_with_never_is_json():
    """`never` in a trim-idle sweep is null in --json (it had no number: a traceback on NaN), and
    the text report says never; each value's row is the replay of that policy alone."""
    trace = SAMPLES / "1-pool-off.parquet"
    p = ckptrace("whatif", trace, "--json", "--sweep", "trim-idle=0.1,never")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["processes"][0]["sweep"]["rows"]
    assert [r["value"] for r in rows] == [1e8, None]
    alone = json.loads(ckptrace("whatif", trace, "--json", "--trim-idle", "never").stdout)["processes"][0]
    assert rows[1]["hits"] == alone["summary"]["hits"]
    text = ckptrace("whatif", trace, "--sweep", "trim-idle=0.1,never")
    assert text.returncode == 0 and "never" in text.stdout, text.stderr


WHATIF_PEAK = """\
import dataclasses
from ckptrace.analyzers.replay import ReplaySource, predict
from ckptrace.analyzers.whatif import POLICIES
(r,) = predict(sys.argv[1], dataclasses.replace(POLICIES["pr201"], cap=4 << 30))
assert isinstance(r.analysis, ReplaySource) and r.analysis.checkpoints is None and not r.analysis.rows.frames
"""


def test_whatif_memory_against_trace_length(tmp_path):
    """Issue 39: whatif of a trace file makes only what its replay reads (analyzers/replay.py), not
    analyze's iteration table (about 200 bytes an iteration). Its traced peak (tracemalloc: Python
    and numpy, deterministic) at 50,000 and 200,000 events of bench_memory's trace grows by about
    110 bytes an event (the kept rows, the checkpoint table, the replay's input), against 173 with
    the whole analysis: held under 132. Not flat: the bound grows with the checkpoints and
    iterations (docs/performance.md, "Memory against trace length")."""
    from helpers import bench_trace, traced_peak

    small, large = 50_000, 200_000
    peaks = [traced_peak(WHATIF_PEAK, bench_trace(tmp_path / f"{n}.parquet", n)) for n in (small, large)]
    per_event = (peaks[1] - peaks[0]) / (large - small)
    assert per_event < 132, (peaks, per_event)
    assert peaks[0] < 12 << 20, peaks  # 6.5 MB at 50,000 events (9.8 with the whole analysis)
