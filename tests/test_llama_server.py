"""End to end on a real llama-server: attach by PID, drive load, match every logged checkpoint.

The legs are recorded by ckptrace.samples.llama_server.run_legs, the code `ckptrace demo
--llama-server` runs: pool-off and pool-on servers from samples/llama-server/build.sh (cached in
${CKPTRACE_CACHE:-/var/cache/ckptrace}), a tiny random mamba model of a shape no default uses,
then pool-off, pool-on, pool-off, each a fresh server with `ckptrace record --pid` attached
before the load. The truth is the server's own log: `created context checkpoint N of M (...,
size = X MiB)` at -lv 4.

Every A/B/A test runs on two builds (BUILDS): GCC + libstdc++ on llama-cpp-python 0.3.36's
llama.cpp, and clang + libc++ on upstream llama.cpp build 11434 with the ported pool. The second
covers three rows at once (upstream, libc++, its pool); GCC on upstream is checked by hand (docs/llama-server.md).
Hybrid and SWA models: test_llama_upstream.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from ckptrace.core.loadgen import make_prompt, run_load
from ckptrace.samples.llama_server import (build_server, cached_model, free_port, llama_server, log_path,
                                           logged_checkpoints, run_legs, ttft_path)
from ckptrace.core.requests_file import read_requests
from ckptrace.core.trace import read_trace, write_trace
from helpers import assert_one_line_error, assert_pool_faster, ckptrace
from llama_checks import BUILDS, assert_pool_mechanism, builds, checkpoint_rows, e2e


# A shape no other test or sample default uses: 42.570 MiB checkpoints (above the 32 MiB floor).
MODEL_SHAPE = {"d_model": 448, "layers": 9, "d_state": 1381}
CLIENTS, REQUESTS = 3, 12
LLAMA_BUILDS = builds(*BUILDS)  # each build's pool-off and pool-on server



@pytest.fixture(scope="module", params=list(BUILDS))
def legs(request, tmp_path_factory) -> list[dict]:
    """pool-off, pool-on, pool-off on one build: builds cached or made now (10 to 20 min each)."""
    tmp = tmp_path_factory.mktemp(f"llama-{request.param}")
    paths = run_legs(tmp, clients=CLIENTS, requests=REQUESTS, prompt_tokens=64, n_predict=4,
                     model=cached_model(**MODEL_SHAPE), **BUILDS[request.param])
    return [{"trace": read_trace(p), "path": p, "logged": logged_checkpoints(log_path(p)),
             "log": log_path(p), "ttft": read_requests(ttft_path(p))} for p in paths]


@pytest.mark.parametrize("leg_index", [0, 1, 2])
@e2e
def test_every_logged_checkpoint_is_recorded_with_its_size(legs, leg_index):
    leg = legs[leg_index]
    logged, ck = leg["logged"], checkpoint_rows(leg)
    assert len(logged) >= 6, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
    assert leg["trace"].meta.lost_events == 0
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
    # the server prints size() in MiB with 3 decimals; the same rounding of the recorded bytes
    recorded = sorted(f"{b / 1024 / 1024:.3f}" for b in ck["bytes"])
    assert recorded == sorted(logged["size_text"])
    assert (ck["copy_ns"] > 0).all()
    assert (ck["iter"] > 0).all() and (ck["iter_kind"] == "prefill").all(), ck[["iter", "iter_kind"]]
    assert (ck["fill_source"] == "measured").all(), ck["fill_source"].value_counts()


@e2e
def test_pool_off_fills_every_checkpoint_with_faults(legs):
    for leg in (legs[0], legs[2]):
        ck = checkpoint_rows(leg)
        assert not ck["pool_hit"].any()
        assert (ck["fill_ns"] > 0).all() and (ck["fill_faults"] > 0).all()


@e2e
def test_pool_misses_are_exactly_the_fresh_buffers(legs):
    assert_pool_mechanism(legs)


@e2e
def test_every_request_completed_with_a_first_token(legs):
    for leg in legs:
        t = leg["ttft"]
        assert len(t) == REQUESTS and (t["status"] == "ok").all(), t
        assert (t["ttft_ns"] > 0).all() and (t["ttft_ns"] <= t["total_ns"]).all()
        # the real server's own account: one timing block per request it processed, each with
        # at most the prompt tokens drive says the server evaluated (fewer when a prefix was reused)
        processed = [int(n) for n in re.findall(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens",
                                                 leg["log"].read_text())]
        assert len(processed) == REQUESTS, leg["log"]
        assert sum(processed) <= t["prompt_tokens"].sum() and min(processed) > 0


@e2e
def test_compare_reads_faster_for_fill(legs):
    p = ckptrace("compare", *(leg["path"] for leg in legs), "--json")
    assert p.returncode == 0, p.stderr
    assert_pool_faster(json.loads(p.stdout))


def overlap(rows: pd.DataFrame, lo: int, hi: int) -> int:
    """Summed intersection of the rows' spans with [lo, hi], by a plain loop (the test's own truth)."""
    return sum(max(0, min(int(e), hi) - max(int(b), lo)) for b, e in zip(rows["start_ns"], rows["end_ns"]))


@e2e
def test_each_request_stall_adds_up_to_the_checkpoints_in_its_window(legs):
    """drive's own requests against the trace's own spans, to the ns; and the server's log: every
    checkpoint it created lies wholly inside some request's window (it saves a prompt's state
    before that prompt's first token)."""
    from ckptrace.analyzers import analyze_trace
    from ckptrace.analyzers.requests import request_table

    for leg in legs:
        t = request_table(leg["ttft"], analyze_trace(leg["trace"]))
        assert t["in_recording"].all(), t  # record attached before the load, stopped after it
        ev = leg["trace"].events
        saved = ev[(ev["kind"] == "checkpoint") & ev["ckpt"].isin(ev.loc[ev["kind"] == "copy", "ckpt"])]
        fills, copies = ev[ev["kind"] == "fill"], ev[ev["kind"] == "copy"]
        assert len(saved) == len(leg["logged"])
        # a create_checkpoint span counts whole, a checkpoint inside one once (as part of it)
        creates = ev[ev["kind"] == "create"]
        lone = saved[[not any(c.tid == k.tid and c.start_ns <= k.start_ns and k.end_ns <= c.end_ns
                              for c in creates.itertuples()) for k in saved.itertuples()]]
        for r in t.itertuples():
            lo, hi = r.start_ns, r.first_token_ns
            assert hi - lo == r.ttft_ns
            assert r.ckpt_ns == overlap(creates, lo, hi) + overlap(lone, lo, hi), r
            assert (r.ckpt_fill_ns, r.ckpt_copy_ns) == (overlap(fills, lo, hi), overlap(copies, lo, hi)), r
            assert r.stall_ns == r.ckpt_ns + (0 if pd.isna(r.restore_ns) else r.restore_ns)
            assert r.rest_ns == r.ttft_ns - r.stall_ns and r.est_ttft_without_fill_ns == r.ttft_ns - r.ckpt_fill_ns
        windows = list(zip(t["start_ns"], t["first_token_ns"]))
        assert all(any(lo <= b and e <= hi for lo, hi in windows) for b, e in zip(saved["start_ns"], saved["end_ns"]))
        assert int(t["ckpt_ns"].max()) > 0


@e2e
def test_compare_reports_ttft_and_throughput_with_intervals(legs):
    """The request files beside the traces are paired; the rows exist with intervals (their
    verdicts depend on the machine's load, so they are not asserted)."""
    p = ckptrace("compare", *(leg["path"] for leg in legs), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = {m["metric"]: m for m in doc["metrics"]}
    ok = [leg["ttft"][leg["ttft"]["status"] == "ok"]["ttft_ns"].to_numpy("float64") / 1e6 for leg in legs]
    for q in (50, 90, 99):
        m = rows[f"ttft_p{q}_ms"]
        assert m["samples_baseline"] == 2 * REQUESTS and m["samples_candidate"] == REQUESTS
        assert m["baseline_value"] == pytest.approx(float(pd.Series([*ok[0], *ok[2]]).quantile(q / 100)))
        assert m["candidate_value"] == pytest.approx(float(pd.Series(ok[1]).quantile(q / 100)))
        assert m["ci_low_pct"] is not None and m["ci_low_pct"] <= m["change_pct"] <= m["ci_high_pct"], m
    tp = rows["throughput_tok_s"]
    t = legs[1]["ttft"]
    wall_s = float((t["start_ns"] + t["total_ns"]).max() - t["start_ns"].min()) / 1e9
    assert tp["candidate_value"] == pytest.approx(t["predicted_tokens"].sum() / wall_s)
    assert (t["predicted_tokens"] == 4).all()  # n_predict, as the server counted
    assert tp["ci_low_pct"] is not None


@e2e
def test_fail_on_slower_trips_on_a_slower_candidate_and_passes_an_aaa(legs, tmp_path):
    """pool-on as the baseline, pool-off as the candidate: page faults per checkpoint at least
    twice as many by construction (over half the pool-on checkpoints hit and fault nothing, every
    pool-off one faults each page of a fresh buffer once): exact counts, where the fill's CPU time
    moves with the machine's load. A/A (pool-off, the other pool-off leg relabelled; compare refuses
    one recording twice): every fresh buffer faults once per page, so the fault count cannot move."""
    on, off1, off2 = legs[1]["path"], legs[0]["path"], legs[2]["path"]
    p = ckptrace("compare", on, off1, off2, "--fail-on", "slower", "--metrics", "checkpoint_faults")
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "--fail-on slower tripped: checkpoint_faults slower" in p.stderr
    relabelled = tmp_path / "2-B.parquet"
    t = read_trace(off2)
    write_trace(relabelled, t.events, replace(t.meta, label="B"))
    p = ckptrace("compare", off1, relabelled, "--fail-on", "any-change", "--metrics", "checkpoint_faults",
                 "--format", "markdown")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "Gate `--fail-on any-change` passed." in p.stdout


@pytest.mark.llama
def test_the_server_is_stopped_when_the_body_fails(tmp_path):
    with pytest.raises(RuntimeError, match="the body failed"):
        with llama_server(build_server(False), cached_model(**MODEL_SHAPE), tmp_path / "s.log") as srv:
            proc = srv.proc
            assert proc.poll() is None
            raise RuntimeError("the body failed")
    assert proc.poll() is not None  # stopped and reaped, not left running
    assert "listening on http://127.0.0.1:" in (tmp_path / "s.log").read_text()  # it had started


# The load driver, against a stand-in server speaking /completion's SSE stream.

class FakeCompletion(BaseHTTPRequestHandler):
    """Answers /health, and /completion with `n_predict` chunks after `first_delay_s`."""

    protocol_version = "HTTP/1.1"
    first_delay_s = 0.05
    step_s = 0.0  # each request's first chunk comes this much later than the previous one's
    lock = threading.Lock()
    prompts: list[str] = []
    in_flight = 0
    max_in_flight = 0

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.prompts.append(body["prompt"])
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        with cls.lock:
            delay = cls.first_delay_s + cls.step_s * (len(cls.prompts) - 1)
        time.sleep(delay)
        for _ in range(body["n_predict"]):
            self._chunk({"content": "tok", "stop": False})
        with cls.lock:  # before the last chunk: the client may send its next request on seeing it
            cls.in_flight -= 1
        self._chunk({"content": "", "stop": True, "tokens_evaluated": len(body["prompt"].split())})
        self.close_connection = True

    def _chunk(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


@pytest.fixture
def fake_server():
    handler = type("Handler", (FakeCompletion,), {"prompts": [], "lock": threading.Lock()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield handler, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_drive_sends_distinct_prompts_and_times_first_token(fake_server):
    handler, url = fake_server
    df = run_load(url, clients=3, requests=7, prompt_tokens=20, n_predict=3, timeout_s=60, seed=5)
    assert list(df["request"]) == list(range(7))
    assert (df["status"] == "ok").all()
    assert len(set(handler.prompts)) == 7 and handler.max_in_flight <= 3
    assert set(df["client"]) <= {0, 1, 2}
    # the stand-in waits first_delay_s before the first chunk
    assert (df["ttft_ns"] >= handler.first_delay_s * 1e9).all()
    assert (df["ttft_ns"] <= df["total_ns"]).all()
    assert sorted(df["prompt_tokens"]) == sorted(len(p.split()) for p in handler.prompts)
    # the same seed gives the same prompts, another seed others
    assert set(handler.prompts) == {make_prompt(i, 20, 5) for i in range(7)}
    assert not set(handler.prompts) & {make_prompt(i, 20, 6) for i in range(7)}


def test_drive_text_percentiles_are_those_of_its_table(fake_server):
    """The text report's p50/p90/p99 are the (linear) percentiles of the TTFTs it lists; the
    stand-in spreads them 10 ms apart so a wrong rank would show."""
    handler, url = fake_server
    handler.first_delay_s, handler.step_s = 0.01, 0.01
    r = ckptrace("drive", url, "--clients", "1", "--requests", "10", "--prompt-tokens", "8", "--n-predict", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split() == ["req", "client", "prompt_tok", "start_ms", "ttft_ms", "total_ms", "status"]
    rows = [ln.split() for ln in lines[1:-1]]
    assert [int(x[0]) for x in rows] == list(range(10)) and all(x[-1] == "ok" for x in rows)
    ttft = pd.Series([float(x[4]) for x in rows])
    assert ttft.max() - ttft.min() >= 20  # the spread is there (90 ms by construction)
    m = re.fullmatch(r"10 of 10 requests ok, 10 sent; TTFT ms: p50 ([\d.]+)  p90 ([\d.]+)  p99 ([\d.]+)", lines[-1])
    assert m, lines[-1]
    for q, printed in zip((0.5, 0.9, 0.99), m.groups()):
        assert abs(float(printed) - ttft.quantile(q)) <= 0.1, (q, printed, ttft.quantile(q))


def test_drive_stops_at_the_time_bound(fake_server):
    handler, url = fake_server
    handler.first_delay_s = 3.0
    df = run_load(url, clients=2, requests=50, prompt_tokens=8, n_predict=1, timeout_s=1.0)
    assert len(df) == 2 and (df["status"] == "timeout").all(), df
    assert df["ttft_ns"].isna().all()


def test_drive_json_fields(fake_server):
    _, url = fake_server
    before = time.monotonic_ns()
    r = ckptrace("drive", url, "--clients", "2", "--requests", "2", "--json")
    after = time.monotonic_ns()
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["requests"]
    # start_ns is on the trace clock (CLOCK_MONOTONIC, system-wide): inside this test's window
    assert all(before < row["start_ns"] < after for row in rows), (before, rows, after)
    assert {k for row in rows for k in row} == {"request", "client", "prompt_tokens", "start_unix_ns",
                                                "start_ns", "ttft_ns", "total_ns", "status", "predicted_tokens"}


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://example.com", "https://127.0.0.1:8080",
                                 "http://127.0.0.2:8080"])
def test_drive_refuses_any_other_target(url):
    r = ckptrace("drive", url)
    assert r.returncode == 2 and "Invalid value for 'URL'" in r.stderr, r.stderr


def test_drive_says_when_nothing_listens():
    port = free_port()
    line = assert_one_line_error(ckptrace("drive", f"http://127.0.0.1:{port}", "--timeout", "1"), code=1)
    assert line.startswith("ckptrace: error: nothing listens at"), line


def test_a_finished_build_that_no_longer_runs_is_built_again(tmp_path):
    """build.sh reuses a finished build only if its binary still runs (`--version`): one that fails
    is said in one line and built again, not handed to a test that then fails far from the cause.
    The rebuild is stopped as soon as it starts (a real one is minutes)."""
    import os
    import signal
    import subprocess

    from ckptrace.samples.llama_server import BUILD_SH

    build = tmp_path / "llama-server" / "0.3.36-off-dl"  # build.sh's key: GGML_BACKEND_DL as the images
    (build / "build" / "bin").mkdir(parents=True)
    binary = build / "build" / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\nexit 127\n")  # a library gone since: the loader's status
    binary.chmod(0o755)
    (build / ".built").touch()
    p = subprocess.Popen(["bash", str(BUILD_SH), "--version", "0.3.36"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "CKPTRACE_CACHE": str(tmp_path)})
    try:
        line = p.stderr.readline()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert line == f"build.sh: {build} is finished but llama-server does not run: building it again\n", line
    assert not (build / ".built").exists() and not binary.exists()
