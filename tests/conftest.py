"""Shared fixtures, and CI's rule that eBPF tests may not be skipped.

Fixtures:
- `require_root_ebpf`: skips, saying why, only where eBPF is truly unavailable here (no root or
  CAP_SYS_ADMIN, bcc not importable, no kernel headers). Use it in every `@pytest.mark.ebpf`
  test.
- `workload`, `static_workload`: paths of the built sample `ckpt-workload` (built once per
  session) and of its static non-PIE build.

The helpers every test shares (CLI runner, one-line error, start-wait-kill, truth, record with
truth, span invariants) are plain functions in helpers.py.

With CKPTRACE_REQUIRE_EBPF=1 (scripts/setup.sh sets it when CI=true) a skipped `ebpf` test, or a
run where no `ebpf` test ran at all, fails the session: a CI run that proved nothing about the
kernel side must not look green.
"""
from __future__ import annotations

import os
import signal

import pytest


def _catch_ignored_stop_signals() -> None:
    """The suite sends SIGINT, SIGHUP and SIGQUIT to the processes it starts and checks that they
    stop. A suite started in the background (`cmd &`: SIGINT and SIGQUIT ignored) or under nohup
    (SIGHUP ignored) would hand those ignored dispositions to every child, and the children would
    rightly ignore the signals. A Python handler here keeps pytest itself as it was started (the
    signal still does nothing to it) while exec gives each child the default disposition."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(s) == signal.SIG_IGN:
            signal.signal(s, lambda signum, frame: None)


_catch_ignored_stop_signals()

REQUIRE_EBPF = os.environ.get("CKPTRACE_REQUIRE_EBPF") == "1"

_ebpf_skipped: list[str] = []
_ebpf_ran: list[str] = []


def ebpf_unavailable_reason() -> str | None:
    """Why eBPF can't be used by this process, or None when it can."""
    from ckptrace.core.errors import CkptraceError
    from ckptrace.probes import kernel

    try:
        kernel.require_privileges()
        kernel.import_bcc()
        kernel.kernel_headers_dir()
    except CkptraceError as e:
        return f"eBPF unavailable: {e}"
    return None


@pytest.fixture(autouse=True)
def _steal_at_start():
    """Each test's start on the VM's steal counter: helpers.clock_tolerance allows for the steal the
    kernel had not yet accounted, never more than the VM saw while the test ran."""
    from helpers import mark_test_start

    mark_test_start()


@pytest.fixture(scope="session")
def require_root_ebpf() -> None:
    reason = ebpf_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def workload():
    """The sample workload (PIE, shared libraries); built once per session."""
    from ckptrace.samples import workload_binary  # lazily: only tests that run it pay the build

    return workload_binary()


@pytest.fixture(scope="session")
def static_workload():
    """The same workload as one static non-PIE executable."""
    from ckptrace.samples import workload_binary

    return workload_binary(static=True)


@pytest.fixture()
def nobody_dir():
    """An empty folder user nobody can write, removed afterwards."""
    import shutil
    import tempfile
    from pathlib import Path

    d = tempfile.mkdtemp(prefix="ckptrace-nobody-")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


# --- llama-server builds: made in the background while the other tests run -----------------------
#
# A cold llama-server build costs about 11 minutes of CPU, and the llama tests need several. Each
# llama test module lists the builds it needs (LLAMA_BUILDS: run_legs/build_argv keywords); when
# the session has llama tests, they run last and one background process builds what they need, in
# the order they need it, at the tests' own priority: at nice 10, beside a busy loop at nice 0 (a
# busy machine), the scheduler's weights (110 against 1024) leave the builds a tenth of a core. A test's
# own build_server call then finds the build done, or waits on build.sh's per-build lock for the
# one in progress, or (when a background build failed) builds it itself: each test still gets
# everything it needs on its own. CKPTRACE_PREBUILD=0 turns the background builds off.

_prebuild: dict = {}


def pytest_collection_modifyitems(config, items) -> None:
    """llama tests last (stable): the background builds get the rest of the suite's time; the arm64
    VM's just before them, its guest having run beside the tests before (prestart)."""
    items.sort(key=lambda item: ("llama" in item.keywords, "aarch64_vm" in item.keywords))


def _llama_builds(items) -> list[dict]:
    builds: list[dict] = []
    for item in items:
        if "llama" not in item.keywords:
            continue
        for spec in getattr(item.module, "LLAMA_BUILDS", ()):
            if spec not in builds:
                builds.append(spec)
    return builds


# A test module may start its slow, self-contained work (the arm64 VM's boot) when the session's
# tests are collected: its `prestart()` runs then, its `prestop()` when the session ends.
_prestarted: list = []


def _prestart(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for module in dict.fromkeys(item.module for item in session.items if hasattr(item, "module")):
        if hasattr(module, "prestart"):
            module.prestart()
            _prestarted.append(module)


def pytest_collection_finish(session: pytest.Session) -> None:
    _prestart(session)
    _start_prebuild(session)
    # A SIGTERM (a CI runner's timeout; scripts/setup.sh stopping the other session) ends the
    # session as Ctrl-C does: teardowns run, so the builds (a session of their own), the guest (a
    # thread) and every process a test started end with it.
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _start_prebuild(session: pytest.Session) -> None:
    import shlex
    import subprocess
    import sys
    import tempfile
    import threading
    import time

    builds = _llama_builds(session.items)
    if (not builds or session.config.option.collectonly or os.environ.get("CKPTRACE_PREBUILD") == "0"
            or os.geteuid() != 0):
        return
    from ckptrace.samples.llama_server import build_argv

    # Each build's wall time, then the CPU all of them took (bash's `times`: its children's user
    # and system time), for the summary's breakdown.
    script = "rc=0; " + "".join(
        f"s=$SECONDS; {shlex.join(build_argv(**spec))} || rc=1; "
        f"echo \"prebuild: {' '.join(f'{k}={v}' for k, v in spec.items())}: $((SECONDS - s)) s\"; "
        for spec in builds) + "echo prebuild: times; times; exit $rc"
    fd, log = tempfile.mkstemp(prefix="ckptrace-prebuild-", suffix=".log")
    proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL,
                            stdout=fd, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "CKPTRACE_PYTHON": sys.executable})
    os.close(fd)
    _prebuild.update(proc=proc, log=log, start=time.monotonic(), builds=len(builds))
    threading.Thread(target=_wait_prebuild, args=(proc,), daemon=True, name="prebuild-wait").start()


def _wait_prebuild(proc) -> None:
    """Reaps the background builds with their CPU (wait4), so the per-file CPU can leave it out."""
    import time

    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    _prebuild.update(end=time.monotonic(), cpu=usage.ru_utime + usage.ru_stime)


def _stop_prebuild() -> str | None:
    """Stops the background builds if still running (build.sh resumes a partial build); how it went."""
    import time

    proc = _prebuild.get("proc")
    if proc is None:
        return None
    took = time.monotonic() - _prebuild["start"]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        return f"stopped after {took:.0f} s, still building (log: {_prebuild['log']})"
    if proc.returncode != 0:
        return f"failed with status {proc.returncode} (the tests built for themselves; log: {_prebuild['log']})"
    took = _prebuild.get("end", time.monotonic()) - _prebuild["start"]
    return (f"{_prebuild['builds']} built or reused in the first {took:.0f} s of the session"
            f"{_prebuild_times(_prebuild['log'])} (log: {_prebuild['log']})")


def _prebuild_times(log: str) -> str:
    """Each build's wall seconds and the builds' CPU, from the background script's log."""
    import re

    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    walls = re.findall(r"^prebuild: (.+): (\d+) s$", text, re.M)
    # `times` prints the shell's line, then its children's: "0m1.5s 0m0.2s"
    kids = re.search(r"^prebuild: times\n.*\n(\d+)m([\d.]+)s (\d+)m([\d.]+)s$", text, re.M)
    parts = [f"{spec} {s} s" for spec, s in walls]
    if kids:
        m1, s1, m2, s2 = kids.groups()
        parts.append(f"CPU {60 * int(m1) + float(s1) + 60 * int(m2) + float(s2):.0f} s")
    return f" ({'; '.join(parts)})" if parts else ""


# Where the suite's time went, per test file (setup, call and teardown summed): printed at the end
# so a slow CI run shows its breakdown without a second run.
_file_seconds: dict[str, float] = {}
_file_cpu: dict[str, float] = {}


def _cpu_now() -> float:
    """CPU of pytest and every process it has waited for, less the background builds'."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - _prebuild.get("cpu", 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu_now()
    yield
    path = item.nodeid.split("::", 1)[0]
    _file_cpu[path] = _file_cpu.get(path, 0.0) + _cpu_now() - before


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    if "ebpf" not in report.keywords:
        return
    if report.skipped and not hasattr(report, "wasxfail"):
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else ""
        _ebpf_skipped.append(f"{report.nodeid}: {why}")
    elif report.when == "call":
        _ebpf_ran.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _prebuild["outcome"] = _stop_prebuild()
    for module in _prestarted:
        if hasattr(module, "prestop"):
            module.prestop()
    if REQUIRE_EBPF and exitstatus == pytest.ExitCode.OK and (_ebpf_skipped or not _ebpf_ran):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _time_breakdown(terminalreporter, top: int = 25) -> None:
    import resource

    if not _file_seconds:
        return
    total = sum(_file_seconds.values())
    terminalreporter.section("time per test file (wall s: setup + call + teardown; CPU s of the processes it waited for)")
    ranked = sorted(_file_seconds.items(), key=lambda kv: -kv[1])
    for path, s in ranked[:top]:
        terminalreporter.line(f"{s:8.1f}  {100 * s / total:4.1f}%  CPU {_file_cpu.get(path, 0.0):7.1f}  {path}")
    rest = ranked[top:]
    if rest:
        walls, cpus = sum(s for _, s in rest), sum(_file_cpu.get(p, 0.0) for p, _ in rest)
        terminalreporter.line(f"{walls:8.1f}  {100 * walls / total:4.1f}%  CPU {cpus:7.1f}  the other {len(rest)} files")
    if _file_cpu:
        terminalreporter.line("CPU per file, most first: " + ", ".join(
            f"{p.removeprefix('tests/')} {c:.0f}" for p, c in sorted(_file_cpu.items(), key=lambda kv: -kv[1])[:top]))
    # CPU of pytest and of every process it has waited for (the tests' targets, recorders and,
    # once finished, the background builds): what the suite asked of the machine's cores.
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    terminalreporter.line(f"{total:8.1f}  in tests; CPU {cpu:.0f} s (pytest and the processes it waited for,"
                          f" the background builds' {_prebuild.get('cpu', 0.0):.0f} s included)")


def pytest_terminal_summary(terminalreporter) -> None:
    _time_breakdown(terminalreporter)
    if _prebuild.get("outcome"):
        terminalreporter.line(f"llama-server background builds: {_prebuild['outcome']}")
    if not REQUIRE_EBPF:
        return
    if _ebpf_skipped:
        terminalreporter.section("CKPTRACE_REQUIRE_EBPF=1: eBPF tests were skipped (failure)", red=True)
        for line in _ebpf_skipped:
            terminalreporter.line(line)
    elif not _ebpf_ran:
        terminalreporter.section("CKPTRACE_REQUIRE_EBPF=1: no eBPF test ran (failure)", red=True)
