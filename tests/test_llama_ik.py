"""End to end on ik_llama.cpp (the fork ik-llama-cpp-python 0.1.5 vendors: build.sh --version ik-0.1.5,
GCC, cached in ${CKPTRACE_CACHE:-/var/cache/ckptrace}) with a tiny qwen35 hybrid (make_model.py
--arch qwen35, the family llama.cpp PR #201 measured; ik cannot load mamba), run with -no-fa.

ik has no common_prompt_checkpoint: server_context::create_checkpoint evicts, asks
llama_state_seq_get_size, builds a std::vector<uint8_t>(n) (operator new and a memset, inlined)
and copies with the 5-argument llama_state_seq_get_data. One leg: a fresh server traced by PID,
driven by 3 clients with a prompt cache (prompt saves), then a reused prompt (a restore). The
truth is the server's own log, which ik writes at every verbosity: `created context checkpoint N
of M (pos_min, pos_max, size = X MiB, took T ms)` with its own clock around the evictions, the
size query, the buffer and the copy; `restored context checkpoint took T ms (..., size = X MiB)`;
`erasing old` / `erased invalidated context checkpoint (..., size = X MiB)`; `saving prompt with
length N, total state size = X MiB`.
"""
from __future__ import annotations

import re

import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.samples.llama_server import (cached_model, log_path, logged_checkpoints, logged_erasures,
                                           logged_prompt_saves, logged_restores, run_legs)
from ckptrace.core.trace import read_trace
from llama_checks import builds, checkpoint_rows, e2e

LLAMA_BUILDS = builds("ik-0.1.5", pools=(False,))  # built in the background (conftest.py)
# A shape no default uses: 12 layers (9 delta-net), 56 heads of 128: 33.0 MiB checkpoints, above
# glibc's largest mmap threshold (32 MiB), so every buffer is a fresh mmap and every erasure a munmap.
MODEL = {"arch": "qwen35", "d_model": 192, "layers": 12, "d_state": 128, "heads": 56}
CLIENTS, REQUESTS = 3, 6
CACHE_RAM_MIB = 1024  # a prompt cache: a slot's old prompt is saved before it takes a new one
# ik checkpoints a prompt this many tokens before its end (default 5) and after its last token: 20
# puts one inside the prefix reuse_prompt keeps, so the reused prompt restores it
SERVER_ARGS = ("--ctx-checkpoints-tolerance", "20")
MS = 1_000_000
LOG_ROUNDING_NS = 5_000  # ik prints its took with 2 decimals of a millisecond


@pytest.fixture(scope="module")
def leg(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ik")
    path, = run_legs(tmp, legs=[("pool-off", False)], clients=CLIENTS, requests=REQUESTS, prompt_tokens=64,
                     n_predict=4, model=cached_model(**MODEL), reuse=True, version="ik-0.1.5",
                     cache_ram=CACHE_RAM_MIB, server_args=SERVER_ARGS)
    log = log_path(path)
    trace = read_trace(path)
    return {"trace": trace, "path": path, "log": log, "analysis": analyze_trace(trace),
            "logged": logged_checkpoints(log), "restores_logged": logged_restores(log),
            "erased": logged_erasures(log), "saves": logged_prompt_saves(log)}


def mib(values) -> list[str]:
    """Bytes as the server prints them: MiB with 3 decimals, sorted."""
    return sorted(f"{b / 1024 / 1024:.3f}" for b in values)


@e2e
def test_the_profile_is_ik_and_every_point_is_found(leg):
    meta = leg["trace"].meta
    assert meta.profile.name == "ik-0.1.5" and meta.profile.missing == [], meta.profile
    points = {p.point for p in meta.probes}
    assert {"create_checkpoint", "state_size", "fill_call", "state_copy", "update_slots", "load_tgt",
            "state_restore", "llama_decode", "save_call"} <= points, points
    assert not points & {"update_tgt", "resize_grow"}  # upstream's names: not in this fork
    assert meta.lost_events == 0 and meta.partial_spans == 0


@e2e
def test_the_servers_own_log_file_stays_beside_its_log(leg):
    # ik writes its LOG() lines to llama.log in its working folder: the leg's, not the caller's
    assert (leg["log"].parent / "llama.log").is_file()


@e2e
def test_every_logged_checkpoint_is_recorded_with_its_size_fill_and_copy(leg):
    logged, ck = leg["logged"], checkpoint_rows(leg)
    assert len(logged) >= CLIENTS * 2, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
    assert mib(ck["bytes"]) == sorted(logged["size_text"])
    assert (ck["create_bytes"] == ck["bytes"]).all()  # ik's checkpoint is its one copy
    # a fresh 33 MiB buffer each time: its memset faults every page in, then the copy fills it
    assert (ck["fill_source"] == "measured").all() and (ck["fill_ns"] > 0).all() and (ck["fill_faults"] > 0).all()
    assert (ck["copy_ns"] > 0).all() and not ck["pool_hit"].any()
    assert (ck["iter"] > 0).all()
    copies = leg["trace"].events.query("kind == 'copy' and ckpt > 0")
    assert (copies["state_flags"] == 1).all()  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, as create_checkpoint passes


@e2e
def test_each_checkpoint_lies_inside_iks_own_took(leg):
    """ik times each checkpoint itself (ggml_time_us, CLOCK_MONOTONIC as the trace) from before its
    evictions to after its copy: our checkpoint (size query to copy) lies inside that time, and that
    time inside our create_checkpoint span. Paired in order: one thread makes them all, one at a time."""
    ck, logged = checkpoint_rows(leg), leg["logged"]
    ev = leg["trace"].events
    creates = ev[ev["kind"] == "create"].sort_values("start_ns")
    assert len(ck) == len(logged)
    for k, took in zip(ck.itertuples(), logged["took_ms"]):
        took_ns = took * MS
        assert k.total_ns <= took_ns + LOG_ROUNDING_NS, (k.ckpt, k.total_ns, took)
        assert k.fill_ns + k.copy_ns <= k.total_ns
        cr = creates[(creates["tid"] == k.tid) & (creates["start_ns"] <= k.start_ns) & (creates["end_ns"] >= k.end_ns)]
        assert len(cr) == 1, k
        assert took_ns <= int(cr["end_ns"].iat[0] - cr["start_ns"].iat[0]) + LOG_ROUNDING_NS, (k.ckpt, took)


@e2e
def test_every_logged_restore_is_recorded_with_its_size_and_outcome(leg):
    logged = leg["restores_logged"]
    assert len(logged) >= 1, f"the reused prompt restored nothing; see {leg['log']}"
    r = leg["analysis"].restores
    r = r[r["source"] == "checkpoint"]
    assert mib(r["bytes"]) == sorted(logged["size_text"])
    assert (r["copy_ns"] > 0).all() and r["restored"].eq(True).all()


@e2e
def test_every_logged_erasure_is_an_eviction(leg):
    """Each checkpoint the server erased (to make room, or invalidated by a shorter prompt) freed
    its buffer: one munmap, inside create_checkpoint before its checkpoint or inside apply_checkpoint."""
    erased, ev = leg["erased"], leg["analysis"].evictions
    assert len(erased) >= 1, f"the server erased no checkpoint; see {leg['log']}"
    assert len(ev) == len(erased), (ev, erased)
    want = {"erasing old": "room", "erased invalidated": "invalidated"}
    assert sorted(ev["why"].astype(str)) == sorted(erased["why"].map(want))
    assert (ev["bytes"] >= erased["size_mib"].min() * 1024 * 1024).all()


@e2e
def test_every_logged_prompt_save_is_recorded_with_its_size(leg):
    saves, ps = leg["saves"], leg["analysis"].prompt_saves
    assert len(saves) >= 1, f"the server saved no prompt; see {leg['log']}"
    assert mib(ps["bytes"]) == sorted(saves["size_text"])
    assert (ps["source"] == "inlined").all() and (ps["copy_ns"] > 0).all()


@e2e
def test_iterations_and_batches(leg):
    """Iterations are server_context::update_slots calls; batches llama_decode(llama_batch), whose
    tokens add up to what the server says it evaluated: each request's prompt tokens (its log's
    `prompt eval time = ... / N tokens`) and every token it generated but the last."""
    a = leg["analysis"]
    it = a.iterations
    assert (it["boundary"].astype(str) == "update_slots").all() and len(it) > 0
    decode = leg["trace"].events.query("kind == 'decode'")
    text = leg["log"].read_text()
    prompt = [int(n) for n in re.findall(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens", text)]
    gen = [int(n) for n in re.findall(r"\n\s*eval time = +[\d.]+ ms / +(\d+) (?:tokens|runs)", text)]
    assert len(prompt) == REQUESTS + 2 == len(gen), (prompt, gen)
    assert int(decode["tokens"].sum()) == sum(prompt) + sum(gen) - len(gen), (int(decode["tokens"].sum()), prompt, gen)
    ck = checkpoint_rows(leg)
    assert set(ck["iter"]) <= set(it["iter"])
    assert pd.Series(it.set_index("iter").loc[ck["iter"], "kind"]).notna().all()


@pytest.mark.llama
def test_symbols_on_a_generation_it_does_not_know_names_the_nearest(monkeypatch):
    """The real ik server, as a ckptrace without the ik profile sees it (what issue 23 found: a
    refusal hinting at stripping and inlining, while the functions simply do not exist there): the
    nearest known generation is named with what was found of it, what the missing points cost, and
    no guess. Then the CLI, which knows ik: the profile and no missing point."""
    from ckptrace.core.errors import SymbolError
    from ckptrace.probes import points, symbols
    from ckptrace.samples.llama_server import build_server
    from helpers import ckptrace

    binary = str(build_server(False, version="ik-0.1.5"))
    known = tuple(p for p in points.PROFILES if p.family != "ik_llama.cpp")
    monkeypatch.setattr(points, "PROFILES", known)
    with pytest.raises(SymbolError) as e:
        symbols.resolve_binary(binary)
    msg = str(e.value)
    assert msg.startswith("update_tgt: common_prompt_checkpoint::update_tgt not found in llama-server, "), msg
    assert "(also missing: state_copy)" in msg
    m = re.search(r"nearest generation: (\S+) \((\d+) of its (\d+) points found: ([^)]*)\)", msg)
    assert m and m.group(1) == "llama_decode", msg  # ik batches through llama_decode, as upstream once did
    assert {"llama_decode", "slot_save", "slot_restore"} <= set(m.group(4).split(", ")), msg
    assert "without update_tgt, state_copy no checkpoint is seen, nothing can be recorded" in msg
    assert "inlined" not in msg and "stripped" not in msg  # every object with llama.cpp names has its .symtab
    monkeypatch.undo()
    r = ckptrace("symbols", binary)
    assert r.returncode == 0, r.stderr
    assert "profile: ik-0.1.5 (" in r.stdout and "missing optional: none" in r.stdout
