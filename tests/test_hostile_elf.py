"""Issue 22, class 2: a file an unprivileged process merely maps is hostile input to root's reader.

`record --pid`, `serve --comm` and `symbols --pid` read every ELF file the target maps, data
mappings included, and any user's process maps what it likes. Each file here is crafted from a
real one (/bin/true, the sample workload) with a few bytes patched: the reader must say what is
wrong with it in one line, in bounded memory and time, never open a FIFO or a device, and (a
library, a data mapping) leave that one file out and search the rest.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CKPTRACE, go, started

TRUE = os.path.realpath("/bin/true")
PEAK_MIB = 500  # ckptrace symbols takes about 40 MiB; the sparse giant once took 5 GB
RECORD_PEAK_MIB = 1500  # record compiles its BPF program in-process (clang): about 460 MiB
BOUND_S = 60  # a bound for a blocked or runaway run, never a speed
SHT_DYNSYM, SHF_COMPRESSED = 11, 0x800

# Runs argv under a timeout (the child killed at it: exit 124) and writes the child's peak RSS (KiB)
# to argv[1]: RUSAGE_CHILDREN of this wrapper sees that one child only.
MEASURED = r"""
import resource, subprocess, sys
try:
    r = subprocess.run(sys.argv[3:], capture_output=True, text=True, timeout=float(sys.argv[2]))
    code, out, err = r.returncode, r.stdout, r.stderr
except subprocess.TimeoutExpired as e:
    code, out, err = 124, "", f"timed out after {sys.argv[2]} s\n"
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(code)
"""


def bounded(tmp_path: Path, *args, cwd=None, peak_mib: int = PEAK_MIB) -> subprocess.CompletedProcess:
    """`ckptrace ARGS`, which must end within BOUND_S and peak below peak_mib of RSS."""
    peak = tmp_path / "peak.kib"
    r = subprocess.run([sys.executable, "-c", MEASURED, peak, str(BOUND_S), CKPTRACE, *map(str, args)],
                       capture_output=True, text=True, timeout=BOUND_S + 60, cwd=cwd)
    assert r.returncode != 124, f"ckptrace {args} blocked or ran past {BOUND_S} s"
    mib = int(peak.read_text()) / 1024
    assert mib < peak_mib, f"ckptrace {args} peaked at {mib:.0f} MiB of RSS"
    assert "Traceback" not in r.stderr, r.stderr
    return r


def one_error(r: subprocess.CompletedProcess) -> str:
    """The run failed with one `ckptrace: error:` line, the last of stderr (notes may come before it)."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert [ln for ln in lines if not ln.startswith("ckptrace: note: ")] == lines[-1:], r.stderr
    assert lines[-1].startswith("ckptrace: error: "), r.stderr
    return lines[-1]


# --- crafting: a real ELF64 little-endian file with a few fields patched ------------------------

def _shdr(b, i: int) -> int:
    return struct.unpack_from("<Q", b, 0x28)[0] + 64 * i


def _section(b, sh_type: int) -> int:
    n = struct.unpack_from("<H", b, 0x3C)[0]
    return next(i for i in range(n) if struct.unpack_from("<I", b, _shdr(b, i) + 4)[0] == sh_type)


def _put(b: bytearray, fmt: str, off: int, value: int) -> bytearray:
    struct.pack_into(fmt, b, off, value)
    return b


def _sparse_giant(b: bytearray, path: Path) -> None:
    """.dynsym moved to a page past the file's end and claiming 2 GiB, the file extended to hold
    it sparsely: about 36 KiB on disk."""
    sec, at = _shdr(b, _section(b, SHT_DYNSYM)), (len(b) + 4095) & ~4095
    _put(b, "<Q", sec + 24, at)
    _put(b, "<Q", sec + 32, (2 << 30) // 24 * 24)
    path.write_bytes(b)
    os.truncate(path, at + (2 << 30))


# case -> (patch of /bin/true's bytes, what the error line must say)
CASES = {
    "truncated-header": (lambda b: b[:40], "truncated: 40 bytes"),
    "truncated-section-headers": (lambda b: b[:_shdr(b, 3)], "section headers at offset"),
    "huge-e_shnum": (lambda b: _put(b, "<H", 0x3C, 0xFFFF), "claims 65535 sections"),
    "extended-section-count": (lambda b: _put(_put(b, "<H", 0x3C, 0), "<Q", _shdr(b, 0) + 32, 1 << 40),
                               "claims 1099511627776 sections"),
    "section-outside-the-file": (lambda b: _put(b, "<Q", _shdr(b, _section(b, SHT_DYNSYM)) + 24, 1 << 40),
                                 "ends past the end of the file"),
    "section-larger-than-the-file": (lambda b: _put(b, "<Q", _shdr(b, _section(b, SHT_DYNSYM)) + 32, 24 << 36),
                                     "ends past the end of the file"),
    "bad-e_shstrndx": (lambda b: _put(b, "<H", 0x3E, 200), "section names' table (section 200)"),
    "huge-e_phnum": (lambda b: _put(b, "<H", 0x38, 60000), "60000 program headers"),
    "compressed-dynsym": (lambda b: _put(b, "<Q", _shdr(b, _section(b, SHT_DYNSYM)) + 8,
                                         struct.unpack_from("<Q", b, _shdr(b, _section(b, SHT_DYNSYM)) + 8)[0]
                                         | SHF_COMPRESSED), ".dynsym is compressed"),
    "sparse-giant": (None, ".dynsym claims 2147483640 bytes"),
}


def crafted(folder: Path, case: str, name: str | None = None, source: str = TRUE) -> Path:
    path = folder / (name or case)
    b = bytearray(Path(source).read_bytes())
    assert b[:6] == b"\x7fELF\x02\x01", "crafting needs an ELF64 little-endian file"
    patch, _ = CASES[case]
    if patch is None:
        _sparse_giant(b, path)
    else:
        path.write_bytes(patch(b))
    return path


@pytest.mark.parametrize("case", CASES)
def test_a_crafted_binary_is_one_line_in_bounded_memory_and_time(tmp_path, case):
    path = crafted(tmp_path, case)
    line = one_error(bounded(tmp_path, "symbols", path))
    assert line.startswith(f"ckptrace: error: {path} is not an ELF program or library that can be read: "), line
    assert CASES[case][1] in line, line


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_a_fifo_or_device_as_binary_is_refused_unopened(tmp_path, what):
    path = tmp_path / "fifo" if what == "fifo" else Path(what)
    if what == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer that never comes
    kind = "a FIFO" if what == "fifo" else "a character device"
    assert one_error(bounded(tmp_path, "symbols", path)) == (
        f"ckptrace: error: {path} is {kind}, not a regular file: give the path of the program")


# --- a library: left out with a note, the rest searched ----------------------------------------

@pytest.fixture()
def workload_copy(tmp_path, workload):
    """The sample workload and its libraries copied into a folder of their own (RUNPATH $ORIGIN:
    a file put beside them is the library its loader, and ckptrace, find first)."""
    folder = tmp_path / "wl"
    folder.mkdir()
    for f in [Path(workload), *Path(workload).parent.glob("libsample-*.so")]:
        shutil.copy2(f, folder / f.name)
    return folder / Path(workload).name


def resolved(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr
    assert "update_tgt " in r.stdout and "state_copy " in r.stdout, r.stdout


@pytest.mark.parametrize("case", ["bad-e_shstrndx", "sparse-giant"])
def test_a_hostile_library_is_noted_and_the_rest_searched(tmp_path, workload_copy, case):
    lib = crafted(workload_copy.parent, case, name="libm.so.6")
    r = bounded(tmp_path, "symbols", workload_copy)
    resolved(r)
    assert r.stderr.startswith(f"ckptrace: note: {lib} not searched: "), r.stderr
    assert CASES[case][1] in r.stderr, r.stderr


def test_a_fifo_in_the_library_path_is_passed_over(tmp_path, workload_copy):
    os.mkfifo(workload_copy.parent / "libm.so.6")  # found first by RUNPATH, before the system's
    r = bounded(tmp_path, "symbols", workload_copy)
    resolved(r)
    assert r.stderr == ""  # passed over as a library of another machine would be: the system's libm is used


def test_a_needed_path_naming_a_fifo_is_noted_unopened(tmp_path, workload_copy):
    b = workload_copy.read_bytes()
    assert b.count(b"\0libm.so.6\0") >= 1
    workload_copy.write_bytes(b.replace(b"\0libm.so.6\0", b"\0./fifo.so\0", 1))  # DT_NEEDED with a slash
    os.mkfifo(workload_copy.parent / "fifo.so")
    r = bounded(tmp_path, "symbols", workload_copy, cwd=workload_copy.parent)
    resolved(r)
    fifo = os.path.realpath(workload_copy.parent / "fifo.so")
    assert r.stderr.splitlines() == [f"ckptrace: note: {fifo} not searched: a FIFO, not a regular file"]


# --- mapped by a process: --pid ----------------------------------------------------------------

MAP_FILES = r"""
/* LD_PRELOAD: map (read-only, the first 64 KiB) each file named in $CKPT_MAP (colon-separated), as
 * any user's process may map any file it can read, before the program's main() runs. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((constructor)) static void map_files(void) {
    const char *list = getenv("CKPT_MAP");
    if (!list) return;
    char *names = strdup(list);
    for (char *p = strtok(names, ":"); p; p = strtok(NULL, ":")) {
        int fd = open(p, O_RDONLY);
        if (fd < 0) continue;
        off_t n = lseek(fd, 0, SEEK_END);
        if (n > 0) mmap(NULL, n < 65536 ? (size_t) n : 65536, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
    }
}
"""
MAPPED = ("bad-e_shstrndx", "section-outside-the-file", "sparse-giant")


@pytest.fixture()
def mapping_env(tmp_path):
    """The environment that makes a program map the crafted files of MAPPED, and their paths."""
    src, lib = tmp_path / "map_files.c", tmp_path / "map_files.so"
    src.write_text(MAP_FILES)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True)
    files = [crafted(tmp_path, case) for case in MAPPED]
    return {**os.environ, "LD_PRELOAD": str(lib), "CKPT_MAP": ":".join(map(str, files))}, files


def mapping_workload(workload, env, *args):
    """The sample workload with the crafted files mapped, waiting for SIGUSR1 (helpers.go)."""
    return started([workload, "--wait-signal", *args], ready="ready pid=", env=env)


def assert_noted(stderr: str, files) -> None:
    notes = [ln for ln in stderr.splitlines() if " not searched: " in ln]
    for f, case in zip(files, MAPPED):
        assert any(ln.startswith(f"ckptrace: note: {f} not searched: ") and CASES[case][1] in ln for ln in notes), \
            (f, stderr)
    assert len(notes) == len(files), stderr


def test_symbols_pid_notes_each_hostile_mapping_and_resolves_the_rest(tmp_path, workload, mapping_env):
    env, files = mapping_env
    with mapping_workload(workload, env) as (wl, _):
        assert sum(str(f) in Path(f"/proc/{wl.pid}/maps").read_text() for f in files) == len(files)
        r = bounded(tmp_path, "symbols", "--pid", wl.pid)
    resolved(r)
    assert_noted(r.stderr, files)


def test_an_unreadable_executable_of_a_pid_is_one_line(tmp_path):
    """The process's own executable is not left out: one line, the error. (The kernel runs it:
    it reads no section header; ckptrace reads them all.)"""
    exe = crafted(tmp_path, "bad-e_shstrndx", name="sleeper", source=os.path.realpath("/bin/sleep"))
    exe.chmod(0o755)
    with subprocess.Popen([exe, "60"]) as p:
        try:
            line = one_error(bounded(tmp_path, "symbols", "--pid", p.pid))
        finally:
            p.kill()
    assert line.startswith(f"ckptrace: error: PID {p.pid}'s executable {exe} can't be read: "
                           "its section names' table (section 200)"), line


def test_a_file_not_read_in_time_is_left_out(workload, monkeypatch):
    """The time bound, without waiting for it: with none left, every file is past its deadline."""
    from ckptrace.core.errors import TargetError
    from ckptrace.probes import elfsafe, symbols

    monkeypatch.setattr(elfsafe, "TIME_S", 0.0)
    with pytest.raises(TargetError, match=r"that can be read: not read in the 0 s it was given$"):
        symbols.resolve_binary(str(workload))


@pytest.mark.ebpf
def test_record_pid_of_a_workload_mapping_hostile_files(require_root_ebpf, tmp_path, workload, mapping_env):
    """`record --pid`: each hostile mapping noted, the workload's checkpoints recorded."""
    from ckptrace.core.trace import read_trace

    env, files = mapping_env
    out = tmp_path / "t.parquet"
    with mapping_workload(workload, env, "--iterations", "100000") as (wl, _):
        go(wl)
        r = bounded(tmp_path, "record", "--quiet", "--pid", wl.pid, "--duration", "2", "-o", out,
                    peak_mib=RECORD_PEAK_MIB)
    assert r.returncode == 0, r.stderr
    assert_noted(r.stderr, files)
    trace = read_trace(out)
    assert trace.meta.pid == wl.pid
    assert (trace.events["kind"] == "checkpoint").sum() > 0


def lines_of(proc):
    """next_line() for a started() process: its stderr lines, read by a thread as they come (a
    bound of 60 s each for a hung test, not a speed)."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(ln) for ln in iter(proc.stderr.readline, "")], daemon=True).start()

    def next_line() -> str:
        try:
            return q.get(timeout=60)
        except queue.Empty:
            raise AssertionError(f"no line from {proc.args[:3]} in 60 s") from None
    return next_line


@pytest.mark.ebpf
def test_serve_comm_goes_on_serving_past_a_process_mapping_hostile_files(require_root_ebpf, tmp_path, workload,
                                                                          mapping_env):
    """`serve --comm`: a healthy process is served; a second of the same name mapping hostile
    files is served too, its mappings noted; serve never stops (it once raised out of its loop)."""
    import re
    import urllib.request

    from helpers import wait_until

    env, files = mapping_env
    name = f"ckh-{os.getpid() % 100000}"
    exe = tmp_path / name
    exe.symlink_to(workload)  # comm: the exec'd name; libraries by $ORIGIN of the real path
    with started([CKPTRACE, "serve", "--comm", name, "--listen", "127.0.0.1:0"],
                 ready="ckptrace: serving http://127.0.0.1:") as (srv, line):
        url = re.search(r"(http://\S+/metrics)", line).group(1)
        next_line = lines_of(srv)
        with mapping_workload(exe, os.environ, "--iterations", "100000") as (healthy, _):
            assert next_line().startswith(f"ckptrace: serving PID {healthy.pid} ({name}, ")
            with mapping_workload(exe, env, "--iterations", "3") as (hostile, _):
                said = [next_line() for _ in files]
                assert_noted("\n".join(said), files)
                assert next_line().startswith(f"ckptrace: serving PID {hostile.pid} ({name}, ")
                go(healthy)

                def served() -> bool:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        text = resp.read().decode()
                    return bool(re.search(rf'^ckptrace_checkpoints_total{{[^}}]*pid="{healthy.pid}"[^}}]*}} [1-9]',
                                          text, re.M))

                wait_until(served, "the healthy process's checkpoints served", watch=srv)
                hostile.send_signal(signal.SIGKILL)
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(60) == 0
        rest = []
        while (ln := next_line()) and not ln.startswith("ckptrace: stopped"):
            rest.append(ln)
        assert not any("Traceback" in ln for ln in rest), rest


# --- issue 39: call-site search bounded ---------------------------------------------------------

UPDATE_TGT = "_ZN24common_prompt_checkpoint10update_tgtEP13llama_contextij"


def many_calls(folder: Path, name: str, n: int, callee: str) -> Path:
    """A program whose update_tgt (its growth inlined: its call sites are searched) is `n` calls."""
    src = folder / f"{name}.s"
    src.write_text(f"""    .text
    .globl {UPDATE_TGT}
    .type {UPDATE_TGT}, @function
{UPDATE_TGT}:
    .rept {n}
    call {callee}
    .endr
    ret
    .size {UPDATE_TGT}, .-{UPDATE_TGT}
helper:
    ret
    .globl llama_state_seq_get_data_ext
    .type llama_state_seq_get_data_ext, @function
llama_state_seq_get_data_ext:
    xor %eax, %eax
    ret
    .size llama_state_seq_get_data_ext, .-llama_state_seq_get_data_ext
    .globl main
    .type main, @function
main:
    xor %eax, %eax
    ret
    .size main, .-main
    .section .note.GNU-stack,"",@progbits
""")
    subprocess.run(["gcc", str(src), "-o", str(folder / name)], check=True)
    return folder / name


@pytest.mark.parametrize("n, callee, why", [
    (3_000_000, "helper", "common_prompt_checkpoint::update_tgt makes more than 65536 calls (at most 65536 are read)"),
    (300, "memset@PLT", "common_prompt_checkpoint::update_tgt makes more than 256 calls to memset or __memset_chk "
                        "(at most 256 are probed)"),
])
def test_a_function_of_millions_of_calls_is_one_line_in_bounded_memory(tmp_path, n, callee, why):
    # A 15 MB update_tgt of 3M calls once took `symbols` (and serve --comm) to 3.9 GB; capstone
    # decoded the whole function before the first call was looked at. Its other points stand.
    exe = many_calls(tmp_path, "calls", n, callee)
    r = bounded(tmp_path, "symbols", "--json", exe)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"ckptrace: note: {exe} call sites not probed: {why}"]
    d = json.loads(r.stdout)
    assert {p["point"] for p in d["points"]} == {"update_tgt", "state_copy"}  # no fill_call
    assert d["not_searched"] == [f"{exe}: {why}"]
