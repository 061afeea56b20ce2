"""Hostile input and hostile places, as an SRE would try them: one clear line or correct behaviour.

Each test is one case of issue 9 (or one of the same kind): the file a user hands over, the folder
written into, the terminal printed on, the signal received, the server talked to.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ckptrace.core.terminal import printable
from helpers import AS_NOBODY, CKPTRACE, assert_one_line_error, ckptrace

CLI = [str(CKPTRACE)]
ESC = "\x1b"
# Clear screen, window title, OSC 52 clipboard write, bidi override, C1 CSI, a line forged.
NASTY = "a\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\u202eb\x9b31m\nverdict: faster"


def run(args, **kw):
    return ckptrace(*args, **kw)


def assert_one_error_line(r, after_recording: bool = False):
    """One `ckptrace: error:` line, the only line (the last one, after a recording's own lines),
    and no escape byte anywhere."""
    assert ESC not in r.stdout + r.stderr
    if not after_recording:
        return assert_one_line_error(r)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("ckptrace: tracing "), r.stderr
    assert [ln for ln in lines if ln.startswith("ckptrace: error")] == lines[-1:], r.stderr
    assert lines[-1].startswith("ckptrace: error: "), r.stderr
    return lines[-1]


# --- terminal -------------------------------------------------------------------------------

def test_printable_shows_every_control_visibly():
    out = printable(NASTY)
    assert out.isprintable()
    assert out == ("a\\x1b[2J\\x1b]0;owned\\x07\\x1b]52;c;ZWNobyBoaQ==\\x07\\u202eb\\x9b31m"
                   "\\nverdict: faster")


def test_printable_keeps_plain_text_and_report_lines():
    assert printable("pool-off, 32 slots: 48.1 MiB ± 2 µs") == "pool-off, 32 slots: 48.1 MiB ± 2 µs"
    assert printable("row 1\nrow 2\x1b[H", lines=True) == "row 1\nrow 2\\x1b[H"
    assert printable("tab\there") == "tab\\there"
    assert printable(42) == "42"


def test_printable_shows_undecodable_path_bytes_as_bytes():
    import os
    name = os.fsdecode(b"trace-\xff\x1b.parquet")
    assert printable(name) == "trace-\\xff\\x1b.parquet"
    printable(name).encode("utf-8")  # no lone surrogate left to crash an echo


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["nope"], ["analyze"], ["analyze", "--bogus", "x"],
                                  ["record", "--pid", "notanumber", "-o", "x"],
                                  ["compare", "--seed", "x", "a", "b"]])
def test_usage_errors_are_one_line(args):
    line = assert_one_error_line(run(args))
    assert "--help" in line


def test_error_naming_a_hostile_path_is_printable(tmp_path):
    line = assert_one_error_line(run(["analyze", tmp_path / NASTY]))
    assert "\\x1b]52;" in line


# --- labels and metadata from a trace reach the terminal made printable ---------------------

def relabeled(src, dst, label, **meta):
    """A real sample trace with another label (and metadata): what a colleague might hand over."""
    import dataclasses

    from ckptrace.core.trace import read_trace, write_trace
    t = read_trace(src)
    write_trace(dst, t.events, dataclasses.replace(t.meta, label=label, **meta))
    return dst


SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"


@pytest.fixture(scope="module")
def nasty_legs(tmp_path_factory):
    d = tmp_path_factory.mktemp("nasty")
    return [relabeled(SAMPLES / "1-pool-off.parquet", d / "1.parquet", NASTY, command=[NASTY]),
            relabeled(SAMPLES / "2-pool-on.parquet", d / "2.parquet", "on" + NASTY),
            relabeled(SAMPLES / "3-pool-off.parquet", d / "3.parquet", NASTY)]


@pytest.mark.parametrize("how", [["analyze"], ["analyze", "--all"], ["analyze", "--json"],
                                 ["compare"], ["compare", "--json"]])
def test_no_escape_byte_from_a_trace_reaches_the_terminal(nasty_legs, how):
    legs = nasty_legs[:1] if how[0] == "analyze" else nasty_legs
    r = run([*how, *legs])
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert ESC not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    assert "verdict: faster" not in [ln.strip() for ln in out.splitlines()]  # no forged line
    if "--json" not in how:
        assert "\\x1b]52;" in r.stdout  # shown, visibly


@pytest.fixture(scope="module")
def nasty_limit(tmp_path_factory):
    """A sample pool-off trace whose process ran under a cgroup memory limit named with escapes and
    a forged line (a cgroup's path is any name its creator chose), small enough for the warning."""
    from ckptrace.core.meta import ProcessInfo, ProcessMemory
    from ckptrace.core.trace import read_meta

    meta = read_meta(SAMPLES / "1-pool-off.parquet")
    memory = ProcessMemory(rss_bytes=200 << 20, rss_peak_bytes=200 << 20, cgroup=NASTY, cgroup_version=2,
                           limit_bytes=256 << 20, limit_from=f"memory.max of /{NASTY}")
    return relabeled(SAMPLES / "1-pool-off.parquet", tmp_path_factory.mktemp("limit") / "1.parquet", NASTY,
                     host_memory_bytes=16 << 30, processes=[ProcessInfo(pid=meta.pid, label=NASTY, memory=memory)])


@pytest.mark.parametrize("how", [["whatif"], ["whatif", "--json"], ["analyze"], ["analyze", "--json"]])
def test_a_cgroup_limit_s_name_reaches_the_terminal_printable(nasty_limit, how):
    """The cgroup memory limit warning quotes where the limit came from: from the trace, so escaped."""
    r = run([*how, nasty_limit])
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "cgroup memory limit" in r.stderr and "ckptrace: warning:" in r.stderr, r.stderr
    assert ESC not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    assert not [ln for ln in out.splitlines() if ln.strip().startswith("verdict: faster")]  # no forged line


# --- writing: only what was asked, never through someone else's symlink ----------------------

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (as ckptrace runs in production)")


def listing(*folders) -> dict:
    """Every entry under the folders with its type, mode, owner, size and mtime: before == after."""
    out = {}
    for folder in folders:
        for p in [Path(folder), *Path(folder).rglob("*")]:
            st = p.lstat()
            out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns,
                           os.readlink(p) if p.is_symlink() else None)
    return out


def devices() -> dict:
    return {p: (os.stat(p).st_mode, os.stat(p).st_rdev) for p in ("/dev/null", "/dev/full")}


@pytest.fixture()
def victim():
    """A root-only file, and a folder of user nobody with nobody's symlinks to it at the names
    root will be asked to write (`checkpoints.csv`, `r.html`, `t.parquet`)."""
    top = Path(tempfile.mkdtemp(prefix="ckptrace-hostile-"))  # pytest's tmp_path is root-only
    top.chmod(0o755)
    secret = top / "root-only"
    secret.write_text("root's data\n")
    secret.chmod(0o600)
    theirs = top / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    for name in ("checkpoints.csv", "r.html", "t.parquet"):
        subprocess.run([*AS_NOBODY, "ln", "-s", str(secret), str(theirs / name)], check=True)
    yield secret, theirs
    shutil.rmtree(top)


@ROOT
@pytest.mark.parametrize("args", [
    ["analyze", SAMPLES / "1-pool-off.parquet", "--csv", "{theirs}"],
    ["dashboard", SAMPLES / "1-pool-off.parquet", "-o", "{theirs}/r.html"],
    ["export", SAMPLES / "1-pool-off.parquet", "-o", "{theirs}/r.html"],
    ["record", "-o", "{theirs}/t.parquet", "--", "/bin/true"],
])
def test_root_never_writes_through_a_symlink_another_user_planted(victim, args):
    secret, theirs = victim
    before = listing(secret.parent)
    line = assert_one_error_line(run([str(a).format(theirs=theirs) for a in args]))
    assert "symlink" in line and "refusing" in line
    assert listing(secret.parent) == before
    assert secret.read_text() == "root's data\n"


# User nobody's watcher: every new name in FOLDER becomes a symlink to VICTIM at once, for a bounded
# time (until STOP appears); it prints each name it saw. /usr/bin/python3: nobody can run it.
SWAPPER = """
import os, sys, time
folder, victim, stop = sys.argv[1:]
before, seen, end = set(os.listdir(folder)), [], time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < end:
    for name in set(os.listdir(folder)) - before - set(seen) - {".swap"}:
        seen.append(name)
        try:
            os.symlink(victim, os.path.join(folder, ".swap"))
            os.rename(os.path.join(folder, ".swap"), os.path.join(folder, name))
        except OSError:
            pass
print("\\n".join(seen))
"""


@pytest.mark.ebpf
def test_root_writes_bcc_chatter_through_no_name_in_a_tmpdir_another_user_owns(require_root_ebpf, workload,
                                                                                  victim, tmp_path):
    """Issue 22, case 1: libbcc's chatter went to a NamedTemporaryFile that root opened again by
    name, so with TMPDIR in another user's folder a watcher swapping that name for a symlink made
    root truncate a root-only file (4 of 8 tries). Now it has no name at all (an anonymous file
    read back through its descriptor): nobody's watcher, racing through doctor's compile and
    load checks and a whole recording (a probe attached per point), finds no name of ours to swap
    (a NamedTemporaryFile's was ckptrace-bcc-*.log, there for the whole compile)."""
    secret, theirs = victim
    stop = secret.parent / "stop"  # where nobody can see it (pytest's tmp_path is root-only)
    watcher = subprocess.Popen([*AS_NOBODY, "/usr/bin/python3", "-c", SWAPPER, theirs, secret, stop],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        env = {"TMPDIR": str(theirs)}
        doctor = run(["doctor"], env=env, timeout=300)
        rec = run(["record", "--quiet", "-o", tmp_path / "t.parquet", "--", workload, "--iterations", "3",
                   "--ckpt-mib", "36"], env=env, timeout=300)
    finally:
        stop.touch()
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert rec.returncode == 0 and "Traceback" not in rec.stderr, rec.stderr
    # None of ours ever had a name there. (Python's tempfile, finding its folder, makes and
    # unlinks one probe file, opened O_EXCL|O_NOFOLLOW: a swap of that name changes nothing.)
    assert [name for name in out.split() if name.startswith("ckptrace") or name.endswith(".log")] == []
    assert secret.read_text() == "root's data\n"


@ROOT
@pytest.mark.parametrize("what", ["dashboard", "csv"])
def test_dev_null_is_written_into_not_replaced(tmp_path, what):
    before = devices()
    args = (["dashboard", SAMPLES / "1-pool-off.parquet", "-o", "/dev/null"] if what == "dashboard"
            else ["analyze", SAMPLES / "1-pool-off.parquet", "--csv", tmp_path])
    r = run(args)
    assert r.returncode == 0, r.stderr
    assert devices() == before


@ROOT
def test_dev_full_is_one_line_and_stays_a_device(tmp_path):
    before = devices()
    line = assert_one_error_line(run(["dashboard", SAMPLES / "1-pool-off.parquet", "-o", "/dev/full"]))
    assert "No space left on device" in line
    assert devices() == before


@ROOT
@pytest.mark.parametrize("node", [("block", stat.S_IFBLK, os.makedev(7, 200)),   # a loop device
                                  ("random", stat.S_IFCHR, os.makedev(1, 8))])    # harmless if written
def test_other_special_files_are_refused(tmp_path, node):
    name, kind, dev = node
    path = tmp_path / f"{name}.html"
    os.mknod(path, 0o644 | kind, dev)
    before = listing(tmp_path)
    line = assert_one_error_line(run(["dashboard", SAMPLES / "1-pool-off.parquet", "-o", path]))
    assert "device" in line and "choose a file path" in line
    assert listing(tmp_path) == before


def test_a_fifo_and_stdout_are_written_into(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    with open(tmp_path / "read", "wb") as sink:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=sink)
        r = run(["dashboard", SAMPLES / "1-pool-off.parquet", "-o", fifo])
        reader.wait(timeout=60)
    html = (tmp_path / "read").read_bytes()
    assert r.returncode == 0, r.stderr
    assert html.startswith(b"<!DOCTYPE html>") and html.rstrip().endswith(b"</html>")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    r = subprocess.run([*CLI, "dashboard", SAMPLES / "1-pool-off.parquet", "-o", "/dev/stdout"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout == html


def test_a_file_being_written_has_no_name_and_is_private(tmp_path):
    """O_TMPFILE: while written the new file is in no folder (a writer killed then leaves nothing;
    test_stream kills a recorder there), then it is named and renamed over the target."""
    from ckptrace.core.output import write_output
    seen = []

    def writer(f):
        seen.append(([p.name for p in tmp_path.iterdir() if p.name != "out.bin"],
                     stat.S_IMODE(os.fstat(f.fileno()).st_mode), os.readlink(f"/proc/self/fd/{f.fileno()}")))
        f.write(b"data")

    for _ in range(2):
        write_output(tmp_path / "out.bin", writer)
    assert [(names, mode) for names, mode, _ in seen] == [([], 0o600), ([], 0o600)]  # no name; private
    assert all(link.endswith(" (deleted)") for _, _, link in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]  # nothing left behind
    assert (tmp_path / "out.bin").read_bytes() == b"data"
    assert stat.S_IMODE((tmp_path / "out.bin").stat().st_mode) == 0o666 & ~_umask()


def test_without_o_tmpfile_temp_files_are_exclusive_private_and_unpredictable(tmp_path, monkeypatch):
    """A filesystem without O_TMPFILE (opening the folder for writing then fails, EISDIR as old
    kernels answer): a named temp file, created exclusively, private, unpredictable."""
    from ckptrace.core.output import write_output
    monkeypatch.setattr(os, "O_TMPFILE", os.O_DIRECTORY)  # the flag without its tmpfile bit: EISDIR
    seen = []

    def writer(f):
        st = os.fstat(f.fileno())
        names = [p for p in tmp_path.iterdir() if p.name != "out.bin"]
        seen.append((names[0].name, stat.S_IMODE(st.st_mode), names[0].is_symlink()))
        f.write(b"data")

    for _ in range(2):
        write_output(tmp_path / "out.bin", writer)
    assert [mode for _, mode, _ in seen] == [0o600, 0o600]  # private while written
    assert not any(link for _, _, link in seen)
    assert seen[0][0] != seen[1][0] and str(os.getpid()) not in seen[0][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]  # nothing left behind
    assert stat.S_IMODE((tmp_path / "out.bin").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@ROOT
def test_full_disk_for_the_report_leaves_nothing_behind(tmp_path):
    """A 64 KiB tmpfs as the output folder, in a private mount namespace (nothing leaks)."""
    script = ("mount -t tmpfs -o size=64k ckptrace-full \"$1\" && shift && "
              "\"$@\"; rc=$?; ls -A \"$OUT\"; exit $rc")
    out = tmp_path / "full"
    out.mkdir()
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(out),
                        *CLI, "dashboard", str(SAMPLES / "1-pool-off.parquet"), "-o", str(out / "r.html")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "OUT": str(out)})
    assert r.returncode == 1 and r.stdout == "", r.stdout  # `ls -A` of the full folder: empty
    line = assert_one_error_line(r)
    assert "No space left on device" in line


# --- recording (real BPF, the sample workload) ------------------------------------------------

# The checkout (venv, CLI) stays visible where a full folder would cover it (a CI clone in /tmp):
# it is bound to /mnt first, then back at its own path inside the covering tmpfs.
FULL = ("[ -n \"$KEEP\" ] && { mount --bind \"$KEEP\" /mnt || exit 98; }; "
        "for d in \"$@\"; do [ \"$d\" = -- ] && break; mount -t tmpfs -o size=16k ckptrace-full \"$d\" "
        "|| exit 99; case \"$KEEP\" in \"$d\"/*) mkdir -p \"$KEEP\" && mount --bind /mnt \"$KEEP\" || exit 97;; esac; "
        "done; while [ \"$1\" != -- ]; do shift; done; shift; \"$@\"; rc=$?; ")
REPO = Path(__file__).resolve().parents[1]


def kept_in(folder) -> str:
    """What `ls -A folder` shows of the checkout kept visible inside it ('' when it is elsewhere)."""
    try:
        return REPO.relative_to(folder).parts[0]
    except ValueError:
        return ""


# 9 s of iterations, 0.3 s apart: each flush's batch takes over 1 KiB, so the stream outgrows a
# 16 KiB folder (its header fits) and the disk fills while streaming.
STREAM_FILLS = ["--iterations", "30", "--ckpt-mib", "8", "--gap-us", "300000"]


def record_on_full_disks(folders, workload, out, tmpdir, workload_args=None):
    """`record` in a private mount namespace where each of `folders` is a full 16 KiB tmpfs;
    prints what each folder holds afterwards (on stdout, one `ls -A` per folder)."""
    script = FULL + "for d in $FOLDERS; do echo \"$d: $(ls -A \"$d\")\"; done; exit $rc"
    keep = str(REPO) if any(kept_in(f) for f in folders) else ""
    with tempfile.TemporaryDirectory(dir="/run", prefix="ckptrace-test-") as away:
        # a workload cached under a folder the full tmpfs covers (CKPTRACE_CACHE=/tmp/...) is run
        # from a copy the mounts leave visible
        if any(Path(workload).is_relative_to(f) for f in folders):  # with its libraries beside it
            workload = Path(shutil.copytree(Path(workload).parent, Path(away) / "w", symlinks=True)) / Path(workload).name
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                               *map(str, folders), "--", *CLI, "record", "--quiet", "-o", str(out), "--",
                               str(workload), *(workload_args or ["--iterations", "3"])],
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ, "TMPDIR": str(tmpdir), "FOLDERS": " ".join(map(str, folders)),
                                   "KEEP": keep})


@pytest.mark.ebpf
def test_full_output_folder_and_tmpdir_rescue_the_recording_elsewhere(require_root_ebpf, workload, tmp_path):
    out_dir, tmpdir = tmp_path / "out", tmp_path / "tmpdir"
    out_dir.mkdir(), tmpdir.mkdir()
    r = record_on_full_disks([out_dir, tmpdir], workload, out_dir / "t.parquet", tmpdir, STREAM_FILLS)
    line = assert_one_error_line(r, after_recording=True)
    # The stream at -o filled its disk: recording stops, the stream stays (readable, cut short:
    # the folder is gone with its namespace) and the whole recording goes where there is room.
    assert "No space left on device; recording stopped" in line and "the whole recording (" in line
    assert "as a cut-short trace" in line
    assert r.stdout.splitlines() == [f"{out_dir}: t.parquet", f"{tmpdir}: "]  # no temp file left behind
    rescued = Path(line.split("saved to ")[1].split(";")[0])
    try:
        from ckptrace.core.trace import read_trace
        t = read_trace(rescued)
        n = int(line.split("the whole recording (")[1].split(" events")[0])
        assert len(t.events) == n and (t.events["kind"] == "checkpoint").sum() >= 1
        assert t.meta.complete and t.meta.stop_reason == "disk full"
        assert stat.S_IMODE(rescued.stat().st_mode) == 0o666 & ~_umask()
    finally:
        rescued.unlink()


@pytest.mark.ebpf
def test_nowhere_to_write_says_the_recording_is_lost(require_root_ebpf, workload):
    everywhere = ["/tmp", "/dev/shm", "/var/tmp"]  # the output and TMPDIR are in /tmp
    r = record_on_full_disks(everywhere, workload, "/tmp/t.parquet", "/tmp", STREAM_FILLS)
    line = assert_one_error_line(r, after_recording=True)
    assert "are lost: no copy could be saved" in line and line.count("No space left on device") == 4
    assert "/tmp/t.parquet holds the " in line  # the stream, cut short where the disk filled
    expected = []
    for d in everywhere:
        names = sorted(n for n in (kept_in(d), "t.parquet" if d == "/tmp" else "") if n)
        expected += [f"{d}: {names[0] if names else ''}", *names[1:]]
    assert r.stdout.splitlines() == expected


@pytest.mark.ebpf
@pytest.mark.parametrize("target", ["/dev/null", "/dev/stdout"])
def test_record_into_dev_null_or_stdout(require_root_ebpf, workload, target):
    before = devices()
    r = subprocess.run([*CLI, "record", "--quiet", "-o", target, "--", str(workload), "--iterations", "3"],
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert devices() == before
    if target == "/dev/stdout":
        import io
        import pyarrow.parquet as pq
        assert pq.read_table(io.BytesIO(r.stdout)).num_rows > 0


# --- targets: a true line for every PID that is not a traceable process ----------------------

def test_kernel_thread_zombie_and_missing_pid_get_true_lines():
    line = assert_one_error_line(run(["symbols", "--pid", "2"]))
    assert line == ("ckptrace: error: PID 2 (kthreadd) is a kernel thread: it runs no user code to probe; "
                    "give the PID of a llama-server")
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert "has exited (a zombie" in assert_one_error_line(run(["symbols", "--pid", zombie.pid]))
    finally:
        zombie.wait()
    assert assert_one_error_line(run(["symbols", "--pid", zombie.pid])).endswith(f"no process with PID {zombie.pid}")


def test_a_thread_id_names_its_process():
    code = ("import threading, time, sys; e = threading.Event(); "
            "threading.Thread(target=lambda: (print(threading.get_native_id(), flush=True), e.wait())).start(); "
            "sys.stdin.read(); e.set()")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        tid = int(p.stdout.readline())
        r = run(["symbols", "--pid", tid, "--json"])
        name = Path(f"/proc/{p.pid}/comm").read_text().strip()
        p.stdin.close()
    assert r.stderr.splitlines()[0] == (f"ckptrace: note: {tid} is a thread of PID {p.pid} ({name}); "
                                        f"using its process, {p.pid}")
    assert f"not found in PID {p.pid}'s objects (" in r.stderr  # resolved in the process


@pytest.mark.ebpf
def test_record_given_a_thread_id_records_its_process(require_root_ebpf, workload, tmp_path):
    from ckptrace.core.trace import read_trace
    from helpers import go, proc_status, wait_until, waiting_workload

    with waiting_workload(workload, "--noise-threads", "1", "--iterations", "100000") as wl:
        go(wl)
        # the noise thread has started (/proc/PID/status's Threads: its task/ entries; {} once reaped)
        wait_until(lambda: int(proc_status(wl.pid).get("Threads", 0)) >= 2, "the workload's noise thread",
                   timeout_s=30, every_s=0.01, watch=wl)
        tid = max(int(t) for t in os.listdir(f"/proc/{wl.pid}/task"))
        r = run(["record", "--quiet", "--pid", tid, "--duration", "2", "-o", tmp_path / "t.parquet"])
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"ckptrace: note: {tid} is a thread of PID {wl.pid} ")
    trace = read_trace(tmp_path / "t.parquet")
    assert trace.meta.pid == wl.pid
    assert (trace.events["kind"] == "checkpoint").sum() > 0  # the main thread's, via its process


# --- reading: only regular files, the schema checked before any arithmetic, memory bounded ------

def hostile_trace(path, columns: dict | None = None, meta_raw: bytes | None = None, rows=None):
    """The sample trace with some columns replaced (any Arrow type) or its metadata bytes replaced."""
    import pyarrow.parquet as pq

    table = pq.read_table(SAMPLES / "1-pool-off.parquet")
    if rows is not None:
        table = table.slice(0, rows)
    for name, values in (columns or {}).items():
        values = values if isinstance(values, pa.Array) else pa.array(values)
        table = table.set_column(table.schema.get_field_index(name), name, values)
    md = dict(table.schema.metadata)
    if meta_raw is not None:
        md[b"ckptrace"] = meta_raw
    pq.write_table(table.replace_schema_metadata(md), path)
    return path


def sample_meta() -> dict:
    import json
    import pyarrow.parquet as pq

    return json.loads(pq.read_schema(SAMPLES / "1-pool-off.parquet").metadata[b"ckptrace"])


def column_of(name: str, fill):
    import pyarrow.parquet as pq

    n = pq.read_metadata(SAMPLES / "1-pool-off.parquet").num_rows
    return [fill(i) for i in range(n)]


def sample_rows() -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(SAMPLES / "1-pool-off.parquet").num_rows


N_ROWS = sample_rows()
COLUMN_CASES = {
    "bools as strings": ({"draft": column_of("draft", lambda i: "False")}, "column draft holds string"),
    "float 1e30": ({"start_ns": column_of("start_ns", lambda i: 1e30)}, "column start_ns holds double"),
    "uint64 past int64": ({"bytes": pa.array([1 << 63] * N_ROWS, pa.uint64())},
                          "column bytes holds 9223372036854775808, outside"),
    "negative time": ({"start_ns": [-5] * N_ROWS}, "column start_ns holds -5, outside"),
    "nulls": ({"faults": [None] + [0] * (N_ROWS - 1)}, "column faults has 1 missing values"),
    "kind as ints": ({"kind": [1] * N_ROWS}, "column kind holds int64, not text"),
}


@pytest.mark.parametrize("case", COLUMN_CASES, ids=list(COLUMN_CASES))
def test_wrong_column_types_and_ranges_are_one_line(tmp_path, case):
    from ckptrace.core.errors import TraceFormatError
    from ckptrace.core.trace import read_trace

    columns, needle = COLUMN_CASES[case]
    path = hostile_trace(tmp_path / "h.parquet", columns)
    with pytest.raises(TraceFormatError, match="^" + re.escape(f"{path}: {needle}")):
        read_trace(path)


def test_reversed_spans_and_parts_outside_their_checkpoint_are_refused(tmp_path):
    import pyarrow.parquet as pq

    from ckptrace.core.errors import TraceFormatError
    from ckptrace.core.trace import read_trace

    t = pq.read_table(SAMPLES / "1-pool-off.parquet").to_pandas()
    kinds = t["kind"].astype(str).tolist()
    ck = kinds.index("checkpoint")
    end = t["end_ns"].tolist()
    end[ck] = int(t["start_ns"].iat[ck]) - 1
    with pytest.raises(TraceFormatError, match=r"1 events end before they start \(first: row \d+, checkpoint"):
        read_trace(hostile_trace(tmp_path / "a.parquet", {"end_ns": end}))
    fill = kinds.index("fill")
    start = t["start_ns"].tolist()
    start[fill] = int(t.loc[(t["kind"] == "checkpoint") & (t["ckpt"] == t["ckpt"].iat[fill]), "start_ns"].iat[0]) - 1
    with pytest.raises(TraceFormatError, match=r"a fill of checkpoint \d+ lies outside its checkpoint"):
        read_trace(hostile_trace(tmp_path / "b.parquet", {"start_ns": start}))
    ids = t["ckpt"].tolist()
    second = kinds.index("checkpoint", ck + 1)
    ids[second] = ids[ck]
    with pytest.raises(TraceFormatError, match=r"checkpoint id \d+ appears 2 times"):
        read_trace(hostile_trace(tmp_path / "c.parquet", {"ckpt": ids}))


META_CASES = {
    "not an object": b"[1, 2]",
    "label a list": {"label": ["a"]},
    "pid a string": {"pid": "1"},
    "pid a bool": {"pid": True},
    "huge int": {"attach_ns": 10 ** 30},
    "int past 2^62": {"lost_events": (1 << 62) + 1},
    "objects an object": {"objects": {"path": "x"}},
    "probe without fields": {"probes": [{"point": "update_tgt"}]},
    "command of ints": {"command": [1, 2]},
    "open_at_stop a number": {"open_at_stop": 3},
    "NaN": b'{"format": "ckptrace-trace", "version": 1, "lost_events": NaN}',
    "deeply nested": b'{"format": "ckptrace-trace", "version": 1, "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "version a string": {"version": "1"},
    "not JSON": b"\xff\xfe{",
    # sizes the analysis divides by or subtracts from (a cgroup limit of 0 was a ZeroDivisionError)
    "cgroup limit 0": {"host_memory_bytes": 1 << 34,
                       "processes": [{"pid": 1, "memory": {"limit_bytes": 0, "limit_from": "memory.max of /"}}]},
    "host memory negative": {"host_memory_bytes": -1},
    "rss negative": {"processes": [{"pid": 1, "memory": {"rss_peak_bytes": -5}}]},
    "gpu count negative": {"gpu": {"ranges_full": -1}},
}


@pytest.mark.parametrize("case", META_CASES, ids=list(META_CASES))
def test_hostile_metadata_of_any_shape_is_one_line(tmp_path, case):
    import json

    shape = META_CASES[case]
    raw = shape if isinstance(shape, bytes) else json.dumps({**sample_meta(), **shape}).encode()
    path = hostile_trace(tmp_path / "m.parquet", meta_raw=raw)
    line = assert_one_error_line(run(["analyze", path]))
    assert line.startswith(f"ckptrace: error: {path}: ")


@pytest.mark.parametrize("what", ["analyze", "dashboard"])
def test_out_of_range_metadata_is_refused_before_arithmetic(tmp_path, what):
    import json

    raw = json.dumps({**sample_meta(), "attach_ns": (1 << 63) - 1, "stop_ns": -(1 << 63)}).encode()
    path = hostile_trace(tmp_path / "m.parquet", meta_raw=raw)
    args = ["analyze", path] if what == "analyze" else ["dashboard", path, "-o", tmp_path / "r.html"]
    assert "outside -2^62..2^62" in assert_one_error_line(run(args))
    assert not (tmp_path / "r.html").exists()


def test_a_small_file_claiming_millions_of_rows_is_refused_before_it_is_read(tmp_path):
    """40 row groups of 100k identical rows compress to a few hundred KiB and claim ~1 GiB."""
    import pyarrow.parquet as pq

    one = pq.read_table(SAMPLES / "1-pool-off.parquet").slice(0, 1)
    block = pa.concat_tables([one] * 100_000).combine_chunks()
    path = tmp_path / "bomb.parquet"
    with pq.ParquetWriter(path, block.schema, compression="zstd") as w:
        for _ in range(40):
            w.write_table(block)
    assert path.stat().st_size < 1 << 20
    # A fresh parent, so RUSAGE_CHILDREN's peak is this one command's.
    measure = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(p.returncode)")
    r = subprocess.run([sys.executable, "-c", measure, *CLI, "analyze", str(path)], capture_output=True,
                       text=True, timeout=120)
    peak_kib = int(r.stderr.splitlines()[-1])
    r.stderr = "\n".join(r.stderr.splitlines()[:-1])
    line = assert_one_error_line(r)
    assert "4000000 events would take about" in line and "a damaged or hostile trace?" in line
    assert peak_kib < 400 << 10  # the CLI's own imports (about 150 MiB here), not 4M rows


def test_a_file_above_the_floor_expanding_past_the_bound_is_refused(tmp_path):
    """A file of a few MiB, so the bound is EXPANSION times its size, not the 256 MiB floor: 3M rows
    whose one varying column pads it to about 1.4 MiB would expand about 650x, past the bound."""
    import pyarrow.parquet as pq

    from ckptrace.core.validate import EXPANSION, MIN_BUDGET

    one = pq.read_table(SAMPLES / "1-pool-off.parquet").slice(0, 1)
    block = pa.concat_tables([one] * 100_000).combine_chunks()
    rng = np.random.default_rng(5)
    path = tmp_path / "big-bomb.parquet"
    with pq.ParquetWriter(path, block.schema, compression="zstd") as w:
        for _ in range(30):
            addr = np.zeros(len(block), "uint64")
            addr[::25] = rng.integers(1, 1 << 62, size=len(addr[::25]), dtype="uint64")
            w.write_table(block.set_column(block.schema.get_field_index("addr"), "addr", pa.array(addr)))
    size = path.stat().st_size
    assert EXPANSION * size > MIN_BUDGET  # the bound is the file's, not the floor
    line = assert_one_error_line(run(["analyze", path], timeout=60))
    assert "3000000 events would take about" in line and f"({EXPANSION}x the file" in line


@pytest.mark.parametrize("node", ["fifo", "/dev/zero", "dir"])
def test_only_regular_files_are_read(tmp_path, node):
    path = {"fifo": tmp_path / "t.parquet", "/dev/zero": Path("/dev/zero"), "dir": tmp_path}[node]
    if node == "fifo":
        os.mkfifo(path)  # nobody writes: opening it for reading would block forever
    line = assert_one_error_line(run(["analyze", path], timeout=60))
    assert ("is a directory" if node == "dir" else "not a regular file") in line


# --- drive: only the server given, a hard time bound, garbage counted as failures ---------------

class RawServer:
    """A server on 127.0.0.1 answering /health with 200 and /completion with `reply(sock)`,
    byte by byte as a hostile or broken server would; counts the /completion requests."""

    def __init__(self, reply):
        self.reply, self.completions = reply, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            if head.startswith(b"GET /health"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                return
            # The whole body before replying: closing with a request byte unread sends a reset, and
            # the client then sees "connection reset", not the reply under test (http.client sends
            # the body in a second write, which Nagle can hold back past the reply).
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            body = len(head) - head.index(b"\r\n\r\n") - 4
            while length and body < int(length.group(1)):
                data = conn.recv(4096)
                if not data:
                    return
                body += len(data)
            self.completions += 1
            try:
                self.reply(conn)
            except OSError:
                pass  # the client hung up

    def close(self):
        self.sock.close()


def sse(*chunks: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            + b"".join(chunks))


def trickle(conn):
    conn.sendall(sse(b'data: {"content": "x'))
    while True:  # one byte at a time, never a whole line: a per-read timeout never fires
        time.sleep(0.2)
        conn.sendall(b"x")


GARBAGE = {
    "not HTTP": (lambda c: c.sendall(b"hello, this is not HTTP\r\n\r\n"), "error: BadStatusLine"),
    "not an event stream": (lambda c: c.sendall(sse(b"<html>hi</html>\n")), "bad response: not an event stream"),
    "bad JSON": (lambda c: c.sendall(sse(b"data: {nope\n\n")), "bad response: a data line is not JSON"),
    "empty 200": (lambda c: c.sendall(sse()), "bad response: an empty response"),
    "no stop chunk": (lambda c: c.sendall(sse(b'data: {"content": "a"}\n\n')),
                      "bad response: the stream ended before its stop chunk"),
    "HTTP 500": (lambda c: c.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
                 "bad response: HTTP 500"),
    "escapes in an error": (lambda c: c.sendall(sse(b'data: {"error": "\\u001b]52;c;aGk=\\u0007"}\n\n')),
                            "bad response: server error"),
    # issue 39: each was a traceback (a thread's RecursionError, int64 overflow) or unbounded memory
    "nested 200k deep": (lambda c: c.sendall(sse(b"data: " + b"[" * 200_000 + b"]" * 200_000 + b"\n\n")),
                         "bad response: a data line is nested too deep"),
    "10^100 tokens": (lambda c: c.sendall(sse(b'data: {"content": "a", "stop": true, "tokens_evaluated": 1'
                                              + b"0" * 100 + b"}\n\n")),
                      "bad response: tokens_evaluated is not a count"),
    "2^63 tokens": (lambda c: c.sendall(sse(b'data: {"content": "a", "stop": true, "tokens_predicted": '
                                            + str(1 << 63).encode() + b"}\n\n")),
                    "bad response: tokens_predicted is not a count"),
    "a line without end": (lambda c: endless_line(c, 64 << 20), "bad response: a line longer than 1 MiB"),
}


def endless_line(conn, total: int):
    """One line of `total` bytes, sent as fast as the client reads (bounded, so a client that reads
    it whole ends too)."""
    conn.sendall(sse(b'data: {"content": "'))
    block = b"x" * (1 << 20)
    for _ in range(total >> 20):
        conn.sendall(block)


@pytest.mark.parametrize("case", GARBAGE, ids=list(GARBAGE))
def test_drive_counts_malformed_responses_as_failures(case):
    reply, reason = GARBAGE[case]
    srv = RawServer(reply)
    try:
        r = run(["drive", srv.url, "--clients", "2", "--requests", "3", "--timeout", "60"])
    finally:
        srv.close()
    line = assert_one_error_line_after(r)
    assert line.startswith(f"ckptrace: error: 3 of 3 requests to {srv.url} did not complete (first: {reason}")
    rows = r.stdout.splitlines()
    assert rows[-1].startswith("0 of 3 requests ok, 3 sent;")
    assert all(reason in row for row in rows[1:-1]), r.stdout


def test_drive_reads_a_line_without_end_in_bounded_memory():
    """A server sending one line of 512 MiB: read whole, it took drive to 3.1 GB (a 3 GB line)."""
    from helpers import ckptrace_peak

    srv = RawServer(lambda c: endless_line(c, 512 << 20))
    try:
        r, peak_kib = ckptrace_peak("drive", srv.url, "--requests", "2", "--timeout", "120")
    finally:
        srv.close()
    assert "(first: bad response: a line longer than 1 MiB" in assert_one_error_line_after(r)
    assert peak_kib < 300 << 10


def test_drive_to_a_closed_port_says_so_long_before_its_timeout():
    """Nothing listens: a refused connection is an answer; --timeout 600 is not waited out (the
    run's own bound, 120 s, would stop the test first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once this block ends: nothing listens there
    line = assert_one_error_line(run(["drive", f"http://127.0.0.1:{port}", "--timeout", "600"], timeout=120))
    assert f"nothing listens at http://127.0.0.1:{port}" in line


def test_drive_follows_no_redirect():
    elsewhere = RawServer(lambda c: c.sendall(sse(b'data: {"content": "a", "stop": true}\n\n')))
    srv = RawServer(lambda c: c.sendall(
        f"HTTP/1.1 302 Found\r\nLocation: {elsewhere.url}/completion\r\nContent-Length: 0\r\n\r\n".encode()))
    try:
        r = run(["drive", srv.url, "--requests", "2", "--timeout", "60"])
    finally:
        srv.close(), elsewhere.close()
    assert "HTTP 302 redirect to" in assert_one_error_line_after(r)
    assert srv.completions == 2 and elsewhere.completions == 0


@pytest.mark.parametrize("bound", ["--timeout", "--request-timeout"])
def test_drive_timeout_is_a_hard_bound_on_a_trickling_server(bound):
    srv = RawServer(trickle)
    try:
        args = ["--timeout", "2"] if bound == "--timeout" else ["--timeout", "120", "--request-timeout", "1"]
        r = run(["drive", srv.url, "--clients", "2", "--requests", "2", *args], timeout=60)
    finally:
        srv.close()
    assert "(first: timeout)" in assert_one_error_line_after(r)
    assert r.stdout.splitlines()[-1].startswith("0 of 2 requests ok, 2 sent;")


def test_drive_all_ok_exits_zero():
    srv = RawServer(lambda c: c.sendall(sse(b'data: {"content": "a"}\n\n',
                                            b'data: {"content": "", "stop": true, "tokens_evaluated": 9}\n\n')))
    try:
        r = run(["drive", srv.url, "--requests", "3", "--timeout", "60"])
    finally:
        srv.close()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[-1].startswith("3 of 3 requests ok, 3 sent;")


def assert_one_error_line_after(r):
    """drive prints its table on stdout, then one error line on stderr; no escape byte anywhere."""
    assert ESC not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptrace: error: "), r.stderr
    return lines[0]


@ROOT
@pytest.mark.parametrize("where", ["theirs", "/tmp"])
def test_demo_refuses_a_folder_someone_else_can_write_in(victim, where):
    """The workload and the servers write there too (truth, logs): no one else may plant links."""
    secret, theirs = victim
    folder = theirs if where == "theirs" else Path("/tmp")
    before = listing(secret.parent)
    line = assert_one_error_line(run(["demo", "--out", folder]))
    assert ("a folder of uid 65534" if where == "theirs" else "a folder others can write to") in line
    assert listing(secret.parent) == before
