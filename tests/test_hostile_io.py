"""Hostile places a command runs in and hostile option values (issue 22): two recorders given the
same -o, a closed or full stdout/stderr, and non-finite numbers in every float option. Each is one
clear line and a clear exit status, never a traceback, and no recording is lost.
"""
from __future__ import annotations

import importlib
import os
import json
from pathlib import Path

import click
import pytest

from helpers import assert_one_line_error, ckptrace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
LEGS = [SAMPLES / f for f in ("1-pool-off.parquet", "2-pool-on.parquet", "3-pool-off.parquet")]


# --- non-finite numbers in every float option -----------------------------------------------

# A command line per command around its float option, every other argument valid, so the line
# printed can only be about the option's value.
FLOAT_ARGS = {
    "record": lambda opt, v, tmp: ["record", "-o", tmp / "t.parquet", opt, v, "--", "true"],
    "serve": lambda opt, v, tmp: ["serve", "--pid", "1", "--listen", "127.0.0.1:0", opt, v],
    "top": lambda opt, v, tmp: ["top", "--pid", "1", "--once", opt, v],
    "drive": lambda opt, v, tmp: ["drive", "http://127.0.0.1:9", "--requests", "1", opt, v],
    "compare": lambda opt, v, tmp: ["compare", *LEGS, opt, v],
}


def float_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every command that takes a float."""
    from ckptrace.cli import COMMANDS

    found = []
    for name in COMMANDS:
        for p in importlib.import_module(f"ckptrace.commands.{name}").command.params:
            if isinstance(p.type, click.types.FloatParamType):
                found.append((name, p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0]))
    return found


def test_every_float_option_refuses_non_finite_values_by_its_type():
    """A new float option is covered too: each is an options.Finite and has a command line below."""
    from ckptrace.options import Finite

    opts = float_options()
    assert len(opts) >= 7, opts
    for name, opt in opts:
        assert name in FLOAT_ARGS, f"{name} {opt}: add a command line to FLOAT_ARGS"
        param = next(p for p in importlib.import_module(f"ckptrace.commands.{name}").command.params
                     if opt in p.opts)
        assert isinstance(param.type, Finite), (name, opt, param.type)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "NaN", "-Infinity"])
@pytest.mark.parametrize("command,option", float_options())
def test_non_finite_numbers_are_one_usage_line(tmp_path, command, option, value):
    r = ckptrace(*FLOAT_ARGS[command](option, value, tmp_path), timeout=60)
    line = assert_one_line_error(r, option, "not a finite number", code=2)
    assert "--help" in line and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing recorded, nothing written


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("option", ["--cap-bytes", "--floor", "--trim-idle", "--sweep cap-bytes=", "--sweep trim-idle="])
def test_whatifs_number_options_parsed_as_text_refuse_non_finite_values(option, value):
    """whatif's sizes, fractions and seconds are parsed from text (ckptrace/commands/whatif.py)."""
    opt, _, prefix = option.partition(" ")
    r = ckptrace("whatif", LEGS[0], opt, prefix + value)
    assert_one_line_error(r, opt, code=2)


@pytest.mark.parametrize("command,option", float_options())
def test_a_finite_value_too_large_for_the_code_below_is_one_usage_line(tmp_path, command, option):
    """1e300 s overflows a socket timeout's C timeval; every float option has an upper bound."""
    r = ckptrace(*FLOAT_ARGS[command](option, "1e300", tmp_path), timeout=60)
    assert_one_line_error(r, option, "is not in the range", code=2)


# --- closed, full or abandoned stdout and stderr -----------------------------------------------

def run_with(args, stdout: str = "pipe", stderr: str = "pipe", timeout: float = 180):
    """`ckptrace ARGS` with each stream as given: "pipe" (captured), "gone" (a pipe whose reader
    has left: writes get EPIPE), "full" (/dev/full: ENOSPC) or "closed" (`>&-`). Returns the
    exit status and what the captured streams got (text)."""
    import os
    import subprocess

    from helpers import CKPTRACE

    files, shell = {}, []
    for fd, how in ((1, stdout), (2, stderr)):
        if how == "gone":
            r, w = os.pipe()
            os.close(r)
            files[fd] = w
        elif how == "full":
            files[fd] = os.open("/dev/full", os.O_WRONLY)
        elif how == "closed":
            files[fd] = subprocess.DEVNULL
            shell.append(f"{fd}>&-")
        else:
            files[fd] = subprocess.PIPE
    argv = [str(CKPTRACE), *map(str, args)]
    if shell:
        argv = ["sh", "-c", f'exec "$@" {" ".join(shell)}', "sh", *argv]
    try:
        p = subprocess.run(argv, stdout=files[1], stderr=files[2], timeout=timeout)
    finally:
        for f in files.values():
            if isinstance(f, int) and f >= 0:
                os.close(f)
    return p.returncode, (p.stdout or b"").decode(errors="replace"), (p.stderr or b"").decode(errors="replace")


def stdout_commands(workload, tmp_path):
    return {"analyze": ["analyze", LEGS[0]], "analyze --json": ["analyze", "--json", LEGS[0]],
            "compare": ["compare", *LEGS], "symbols": ["symbols", workload], "--help": ["record", "--help"],
            "--version": ["--version"], "export -o /dev/stdout": ["export", LEGS[0], "-o", "/dev/stdout"]}


@pytest.mark.parametrize("how", ["gone", "full", "closed"])
@pytest.mark.parametrize("name", ["analyze", "analyze --json", "compare", "symbols", "--help", "--version",
                                  "export -o /dev/stdout"])
def test_a_stdout_that_fails_is_141_or_one_line(workload, tmp_path, name, how):
    """`| head -1` whose reader left: 141 and nothing said (a filter's SIGPIPE); /dev/full or a
    closed stdout: one line and exit 1. Before: a traceback (full), exit 1 with nothing said
    (gone), exit 0 with the output lost (closed)."""
    rc, _, err = run_with(stdout_commands(workload, tmp_path)[name], stdout=how)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if how == "gone":
        assert (rc, err) == (141, "")
        return
    assert rc == 1 and len(err.splitlines()) == 1, (rc, err)
    if name.startswith("export"):  # written through its own descriptor (core/output.py)
        assert err.startswith("ckptrace: error: ") and (
            "No space left on device" in err if how == "full" else "fd 1 was closed when ckptrace started" in err)
    else:
        reason = "No space left on device" if how == "full" else "it was closed when ckptrace started"
        assert err == f"ckptrace: error: cannot write to stdout ({reason})\n"


@pytest.mark.parametrize("how", ["gone", "full", "closed"])
def test_a_stderr_that_fails_changes_no_result(tmp_path, how):
    """Progress, notes and errors that can't be shown are dropped; the output and the exit status
    are the command's own."""
    _, want, _ = run_with(["analyze", LEGS[0]])
    assert run_with(["analyze", LEGS[0]], stderr=how)[:2] == (0, want)
    assert run_with(["analyze", tmp_path / "none.parquet"], stderr=how)[:2] == (1, "")
    out = tmp_path / "t.html"
    assert run_with(["dashboard", *LEGS, "-o", out], stderr=how)[:2] == (0, f"{out}\n")
    assert out.stat().st_size > 0


def complete_trace(path: Path, truth: Path):
    """The finished trace at `path` holds every checkpoint the workload's truth file counts."""
    from ckptrace.core.trace import read_trace

    from helpers import truth_count

    t = read_trace(path)
    assert t.meta.complete and t.meta.stop_reason == "target exited", t.meta
    assert (t.events["kind"] == "checkpoint").sum() == truth_count(truth) > 0
    return t


@pytest.mark.ebpf
@pytest.mark.parametrize("stdout,stderr", [("gone", "pipe"), ("full", "pipe"), ("closed", "pipe"),
                                           ("pipe", "gone"), ("pipe", "full"), ("pipe", "closed")])
def test_record_keeps_its_trace_whatever_stdout_and_stderr_do(require_root_ebpf, workload, tmp_path, stdout,
                                                              stderr):
    """`record --json` with its summary's stdout abandoned, full or closed: the trace is written
    first, then 141 or one line saying it is; with stderr so, its notes are dropped, exit 0."""
    out, truth = tmp_path / "t.parquet", tmp_path / "truth.jsonl"
    rc, got, err = run_with(["record", "--quiet", "--json", "-o", out, "--", workload, "--iterations", "3",
                             "--truth", truth], stdout=stdout, stderr=stderr)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    complete_trace(out, truth)
    lines = err.splitlines()
    if stdout == "gone":
        assert rc == 141 and lines[-1].startswith("ckptrace: wrote "), err
    elif stdout != "pipe":
        reason = "No space left on device" if stdout == "full" else "it was closed when ckptrace started"
        assert rc == 1 and lines[-1] == f"ckptrace: error: cannot write to stdout ({reason}); the trace {out} is written"
        assert lines[-2].startswith("ckptrace: wrote "), err
    else:
        assert rc == 0 and json.loads(got)["checkpoints"] > 0, (rc, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet", "truth.jsonl"]


@pytest.mark.ebpf
def test_record_into_a_stdout_whose_reader_left_saves_the_recording_elsewhere(require_root_ebpf, workload,
                                                                            tmp_path):
    truth = tmp_path / "truth.jsonl"
    rc, _, err = run_with(["record", "--quiet", "-o", "/dev/stdout", "--", workload, "--iterations", "3",
                           "--truth", truth], stdout="gone")
    line = err.splitlines()[-1]
    assert rc == 1 and line.startswith("ckptrace: error: cannot write the trace /dev/stdout: its reader went "
                                       "away (broken pipe); the recording was saved to "), err
    saved = Path(line.rsplit(" ", 1)[1])
    try:
        complete_trace(saved, truth)
    finally:
        saved.unlink()


@pytest.mark.ebpf
def test_record_into_a_closed_stdout_is_refused_before_it_starts(require_root_ebpf, workload, tmp_path):
    marker = tmp_path / "ran"
    rc, _, err = run_with(["record", "--quiet", "-o", "/dev/stdout", "--", "touch", marker], stdout="closed")
    assert rc == 1 and err == ("ckptrace: error: /dev/stdout: fd 1 was closed when ckptrace started; give a "
                               "file path for the trace\n")
    assert not marker.exists()


# --- two recorders given the same -o ----------------------------------------------------------

@pytest.mark.ebpf
def test_a_second_recorder_on_the_same_output_refuses_and_the_first_keeps_its_trace(require_root_ebpf, workload,
                                                                                    tmp_path):
    """While one recorder streams into -o, a second `record` given it (by its name, a symlink or
    a hard link) refuses in one line before its command runs, and so does any other output of
    ckptrace; the first records to the end. Before: the second renamed its own stream over the
    first's, which then wrote on unnamed and at its end replaced the second's trace with its own."""
    from helpers import go, recorder, truth_count, waiting_workload

    out, truth = tmp_path / "t.parquet", tmp_path / "truth.jsonl"
    (tmp_path / "link.parquet").symlink_to(out)
    with waiting_workload(workload, "--iterations", "3", truth=truth) as w, recorder(out, "--pid", w.pid) as first:
        os.link(out, tmp_path / "hard.parquet")
        for name in ("t.parquet", "link.parquet", "hard.parquet"):
            ran = tmp_path / f"ran-{name}"
            r = ckptrace("record", "--quiet", "-o", tmp_path / name, "--", "touch", ran)
            assert_one_line_error(r, f"another `ckptrace record` (pid {first.pid}) is writing its trace there "
                                     "now; give another path for the trace", code=1)
            assert not ran.exists()
        assert_one_line_error(ckptrace("export", LEGS[0], "-o", out), "another `ckptrace record`", code=1)
        os.unlink(tmp_path / "hard.parquet")
        go(w)
        assert first.wait(120) == 0, first.stderr.read()
    complete_trace(out, truth)
    assert truth_count(truth) > 0


@pytest.mark.ebpf
def test_recorders_started_together_on_one_output_record_once(require_root_ebpf, workload, tmp_path):
    """Three recorders started at once with the same -o: all pass the early check (nothing is
    there yet) and compile; at the stream's creation one wins (link() makes the name, or the
    file it replaces is held locked until its rename) and the others refuse: one trace, whole,
    and one workload run."""
    import subprocess

    from helpers import CKPTRACE, truth_count

    out = tmp_path / "t.parquet"
    truths = [tmp_path / f"truth-{i}.jsonl" for i in range(3)]
    # the winner's workload pauses 10 s between iterations, so the three overlap even when their
    # compiles end seconds apart (one that began after another had finished would rightly replace it)
    procs = [subprocess.Popen([CKPTRACE, "record", "--quiet", "-o", out, "--", workload, "--iterations", "3",
                               "--gap-us", "10000000", "--truth", t], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for t in truths]
    results = [(p.wait(240), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close(), p.stderr.close()
    ok = [i for i, (rc, _) in enumerate(results) if rc == 0]
    assert len(ok) == 1, results
    for i, (rc, err) in enumerate(results):
        if i in ok:
            continue
        lines = err.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("ckptrace: error: "), err
        assert "another `ckptrace record`" in lines[0] or "a file appeared there" in lines[0], err
        assert not truths[i].exists()  # its command never ran
    complete_trace(out, truths[ok[0]])


@pytest.mark.ebpf
def test_another_users_lock_on_a_file_of_theirs_does_not_stop_a_recording(require_root_ebpf, workload,
                                                                          nobody_dir, tmp_path):
    """Only locks on files of ours or root's mark a recording: user nobody holding a flock on a
    file of theirs at -o can't make root's recorder refuse (it replaces the file, as before)."""
    import subprocess

    from helpers import AS_NOBODY

    out, truth = nobody_dir / "t.parquet", tmp_path / "truth.jsonl"
    hold = ("import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([*AS_NOBODY, "/usr/bin/python3", "-c", hold, out], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert out.stat().st_uid == 65534
        r = ckptrace("record", "--quiet", "-o", out, "--", workload, "--iterations", "3", "--truth", truth,
                     timeout=180)
        assert r.returncode == 0, r.stderr
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()
    complete_trace(out, truth)
    assert out.stat().st_uid == 0
