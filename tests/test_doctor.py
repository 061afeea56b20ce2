"""`ckptrace doctor` and the kernel facts behind it, on the real machine: no mocks of the kernel."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ckptrace.core.errors import EbpfUnavailable
from ckptrace.probes import kernel
from helpers import (AS_NOBODY, CKPTRACE, NO_BCC, assert_one_line_error, ckptrace, wait_until,
                     why_nobody_cannot_run_ckptrace)

REPO = Path(__file__).resolve().parents[1]
# Run the CLI as user nobody, or as uid 0 with every capability dropped.
AS_CAPLESS_ROOT = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
# Root with only the two capabilities said to suffice: bpf() works, a uprobe on a process does not.
ONLY = "-all,+bpf,+perfmon"
AS_BPF_PERFMON_ROOT = ["setpriv", f"--inh-caps={ONLY}", f"--ambient-caps={ONLY}", f"--bounding-set={ONLY}", "--"]


def run(args, env=None, prefix=(), cwd=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*prefix, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=120)


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def assert_check_lines_only(stdout: str) -> None:
    """Doctor's stdout is its check lines and nothing else (libbcc's chatter is captured)."""
    for ln in lines_of(stdout):
        assert re.match(r"^(ok   |FAIL )\S.*?: ", ln), ln


@pytest.mark.ebpf
def test_doctor_passes_here(require_root_ebpf):
    r = ckptrace("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    assert_check_lines_only(r.stdout)
    out = lines_of(r.stdout)
    assert all(ln.startswith("ok ") for ln in out), r.stdout
    names = {ln[5:].split(": ", 1)[0] for ln in out}
    for category, event in kernel.TRACEPOINTS:
        assert f"tracepoint {category}:{event}" in names
    for name in ("privileges", "PID namespace", "bpf() syscall", "tracefs", "uprobes", "BTF", "bcc",
                 "kernel headers", "compile", "raw tracepoints"):
        assert name in names


@pytest.mark.ebpf
def test_doctor_json_parses_and_matches_the_text(require_root_ebpf):
    result = ckptrace("doctor", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = json.loads(result.stdout)["checks"]
    assert [set(c) for c in checks] == [{"check", "ok", "detail", "fix"}] * len(checks)
    assert all(c["ok"] and c["fix"] == "" for c in checks)
    btf = next(c for c in checks if c["check"] == "BTF")
    off = kernel.task_struct_offsets()
    assert f"min_flt +{off['min_flt']}" in btf["detail"]


def test_doctor_help_has_examples():
    result = ckptrace("doctor", "--help")
    assert result.returncode == 0
    assert "Examples:" in result.stdout and "ckptrace doctor --json" in result.stdout


def test_doctor_checks_every_tracepoint_the_recorder_attaches():
    """A tracepoint added to the BPF program without a doctor check fails here."""
    src = (REPO / "probes" / "checkpoint.bpf.c").read_text()
    used = set(re.findall(r"^TRACEPOINT_PROBE\((\w+),\s*(\w+)\)", src, re.M))
    raw = set(re.findall(r"^RAW_TRACEPOINT_PROBE\((\w+)\)", src, re.M))
    assert used, "no TRACEPOINT_PROBE found: has the program moved?"
    assert used <= set(kernel.TRACEPOINTS)
    assert raw <= set(kernel.RAW_TRACEPOINTS)
    assert raw <= {event for _, event in kernel.TRACEPOINTS}


@pytest.mark.parametrize("who", ["nobody", "root-without-capabilities", "root-with-CAP_BPF-CAP_PERFMON"])
@pytest.mark.parametrize("what", ["doctor", "record"])
def test_without_privileges_one_clear_line(who, what, nobody_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another user or drop capabilities")
    if who == "nobody":
        why = why_nobody_cannot_run_ckptrace()
        if why:  # e.g. a clone under /root; the capability-less root case still runs
            pytest.skip(why)
    prefix = {"nobody": AS_NOBODY, "root-without-capabilities": AS_CAPLESS_ROOT}.get(who, AS_BPF_PERFMON_ROOT)
    args = ["doctor"] if what == "doctor" else ["record", "-o", str(nobody_dir / "x.parquet"),
                                                 "--", "/bin/true"]
    r = ckptrace(*args, wrap=prefix, cwd=nobody_dir)
    assert "Traceback" not in r.stdout + r.stderr
    err = assert_one_line_error(r)
    assert re.search(r"root|CAP_SYS_ADMIN", err), err
    if what == "doctor":
        assert_check_lines_only(r.stdout)
        assert re.search(r"^FAIL privileges: .*; fix: ", r.stdout, re.M), r.stdout


def test_bcc_missing_fails_the_bcc_check():
    # None in sys.modules makes `import bcc` raise ImportError, as if it were not installed.
    r = ckptrace("doctor", entry=NO_BCC)
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    assert_check_lines_only(r.stdout)
    bcc_line = next(ln for ln in lines_of(r.stdout) if ln[5:].startswith("bcc: "))
    assert bcc_line.startswith("FAIL bcc: bcc is not importable from ")
    assert "fix: install python3-bpfcc" in bcc_line
    assert re.search(r"^FAIL compile: not tried", r.stdout, re.M)
    assert len(lines_of(r.stderr)) == 1


@pytest.mark.parametrize("into", ["pipe", "file"])
def test_headers_missing_fails_with_the_fix(tmp_path, into):
    # libbcc prints its complaint with C stdio, block-buffered off a terminal: unflushed when the
    # capture ended, it reached the real stdout at exit (seen with stdout a file, and once in CI)
    env = {"BCC_KERNEL_SOURCE": "/nonexistent", "CKPTRACE_BPF_CACHE": str(tmp_path / "bpf")}
    if into == "file":
        with open(tmp_path / "out", "w+") as out:
            # the environment CI's `env -i` gives (the leak showed there, not under a login shell's)
            bare = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
            r = subprocess.run([str(CKPTRACE), "doctor"], stdout=out, stderr=subprocess.PIPE, text=True,
                               env={**bare, **env}, timeout=300)
            out.seek(0)
            r.stdout = out.read()
    else:
        r = ckptrace("doctor", env=env)
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    assert_check_lines_only(r.stdout)  # libbcc prints its headers complaint to stdout: captured
    line = next(ln for ln in lines_of(r.stdout) if " kernel headers:" in ln)
    assert line.startswith("FAIL kernel headers: kernel headers not found at /nonexistent")
    assert "; fix: unset BCC_KERNEL_SOURCE" in line
    assert len(lines_of(r.stderr)) == 1


def test_headers_missing_raises_for_the_recorder(monkeypatch):
    monkeypatch.setenv("BCC_KERNEL_SOURCE", "/nonexistent")
    with pytest.raises(EbpfUnavailable, match="kernel headers not found at /nonexistent"):
        kernel.kernel_headers_dir()


def test_task_struct_fault_counters_are_adjacent_longs():
    """task_struct declares `unsigned long min_flt, maj_flt;`: a wrong parse breaks adjacency."""
    off = kernel.task_struct_offsets()
    assert set(off) == {"min_flt", "maj_flt"}
    assert off["min_flt"] % 8 == 0
    assert off["maj_flt"] == off["min_flt"] + 8
    size = next(t["size"] for t in kernel.btf_types().values()
                if t["kind"] == "STRUCT" and t["name"] == "task_struct")
    assert 0 < off["min_flt"] < off["maj_flt"] + 8 <= size


def test_scheduler_counters_are_found_in_btf():
    """This kernel has them (CONFIG_SCHED_INFO): every offset is inside its struct."""
    off, note = kernel.sched_offsets()
    assert off is not None, note
    assert set(off) == set(kernel.SCHED_FIELDS)
    assert off["sum_exec_runtime"] == off["exec_start"] + 8  # adjacent u64s in sched_entity
    assert off["nivcsw"] == off["nvcsw"] + 8


@pytest.mark.ebpf
def test_compile_error_names_the_first_clang_error(require_root_ebpf):
    with pytest.raises(EbpfUnavailable, match=r"error: use of undeclared identifier 'nosuch'"):
        kernel.load_bpf(text="int f(void *ctx) { return nosuch; }\n")


# Our own fixed C that bcc's LLVM cannot compile and stops on with a fatal error (a variable-length
# array: "Unsupported dynamic stack allocation"); LLVM aborts the process after printing it.
LLVM_FATAL = ("int f(void *ctx) { int n = bpf_get_prandom_u32() & 7; char b[n + 1]; b[0] = 1;\n"
              "  bpf_trace_printk(\"%d\", b[n]); return 0; }\n")
# record with its BPF source swapped for another file (the recorder's own module attribute).
WITH_BPF_SOURCE = [sys.executable, "-c", "import sys; from pathlib import Path; from ckptrace.probes import loader; "
                   "loader.BPF_SOURCE = Path(sys.argv.pop(1)); from ckptrace.cli import main; main()"]


@pytest.mark.ebpf
def test_record_says_in_one_line_that_llvm_stopped_the_compile(require_root_ebpf, tmp_path, workload):
    """A fatal error in bcc's LLVM used to abort `record` with nothing said (LLVM exits from
    inside the compile, whose output ckptrace captures): now one line, the compiler's output
    kept in a new file in TMPDIR, exit 1, no trace and no held command left behind."""
    source = tmp_path / "fatal.bpf.c"
    source.write_text(LLVM_FATAL)
    out = tmp_path / "t.parquet"
    r = ckptrace(source, "record", "-o", out, "--", workload, "--iterations", "1",
                 entry=WITH_BPF_SOURCE, env={"TMPDIR": str(tmp_path)})
    line = assert_one_line_error(r, "compile failed", "Unsupported dynamic stack allocation", code=1)
    logs = list(tmp_path.glob("ckptrace-bpf-compile-*.log"))
    assert len(logs) == 1 and line.endswith(f"its output is in {logs[0]}"), (line, logs)
    assert "LLVM ERROR: Unsupported dynamic stack allocation" in logs[0].read_text()
    assert logs[0].stat().st_mode & 0o777 == 0o600
    assert not out.exists() and r.stdout == ""
    # The held command dies with its recorder (PR_SET_PDEATHSIG): no process still names the source.
    wait_until(lambda: not any(str(source) in cmdline for cmdline in _cmdlines()),
               "the held command to go with its recorder", timeout_s=30)


def _cmdlines() -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                found.append((d / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:  # exited meanwhile
                pass
    return found


def test_setup_links_the_newest_debian_headers(tmp_path):
    """scripts/setup.sh's header step on a fake /lib/modules and /usr/src."""
    src, modules = tmp_path / "src", tmp_path / "modules"
    for version in ("6.1.0-9", "6.1.0-56"):
        (src / f"linux-headers-{version}-amd64" / "include").mkdir(parents=True)
        (src / f"linux-headers-{version}-common").mkdir()
    env = {"CKPTRACE_MODULES_DIR": str(modules), "CKPTRACE_USR_SRC": str(src),
           "CKPTRACE_KERNEL_RELEASE": "9.9.9-test"}
    step = ["bash", "-c", f"source {REPO / 'scripts' / 'setup.sh'} && link_headers"]
    first = run(step, env=env)
    assert first.returncode == 0, first.stderr
    kdir = modules / "9.9.9-test"
    assert os.readlink(kdir / "build") == str(src / "linux-headers-6.1.0-56-amd64")
    assert os.readlink(kdir / "source") == str(src / "linux-headers-6.1.0-56-common")
    assert "linked" in first.stdout and "docs/kernel-facts.md" in first.stdout
    second = run(step, env=env)
    assert second.returncode == 0 and "present" in second.stdout and "linked" not in second.stdout
    # The linked headers vanish (package upgraded): relink both to what is there now.
    shutil.rmtree(src / "linux-headers-6.1.0-56-amd64")
    third = run(step, env=env)
    assert third.returncode == 0, third.stderr
    assert os.readlink(kdir / "build") == str(src / "linux-headers-6.1.0-9-amd64")
    assert os.readlink(kdir / "source") == str(src / "linux-headers-6.1.0-9-common")


@pytest.mark.ebpf
def test_on_an_arm64_kernel_the_x86_fault_tracepoint_is_not_required(require_root_ebpf, monkeypatch):
    # arm64 kernels have no exceptions:page_fault_user (x86's): doctor passes, says what that costs
    # (--fault-sample), and its raw tracepoint check attaches the rest, on this real kernel.
    from ckptrace.commands import doctor
    from ckptrace.probes import arch

    monkeypatch.setattr(arch, "running", lambda machine=None: arch.ARCHES["aarch64"])
    real = kernel.tracepoint_exists
    monkeypatch.setattr(kernel, "tracepoint_exists", lambda c, e: (c, e) != kernel.FAULT_TRACEPOINT and real(c, e))
    checks = {c.check: c for c in doctor.run_checks()}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert "--fault-sample is unavailable" in checks["tracepoint exceptions:page_fault_user"].detail
    assert checks["raw tracepoints"].detail == "attached rss_stat"
