"""`ckptrace whatif` on a real llama-server: PR #201's pool predicted from a pool-off recording,
held to the pool-on build's own log and recording of the same load.

Both legs (0.3.36, GCC; samples/llama-server/build.sh with and without --pool) get the same load
on a fresh server with `ckptrace record --pid` attached: 12 distinct prompts of 64 words, then one
tiny prompt per slot (its old checkpoints are erased, into the pool, and it is too short to make
one: a prompt decoded in one batch from an empty memory has nothing to checkpoint), a pause of
2.5 s (the pool-on server trims its pool after a second with no task), 6 more prompts of 64
words. The truth is the pool-on server's log at -lv 4: one `get: hit|miss for X MiB (...)` line
per get and one `trim: freeing N pooled buffers, X MiB` per trim that freed something
(samples/llama-server/pool.patch).
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.core.loadgen import RESULT_COLUMNS, local_url, one_request, run_load
from ckptrace.core.requests_file import write_requests
from ckptrace.samples.llama_server import build_server, cached_model, llama_server, log_path, recorder, ttft_path
from ckptrace.core.trace import read_trace
from helpers import ckptrace
from llama_checks import builds, e2e

LLAMA_BUILDS = builds("0.3.36")  # build_server's default version, pool-off and pool-on
CLIENTS, FIRST, SECOND, PAUSE_S = 3, 12, 6, 2.5
GET_LINE = re.compile(r"get: (hit|miss) for ([0-9.]+) MiB \(hits = \d+, misses = \d+, pooled = (\d+)\)")
TRIM_LINE = re.compile(r"trim: freeing (\d+) pooled buffers, ([0-9.]+) MiB")


def tiny_prompts(url: str) -> pd.DataFrame:
    """One one-word prompt per slot, all at once (each takes an idle slot): decoded in one batch
    from an empty memory, it makes no checkpoint, and its slot's old ones go to the pool."""
    deadline = time.monotonic() + 600
    body = lambda i: {"prompt": ["Hello", "World", "Again"][i], "n_predict": 4, "stream": True,  # noqa: E731
                      "temperature": 0.0, "seed": i}
    with ThreadPoolExecutor(CLIENTS) as pool:
        rows = list(pool.map(lambda i: {**one_request(local_url(url), body(i), deadline), "request": i, "client": i},
                             range(CLIENTS)))
    return pd.DataFrame(rows).astype(RESULT_COLUMNS)


@pytest.fixture(scope="module")
def legs(tmp_path_factory) -> dict:
    """The pool-off and pool-on legs of one load with an idle pause in it: trace, log, requests."""
    tmp = tmp_path_factory.mktemp("llama-whatif")
    model = cached_model()
    out = {}
    for name, pool in (("off", False), ("on", True)):
        trace = tmp / f"{name}.parquet"
        with llama_server(build_server(pool), model, log_path(trace), slots=CLIENTS) as srv:
            with recorder(srv.pid, trace, f"pool-{name}"):
                first = run_load(srv.url, CLIENTS, FIRST, prompt_tokens=64, n_predict=4, timeout_s=1200, seed=7)
                tiny = tiny_prompts(srv.url)
                time.sleep(PAUSE_S)
                second = run_load(srv.url, CLIENTS, SECOND, prompt_tokens=64, n_predict=4, timeout_s=1200, seed=8)
        requests = pd.concat([first, tiny.assign(request=tiny["request"] + FIRST),
                              second.assign(request=second["request"] + FIRST + CLIENTS)], ignore_index=True)
        assert (requests["status"] == "ok").all(), requests
        write_requests(ttft_path(trace), requests)
        out[name] = {"path": trace, "trace": read_trace(trace), "log": log_path(trace).read_text(errors="replace")}
    return out


def prediction(legs, *args) -> dict:
    p = ckptrace("whatif", legs["off"]["path"], "--json", *args)
    assert p.returncode == 0, p.stderr
    (proc,) = json.loads(p.stdout)["processes"]
    return proc


@e2e
def test_the_prediction_matches_the_pool_on_servers_log_and_recording(legs):
    pred = prediction(legs)
    s = pred["summary"]
    gets = GET_LINE.findall(legs["on"]["log"])
    trims = TRIM_LINE.findall(legs["on"]["log"])
    assert len(gets) == s["gets"] > 0, (len(gets), s["gets"])
    assert s["hits"] == sum(g[0] == "hit" for g in gets) > 0
    off, on = analyze_trace(legs["off"]["trace"]), analyze_trace(legs["on"]["trace"])
    assert s["misses"] == int((on.checkpoints["mmaps"] > 0).sum())
    # the idle trim: as many as the server logged, each freeing what the replay had pooled
    assert s["trims"] == len(trims) >= 1, (s["trims"], trims)
    trimmed = [e["bytes"] for e in pred["pooled"] if e["event"] == "trim"]
    assert [f"{b / 1024 / 1024:.3f}" for b in trimmed] == [t[1] for t in trims]
    # the most the pool held: the log says how many buffers it held before each get (after it, plus
    # one for a hit) and at each trim: the prediction's high-water mark is at least the most of
    # those, and within 1% of it
    size = {g[1] for g in gets}
    assert len(size) == 1, size  # one checkpoint size: a count of buffers x that size is the pooled bytes
    mib = float(size.pop()) * 1024 * 1024
    before = max([int(n) + (h == "hit") for h, _, n in gets] + [int(n) for n, _ in trims])
    assert s["pooled_hwm_buffers"] >= before
    assert abs(s["pooled_hwm_bytes"] - before * mib) <= 0.01 * before * mib, (s["pooled_hwm_bytes"], before)
    assert abs(s["held_hwm_bytes"] - on.memory["peak_held_bytes"]) <= 0.01 * on.memory["peak_held_bytes"]
    # Fill time saved on CPU, held to what the pool-on server's hits cost. The replay keeps each miss's
    # recorded cost, so the two runs' misses differ only by run-to-run noise, which the difference of
    # all their fills would add to the comparison: a fresh 48 MiB fill took 40 to 180 ms on CPU here as
    # a neighbour's memory traffic came and went (docs/validation.md), and one slow miss of 12 moves a
    # 24-hit saving past 10%. So the saving compared is the hits': the pool-off fills of the checkpoints
    # predicted to hit, less the fills of the pool-on server's hits (its checkpoints that mapped nothing).
    hits_off = sum(o["fill_cpu_ns"] for o in pred["outcomes"] if o["outcome"] == "hit")
    on_hits = int(on.checkpoints.loc[(on.checkpoints["mmaps"] == 0).to_numpy(), "fill_cpu_ns"].sum())
    measured = hits_off - on_hits
    assert abs(s["fill_cpu_saved_ns"] - measured) <= 0.10 * measured, (s["fill_cpu_saved_ns"], measured, on_hits)
    # with its request file, each request's predicted TTFT: no more than its own fill time saved
    assert pred["requests"]["summary"]["with_breakdown"] == FIRST + CLIENTS + SECOND
    assert all(r["saved_ns"] >= 0 and r["predicted_ttft_ns"] <= r["ttft_ns"] for r in pred["requests"]["rows"])


@e2e
def test_never_trimming_would_have_kept_the_second_loads_buffers(legs):
    """The same recording without the idle trim: the pause frees nothing, so the second load's
    first checkpoints would hit; each trim the server logged cost that many hits."""
    trim = prediction(legs)["summary"]
    never = prediction(legs, "--trim-idle", "never")["summary"]
    assert never["trims"] == 0 and never["hits"] > trim["hits"]
