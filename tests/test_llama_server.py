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

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from click.testing import CliRunner

from ckptrace.cli import cli
from ckptrace.commands.drive import make_prompt, run_load

from ckptrace.trace import read_trace



def e2e(test):
    """Marks of the tests that build and trace a real server (the driver tests need neither)."""
    return pytest.mark.llama(pytest.mark.ebpf(pytest.mark.usefixtures("require_root_ebpf")(test)))


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
@e2e
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


@e2e
def test_pool_off_fills_every_checkpoint_with_faults(legs):
    for leg in (legs[0], legs[2]):
        ck = checkpoint_rows(leg)
        assert not ck["pool_hit"].any()
        assert (ck["fill_ns"] > 0).all() and (ck["fill_faults"] > 0).all()


@e2e
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


@e2e
def test_compare_reads_faster_for_fill(legs):
    p = _run([*CKPTRACE, "compare", *(leg["path"] for leg in legs), "--json"], timeout=120)
    metrics = {m["metric"]: m for m in json.loads(p.stdout)["metrics"]}
    assert metrics["checkpoint_fill_ns"]["verdict"] == "faster", metrics["checkpoint_fill_ns"]


# The load driver, against a stand-in server speaking /completion's SSE stream.

class FakeCompletion(BaseHTTPRequestHandler):
    """Answers /health, and /completion with `n_predict` chunks after `first_delay_s`."""

    protocol_version = "HTTP/1.1"
    first_delay_s = 0.05
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
        time.sleep(cls.first_delay_s)
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


def test_drive_stops_at_the_time_bound(fake_server):
    handler, url = fake_server
    handler.first_delay_s = 3.0
    df = run_load(url, clients=2, requests=50, prompt_tokens=8, n_predict=1, timeout_s=1.0)
    assert len(df) == 2 and (df["status"] == "timeout").all(), df
    assert df["ttft_ns"].isna().all()


def test_drive_json_fields(fake_server):
    _, url = fake_server
    r = CliRunner().invoke(cli, ["drive", url, "--clients", "2", "--requests", "2", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {k for row in rows for k in row} == {"request", "client", "prompt_tokens", "start_unix_ns",
                                                "start_ns", "ttft_ns", "total_ns", "status"}


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://example.com", "https://127.0.0.1:8080",
                                 "http://127.0.0.2:8080"])
def test_drive_refuses_any_other_target(url):
    r = CliRunner().invoke(cli, ["drive", url])
    assert r.exit_code == 2 and "Invalid value for 'URL'" in r.output, r.output


def test_drive_says_when_nothing_listens():
    port = free_port()
    p = subprocess.run([*CKPTRACE, "drive", f"http://127.0.0.1:{port}", "--timeout", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("ckptrace: error: nothing listens at"), p.stderr
