"""One helper per job the tests repeat: run the CLI, check a one-line error, start a process and
always stop it, read the workload's truth, record it with that truth, and the span invariants.

The CLI runner runs the real `ckptrace` console script that pip installed beside this Python, in
a subprocess: that is what a user runs, so a test sees the entry point, main()'s one-line error
handling (click's in-process runner bypasses it: an exception that would be a traceback for a user
passes there), stdout and stderr apart, real exit codes, and it can be signalled. Starting it costs
about 0.4 s here (`ckptrace analyze --help`), which the suite can afford.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

CKPTRACE = Path(sys.executable).with_name("ckptrace")
# Run as user nobody, with no capabilities.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
# The same entry with bcc made unimportable (None in sys.modules makes `import bcc` fail).
NO_BCC = [sys.executable, "-c", "import sys; sys.modules['bcc'] = None; from ckptrace.cli import main; main()"]


def ckptrace(*args, timeout: float = 300, env: dict | None = None, entry: list | None = None,
             wrap: list | tuple = (), cwd=None, **kw) -> subprocess.CompletedProcess:
    """Run `ckptrace ARGS` to completion; `env` adds to this environment, `wrap` goes in front
    (setpriv...), `entry` replaces the console script (NO_BCC)."""
    cmd = [*wrap, *(entry or [str(CKPTRACE)]), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env={**os.environ, **(env or {})}, **kw)
    assert_no_traceback(p)
    return p


def assert_no_traceback(p: subprocess.CompletedProcess) -> None:
    """No input makes a command print a Python traceback (README: one line, never a traceback):
    held for every run of the CLI through this helper, whatever the test asserts besides."""
    err = p.stderr if isinstance(p.stderr, str) else (p.stderr or b"").decode(errors="replace")
    assert "Traceback (most recent call last)" not in err and "Exception ignored" not in err, err[-3000:]


def why_nobody_cannot_run_ckptrace() -> str | None:
    """None when user nobody can import ckptrace with this Python, else why not (e.g. a clone
    under /root): tests that need nobody skip with it."""
    r = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import ckptrace.cli"], capture_output=True,
                       text=True, cwd="/", timeout=120)
    if r.returncode == 0:
        return None
    return (f"user nobody can't run {sys.executable} with ckptrace ({r.stderr.strip().splitlines()[-1:]}): "
            "the checkout must be world-readable")


def assert_one_line_error(p: subprocess.CompletedProcess, *needles: str, code: int | None = None) -> str:
    """README: bad input gets one line `ckptrace: error: ...` on stderr and a non-zero exit."""
    assert (p.returncode == code) if code is not None else (p.returncode not in (0, None)), \
        (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptrace: error: "), p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def started(argv, ready: str | None = None, **popen) -> Iterator[tuple[subprocess.Popen, str]]:
    """Start argv; with `ready`, wait for its first stderr line, which must start with it. Yield
    the process and that line; on the way out kill it if it still runs, reap it, close its pipe."""
    proc = subprocess.Popen(list(map(str, argv)), stderr=subprocess.PIPE, text=True, **popen)
    try:
        line = proc.stderr.readline() if ready is not None else ""
        assert ready is None or line.startswith(ready), f"{line!r} (expected {ready!r}...)"
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        proc.stderr.close()


@contextlib.contextmanager
def waiting_workload(binary, *args, truth: Path | None = None) -> Iterator[subprocess.Popen]:
    """The sample workload started with --wait-signal: it has printed `ready pid=N` and waits
    for SIGUSR1 (`go(proc)`) before its first iteration."""
    extra = ["--truth", truth] if truth else []
    with started([binary, "--wait-signal", *extra, *args], ready="ready pid=") as (proc, line):
        assert line.strip() == f"ready pid={proc.pid}", line
        yield proc


def go(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGUSR1)


@contextlib.contextmanager
def recorder(out: Path, *args) -> Iterator[subprocess.Popen]:
    """`ckptrace record --quiet -o OUT ARGS` running with its probes attached (its start line,
    `ckptrace: tracing ...`, has been printed); killed on the way out if still running."""
    with started([CKPTRACE, "record", "--quiet", "-o", out, *args], ready="ckptrace: tracing") as (proc, line):
        proc.start_line = line
        yield proc


def launched_pid(start_line: str) -> int:
    """The launched command's pid from record's start line (`... (pid N) ...`)."""
    return int(start_line.split("(pid ")[1].split(")")[0])


def wait_until(condition, what: str, timeout_s: float = 60, every_s: float = 0.02, watch=()):
    """Poll `condition()` until it returns something true (an event: a line, a file, a counter),
    and return that; fail naming `what` after timeout_s (a bound for a hung test, not a speed).

    `watch`: the process (a Popen, or several) the event depends on. Once one has exited, the
    event can no longer come: fail at once with its exit status and last stderr line, rather
    than wait out timeout_s (a dead demo once cost a 1200 s wait)."""
    watched = [watch] if isinstance(watch, subprocess.Popen) else list(watch)
    deadline = time.monotonic() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        for proc in watched:
            if proc.poll() is not None:  # the event may have come just before it exited
                try:
                    got = condition()
                except Exception as e:  # e.g. it read /proc/PID of the process now reaped
                    got = None
                    why = f" ({type(e).__name__}: {e})"
                else:
                    why = ""
                assert got, f"waiting for {what}: {describe_exit(proc)}{why}"
                return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(every_s)


def describe_exit(proc: subprocess.Popen) -> str:
    """`ARGV0 (pid N) exited with status S: LAST STDERR LINE` for a process that has exited."""
    name = Path(str(proc.args[0] if isinstance(proc.args, (list, tuple)) else proc.args).split()[0]).name
    status = proc.returncode if proc.returncode >= 0 else f"signal {-proc.returncode}"
    return f"{name} (pid {proc.pid}) exited with status {status}: {last_stderr_line(proc)}"


def last_stderr_line(proc: subprocess.Popen) -> str:
    """The last non-empty line still unread on an exited process's stderr pipe, without blocking
    (a child it left behind may hold the pipe open); "no stderr" when there is none to read."""
    if proc.stderr is None or proc.stderr.closed:
        return "no stderr"
    fd = proc.stderr.fileno()
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    lines = [ln.strip() for ln in b"".join(chunks).decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no stderr"


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict ({} once the process is gone and reaped)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def signal_pending(pid: int, sig: int) -> bool:
    """`sig` is pending for the process (sent to it, not yet delivered: e.g. it is stopped)."""
    st = proc_status(pid)
    return bool(st) and bool(int(st["ShdPnd"], 16) & (1 << (sig - 1)))


# --- the workload's truth ---------------------------------------------------------------------

def truth_records(path: Path) -> list[dict]:
    """The workload's truth file as written: one JSON object per line."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def truth_count(path: Path, kind: str = "checkpoint") -> int:
    """How many records of `kind` the workload has written so far (it flushes each line)."""
    try:
        return sum(f'"type":"{kind}"' in line for line in Path(path).read_text().splitlines())
    except FileNotFoundError:
        return 0


def wait_for_truth(path: Path, n: int = 1, kind: str = "checkpoint", watch=()) -> None:
    """Until the workload has finished n records of `kind` (it is past them, by its own account).
    `watch`: as wait_until's, the workload (or the recorder that launched it)."""
    wait_until(lambda: truth_count(path, kind) >= n, f"{n} {kind} lines in {path}", watch=watch)


def load_truth(path: Path) -> dict[str, pd.DataFrame]:
    """The truth as one frame per record type (checkpoint, iteration, summary...), each built from
    its own lines, so a type's integers stay integers whatever fields other types lack."""
    rows: dict[str, list[dict]] = {}
    for r in truth_records(path):
        rows.setdefault(r["type"], []).append({k: v for k, v in r.items() if k != "type"})
    return {t: pd.DataFrame(rs) for t, rs in sorted(rows.items())}


def steal_ns() -> int:
    """Time the hypervisor took from this VM's CPUs, all CPUs together (/proc/stat, in ticks)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def kernel_tick_ns() -> int:
    """One scheduler tick (CONFIG_HZ from /proc/config.gz; 10 ms, HZ=100, the coarsest, if absent)."""
    import gzip

    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            hz = next(int(ln.split("=")[1]) for ln in f if ln.startswith("CONFIG_HZ="))
    except (OSError, StopIteration, ValueError):
        hz = 100
    return 1_000_000_000 // hz


# The VM's steal counter when the running test started (conftest.py's autouse fixture sets it).
_steal_at_test_start: list[int] = []


def mark_test_start() -> None:
    """Called as each test starts (conftest.py): unaccounted_steal_bound counts from here."""
    _steal_at_test_start[:] = [steal_ns()]


def unaccounted_steal_bound() -> int:
    """How far an on-CPU reading may be from the thread's clock through steal alone.

    The probe's on-CPU figure (checkpoint.bpf.c sched_read) subtracts the steal the run queue has
    accounted; steal since the run queue's last clock update (at most one tick) is not yet
    accounted and reads as on-CPU time, while CLOCK_THREAD_CPUTIME_ID updates the clock first.
    A span's figure holds that error at its end minus at its start: at most one tick, and never
    more than the steal the VM saw during the test (0 on a host that steals nothing)."""
    if not _steal_at_test_start:
        return 0
    return min(max(steal_ns() - _steal_at_test_start[-1], 0), kernel_tick_ns())


def clock_tolerance(truth_ns):
    """docs/tests.md's promise against the workload's own clock: 5% + 0.5 ms (issue 2), plus
    what steal the kernel had not yet accounted can add (unaccounted_steal_bound)."""
    return 0.05 * truth_ns + 0.5e6 + unaccounted_steal_bound()


def within_clock(ours_ns, truth_ns) -> bool:
    """Every value (scalar or array) within clock_tolerance of the truth."""
    return bool(np.all(np.abs(np.asarray(ours_ns) - np.asarray(truth_ns)) <= clock_tolerance(np.asarray(truth_ns))))


@dataclass
class Recording:
    trace: object  # ckptrace.core.trace.Trace
    truth: dict[str, pd.DataFrame]
    summary: dict  # record --json
    proc: subprocess.CompletedProcess
    path: Path


def record_with_truth(tmp_path: Path, workload_argv: list, *record_args, name: str = "t", rc: int = 0) -> Recording:
    """`ckptrace record --json` of the workload writing its truth beside the trace; must succeed
    (exit with `rc`: the workload's own exit status)."""
    from ckptrace.core.trace import read_trace

    trace, truth = tmp_path / f"{name}.parquet", tmp_path / f"{name}.truth.jsonl"
    p = ckptrace("record", "--quiet", "--json", "-o", trace, *record_args, "--", *workload_argv,
                 "--truth", truth, timeout=180)
    assert p.returncode == rc, p.stderr
    assert "Traceback" not in p.stderr
    return Recording(read_trace(trace), load_truth(truth), json.loads(p.stdout), p, trace)


# --- invariants of analysed spans -------------------------------------------------------------

def assert_parts_fit(rows, faults_measured: bool = False) -> None:
    """Each iteration's (or checkpoint's) parts fit its span: fill + copy <= span. With every
    fault time measured (not estimated: docs/commands.md says estimates are never clamped), the fault time
    is also a part of fill + copy. Takes analyzer frames or `analyze --json` rows."""
    df = pd.DataFrame(rows)
    span = df["span_ns"] if "span_ns" in df else df["end_ns"] - df["start_ns"]
    bad = df["fill_ns"] + df["copy_ns"] > span
    if faults_measured:
        bad |= df["fault_ns"] > df["fill_ns"] + df["copy_ns"]
    assert not bad.any(), f"parts outside their span:\n{df[bad].to_string()}"


def assert_pool_faster(comparison: dict, faults: str = "checkpoint_faults") -> None:
    """A pool's effect as compare --json states it, on exact counts: fewer page faults per
    checkpoint (a hit reuses a resident buffer and faults nothing; every miss faults each page of
    its fresh buffer once), so 'faster' on checkpoint_faults. Not on the fill's wall time (a busy
    machine read pool-on +6.8% once) nor its CPU time (a verdict on it read 'no change' once,
    commit 4b2a36a): the machine's load moves those, never a fault count."""
    m = {x["metric"]: x for x in comparison["metrics"]}
    assert m[faults]["verdict"] == "faster", (m[faults], comparison["warnings"])


SPAWN_AT_PID = Path(__file__).resolve().with_name("spawn_at_pid.c")


def spawner(folder: Path) -> Path:
    """spawn_at_pid.c built into `folder`: runs a program as a given (free) pid, to reuse one."""
    exe = folder / "spawn-at-pid"
    subprocess.run(["gcc", "-O1", "-o", exe, SPAWN_AT_PID], check=True)
    return exe


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): it runs nothing until SIGCONT."""
    return proc_status(pid).get("State", "").startswith("T")


def start_ticks(pid: int) -> int:
    """/proc/PID/stat field 22, the process's start time (read here independently of ckptrace)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2:].split()[19])


def validate_json(name: str, doc: dict) -> None:
    """`doc` against docs/schemas/NAME.schema.json (jsonschema.ValidationError if it does not fit)."""
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schemas" / f"{name}.schema.json")
                        .read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


# Run argv under a fresh parent, so RUSAGE_CHILDREN's peak is that one command's.
_PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")


def ckptrace_peak(*args, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    """`ckptrace ARGS` run to completion and its peak RSS in KiB (the stderr without that figure)."""
    r = subprocess.run([sys.executable, "-c", _PEAK, str(CKPTRACE), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    lines = r.stderr.splitlines()
    r.stderr = "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "")
    return r, int(lines[-1])


# --- memory against trace length (issue 39) -----------------------------------------------------

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def bench_trace(path: Path, n: int) -> Path:
    """benchmarks/bench_memory.py's synthetic trace of `n` events (what its figures are measured on)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import bench_memory as b; "
            "b.synthetic_trace(Path(sys.argv[2]), int(sys.argv[3]))")
    subprocess.run([sys.executable, "-c", code, str(BENCHMARKS), str(path), str(n)], check=True)
    return path


def traced_peak(code: str, *args) -> int:
    """The peak of Python's and numpy's allocations (tracemalloc) while `code` runs in a fresh
    child (sys.argv[1:] = `args`), after its imports: deterministic, unlike RSS, which a busy
    machine's allocator retention moves. Arrow's own pool is not traced (the reader's batches: a
    fixed part)."""
    run = ("import sys, tracemalloc\nimport ckptrace.api, ckptrace.renderers.perfetto, ckptrace.renderers.chrome\n"
           f"tracemalloc.start()\n{code}\nprint(tracemalloc.get_traced_memory()[1])\n")
    p = subprocess.run([sys.executable, "-c", run, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[-1])
