"""What else the machine was doing while a leg was recorded: the recorder's machine-state guard.

A leg's wall times, and the on-CPU time of memory-bound work (a zero fill, a copy), move with
the machine's other tasks, not only with the code. llama.cpp PR #201 kept every arm inside one
capped window and checked each against a thermal-guard log; on a shared host the counterpart is
this record: read from /proc and /sys (no BPF, no root needed) when the probes are in, about
once a second while recording, and at the stop, and kept per leg in the trace's `machine`
metadata (core/meta.py MachineState). `compare` then says whether the legs ran in one state
(analyzers/machine_state.py).

Figures (each None where this machine does not have the source):
- other tasks' CPU (cores): every CPU's busy time (/proc/stat: user, nice, system, irq, softirq,
  steal excluded) less the targets' own (/proc/PID/stat utime + stime, and a launched target's
  once reaped: getrusage(RUSAGE_CHILDREN)) and the recorder's (getrusage(RUSAGE_SELF)); mean
  over the leg, and the lowest and highest of its windows of about one second;
- steal: the hypervisor's share of all CPU time (/proc/stat);
- PSI (/proc/pressure/cpu, memory): the share of the time some task waited for a CPU, and some
  or all tasks stalled on memory;
- CPU frequency (cpufreq's scaling_cur_freq, else /proc/cpuinfo's "cpu MHz"): lowest and highest
  of the per-sample means; thermal throttle events (/sys/.../thermal_throttle) over the leg.
"""
from __future__ import annotations

import glob
import os
import resource
import time
from dataclasses import dataclass

from ckptrace.core.meta import MachineState

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
WINDOW_S = 1.0  # the shortest window the lowest/highest other-tasks figure is taken over
BUSY = (0, 1, 2, 5, 6)  # /proc/stat cpu fields: user, nice, system, irq, softirq (guest is in user)
IDLE, IOWAIT, STEAL = 3, 4, 7


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_jiffies() -> list[int] | None:
    text = _read("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    return [int(x) for x in text.split("\n", 1)[0].split()[1:9]]


def _psi(resource_name: str) -> dict[str, int] | None:
    """{"some": total us, "full": total us} of /proc/pressure/NAME."""
    text = _read(f"/proc/pressure/{resource_name}")
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        for f in fields:
            if f.startswith("total="):
                out[kind] = int(f[6:])
    return out


def _pid_ticks(pid: int) -> int | None:
    """utime + stime of a process (all its threads, the ones gone too), in clock ticks."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _cpu_mhz() -> float | None:
    """The CPUs' mean current frequency: cpufreq where the machine has it, else /proc/cpuinfo."""
    khz = [int(t) for p in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")
           if (t := (_read(p) or "").strip()).isdigit()]
    if khz:
        return sum(khz) / len(khz) / 1000
    text = _read("/proc/cpuinfo") or ""
    mhz = [float(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    return sum(mhz) / len(mhz) if mhz else None


def _throttles() -> int | None:
    counts = [int(t) for p in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle/*_throttle_count")
              if (t := (_read(p) or "").strip()).isdigit()]
    return sum(counts) if counts else None


def _rusage_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@dataclass
class _Sample:
    t: float  # time.monotonic()
    jiffies: list[int] | None
    target_s: float  # the targets' CPU seconds so far (live ones read, reaped children's added)
    own_s: float
    psi_cpu: dict | None
    psi_memory: dict | None
    mhz: float | None
    throttles: int | None


class MachineSampler:
    """Samples the machine at start(), at each sample() at least WINDOW_S apart, and at stop()."""

    def __init__(self, pids: list[int], child: int | None = None):
        self.pids = list(pids)
        self.child = child  # a launched target: once reaped, its CPU time is in RUSAGE_CHILDREN
        self.last_ticks: dict[int, int] = {}  # a target's last reading, kept once it is gone
        self.samples: list[_Sample] = []
        self.cpus = os.cpu_count() or 1

    def _take(self) -> _Sample:
        for pid in self.pids:
            ticks = _pid_ticks(pid)
            if ticks is not None:
                self.last_ticks[pid] = ticks
            elif pid == self.child:
                self.last_ticks.pop(pid, None)  # reaped: counted in RUSAGE_CHILDREN from now on
        return _Sample(time.monotonic(), _cpu_jiffies(), sum(self.last_ticks.values()) * TICK_S
                       + _rusage_s(resource.RUSAGE_CHILDREN), _rusage_s(resource.RUSAGE_SELF),
                       _psi("cpu"), _psi("memory"), _cpu_mhz(), _throttles())

    def start(self) -> None:
        self.samples = [self._take()]

    def sample(self) -> None:
        if self.samples and time.monotonic() - self.samples[-1].t >= WINDOW_S:
            self.samples.append(self._take())

    def stop(self) -> MachineState:
        if not self.samples:
            return MachineState(note="not recorded: no sample taken")
        last = self._take()
        if last.t - self.samples[-1].t < WINDOW_S / 2 and len(self.samples) > 1:
            self.samples[-1] = last  # a window too short to say anything of its own: merge it
        else:
            self.samples.append(last)
        return summarize(self.samples, self.cpus)


def _others_cores(a: _Sample, b: _Sample) -> float | None:
    if a.jiffies is None or b.jiffies is None or b.t <= a.t:
        return None
    busy = sum(b.jiffies[i] - a.jiffies[i] for i in BUSY) * TICK_S
    return max(0.0, busy - (b.target_s - a.target_s) - (b.own_s - a.own_s)) / (b.t - a.t)


def _share(a: dict | None, b: dict | None, kind: str, seconds: float) -> float | None:
    if a is None or b is None or kind not in a or kind not in b or seconds <= 0:
        return None
    return min(1.0, max(0.0, (b[kind] - a[kind]) / 1e6 / seconds))


def summarize(samples: list[_Sample], cpus: int) -> MachineState:
    first, last = samples[0], samples[-1]
    seconds = last.t - first.t
    windows = [x for x in (_others_cores(a, b) for a, b in zip(samples, samples[1:])) if x is not None]
    steal = None
    if first.jiffies is not None and last.jiffies is not None:
        total = sum(last.jiffies) - sum(first.jiffies)
        steal = (last.jiffies[STEAL] - first.jiffies[STEAL]) / total if total > 0 else None
    mhz = [s.mhz for s in samples if s.mhz is not None]
    missing = [what for what, v in (("/proc/stat", first.jiffies), ("PSI", first.psi_cpu), ("CPU frequency", mhz or None),
                                    ("thermal throttle counters", first.throttles)) if v is None]
    return MachineState(
        recorded=True, interval_s=round(seconds, 3), cpus=cpus, windows=len(windows),
        others_cores=_others_cores(first, last), others_cores_min=min(windows) if windows else None,
        others_cores_max=max(windows) if windows else None,
        target_cores=(last.target_s - first.target_s) / seconds if seconds > 0 else None,
        steal_share=steal,
        psi_cpu_some=_share(first.psi_cpu, last.psi_cpu, "some", seconds),
        psi_memory_some=_share(first.psi_memory, last.psi_memory, "some", seconds),
        psi_memory_full=_share(first.psi_memory, last.psi_memory, "full", seconds),
        cpu_mhz_min=min(mhz) if mhz else None, cpu_mhz_max=max(mhz) if mhz else None,
        throttle_events=(last.throttles - first.throttles) if first.throttles is not None
        and last.throttles is not None else None,
        note="; ".join(f"{m} not available on this machine" for m in missing))
