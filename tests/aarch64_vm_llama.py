"""Runs in the arm64 VM (tests/test_aarch64_vm.py's job), not on the host: PyPI's xllamacpp aarch64
wheel (llama.cpp build 11549) serving MODEL from the guest's python (samples/llama-server/
python_server.py), `ckptrace record --pid` on it, `clients` streaming clients sending `requests`
prompts: one pool-off leg as samples/llama_server.run_legs records it on x86 (no pool build
exists for this wheel). Writes TRACE and the server's log beside it (log_path); prints each
phase's guest seconds on stderr and a JSON summary on stdout.

    PYTHONPATH=WHEEL:/opt/ckptrace-deps:/src python3 tests/aarch64_vm_llama.py MODEL TRACE
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ckptrace.samples.llama_server import llama_server, recorder, run_load, settle


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--n-predict", type=int, default=4)
    a = ap.parse_args()
    t0 = time.monotonic()
    times = {}

    def lap(name: str) -> None:
        times[name] = round(time.monotonic() - t0, 1)
        print(f"llama: {name} at {times[name]} s", file=sys.stderr, flush=True)

    # Emulated: importing the 100 MB module, loading the model and compiling nothing still take
    # tens of seconds; the bounds are for a hung guest only.
    with llama_server(Path(sys.executable), a.model, a.trace.with_suffix(".log"), slots=a.clients,
                      ready_timeout_s=900, version="11549") as srv:
        lap("server ready")
        with recorder(srv.pid, a.trace, "pool-off", attach_timeout_s=900):
            lap("recorder attached")
            df = run_load(srv.url, a.clients, a.requests, a.prompt_tokens, a.n_predict, timeout_s=1200, seed=1)
            settle(srv.url)  # the recorder stops after the server's last checkpoint
            lap("requests done")
    lap("trace written")
    bad = df[df["status"] != "ok"]
    print(json.dumps({"requests": len(df), "failed": len(bad), "times_s": times,
                      "statuses": sorted(set(df["status"]))}))
    return 0 if len(df) == a.requests and bad.empty else 1


if __name__ == "__main__":
    sys.exit(main())
