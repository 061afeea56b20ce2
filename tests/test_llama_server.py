"""End to end on a real llama-server: attach by PID, drive load, match every logged checkpoint.

Builds (or reuses, from ${CKPTRACE_CACHE:-/var/cache/ckptrace}) llama-server pool-off and
pool-on with samples/llama-server/build.sh, writes a tiny random mamba model with
make_model.py, then records three legs, pool-off, pool-on, pool-off, each a fresh server with
`ckptrace record --pid` attached before `ckptrace drive` sends the load. The truth is the
server's own log: `created context checkpoint N of M (..., size = X MiB)` at -lv 4.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from ckptrace.trace import read_trace

pytestmark = [pytest.mark.llama, pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "llama-server"
CACHE = Path(os.environ.get("CKPTRACE_CACHE", "/var/cache/ckptrace")) / "llama-server"
CKPTRACE = [sys.executable, "-m", "ckptrace"]

# A shape no other test or sample default uses: 42.570 MiB checkpoints (above the 32 MiB floor).
MODEL_SHAPE = {"d_model": 448, "layers": 9, "d_state": 1381}
CLIENTS, REQUESTS, PROMPT_WORDS = 3, 6, 64
UBATCH = 16  # checkpoints are made n_ubatch + 4 and 4 tokens before a prompt's end
CKPT_LINE = re.compile(r"created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), "
                       r"pos_max = (-?\d+), n_tokens = (\d+), size = ([0-9.]+) MiB\)")


def _run(argv: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{argv[:3]} failed ({p.returncode}):\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def servers() -> dict[str, Path]:
    """llama-server binaries, pool-off and pool-on: cached, or built now (about 10 min each)."""
    out = {}
    for name, flags in (("off", []), ("on", ["--pool"])):
        p = _run(["bash", SAMPLE / "build.sh", *flags], timeout=3600)
        out[name] = Path(p.stdout.strip().splitlines()[-1])
        assert out[name].is_file(), out[name]
    return out


@pytest.fixture(scope="module")
def model() -> Path:
    shape = MODEL_SHAPE
    path = CACHE / "models" / f"mamba-{shape['d_model']}x{shape['layers']}-s{shape['d_state']}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, SAMPLE / "make_model.py", path, "--d-model", shape["d_model"],
              "--layers", shape["layers"], "--d-state", shape["d_state"]], timeout=600)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, grace: float = 20.0) -> None:
    """Stop a process this test started: sig, then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def server_argv(binary: Path, model: Path, port: int) -> list[str]:
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(CLIENTS), "-c", str(CLIENTS * 1024), "-b", "64", "-ub", str(UBATCH),
            "-t", "2", "-lv", "4", "--cache-ram", "0", "--no-webui"]


@contextmanager
def llama_server(binary: Path, model: Path, log: Path):
    """A started llama-server whose /health answers 200; always stopped on the way out."""
    port = free_port()
    with open(log, "w") as f:
        proc = subprocess.Popen(server_argv(binary, model, port), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"llama-server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"llama-server not ready in 120 s:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.3)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextmanager
def recorder(pid: int, out: Path, label: str):
    """`ckptrace record --pid` attached (its start line seen); stopped with SIGINT on the way out."""
    proc = subprocess.Popen([*CKPTRACE, "record", "--quiet", "--json", "--pid", str(pid), "-o", str(out),
                             "--label", label], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen = []
        while True:  # the start line is printed once every probe is attached
            line = proc.stderr.readline()
            seen.append(line)
            if line.startswith("ckptrace: tracing"):
                break
            assert line and time.monotonic() < deadline, f"recorder did not attach:\n{''.join(seen)}"
        yield proc
    finally:
        stop(proc, signal.SIGINT, grace=60)


def logged_checkpoints(log: Path) -> pd.DataFrame:
    rows = [m.groups() for m in CKPT_LINE.finditer(log.read_text())]
    cols = ["n", "of", "pos_min", "pos_max", "n_tokens", "size_mib"]
    df = pd.DataFrame(rows, columns=cols)
    return df.astype({c: "int64" for c in cols[:-1]})


def run_leg(tmp_path: Path, binary: Path, model: Path, label: str, i: int) -> dict:
    log, trace = tmp_path / f"{i}-{label}.log", tmp_path / f"{i}-{label}.parquet"
    with llama_server(binary, model, log) as (proc, url):
        with recorder(proc.pid, trace, label) as rec:
            drive = _run([*CKPTRACE, "drive", url, "--clients", CLIENTS, "--requests", REQUESTS,
                          "--prompt-tokens", PROMPT_WORDS, "--n-predict", 4, "--timeout", 600,
                          "--seed", i, "--json"], timeout=700)
        out, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err[-3000:]
    ttft = pd.DataFrame(json.loads(drive.stdout))
    assert (ttft["status"] == "ok").all(), ttft
    return {"trace": read_trace(trace), "path": trace, "logged": logged_checkpoints(log),
            "log": log, "summary": json.loads(out)}


@pytest.fixture(scope="module")
def legs(servers, model, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("llama")
    return [run_leg(tmp, servers[arm], model, f"pool-{arm}", i)
            for i, arm in enumerate(("off", "on", "off"))]


def checkpoint_rows(leg: dict) -> pd.DataFrame:
    from ckptrace.analyzers import analyze_trace

    a = analyze_trace(leg["trace"])
    ck = a.checkpoints[~a.checkpoints["draft"]].sort_values("start_ns", ignore_index=True)
    kinds = a.iterations.set_index("iter")["kind"]
    return ck.assign(iter_kind=ck["iter"].map(kinds).astype("string"))


@pytest.mark.parametrize("leg_index", [0, 1, 2])
def test_every_logged_checkpoint_is_recorded_with_its_size(legs, leg_index):
    leg = legs[leg_index]
    logged, ck = leg["logged"], checkpoint_rows(leg)
    assert len(logged) >= 6, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
    assert leg["trace"].meta["lost_events"] == 0
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
    # the server prints size() in MiB with 3 decimals; the same rounding of the recorded bytes
    recorded = sorted(f"{b / 1024 / 1024:.3f}" for b in ck["bytes"])
    assert recorded == sorted(logged["size_mib"])
    assert (ck["copy_ns"] > 0).all()
    assert (ck["iter"] > 0).all() and (ck["iter_kind"] == "prefill").all(), ck[["iter", "iter_kind"]]


def test_pool_off_fills_every_checkpoint_with_faults(legs):
    for leg in (legs[0], legs[2]):
        ck = checkpoint_rows(leg)
        assert not ck["pool_hit"].any()
        assert (ck["fill_ns"] > 0).all() and (ck["fill_faults"] > 0).all()


def test_pool_on_hits_without_fill_faults_after_warm_up(legs):
    ck = checkpoint_rows(legs[1])
    # warm-up: each slot's first prompt finds the pool empty (2 checkpoints a prompt); a slot
    # taking its next prompt erases its old checkpoints into the pool before making new ones
    warm_up = 2 * CLIENTS
    after = ck.iloc[warm_up:]
    assert len(after) >= CLIENTS, ck
    assert after["pool_hit"].all(), ck[["ckpt", "pool_hit", "fill_faults", "faults"]]
    # a pooled buffer is resident: neither the fill nor the copy into it faults
    assert (after["fill_faults"] == 0).all() and (after["faults"] == 0).all()
    assert (ck.iloc[:warm_up]["fill_faults"] > 0).all()


def test_compare_reads_faster_for_fill(legs):
    p = _run([*CKPTRACE, "compare", *(leg["path"] for leg in legs), "--json"], timeout=120)
    metrics = {m["metric"]: m for m in json.loads(p.stdout)["metrics"]}
    assert metrics["checkpoint_fill_ns"]["verdict"] == "faster", metrics["checkpoint_fill_ns"]
