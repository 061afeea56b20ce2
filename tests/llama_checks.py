"""What the real llama-server tests check on a recorded leg, shared by both llama.cpp generations."""
from __future__ import annotations

import pandas as pd
import pytest


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
