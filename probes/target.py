"""Which process a `--pid` names, said truly: alive, a user process, a whole thread group.

The probes filter on the thread group id (the process); a thread id would match nothing and
record nothing in silence, so it is resolved to its process with a note. Kernel threads run no
user code to probe. Read from /proc/PID/stat and /proc/PID/status, which anyone may read.
"""
from __future__ import annotations

import os

from ckptrace.core.errors import NotPermitted, TargetError
from ckptrace.core.terminal import printable

PF_KTHREAD = 0x00200000  # <linux/sched.h>: task->flags of a kernel thread


def process_of(pid: int) -> tuple[int, str | None]:
    """(the process id to trace, a note to print or None); TargetError when it can't be traced."""
    if pid is None or pid <= 0:
        raise TargetError(f"invalid PID {pid}")
    stat = _stat(pid)
    if stat is None:
        raise TargetError(f"no process with PID {pid}")
    comm, state, flags, _ = stat
    if int(flags) & PF_KTHREAD:
        raise TargetError(f"PID {pid} ({printable(comm)}) is a kernel thread: it runs no user code to "
                          "probe; give the PID of a llama-server")
    if state in ("Z", "X"):
        raise TargetError(f"PID {pid} ({printable(comm)}) has exited (a zombie, not yet reaped by its parent)")
    tgid = _tgid(pid)
    if tgid is None:
        raise TargetError(f"no process with PID {pid}")
    if tgid != pid:
        name = (_stat(tgid) or (comm,))[0]
        return tgid, f"{pid} is a thread of PID {tgid} ({printable(name)}); using its process, {tgid}"
    return pid, None


def alive(pid: int, start: int | None = None) -> bool:
    """Whether the process runs; with `start` (start_time's value), whether it is still that
    process and not a later one the pid was given to."""
    stat = _stat(pid)
    return stat is not None and stat[1] not in ("Z", "X") and (start is None or stat[3] == start)


def start_time(pid: int) -> int | None:
    """When the process started (/proc/PID/stat field 22, clock ticks since boot); None when it is
    gone. A pid is reused, (pid, start time) never: it names one process for good."""
    stat = _stat(pid)
    return stat[3] if stat else None


def unreadable(pid: int, what: str) -> NotPermitted:
    """The true message for a /proc/PID file the kernel refuses to show us."""
    if os.geteuid() == 0:
        return NotPermitted(f"cannot read {what}: the kernel refuses it even to root (PID {pid} is more "
                            "privileged than ckptrace here, or a security module forbids it): it can't be "
                            "traced from this process")
    return NotPermitted(f"cannot read {what}: run as root or as the owner of PID {pid}")


def _stat(pid: int) -> tuple[str, str, str, int] | None:
    """(comm, state, flags, start time) from /proc/PID/stat; None when there is no such task."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    comm = text[text.find("(") + 1:text.rfind(")")]  # comm may hold spaces and parentheses
    fields = text[text.rfind(")") + 2:].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return comm, fields[0], fields[6], int(fields[19])  # fields[i] is stat's field i + 3


def _tgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def comm_of(pid: int) -> str:
    """The process's name (/proc/PID/stat's comm, at most 15 bytes); "" when it is gone."""
    stat = _stat(pid)
    return stat[0] if stat else ""


def processes_named(name: str) -> list[int]:
    """Live user processes whose comm is `name` (the kernel keeps 15 bytes of it), by pid."""
    want = name[:15]
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat and stat[0] == want and stat[1] not in ("Z", "X") and not int(stat[2]) & PF_KTHREAD:
            found.append(int(entry.name))
    return sorted(found)


def resident_members(pid: int) -> tuple[int, int, int, int] | None:
    """(file, anon, swap, shmem) bytes of the process from /proc/PID/status (kmem:rss_stat's
    members in its order); None when it can't be read."""
    keys = {"RssFile:": 0, "RssAnon:": 1, "VmSwap:": 2, "RssShmem:": 3}
    out = [0, 0, 0, 0]
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in keys:
                    out[keys[parts[0]]] = int(parts[1]) << 10  # kB
    except (OSError, ValueError, IndexError):
        return None
    return tuple(out)
