"""Facts about the running kernel that recording needs, each checked by a real call, never assumed."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from ckptrace.core.errors import CkptraceError, EbpfUnavailable, NotPermitted

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

SETUP = "bash scripts/setup.sh install"
BTF_PATH = Path("/sys/kernel/btf/vmlinux")
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe/type")
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

# Every tracepoint the recorder attaches to (probes/*.bpf.c); doctor checks each one.
TRACEPOINTS = (
    ("exceptions", "page_fault_user"),
    ("kmem", "rss_stat"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
    ("syscalls", "sys_enter_mmap"),
    ("syscalls", "sys_exit_mmap"),
    ("syscalls", "sys_enter_munmap"),
    ("syscalls", "sys_enter_mremap"),
    ("syscalls", "sys_exit_mremap"),
)
# Attached as raw tracepoints (RAW_TRACEPOINT_PROBE): no argument copy on the per-fault path.
RAW_TRACEPOINTS = ("page_fault_user", "rss_stat")
FAULT_TRACEPOINT = ("exceptions", "page_fault_user")  # x86's only: --fault-sample's (probes/arch.py)

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
_BPF_MAP_CREATE = 0
_BPF_MAP_TYPE_ARRAY = 2


def error_with_fix(cls: type[CkptraceError], what: str, fix: str) -> CkptraceError:
    """An error whose message is 'what: fix', keeping both parts for doctor's lines."""
    e = cls(f"{what}: {fix}")
    e.what, e.fix = what, fix
    return e


def effective_caps() -> int:
    """This process's effective capability mask (CapEff in /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def privileges() -> str:
    """Describe why this process may record, or raise NotPermitted.

    Capabilities decide, not the uid: root with its capabilities dropped can't load BPF. CAP_BPF
    plus CAP_PERFMON load the programs, but attaching a uprobe to one process (perf_event_open
    with a pid) was refused with EACCES here (Linux 6.18) without CAP_SYS_ADMIN, also with
    CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH added; CAP_SYS_ADMIN alone recorded.
    """
    caps = effective_caps()
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    if caps >> CAP_SYS_ADMIN & 1:
        return f"{who} with CAP_SYS_ADMIN"
    if os.geteuid() == 0:
        raise error_with_fix(NotPermitted, "recording needs CAP_SYS_ADMIN (CAP_BPF and CAP_PERFMON alone can't "
                             "attach uprobes to a process), and this root process has had it dropped",
                             "run it as root with full capabilities (plain sudo)")
    raise error_with_fix(NotPermitted, "recording needs root (CAP_SYS_ADMIN, and tracefs readable)", "run with sudo")


OPEN_FILES_HEADROOM = 256  # descriptors besides the uprobes': the program's maps, the trace, /proc files


def open_files_for(uprobes: int, what: str) -> None:
    """Make room for `uprobes` more perf events, one descriptor each (64 processes of 20 uprobes
    take 1,280; a shell's default soft limit is often 1,024): the soft limit on open files is
    raised to the hard one, and EbpfUnavailable (one line) says so when even that is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 0
    if used + uprobes + OPEN_FILES_HEADROOM > soft:
        raise EbpfUnavailable(f"{what} takes {uprobes} uprobes, one open file each, and this process may open "
                              f"{soft} (ulimit -n; {used} open now): raise the limit (ulimit -Hn, or LimitNOFILE= "
                              "for a service) or trace fewer processes")


def require_privileges() -> None:
    """Raise NotPermitted unless this process may load BPF programs and attach probes, and
    EbpfUnavailable when it can't name its targets as the kernel's probes do (pid_namespace)."""
    privileges()
    pid_namespace()


PROC_PID_INIT_INO = 0xEFFFFFFC  # the host's (initial) PID namespace's inode number, a kernel constant (proc_ns.h)


def pid_namespace() -> str:
    """Describe this process's PID namespace, or raise EbpfUnavailable when it is not the host's.

    The probes key their targets by bpf_get_current_pid_tgid(), the PID in the host's (initial)
    namespace, and the recorder knows a target by the PID it sees. In a child namespace (a
    container, a sidecar sharing a pod's PIDs) the two differ and a recording would attach and
    record nothing: measured here, 0 events of a workload's 2 checkpoints. Told by the
    namespace's inode, not /proc/self/status's NSpid: a container's own /proc lists its PIDs alone."""
    try:
        ino = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return "unknown (no /proc/self/ns/pid)"
    if ino != PROC_PID_INIT_INO:
        raise error_with_fix(
            EbpfUnavailable, f"ckptrace runs in a child PID namespace (pid:[{ino}]), and the kernel's probes name "
            "processes by their PIDs in the host's",
            "run it in the host's PID namespace (on the host, docker run --pid=host, a Kubernetes pod with "
            "hostPID: true): docs/containers.md")
    return f"the host's (pid:[{ino}])"


def bpf_syscall() -> None:
    """Create and close a one-entry BPF array map with bpf(2): the smallest real use of the call."""
    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        raise error_with_fix(EbpfUnavailable, f"bpf() syscall number unknown on {platform.machine()}",
                     "use an x86_64 or aarch64 machine")
    # union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries; rest zero.
    attr = (ctypes.c_uint32 * 16)(_BPF_MAP_TYPE_ARRAY, 4, 8, 1)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_int(_BPF_MAP_CREATE), ctypes.byref(attr),
                      ctypes.c_uint(ctypes.sizeof(attr)))
    if fd >= 0:
        os.close(fd)
        return
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.EACCES):
        raise error_with_fix(NotPermitted, f"bpf(BPF_MAP_CREATE) failed: {os.strerror(err)}",
                     "run with sudo (root)")
    if err == errno.ENOSYS:
        raise error_with_fix(EbpfUnavailable, "the kernel has no bpf() syscall",
                     "boot a kernel built with CONFIG_BPF_SYSCALL=y")
    raise error_with_fix(EbpfUnavailable, f"bpf(BPF_MAP_CREATE) failed: {os.strerror(err)}",
                 "check the kernel's BPF support (CONFIG_BPF_SYSCALL) and memlock limits")


def _mounted(fstype: str) -> list[str]:
    """Mount points of one filesystem type, from /proc/self/mounts."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == fstype:
            points.append(fields[1])
    return points


def tracefs_dir() -> Path:
    """The tracefs folder that has events/ (bcc and our format lookups read it)."""
    denied = None
    for d in TRACEFS_DIRS:
        try:
            if (d / "events").is_dir():
                return d
        except PermissionError:
            denied = d
    if denied is not None or any(Path(p) in TRACEFS_DIRS for p in _mounted("tracefs")):
        d = denied or TRACEFS_DIRS[0]
        raise error_with_fix(NotPermitted, f"tracefs at {d} is mounted but not readable by uid {os.geteuid()}",
                     "run with sudo")
    raise error_with_fix(EbpfUnavailable, "tracefs is not mounted",
                 f"mount -t tracefs nodev {TRACEFS_DIRS[0]} (or {SETUP})")


def tracepoint_exists(category: str, event: str) -> bool:
    """Whether tracefs lists the tracepoint category:event (raises if tracefs is unusable)."""
    return (tracefs_dir() / "events" / category / event).is_dir()


def uprobes_supported() -> bool:
    """Whether the kernel offers uprobes: the uprobe PMU (what bcc uses) or tracefs uprobe_events."""
    if UPROBE_PMU.exists():
        return True
    with contextlib.suppress(CkptraceError, OSError):
        return (tracefs_dir() / "uprobe_events").exists()
    return False


def import_bcc():
    """The bcc module, or EbpfUnavailable saying how to make it importable from this Python."""
    try:
        import bcc
    except (ImportError, OSError):  # OSError: the module is there but libbcc.so is not
        raise error_with_fix(EbpfUnavailable, f"bcc is not importable from {sys.executable}",
                     "install python3-bpfcc and use a venv made with --system-site-packages "
                     f"({SETUP})") from None
    return bcc


def bcc_version() -> str:
    """The version of the bcc this Python imports."""
    return getattr(import_bcc(), "__version__", "unknown")


def kernel_headers_dir() -> Path:
    """Where bcc will look for kernel headers: BCC_KERNEL_SOURCE if set, else the module build dir."""
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        d = Path(env)
        if not (d / "include").is_dir():
            raise error_with_fix(EbpfUnavailable, f"kernel headers not found at {d} (from BCC_KERNEL_SOURCE)",
                         f"unset BCC_KERNEL_SOURCE and run {SETUP} (links the closest Debian "
                         "linux-headers)")
        return d
    d = Path("/lib/modules") / os.uname().release / "build"
    if not (d / "include").is_dir():
        raise error_with_fix(EbpfUnavailable, f"kernel headers not found at {d}",
                     f"run {SETUP} (links the closest Debian linux-headers)")
    return d


@functools.cache
def btf_types() -> dict[int, dict]:
    """The running kernel's BTF types by id, from `bpftool -j btf dump` (JSON, not its text)."""
    if not BTF_PATH.exists():
        raise error_with_fix(EbpfUnavailable, f"the kernel exposes no BTF at {BTF_PATH}",
                     "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    try:
        out = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(BTF_PATH), "format", "raw"],
                             capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise error_with_fix(EbpfUnavailable, "bpftool is missing (it reads task_struct offsets from BTF)",
                     "apt-get install bpftool") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no output"])[0]
        raise error_with_fix(EbpfUnavailable, f"bpftool could not dump {BTF_PATH}: {first}",
                     "apt-get install --reinstall bpftool")
    try:
        types = json.loads(out.stdout)["types"]
        return {int(t["id"]): t for t in types}
    except (ValueError, KeyError, TypeError):
        raise error_with_fix(EbpfUnavailable, f"bpftool's JSON dump of {BTF_PATH} is not what ckptrace "
                     "reads", "apt-get install --reinstall bpftool") from None


_MODIFIERS = {"TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"}


def _resolve(types: dict[int, dict], type_id: int) -> dict:
    """Follow typedef/const/volatile to the underlying type."""
    t = types[type_id]
    while t["kind"] in _MODIFIERS:
        t = types[t["type_id"]]
    return t


def _find_member(types: dict[int, dict], struct: dict, name: str, base_bits: int = 0):
    """(bits_offset, bitfield_size, type) of a member, searching anonymous structs and unions."""
    for m in struct.get("members", ()):
        if m["name"] == name:
            return base_bits + m["bits_offset"], m.get("bitfield_size", 0), _resolve(types, m["type_id"])
        if m["name"] == "(anon)":
            inner = _resolve(types, m["type_id"])
            if inner["kind"] in ("STRUCT", "UNION"):
                found = _find_member(types, inner, name, base_bits + m["bits_offset"])
                if found:
                    return found
    return None


def _struct(name: str) -> dict | None:
    for t in btf_types().values():
        if t["kind"] == "STRUCT" and t["name"] == name:
            return t
    return None


def _u64_offset(path: str) -> int | str:
    """Byte offset of the 8-byte field or pointer `struct.member[.member...]`, or why there is none."""
    name, *parts = path.split(".")
    types, t, bits = btf_types(), _struct(name), 0
    if t is None:
        return f"no struct {name} in this kernel's BTF"
    for part in parts:
        found = _find_member(types, t, part) if t["kind"] in ("STRUCT", "UNION") else None
        if found is None:
            return f"{path} is not in this kernel's BTF"
        more, bitfield, t = found
        bits += more
        if bitfield:
            return f"{path} is a bitfield in this kernel's BTF"
    # The recorder reads these as u64: refuse anything else rather than misread.
    if bits % 8 or (t["kind"] != "PTR" and t.get("size") != 8):
        return f"{path} is not an 8-byte field in this kernel's BTF"
    return bits // 8


# Field -> path. Fault counters are what getrusage(RUSAGE_THREAD) reports; the scheduler fields
# are what CLOCK_THREAD_CPUTIME_ID and /proc/PID/task/TID/schedstat report, and the thread's rq
# clocks relate se.exec_start to the time of the read (see checkpoint.bpf.c sched_read).
FAULT_FIELDS = {"min_flt": "task_struct.min_flt", "maj_flt": "task_struct.maj_flt"}
SCHED_FIELDS = {"sum_exec_runtime": "task_struct.se.sum_exec_runtime",
                "exec_start": "task_struct.se.exec_start", "run_delay": "task_struct.sched_info.run_delay",
                "nvcsw": "task_struct.nvcsw", "nivcsw": "task_struct.nivcsw",
                "se_cfs_rq": "task_struct.se.cfs_rq", "cfs_rq_rq": "cfs_rq.rq",
                "rq_clock": "rq.clock", "rq_clock_task": "rq.clock_task"}


@functools.cache
def task_struct_offsets() -> dict[str, int]:
    """Byte offsets of min_flt and maj_flt in the running kernel's task_struct, from its BTF.

    Never from the kernel headers: those may be another kernel version's (docs/kernel-facts.md).
    """
    offsets = {}
    for field, path in FAULT_FIELDS.items():
        off = _u64_offset(path)
        if isinstance(off, str):
            raise error_with_fix(EbpfUnavailable, off, "report this kernel version to ckptrace")
        offsets[field] = off
    return offsets


@functools.cache
def sched_offsets() -> tuple[dict[str, int] | None, str]:
    """Offsets of the thread's scheduler counters, or (None, one line saying why they are absent).

    Optional: without them recording still works and the CPU/wait columns are 'not recorded'.
    """
    offsets = {}
    for field, path in SCHED_FIELDS.items():
        off = _u64_offset(path)
        if isinstance(off, str):
            return None, f"{off}: on-CPU time, run-queue wait and switches are not recorded"
        offsets[field] = off
    return offsets, ("the thread's task_struct se.sum_exec_runtime (plus the part not yet accounted, "
                     "since se.exec_start), sched_info.run_delay, nvcsw and nivcsw, read at span "
                     "entry and return")


@functools.cache
def rss_counters() -> tuple[int, int, int] | str:
    """Where the mm's resident page counters are: (task_struct.mm, the byte offset of the first
    counter's value in mm_struct, the stride between counters), or why they can't be read.

    6.2 and later: `struct percpu_counter rss_stat[NR_MM_COUNTERS]`, each read at its `count`
    (what /proc/PID/statm shows: the per-CPU deltas not yet folded in are left out, as there);
    before: `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`.
    """
    mm = _u64_offset("task_struct.mm")
    if isinstance(mm, str):
        return mm
    types, t = btf_types(), _struct("mm_struct")
    found = _find_member(types, t, "rss_stat") if t else None
    if found is None:
        return "mm_struct.rss_stat is not in this kernel's BTF"
    bits, _, rss = found
    if rss["kind"] == "STRUCT":  # mm_rss_stat: one array of 8-byte atomics
        inner = _find_member(types, rss, "count")
        if inner is None or inner[2]["kind"] != "ARRAY":
            return "mm_struct.rss_stat has no count array in this kernel's BTF"
        bits, rss = bits + inner[0], inner[2]
        elem, stride, value_bits = _resolve(types, rss["type_id"]), 8, 0
    elif rss["kind"] == "ARRAY":
        elem = _resolve(types, rss["type_id"])
        value = _find_member(types, elem, "count") if elem["kind"] == "STRUCT" else None
        if value is None or value[2].get("size") != 8:
            return "mm_struct.rss_stat's counters have no 8-byte count in this kernel's BTF"
        stride, value_bits = elem["size"], value[0]
    else:
        return "mm_struct.rss_stat is neither an array nor mm_rss_stat in this kernel's BTF"
    if rss.get("nr_elems", 0) < 4 or elem.get("size", 0) > stride or (bits + value_bits) % 8:
        return "mm_struct.rss_stat is not four counters in this kernel's BTF"
    return mm, (bits + value_bits) // 8, stride


def btf_cflags() -> tuple[list[str], bool, str]:
    """The -D flags probes/checkpoint.bpf.c takes from the running kernel's BTF (fault counter
    and scheduler field offsets), whether the scheduler counters are recorded, and why not."""
    offsets = task_struct_offsets()
    sched, note = sched_offsets()
    flags = [f"-DMIN_FLT_OFF={int(offsets['min_flt'])}", f"-DMAJ_FLT_OFF={int(offsets['maj_flt'])}",
             f"-DSCHED_COUNTERS={int(sched is not None)}"]
    flags += [f"-D{name.upper()}_OFF={int(off)}" for name, off in (sched or {}).items()]
    rss = rss_counters()  # without them RSS is recorded only per fault (record --rss-per-fault)
    if not isinstance(rss, str):
        flags += [f"-DTASK_MM_OFF={rss[0]}", f"-DMM_RSS_OFF={rss[1]}", f"-DMM_RSS_STRIDE={rss[2]}",
                  f"-DRSS_PAGE_SHIFT={resource.getpagesize().bit_length() - 1}"]
    return flags, sched is not None, note


def _libc_fflush() -> None:
    """fflush(NULL): every C stdio stream of this process written out now."""
    ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output():
    """Send fds 1 and 2 to an anonymous file while the block runs (libbcc and clang print
    diagnostics there, some to stdout); yields a list that holds the text once the block is done.

    The file never has a name (O_TMPFILE, or unlinked at once where the filesystem lacks it)
    and is read back through its descriptor: with a TMPDIR another user can write, there is no
    name for them to swap for a link that root would then write through."""
    sys.stdout.flush()
    sys.stderr.flush()
    text: list[str] = []
    with tempfile.TemporaryFile("w+b", prefix="ckptrace-bcc-") as log:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield text
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # libbcc prints with C stdio: its stdout is block-buffered when not a terminal, and what
            # sat in that buffer would reach the real stdout at exit, after the fds are restored
            _libc_fflush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            log.seek(0)
            text.append(log.read().decode(errors="replace"))


def _first_error_line(log: str, exc: BaseException) -> str:
    # bcc runs `modprobe kheaders` first; its "not found" is noise, not the error.
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and "modprobe" not in ln]
    for pattern in (r"error:", r"Unable to|cannot|failed|Failed"):
        for ln in lines:
            if re.search(pattern, ln):
                # libbcc's headers message goes on about CONFIG_IKHEADERS: its first sentence says it
                return ln.split(". ")[0] if len(ln) > 100 else ln
    return lines[0] if lines else str(exc)


# LLVM's C API (llvm-c/ErrorHandling.h): void (*LLVMFatalErrorHandler)(const char *reason)
_LLVM_FATAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def _exit_on_fatal_compile_error(reason: bytes | None, terminal: int) -> None:
    """LLVM's fatal error handler while bcc compiles. LLVM aborts the process when a handler
    returns, and its stderr is captured_output's file, so without this the user saw nothing.
    Here the captured output is kept in a new file (mkstemp: a fresh name, never through a
    link), one line says so on the real stderr, and the process exits 1."""
    why = (reason or b"").decode(errors="replace").strip() or "no reason given"
    try:
        os.write(2, f"LLVM ERROR: {why}\n".encode())  # where LLVM would have written it: the log
        os.lseek(2, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(2, 1 << 16):
            chunks.append(chunk)
        fd, path = tempfile.mkstemp(prefix="ckptrace-bpf-compile-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            log.write(b"".join(chunks))
        where = f"its output is in {path}"
    except OSError as e:
        where = f"its output could not be kept ({e.strerror})"
    from ckptrace.core.terminal import printable  # the reason is LLVM's text; the path TMPDIR's

    line = (f"ckptrace: error: the BPF program's compile failed: LLVM stopped on a fatal error "
            f"({why}); {where}")
    try:
        os.write(terminal, (printable(line) + "\n").encode(errors="replace"))
    finally:
        os._exit(EbpfUnavailable.exit_code)  # a return here is LLVM's abort()


@contextlib.contextmanager
def fatal_compile_errors_reported(bcc, terminal: int):
    """While the block runs, an LLVM fatal error exits with one line on fd `terminal`
    (_exit_on_fatal_compile_error) instead of aborting silently; LLVM's default after."""
    try:
        install, reset = bcc.lib.LLVMInstallFatalErrorHandler, bcc.lib.LLVMResetFatalErrorHandler
    except AttributeError:  # an LLVM linked without its C API: its own abort, as before
        yield
        return
    handler = _LLVM_FATAL_HANDLER(lambda reason: _exit_on_fatal_compile_error(reason, terminal))
    install.argtypes, install.restype = [_LLVM_FATAL_HANDLER], None
    reset.argtypes, reset.restype = [], None
    install(handler)
    try:
        yield
    finally:
        reset()


def load_bpf(**bpf_kwargs):
    """bcc.BPF(**bpf_kwargs) with libbcc's stderr chatter captured and failures as one-line errors.

    EPERM becomes NotPermitted; a compile error becomes EbpfUnavailable with clang's first
    error line; a fatal error inside LLVM exits the process with one line
    (fatal_compile_errors_reported).
    """
    bcc = import_bcc()
    if isinstance(bpf_kwargs.get("text"), str):  # bcc wants bytes and warns otherwise
        bpf_kwargs["text"] = bpf_kwargs["text"].encode()
    failure = None
    sys.stderr.flush()
    terminal = os.dup(2)  # the real stderr, for the fatal error's line while fd 2 is captured
    try:
        with captured_output() as out, fatal_compile_errors_reported(bcc, terminal):
            try:
                return bcc.BPF(**bpf_kwargs)
            except Exception as e:  # bcc raises bare Exception for compile and load failures
                failure = e
    finally:
        os.close(terminal)
    raise bpf_failure(out[0], failure)


def bpf_failure(text: str, failure: BaseException) -> CkptraceError:
    """The one-line error for a failed bcc compile or load, from libbcc's captured output."""
    line = _first_error_line(text, failure)
    if "Operation not permitted" in text + str(failure) or "super-user" in str(failure):
        return error_with_fix(NotPermitted, f"the kernel refused to load a BPF program ({line})",
                              "run with sudo (root)")
    if "kernel headers" in line:
        return error_with_fix(EbpfUnavailable, f"bcc could not compile: {line}", f"run {SETUP}")
    return error_with_fix(EbpfUnavailable, f"bcc could not compile or load a program: {line}",
                          f"run {SETUP}, then ckptrace doctor")


TRIVIAL = "int ckptrace_trivial(void *ctx) { return 0; }\n"


def compile_trivial() -> None:
    """bcc compiles a trivial program and the kernel verifies and loads it (not attached)."""
    b = load_bpf(text=TRIVIAL)
    try:
        failure = None
        with captured_output() as out:
            try:
                b.load_func(b"ckptrace_trivial", type(b).RAW_TRACEPOINT)
            except Exception as e:
                failure = e
        if failure is not None:
            line = _first_error_line(out[0], failure)
            if "permitted" in line or "super-user" in str(failure):
                raise error_with_fix(NotPermitted, f"the kernel refused a trivial program ({line})",
                                     "run with sudo (root)")
            raise error_with_fix(EbpfUnavailable, f"the kernel rejected a trivial program: {line}",
                                 "check the kernel's BPF support (CONFIG_BPF_SYSCALL)")
    finally:
        b.cleanup()


def attach_raw_tracepoints(names: tuple[str, ...] = RAW_TRACEPOINTS) -> None:
    """Compile, load and attach an empty RAW_TRACEPOINT_PROBE on each name, then detach."""
    for name in names:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):  # only our own fixed names become C
            raise ValueError(f"not a tracepoint name: {name!r}")
    text = "".join(f"RAW_TRACEPOINT_PROBE({n}) {{ return 0; }}\n" for n in names)
    load_bpf(text=text).cleanup()
