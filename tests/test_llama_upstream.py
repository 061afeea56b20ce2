"""End to end on upstream llama.cpp (build 11434) with the hybrid and SWA models, and restores.

The server is samples/llama-server/build.sh --version 11434 --libcxx (clang + libc++, the build
test_llama_server.py's upstream A/B/A uses, cached in ${CKPTRACE_CACHE:-/var/cache/ckptrace}).
One pool-off leg per model (make_model.py --arch hybrid: a jamba, mamba and attention layers;
--arch swa: a gemma2, sliding-window attention), each a fresh server traced by PID, driven, then
asked to reuse a prompt (reuse_prompt) so that it restores a checkpoint. The truth is the server's
own log: `created context checkpoint ... size = X MiB` and `restored context checkpoint ... size =
X MiB` at -lv 4.

A third leg makes speculative checkpoints without a draft model: the mamba model of the A/B/A on
the same server with upstream's n-gram self-speculation (SPEC_ARGS) at -lv 5, where the server
also logs `created speculative checkpoint (..., size = X MiB, ...)` for each update_tgt before
a drafted batch.
"""
from __future__ import annotations

import pytest

from ckptrace.samples.llama_server import (SPEC_ARGS, cached_model, log_path, logged_checkpoints, logged_restores,
                                           logged_spec_checkpoints, run_legs)
from ckptrace.core.trace import read_trace
from llama_checks import BUILDS, builds, checkpoint_rows, e2e

# Shapes no default uses. hybrid: 6 of 8 layers recurrent, 32.813 MiB checkpoints (the
# recurrent part only); swa: 4 of 8 layers sliding, 8 KiB a cached token (0.157 MiB at 20).
MODELS = {"hybrid": {"arch": "hybrid", "d_model": 448, "layers": 8, "d_state": 1597},
          "swa": {"arch": "swa", "d_model": 512, "layers": 8, "window": 384}}
# fewer requests than the A/B/A: every checkpoint is checked, and these legs are about the model
# kinds and restores, not the pool
CLIENTS, REQUESTS = 3, 6
BUILD = "11434-libcxx"  # llama_checks.BUILDS: the pool-off server of the upstream A/B/A
LLAMA_BUILDS = builds(BUILD, pools=(False,))


@pytest.fixture(scope="module", params=list(MODELS))
def leg(request, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp(request.param)
    path, = run_legs(tmp, legs=[("pool-off", False)], clients=CLIENTS, requests=REQUESTS, prompt_tokens=64,
                     n_predict=4, model=cached_model(**MODELS[request.param]), reuse=True,
                     **BUILDS[BUILD])
    return {"model": request.param, "trace": read_trace(path), "path": path, "log": log_path(path),
            "logged": logged_checkpoints(log_path(path)), "restores_logged": logged_restores(log_path(path))}


@e2e
def test_every_logged_checkpoint_is_recorded_with_its_size_fill_and_copy(leg):
    logged, ck = leg["logged"], checkpoint_rows(leg)
    assert len(logged) >= 2 * REQUESTS, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
    assert leg["trace"].meta.lost_events == 0
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
    # the server prints size() in MiB with 3 decimals; the same rounding of the recorded bytes
    assert sorted(f"{b / 1024 / 1024:.3f}" for b in ck["bytes"]) == sorted(logged["size_text"])
    assert (ck["fill_ns"] > 0).all() and (ck["copy_ns"] > 0).all(), ck[["ckpt", "fill_ns", "copy_ns"]]
    assert (ck["fill_source"] == "measured").all(), ck["fill_source"].value_counts()
    assert (ck["iter"] > 0).all() and (ck["iter_kind"] == "prefill").all(), ck[["iter", "iter_kind"]]
    if leg["model"] == "hybrid":  # the recurrent layers' state: one size, a fresh mmap each time
        assert ck["bytes"].nunique() == 1 and (ck["fill_faults"] > 0).all()
    else:  # the window's cells: grows with the tokens cached
        assert ck["bytes"].nunique() > 1


@e2e
def test_every_logged_restore_is_recorded_with_its_size_and_copy(leg):
    from ckptrace.analyzers import analyze_trace

    logged = leg["restores_logged"]
    assert len(logged) >= 1, f"the reused prompt restored nothing; see {leg['log']}"
    r = analyze_trace(leg["trace"]).restores
    r = r[(r["source"] == "checkpoint") & ~r["draft"]]
    assert sorted(f"{b / 1024 / 1024:.3f}" for b in r["bytes"]) == sorted(logged["size_text"])
    assert (r["copy_ns"] > 0).all(), r


# The A/B/A's mamba (test_llama_server.MODEL_SHAPE, 42.574 MiB), cached already; 16 tokens a
# request: the drafter starts once the model repeats a token, then drafts before most rounds.
SPEC_MODEL = {"d_model": 448, "layers": 9, "d_state": 1381}
SPEC_REQUESTS, SPEC_PREDICT = 2, 16


@pytest.fixture(scope="module")
def spec_leg(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("spec")
    path, = run_legs(tmp, legs=[("pool-off", False)], clients=1, requests=SPEC_REQUESTS, prompt_tokens=64,
                     n_predict=SPEC_PREDICT, model=cached_model(**SPEC_MODEL), server_args=SPEC_ARGS,
                     verbosity=5, **BUILDS[BUILD])
    return {"trace": read_trace(path), "path": path, "log": log_path(path),
            "logged": logged_checkpoints(log_path(path)), "spec_logged": logged_spec_checkpoints(log_path(path))}


@e2e
def test_every_logged_speculative_checkpoint_is_recorded_as_spec(spec_leg):
    """The server's own split: its `created speculative checkpoint` lines are exactly the rows with
    `spec` true (count and sizes), its `created context checkpoint` lines the others."""
    ck, spec_logged = checkpoint_rows(spec_leg), spec_leg["spec_logged"]
    assert spec_leg["trace"].meta.lost_events == 0
    assert len(spec_logged) >= SPEC_REQUESTS, f"only {len(spec_logged)} speculative checkpoints; see {spec_leg['log']}"
    spec, ordinary = ck[ck["spec"]], ck[~ck["spec"]]
    assert len(spec) == len(spec_logged), f"{len(spec)} recorded, {len(spec_logged)} in {spec_leg['log']}"
    assert sorted(f"{b / 1024 / 1024:.3f}" for b in spec["bytes"]) == sorted(spec_logged["size_text"])
    assert (spec_logged["draft_mib"] == 0).all()  # no draft model: the target's state only
    assert sorted(f"{b / 1024 / 1024:.3f}" for b in ordinary["bytes"]) == sorted(spec_leg["logged"]["size_text"])
    assert (ck["copy_ns"] > 0).all() and (ck["fill_source"] == "measured").all(), ck
