"""What the real llama-server tests check on a recorded leg, shared by both llama.cpp generations."""
from __future__ import annotations

import pandas as pd
import pytest


# The builds the real-server tests run: build.sh's version and compiler (run_legs' keywords).
# 0.3.36 GCC + libstdc++ (its pool pair); upstream 11434 clang + libc++ (its pool pair, and the
# hybrid and SWA legs on its pool-off server): together the rows of docs/llama-server.md's verified table.
# Both measure the fill: GCC's growth (_M_default_append) is out of line and probed; clang -O3
# inlines libc++'s growth into update_tgt, and the probes sit on its memset call sites there.
BUILDS = {"0.3.36": {"version": "0.3.36", "libcxx": False},
          "11434-libcxx": {"version": "11434", "libcxx": True}}
# One configuration each (GCC, no pool patch): ik_llama.cpp's server and upstream 11549 in Python.
OTHER_BUILDS = {"ik-0.1.5": {"version": "ik-0.1.5", "libcxx": False},
                "11549": {"version": "11549", "libcxx": False}}


def builds(*names: str, pools=(False, True)) -> list[dict]:
    """A test module's LLAMA_BUILDS (conftest.py builds them in the background): build_argv's
    keywords for each of BUILDS' `names`, pool-off and pool-on by default."""
    return [{"pool": pool, **{**BUILDS, **OTHER_BUILDS}[name]} for name in names for pool in pools]


def e2e(test):
    """Marks of the tests that build and trace a real server (the driver tests need neither)."""
    return pytest.mark.llama(pytest.mark.ebpf(pytest.mark.usefixtures("require_root_ebpf")(test)))


def checkpoint_rows(leg: dict) -> pd.DataFrame:
    from ckptrace.analyzers import analyze_trace

    a = analyze_trace(leg["trace"])
    ck = a.checkpoints[~a.checkpoints["draft"]].sort_values("start_ns", ignore_index=True)
    kinds = a.iterations.set_index("iter")["kind"]
    return ck.assign(iter_kind=ck["iter"].map(kinds).astype("string"))


def fresh_buffer(leg: dict) -> pd.Series:
    """Per checkpoint (by ckpt id): its copy wrote into a mapping its own fill had just mmap()ed.
    Buffer identity from the trace's addresses, whatever order the requests arrived in."""
    ev = leg["trace"].events
    copies = ev[ev["kind"] == "copy"].set_index("ckpt")["addr"]
    maps = ev[(ev["kind"] == "mmap") & (ev["ckpt"] > 0)]
    inside = {c: ((maps["ckpt"] == c) & (maps["addr"] <= a) & (a < maps["addr"] + maps["bytes"])).any()
              for c, a in copies.items()}
    return pd.Series(inside, dtype=bool)


def assert_pool_mechanism(legs: list[dict]) -> None:
    """The pool's effect as a mechanism, not a timing: in every leg a checkpoint missed the pool
    exactly when its copy went into a buffer its own fill had just mmap()ed; in the pool-on leg
    (legs[1]) most checkpoints reuse a buffer an earlier checkpoint of the leg wrote into,
    resident, so neither the fill nor the copy into it faults."""
    for leg in legs:
        ck = checkpoint_rows(leg).set_index("ckpt")
        fresh = fresh_buffer(leg).reindex(ck.index)
        assert (ck["pool_hit"] == ~fresh).all(), ck[["pool_hit", "fill_faults"]].assign(fresh=fresh)
    ck = checkpoint_rows(legs[1])
    ev = legs[1]["trace"].events
    dest = ev[ev["kind"] == "copy"].set_index("ckpt")["addr"]
    hits = ck[ck["pool_hit"]]
    assert len(hits) > len(ck) / 2, ck[["ckpt", "pool_hit", "fill_faults", "faults"]]
    for _, h in hits.iterrows():
        earlier = ck[ck["start_ns"] < h["start_ns"]]["ckpt"]
        assert dest[h["ckpt"]] in set(dest[earlier]), h
    assert (hits["fill_faults"] == 0).all() and (hits["faults"] == 0).all()
    assert (ck[~ck["pool_hit"]]["fill_faults"] > 0).all()
