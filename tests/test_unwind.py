"""A traced program never dies of being traced: checkpoints that throw (from update_tgt, from the
state copy, std::bad_alloc from the growth inside resize()) or longjmp out, caught by their caller,
run the same traced and untraced (same output, same exit status), every checkpoint that completed
is a row and each one cut short is counted (abandoned_spans, and the end line says it).

A uretprobe would put the kernel's trampoline in place of the return address and C++ unwinding
through it ends in std::terminate (SIGABRT): the recorder probes the functions' return
instructions instead (probes/returns.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ckptrace.core.trace import read_trace
from helpers import ckptrace, recorder, started

PROGRAM = Path(__file__).resolve().with_name("throwing_checkpoint.cpp")
N = 20  # checkpoints per run: the odd ones are cut short

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    out = tmp_path_factory.mktemp("unwind") / "throwing-checkpoint"
    subprocess.run(["g++", "-O2", "-g", "-o", out, PROGRAM], check=True)
    return out


def untraced(program, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([program, mode, str(N)], capture_output=True, text=True, timeout=60)


def test_return_instructions_are_probed_not_the_return_address(program):
    """Every probed function of the program gets its returns as plain uprobes (no uretprobe)."""
    from ckptrace.probes import loader, symbols

    plan = symbols.resolve_binary(str(program))
    probed = {p.point: loader.ends(p) for p in plan.points if loader.PROGRAMS[p.point][1]}
    assert set(probed) == {"update_tgt", "resize_grow", "state_copy", "update_slots"}, probed
    assert all(probed.values()), probed


@pytest.mark.parametrize("mode", ["copy", "tgt", "alloc", "longjmp"])
def test_a_checkpoint_that_throws_or_longjmps_runs_as_untraced(program, mode, tmp_path):
    plain = untraced(program, mode)
    assert plain.returncode == 3 and f"done: {N // 2} ok, {N // 2} cut short" in plain.stdout, plain
    out = tmp_path / "t.parquet"
    p = ckptrace("record", "--quiet", "-o", out, "--", program, mode, N, timeout=180)
    assert (p.returncode, p.stdout) == (plain.returncode, plain.stdout), p.stderr
    assert "exit code 3" in p.stderr and f"{N // 2} spans never returned" in p.stderr, p.stderr
    tr = read_trace(out)
    ev = tr.events
    kinds = ev["kind"].value_counts()
    assert kinds["checkpoint"] == N // 2 and kinds["iteration"] == N  # the completed ones, each iteration
    assert tr.meta.abandoned_spans == N // 2 and tr.meta.open_at_stop.total == 0
    assert (ev.loc[ev["kind"] == "checkpoint", "bytes"] == 1 << 20).all()
    # a cut-short checkpoint's parts that ended are rows of their own (no checkpoint row holds them)
    fills = {"copy": N, "tgt": N, "alloc": N // 2, "longjmp": N}[mode]
    copies = {"copy": N // 2, "tgt": N, "alloc": N // 2, "longjmp": N // 2}[mode]
    assert (kinds["fill"], kinds["copy"]) == (fills, copies)
    a = ckptrace("analyze", "--json", out)
    assert a.returncode == 0, a.stderr


def test_a_signal_death_is_the_exit_status(program, tmp_path):
    """record -- CMD exits with CMD's status; a signal N is 128+N, as a shell says it."""
    plain = untraced(program, "abort")
    assert plain.returncode == -6
    p = ckptrace("record", "--quiet", "-o", tmp_path / "t.parquet", "--", program, "abort", N, timeout=180)
    assert p.returncode == 134 and p.stdout == plain.stdout, p.stderr
    assert "exit code -6" in p.stderr
    assert read_trace(tmp_path / "t.parquet").events["kind"].eq("checkpoint").sum() == N


def test_attached_to_a_running_program_that_throws(program, tmp_path):
    """record -p into a running process: its throws are caught as before it was traced."""
    out = tmp_path / "t.parquet"
    with started([program, "tgt", N, "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as (proc, _):
        assert proc.stdout.readline().strip() == f"pid {proc.pid} waiting"
        with recorder(out, "-p", proc.pid) as rec:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.wait(60) == 3
            assert rec.wait(60) == 0
        assert proc.stdout.read().splitlines()[-1] == f"done: {N // 2} ok, {N // 2} cut short"
    tr = read_trace(out)
    assert tr.events["kind"].eq("checkpoint").sum() == N // 2 and tr.meta.abandoned_spans == N // 2
