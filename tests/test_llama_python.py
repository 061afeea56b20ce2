"""End to end on llama.cpp inside Python: upstream build 11549 compiled into xllamacpp 2026.10.11549's
extension module (build.sh --version 11549 installs PyPI's prebuilt wheel, as its users do, into a venv in
${CKPTRACE_CACHE:-/var/cache/ckptrace}),
its server run by samples/llama-server/python_server.py in that venv's python. `ckptrace record
--pid` attaches to the Python process: the probe points are in the module's shared object.

One leg with a tiny qwen35 hybrid: 3 clients, a reused prompt (a restore), then slot 0 saved to a
file and restored from it (--slot-save-path). The truth is the server's own log at -lv 4 (in 11549
the `created context checkpoint` line is at trace level: CommonParams.verbosity 4) and its answers
to the slot actions.
"""
from __future__ import annotations

import json

import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.samples.llama_server import (cached_model, log_path, logged_checkpoints, logged_restores, run_legs,
                                           slots_path)
from ckptrace.core.trace import read_trace
from llama_checks import builds, checkpoint_rows, e2e

LLAMA_BUILDS = builds("11549", pools=(False,))  # built in the background (conftest.py)
# A shape no default uses: 20 layers (15 delta-net), 40 heads of 128: 39.30 MiB checkpoints.
MODEL = {"arch": "qwen35", "d_model": 128, "layers": 20, "d_state": 128, "heads": 40}
CLIENTS, REQUESTS = 3, 6
MS = 1_000_000


@pytest.fixture(scope="module")
def leg(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("py11549")
    path, = run_legs(tmp, legs=[("pool-off", False)], clients=CLIENTS, requests=REQUESTS, prompt_tokens=64,
                     n_predict=4, model=cached_model(**MODEL), reuse=True, version="11549", slot_files=True)
    trace = read_trace(path)
    return {"trace": trace, "path": path, "log": log_path(path), "analysis": analyze_trace(trace),
            "logged": logged_checkpoints(log_path(path)), "restores_logged": logged_restores(log_path(path)),
            "slots": json.loads(slots_path(path).read_text())}


def mib(values) -> list[str]:
    return sorted(f"{b / 1024 / 1024:.3f}" for b in values)


@e2e
def test_the_server_is_in_the_python_process_and_matches_11549(leg):
    meta = leg["trace"].meta
    assert meta.profile.name == "11549", meta.profile
    assert meta.executable and "python" in meta.executable.rsplit("/", 1)[-1]
    where = {p.object.rsplit("/", 1)[-1] for p in meta.probes if p.point in ("update_tgt", "state_copy")}
    assert len(where) == 1 and next(iter(where)).startswith("xllamacpp"), where
    assert meta.lost_events == 0


@e2e
def test_every_logged_checkpoint_is_recorded_with_its_size_fill_and_copy(leg):
    logged, ck = leg["logged"], checkpoint_rows(leg)
    assert len(logged) >= 2 * REQUESTS, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
    assert mib(ck["create_bytes"]) == sorted(logged["size_text"])  # tgt + dft + spec, as size() counts
    assert mib(ck["bytes"]) == sorted(logged["size_text"])  # no draft model, no speculative state
    assert (ck["fill_source"] == "measured").all() and (ck["fill_ns"] > 0).all() and (ck["fill_faults"] > 0).all()
    assert (ck["copy_ns"] > 0).all() and (ck["iter"] > 0).all()
    assert not ck["on_device"].any()
    copies = leg["trace"].events.query("kind == 'copy' and ckpt > 0")
    assert (copies["state_flags"] == 1).all()  # PARTIAL_ONLY: the server's checkpoints go to host memory


@e2e
def test_every_logged_restore_is_recorded_and_reports_success(leg):
    logged = leg["restores_logged"]
    assert len(logged) >= 1, f"the reused prompt restored nothing; see {leg['log']}"
    r = leg["analysis"].restores
    r = r[(r["source"] == "checkpoint") & ~r["draft"]]
    assert mib(r["bytes"]) == sorted(logged["size_text"])
    # 11549's load_tgt returns whether it restored: read from its return, true for each
    assert r["restored"].eq(True).all() and (r["copy_ns"] > 0).all()
    rs = leg["trace"].events.query("kind == 'restore' and not draft and bytes > 0")
    assert len(rs) == len(r) and (rs["outcome"] == 1).all()  # 1: ok, from load_tgt's bool


@e2e
def test_slot_save_and_restore_are_spans_the_server_accounts_for(leg):
    """The server's answers: n_written = the state file's bytes (our slot_save span) + the checkpoint
    appendix 11549 writes after it; n_read likewise. Its save_ms/restore_ms cover our spans."""
    save, restore = leg["slots"]
    sf = leg["analysis"].slot_files
    saves, loads = sf[sf["action"] == "save"], sf[sf["action"] == "restore"]
    assert len(saves) == 1 and len(loads) == 2 and sf["ok"].all(), sf
    assert 0 < int(saves["bytes"].iat[0]) <= save["n_written"]
    assert 0 < int(loads["bytes"].iat[1]) <= restore["n_read"]
    assert save["n_written"] - int(saves["bytes"].iat[0]) == restore["n_read"] - int(loads["bytes"].iat[1])
    assert int(saves["total_ns"].iat[0]) <= save["timings"]["save_ms"] * MS + 5_000
    assert int(loads["end_ns"].iat[1] - loads["start_ns"].iat[0]) <= restore["timings"]["restore_ms"] * MS + 5_000
