"""The processes a recording follows: a pid, a list of pids, every process of a name (`--comm`)
or a launched command, each resolved to its probe plan and start time (`Target`); `Targets`
notes who exited while the others are recorded."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckptrace.core.errors import TargetError
from ckptrace.core.meta import ProcessInfo, ProcessMemory
from ckptrace.core.terminal import printable
from ckptrace.probes.launch import HeldChild
from ckptrace.probes.loader import MAX_TARGETS, untrace_process
from ckptrace.probes.messages import note, say, to_stderr
from ckptrace.probes.process_memory import read_process_memory
from ckptrace.probes.target import alive, comm_of, process_of, processes_named, start_time

if TYPE_CHECKING:
    from ckptrace.probes.record_session import RecordOptions

COMM_POLL_S = 0.5  # --comm: how often to look for a process of that name while none runs


@dataclass
class Target:
    """One traced process: its probe plan (processes may be different builds) and its label."""
    pid: int
    label: str
    comm: str
    plan: object  # symbols.ProbePlan
    ended_ns: int | None = None  # CLOCK_MONOTONIC when it was seen gone
    start: int | None = None  # target.start_time: with pid, this process and not a later one with its pid
    memory: ProcessMemory | None = None  # its RSS and cgroup limit as last read while it ran

    def read_memory(self) -> None:
        """Read its RSS and cgroup memory limit again, if it is still this process."""
        mem = read_process_memory(self.pid)
        if mem is not None and self.alive():
            self.memory = mem

    @property
    def build_id(self) -> str | None:
        return next((o.build_id for o in self.plan.objects if o.path == self.plan.target), None)

    def alive(self) -> bool:
        """Still running, and still this process (its pid was not given to another)."""
        return alive(self.pid, self.start)

    def info(self) -> ProcessInfo:
        return ProcessInfo(pid=self.pid, label=self.label, comm=self.comm, executable=self.plan.target,
                           build_id=self.build_id, exited_ns=self.ended_ns, profile=self.plan.profile.name,
                           start_ticks=self.start, memory=self.memory)


class Targets(list):
    """The processes of a recording; a process that exits ends its part, the others go on."""

    def __init__(self, items, bpf=None):
        super().__init__(items)
        self.bpf = bpf

    def any_alive(self) -> bool:
        for t in self:
            if t.ended_ns is None and not t.alive():
                t.ended_ns = time.monotonic_ns()
                if self.bpf is not None:  # its pid may be reused: stop matching it
                    untrace_process(self.bpf, t.pid)
                if any(o.ended_ns is None for o in self):
                    say(f"ckptrace: PID {t.pid} ({printable(t.comm)}) exited; recording the others")
        return any(t.ended_ns is None for t in self)


def resolve_process(pid: int, label: str | None = None) -> Target:
    """Public API (record and serve): a running process as a Target, its probe points resolved in
    the objects it has mapped and its start time taken (label None: its comm). TargetError (one
    line) when it can't be traced, including a process that exits meanwhile: a vanishing
    /proc/PID file never escapes as a plain OSError."""
    from ckptrace.probes import symbols

    start = start_time(pid)
    try:
        plan = symbols.resolve_pid(pid, note=note)
    except OSError as e:
        raise _gone_or(pid, f"PID {pid}: cannot read its mappings ({e.strerror or e})") from None
    name = comm_of(pid)
    if start is None or not alive(pid, start):
        raise _gone_or(pid, "")
    return Target(pid, name if label is None else label, name, plan, start=start)


def _gone_or(pid: int, why: str) -> TargetError:
    return TargetError(why if why and alive(pid) else f"PID {pid} exited while its probes were being resolved")


def resolve_targets(pid, command: list[str] | None, comm: str | None, opts: RecordOptions):
    """Public API (record): the processes to record, as (held child or None, Targets). `pid` is
    an int or a list of ints or (pid, label) pairs; `comm` takes every process of that name running
    now (waiting while there is none; later ones are not added); `command` is launched, held
    before its exec until the probes are in."""
    from ckptrace.probes import symbols

    if command:
        child = HeldChild(command)
        try:
            plan = symbols.resolve_binary(child.path, note=note)
        except BaseException:
            child.abandon()
            raise
        name = Path(child.path).name[:15]
        return child, Targets([Target(child.pid, f"{name}#1", name, plan, start=start_time(child.pid))])
    wanted = _wait_for_comm(comm, opts) if comm else [pid] if isinstance(pid, int) else list(pid)
    chosen: dict[int, str | None] = {}
    for item in wanted:
        p, label = item if isinstance(item, tuple) else (item, None)
        p, said = process_of(p)  # a thread id names its process
        if said:
            say(f"ckptrace: note: {said}")
        if p not in chosen or label:
            chosen[p] = label
    if len(chosen) > MAX_TARGETS:
        raise TargetError(f"{len(chosen)} processes: one recording follows at most {MAX_TARGETS}")
    targets, seen = [], {}
    for p, label in chosen.items():
        name = comm_of(p)
        seen[name] = seen.get(name, 0) + 1
        if label is None:  # its name and rank: the same process label in every leg (compare --per-process)
            label = f"{name}#{seen[name]}"
        try:
            targets.append(resolve_process(p, label))
        except TargetError:
            if len(chosen) == 1 or alive(p):
                raise
            say(f"ckptrace: note: PID {p} exited while its probes were being resolved; recording the others")
    if not targets:
        raise TargetError("every process exited while its probes were being resolved: nothing recorded")
    return None, Targets(targets)


def _wait_for_comm(comm: str, opts: RecordOptions) -> list[int]:
    """The pids of every process named `comm`; while there is none, wait (a status line), say so
    after the hint time, and give up at --duration."""
    if not comm or "/" in comm or len(comm.encode()) > 255:
        raise TargetError(f"--comm takes a process name (as in /proc/PID/comm), got {printable(comm)!r}")
    t0 = time.monotonic()
    hinted = drawn = False
    while True:
        found = processes_named(comm)
        if found:
            if drawn:
                to_stderr("\r" + " " * 79 + "\r")
            return found
        waited = time.monotonic() - t0
        if opts.duration_s and waited >= opts.duration_s:
            raise TargetError(f"no process named {printable(comm)!r} appeared in {opts.duration_s:g} s: "
                              "nothing recorded")
        if opts.status and sys.stderr.isatty():
            to_stderr("\r" + f"{waited:7.1f} s  waiting for a process named {printable(comm)}"[:79].ljust(79))
            drawn = True
        if not hinted and waited >= opts.no_checkpoint_hint_s:
            hinted = True
            if drawn:
                to_stderr("\r" + " " * 79 + "\r")
            say(f"ckptrace: no process named {printable(comm)!r} in {opts.no_checkpoint_hint_s:g} s "
                "(names are the kernel's comm, at most 15 characters: see `ps -o comm`); still waiting, "
                "Ctrl-C to stop")
        time.sleep(COMM_POLL_S)
