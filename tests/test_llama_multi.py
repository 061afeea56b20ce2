"""Two real llama-servers recorded at once (`record --pid A=off --pid B=on`): each process's own
breakdown against its own server log (`created context checkpoint ... size = X MiB` at -lv 4).

One server pair per test session: a pool-off build with make_model.py's default model (48.094
MiB checkpoints) and a pool-on build with another shape (42.570 MiB), loaded at the same time
by two drivers, so one recording holds both and neither's rows can pass for the other's.
"""
from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptrace.analyzers.processes import process_traces
from ckptrace.core.loadgen import run_load
from ckptrace.samples.llama_server import build_server, cached_model, llama_server, logged_checkpoints
from ckptrace.core.trace import read_trace
from helpers import CKPTRACE, ckptrace, started
from llama_checks import builds

pytestmark = [pytest.mark.llama, pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

OTHER_SHAPE = {"d_model": 448, "layers": 9, "d_state": 1381}  # test_llama_server.py's: 42.570 MiB
LLAMA_BUILDS = builds("0.3.36")  # build_server's default version, pool-off and pool-on
LOADS = {"off": 3, "on": 4}  # requests per server: different counts, so a mix-up shows
# A bound for a hung test, not a speed: with eight jobs on 2 cores, one 64-token prompt took 88 s.
LOAD_TIMEOUT_S = 900.0


def test_two_servers_recorded_at_once_give_two_correct_breakdowns(tmp_path):
    models = {"off": cached_model(), "on": cached_model(**OTHER_SHAPE)}
    logs = {k: tmp_path / f"{k}.log" for k in LOADS}
    out = tmp_path / "two.parquet"
    with llama_server(build_server(False), models["off"], logs["off"], slots=2) as off, \
            llama_server(build_server(True), models["on"], logs["on"], slots=2) as on, \
            started([CKPTRACE, "record", "--quiet", "-o", out, "--label", "pair",
                     "--pid", f"{off.pid}=off,{on.pid}=on"], ready="ckptrace: tracing") as (rec, _):
        with ThreadPoolExecutor(2) as pool:
            loads = {k: pool.submit(run_load, srv.url, 2, LOADS[k], 64, 2, LOAD_TIMEOUT_S, seed=i)
                     for i, (k, srv) in enumerate((("off", off), ("on", on)), 1)}
            results = {k: f.result() for k, f in loads.items()}
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
    for k, df in results.items():
        assert len(df) == LOADS[k] and (df["status"] == "ok").all(), df
    trace = read_trace(out)
    assert trace.meta.lost_events == 0
    pids = {"off": off.pid, "on": on.pid}
    subs = {info.label: (info, sub) for info, sub in process_traces(trace)}
    assert set(subs) == {"off", "on"}
    doc = json.loads(ckptrace("analyze", "--json", out).stdout)
    entries = {p["label"]: p for p in doc["processes"]}
    for k in LOADS:
        info, sub = subs[k]
        assert info.pid == pids[k] and info.build_id and info.comm == "llama-server"
        logged = logged_checkpoints(logs[k])
        assert len(logged) >= 4, f"the server made only {len(logged)} checkpoints; see {logs[k]}"
        ev = sub.events
        ck = ev[(ev["kind"] == "checkpoint") & ~ev["draft"]]
        assert (ev["pid"] == pids[k]).all()
        assert len(ck) == len(logged), f"{k}: {len(ck)} recorded, {len(logged)} in {logs[k]}"
        # the server prints size() in MiB with 3 decimals; the same rounding of the recorded bytes
        assert sorted(f"{b / 1024 / 1024:.3f}" for b in ck["bytes"]) == sorted(logged["size_text"])
        s = entries[k]["summary"]
        assert s["checkpoints"] == len(logged)
        mem = entries[k]["memory"]
        misses = s["checkpoints"] - s["pool_hits"]
        # every miss mapped one fresh buffer of its checkpoint's size (and glibc's header page)
        assert mem["buffers_mapped"] == misses
        assert misses * ck["bytes"].max() <= mem["buffer_bytes_mapped"] <= misses * (ck["bytes"].max() + 2 * 4096)
        assert mem["peak_rss_bytes"] > mem["peak_held_bytes"] > 0
    assert entries["off"]["summary"]["pool_hits"] == 0 and entries["on"]["summary"]["pool_hits"] > 0
    assert entries["off"]["build_id"] != entries["on"]["build_id"]  # two builds, each its own
