"""Runs in the arm64 VM (tests/test_aarch64_vm.py's job), not on the host: PyPI's xllamacpp aarch64
wheel (llama.cpp build 11549) serving MODEL from the guest's python (samples/llama-server/
python_server.py), `ckptrace record --pid` on it, one client sending `requests` prompts one after
another: a pool-off leg as samples/llama_server.run_legs records one on x86 (no pool build exists
for this wheel). Writes TRACE, the server's log beside it (.log, as run_legs' log_path) and the
recorder's stderr (.record.err); prints each phase's guest seconds on stderr and a JSON summary
on stdout.

Standard library only: ckptrace.samples.llama_server and core.loadgen import pandas, 30 s under
emulation (measured: the whole driver's start), so the server's command line is written here and
the host test holds it equal to server_argv's.

    PYTHONPATH=WHEEL:/opt/ckptrace-deps:/src python3 tests/aarch64_vm_llama.py MODEL TRACE
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

T0 = time.monotonic()
PYTHON_SERVER = Path(__file__).resolve().parent.parent / "samples" / "llama-server" / "python_server.py"
WORDS = ("time", "state", "model", "server", "river", "stone", "light", "garden", "number", "window", "paper",
         "music", "table", "water", "city", "night", "story", "road", "color", "field")


def server_command(python: str, model: Path, port: int, slots: int) -> list[str]:
    """samples/llama_server.server_argv's for build 11549 (-lv 4: the checkpoint lines)."""
    return [python, str(PYTHON_SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * 1024), "-b", "64", "-ub", "16", "-t", "2",
            "--cache-ram", "0", "-lv", "4", "--no-webui"]


def lap(name: str) -> float:
    t = round(time.monotonic() - T0, 1)
    # and the guest's uptime (CLOCK_MONOTONIC: no suspend in the VM), to set beside the job's lines
    print(f"llama: {name} at {t} s (uptime {time.monotonic():.1f})", file=sys.stderr, flush=True)
    return t


def get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main() -> int:
    lap("driver's standard-library imports done")
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--n-predict", type=int, default=4)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    times, answers = {}, []
    # Bounds for a hung guest only: emulated, the module and the model load in about 20 s, the
    # recorder attaches in about 30.
    with open(a.trace.with_suffix(".log"), "w") as log:
        server = subprocess.Popen(server_command(sys.executable, a.model, port, 1), stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, cwd=a.trace.parent)
    rec_err = a.trace.with_suffix(".record.err")
    rec = None
    try:
        deadline = time.monotonic() + 900
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited ({server.returncode}): see its log")
            try:
                if get(f"{base}/health", 10) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not answer /health in 900 s")
            time.sleep(0.5)
        times["server ready"] = lap("server ready")
        with open(rec_err, "w") as err:
            rec = subprocess.Popen([sys.executable, "-m", "ckptrace", "record", "--quiet", "--json", "--pid",
                                    str(server.pid), "-o", str(a.trace), "--label", "pool-off"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 900
        while "ckptrace: tracing" not in rec_err.read_text(errors="replace"):
            if rec.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ckptrace record did not attach: {rec_err.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        times["recorder attached"] = lap("recorder attached")
        for i in range(a.requests):  # distinct prompts from their second word: each a new prefill
            rng = random.Random(i)
            prompt = f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(a.words - 3))
            body = {"prompt": prompt, "n_predict": a.n_predict, "temperature": 0.0, "seed": 0, "cache_prompt": True}
            req = urllib.request.Request(f"{base}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
            answers.append({"prompt_tokens": out.get("timings", {}).get("prompt_n"),
                            "predicted": out.get("timings", {}).get("predicted_n")})
        get(f"{base}/slots", 600)  # answered after the loop's current update_slots: its checkpoints made
        times["requests done"] = lap("requests done")
        rec.send_signal(signal.SIGINT)
        rc = rec.wait(900)
        times["trace written"] = lap("trace written")
        if rc != 0:
            raise SystemExit(f"ckptrace record exited {rc}: {rec_err.read_text(errors='replace')[-2000:]}")
    finally:
        for p in (rec, server):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
    print(json.dumps({"requests": answers, "times_s": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
