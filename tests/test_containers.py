"""Servers in containers as people run them, traced from the host by --pid and --comm.

Each container is built from the sample workload as llama.cpp's official images lay a server out
(/app/NAME, its libraries in /app, the system's at their paths) and started as a Docker-style
container (own mount, PID and network namespaces, an overlay root, pivot_root) or a chroot jail (no
namespace: the host sees its files at their host paths). A uprobe is placed on an inode: the path
the kernel opens must reach the mapped file, which its device and inode in /proc/PID/maps decide.
Legs pool-off, pool-on, pool-off (A/B/A); every checkpoint the workload's truth file lists is in
the trace with its bytes, whether it filled, and its fault counts.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from ckptrace.samples.llama_server import (build_server, cached_model, free_port, logged_checkpoints, server_argv)
from ckptrace.samples.llama_server import recorder as llama_recorder
from ckptrace.core.trace import read_trace
from containers import SHAPES, app_root, container
from helpers import CKPTRACE, assert_one_line_error, assert_pool_faster, load_truth, recorder, wait_until
from llama_checks import assert_pool_mechanism, builds, checkpoint_rows, e2e

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]

LEGS = (("pool-off", "off", "--pid"), ("pool-on", "on", "--comm"), ("pool-off", "off", "--pid"))
WORKLOAD_ARGS = ["--iterations", "9", "--wait-signal", "--truth", "/out/truth.jsonl"]


def unique_name() -> str:
    """A comm no other process on a shared machine has (--comm takes every process of the name)."""
    return f"ckc-{secrets.token_hex(4)}"


def checkpoints_vs_truth(trace_path: Path, truth_path: Path) -> pd.DataFrame:
    """One row per checkpoint, the recorder's beside the workload's (its tids are its namespace's)."""
    ev = read_trace(trace_path).events
    t = load_truth(truth_path)["checkpoint"].sort_values("start_ns").reset_index(drop=True)
    ck = ev[ev["kind"] == "checkpoint"].sort_values("start_ns").reset_index(drop=True)
    assert len(ck) == len(t) > 0, f"recorded {len(ck)} checkpoints, the workload made {len(t)}"
    fill = ev[ev["kind"] == "fill"].set_index("ckpt")
    copy = ev[ev["kind"] == "copy"].set_index("ckpt")
    return pd.DataFrame({
        "bytes": ck["bytes"], "truth_bytes": t["bytes"],
        "has_fill": ck["ckpt"].isin(fill.index), "truth_pool_hit": t["pool_hit"].astype(bool),
        "fill_faults": ck["ckpt"].map(fill["faults"]).fillna(0), "truth_fill_faults": t["fill_faults"],
        "copy_faults": ck["ckpt"].map(copy["faults"]), "truth_copy_faults": t["copy_faults"],
    })


def run_leg(shape: str, root: Path, work: Path, name: str, label: str, pool: str, how: str,
            trace: Path) -> tuple[int, Path]:
    """One leg: the container started waiting, the recorder attached from the host (by PID or
    by name), the workload let go and run to its end. Returns (host PID, truth file)."""
    argv = [f"/app/{name}", "--pool", pool, *WORKLOAD_ARGS]
    with container(shape, root, work, argv, ready="ready pid=") as c:
        target = ["--pid", str(c.pid)] if how == "--pid" else ["--comm", name]
        with recorder(trace, *target, "--label", label) as rec:
            assert f"(pid {c.pid})" in rec.start_line or str(c.pid) in rec.start_line, rec.start_line
            os.kill(c.pid, signal.SIGUSR1)  # the namespace's PID 1 takes it: it has a handler
            assert c.proc.wait(120) == 0
            assert rec.wait(120) == 0, rec.stderr.read()
        truth = c.out / "truth.jsonl"
        kept = trace.with_suffix(".truth.jsonl")
        kept.write_bytes(truth.read_bytes())
        return c.pid, kept


@pytest.mark.parametrize("shape", SHAPES)
def test_a_b_a_through_a_container_finds_every_checkpoint(tmp_path, workload, shape):
    name = unique_name()
    root = app_root(tmp_path / "root", workload, name=name)
    for i, (label, pool, how) in enumerate(LEGS, 1):
        trace = tmp_path / f"{i}-{label}.parquet"
        pid, truth = run_leg(shape, root, tmp_path / f"work{i}", name, label, pool, how, trace)
        m = checkpoints_vs_truth(trace, truth)
        assert (m["bytes"] == m["truth_bytes"]).all()
        assert (m["has_fill"] == ~m["truth_pool_hit"]).all()
        for col in ("fill_faults", "copy_faults"):
            assert ((m[col] - m[f"truth_{col}"]).abs() <= 0.01 * m[f"truth_{col}"]).all(), m
        if pool == "off":
            assert not m["truth_pool_hit"].any() and (m["fill_faults"] >= m["bytes"] // 4096).all()
        else:
            assert m["truth_pool_hit"].any() and (m.loc[m["truth_pool_hit"], "fill_faults"] == 0).all()
        meta = read_trace(trace).meta
        assert meta.pid == pid  # the host's: the namespace's own is 1
        assert meta.executable == (f"/app/{name}" if shape == "docker" else f"{root}/app/{name}")
        # The path each uprobe was placed through: the process's root for the Docker-style one
        # (the host has no /app), the host path for the jail (maps gives it so; its root prefixed
        # to it names nothing).
        where = Path(f"/proc/{pid}/root", "app") if shape == "docker" else root / "app"
        assert {Path(p.object).parent for p in meta.probes} == {where}, meta.probes
    compared = subprocess.run([CKPTRACE, "compare", "--json", *(str(tmp_path / f"{i}-{label}.parquet")
                                                                for i, (label, _, _) in enumerate(LEGS, 1))],
                              capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr
    assert_pool_faster(json.loads(compared.stdout))


def test_a_name_shadowed_since_the_map_is_reached_through_map_files(tmp_path, workload):
    """The jail's /app hidden, in the recorder's own mount namespace, by a mount made after the
    program mapped its files: no name reaches them from the recorder, the kernel's
    /proc/PID/map_files link does, and the probes go in through it."""
    name = unique_name()
    root = app_root(tmp_path / "root", workload, name=name)
    trace = tmp_path / "t.parquet"
    with container("chroot", root, tmp_path / "work", [f"/app/{name}", "--pool", "off", *WORKLOAD_ARGS],
                   ready="ready pid=") as c:
        script = 'mount -t tmpfs none "$1" && shift && exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root / "app"),
                str(CKPTRACE), "record", "--quiet", "-o", str(trace), "--pid", str(c.pid)]
        rec = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        try:
            line = rec.stderr.readline()
            assert line.startswith("ckptrace: tracing"), line + rec.stderr.read()
            os.kill(c.pid, signal.SIGUSR1)
            assert c.proc.wait(120) == 0
            assert rec.wait(120) == 0, rec.stderr.read()
        finally:
            if rec.poll() is None:
                rec.kill()
            rec.wait(60)
            rec.stderr.close()
        m = checkpoints_vs_truth(trace, c.out / "truth.jsonl")
    assert (m["bytes"] == m["truth_bytes"]).all() and m["has_fill"].all()
    objects = {p.object for p in read_trace(trace).meta.probes}
    assert all(o.startswith(f"/proc/{c.pid}/map_files/") for o in objects), objects


def test_a_tracer_in_a_child_pid_namespace_is_refused_in_one_line(workload):
    """ckptrace itself in a container's PID namespace (a sidecar sharing a pod's PIDs): the probes
    name processes by host PID, so it would record nothing; record says why, doctor fails the check."""
    inside = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    r = subprocess.run([*inside, str(CKPTRACE), "record", "-o", "/dev/null", "--", str(workload), "--iterations", "3"],
                       capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, "child PID namespace", "--pid=host")  # the workload's own lines: it never ran
    d = subprocess.run([*inside, str(CKPTRACE), "doctor"], capture_output=True, text=True, timeout=300)
    assert d.returncode == 1 and re.search(r"^FAIL PID namespace: .*; fix: .*hostPID", d.stdout, re.M), d.stdout

# --- a real llama-server in each container shape ---------------------------------------------

LLAMA_BUILDS = builds("0.3.36")  # GCC + libstdc++, shared, GGML_BACKEND_DL: the official images' kind of build
MODEL_SHAPE = {"d_model": 448, "layers": 9, "d_state": 1381}  # test_llama_server's model (cached once)
CLIENTS, REQUESTS, PORT = 3, 12, 8080


def llama_leg(shape: str, root: Path, work: Path, label: str, trace: Path) -> dict:
    """One leg: /app/llama-server started in the container (its libraries found by LD_LIBRARY_PATH
    =/app: the build's RUNPATH names its build folder), attached from the host by PID once it
    listens, driven with distinct prompts from inside its network namespace (`nsenter --net`, as
    `kubectl exec` or a sidecar would), the recorder stopped after the last request's checkpoints."""
    port = PORT if shape == "docker" else free_port()  # the jail shares the host's network
    log = trace.with_suffix(".log")
    argv = server_argv(Path("/app/llama-server"), Path("/models/model.gguf"), port, slots=CLIENTS)
    env = {**os.environ, "LD_LIBRARY_PATH": "/app"}
    with open(log, "w") as out, container(shape, root, work, argv, stdout=out, stderr=subprocess.STDOUT, env=env) as c:
        wait_until(lambda: "listening on http" in log.read_text(errors="replace"), f"llama-server in {log}",
                   timeout_s=300, watch=[c.proc])
        mapped = Path(f"/proc/{c.pid}/maps").read_text()
        netns = ["nsenter", f"--net=/proc/{c.pid}/ns/net"] if shape == "docker" else []
        with llama_recorder(c.pid, trace, label):
            p = subprocess.run([*netns, str(CKPTRACE), "drive", f"http://127.0.0.1:{port}", "--clients", str(CLIENTS),
                                "--requests", str(REQUESTS), "--prompt-tokens", "64", "--n-predict", "4",
                                "--timeout", "600", "-o", str(trace.with_suffix(".requests.json"))],
                               capture_output=True, text=True, timeout=700)
            assert p.returncode == 0, p.stderr
            # the driver has every answer: each request's checkpoints were made before its first token
    return {"trace": read_trace(trace), "path": trace, "logged": logged_checkpoints(log), "log": log, "maps": mapped}


def assert_backend_dlopened(root: Path, leg: dict) -> None:
    """The CPU backend of a GGML_BACKEND_DL build: not a library the loader maps at exec (not in
    ldd's list of /app/llama-server), ggml's own line says it loaded it from /app (or, in a jail
    without /proc, from the working folder /app: "./"), and the server maps it since."""
    listed = subprocess.run(["ldd", str(root / "app" / "llama-server")], capture_output=True, text=True,
                            env={**os.environ, "LD_LIBRARY_PATH": str(root / "app")}, check=True).stdout
    assert "libggml-cpu" not in listed and "libggml-base" in listed, listed
    line = re.search(r"load_backend: loaded CPU backend from (\S+)", leg["log"].read_text(errors="replace"))
    assert line and line.group(1) in ("/app/libggml-cpu.so", "./libggml-cpu.so"), f"no such line in {leg['log']}"
    assert re.search(r"/app/libggml-cpu\.so$", leg["maps"], re.M), leg["maps"]
    assert "libggml-cpu.so" in {Path(o.path).name for o in leg["trace"].meta.objects}


@pytest.mark.parametrize("shape", SHAPES)
@e2e
def test_a_real_llama_server_in_a_container_a_b_a(tmp_path, shape):
    model = cached_model(**MODEL_SHAPE)
    roots = {}
    for pool in (False, True):
        binary = build_server(pool, version="0.3.36")
        roots[pool] = app_root(tmp_path / f"root-{pool}", binary, files={"/models/model.gguf": model})
        assert (roots[pool] / "app" / "libggml-cpu.so").is_file()  # the images' layout: the backend in /app
    legs = []
    for i, (label, pool) in enumerate((("pool-off", False), ("pool-on", True), ("pool-off", False)), 1):
        leg = llama_leg(shape, roots[pool], tmp_path / f"work{i}", label, tmp_path / f"{i}-{label}.parquet")
        logged, ck = leg["logged"], checkpoint_rows(leg)
        assert len(logged) >= 6, f"the server made only {len(logged)} checkpoints; see {leg['log']}"
        assert leg["trace"].meta.lost_events == 0
        assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} in {leg['log']}"
        assert sorted(f"{b / 1024 / 1024:.3f}" for b in ck["bytes"]) == sorted(logged["size_text"])
        assert (ck["fill_source"] == "measured").all()
        assert_backend_dlopened(roots[pool], leg)
        legs.append(leg)
    assert_pool_mechanism(legs)
    compared = subprocess.run([CKPTRACE, "compare", "--json", *(str(leg["path"]) for leg in legs)],
                              capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr
    assert_pool_faster(json.loads(compared.stdout))
