"""A trace's metadata: one typed record, stored as JSON beside the events (see trace.py).

Adding a field is one line in TraceMeta, with a default that means "not recorded" so that
older traces still read, plus the line in the recorder (probes/record_meta.py) that fills it.
Reading checks every known field's JSON type, so a reader can use the fields directly;
keys this version does not know (a newer writer's) are kept in `extra` and written back.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from ckptrace.core.errors import TraceFormatError

INT_LIMIT = 1 << 62  # any integer field: sums and differences of a few stay inside int64
# Bounds on what a hostile trace's metadata can make a reader build (20,000 processes once took
# 1 GB and 90 s to analyse): the JSON's length, checked before parsing (trace.py), and every list's
# items. A recording follows at most 64 processes (probes/loader.py MAX_TARGETS); each maps a
# few hundred objects, each with a handful of probe points. A `command` is bounded by JSON_MAX only.
JSON_MAX = 8 << 20
LIST_MAX = 1 << 16
MAX_PROCESSES = 64


@dataclass(frozen=True)
class ObjectInfo:
    """One object mapped into the target: the executable or a shared library."""
    path: str
    build_id: str | None = None


@dataclass(frozen=True)
class ProbeInfo:
    """One resolved probe point: where its uprobe was attached."""
    point: str  # update_tgt, resize_grow, ... (probes/points.py)
    symbol: str  # demangled
    object: str
    vaddr: int
    offset: int  # file offset
    build_id: str | None = None


@dataclass
class OpenSpans:
    """Spans entered but not returned when recording stopped (dropped from the events)."""
    checkpoints: int = field(default=0, metadata={"min": 0})
    iterations: int = field(default=0, metadata={"min": 0})

    @property
    def total(self) -> int:
        return self.checkpoints + self.iterations


@dataclass
class SchedCounters:
    """Whether cpu_ns, wait_ns, nvcsw and nivcsw were recorded, and how or why not (one line)."""
    recorded: bool = False
    note: str = "not recorded"


@dataclass
class FaultTime:
    """How fault_ns was measured (probes/fault_time.py), with the calibration it used."""
    method: str = "none"  # "cpu-minus-resident", or "none"
    definition: str = "not measured"
    resident_ns: dict[str, list[list[int]]] | None = None  # span kind -> [[bytes, ns], ...]
    resident_max_share: float | None = None  # measured only where resident <= this share of cpu_ns
    calibration_s: float | None = None


@dataclass
class ProfileInfo:
    """The llama.cpp generation the target's probe points matched (probes/points.py PROFILES)."""
    name: str = "unknown"  # "llama_decode", "0.3.36", "11434", "ik-0.1.5" or "unknown"
    generation: str = "not matched"  # in words
    matched: list[str] = field(default_factory=list)  # the profile's points found ("fill": any growth)
    missing: list[str] = field(default_factory=list)  # the profile's points not found
    source: dict[str, str] = field(default_factory=dict)  # each point found -> the profile describing it
    nearest: str = ""  # name "unknown": the profile nearest to what was found (its points are probed)


@dataclass
class ProcessMemory:
    """A process's memory and its cgroup's limit, as the recorder last read them while it ran
    (probes/process_memory.py). Each None: not read (e.g. the process had gone)."""
    rss_bytes: int | None = field(default=None, metadata={"min": 0})  # /proc/PID/status VmRSS
    # VmHWM: the most it has held resident since it started
    rss_peak_bytes: int | None = field(default=None, metadata={"min": 0})
    cgroup: str | None = None  # its memory cgroup, as /proc/PID/cgroup names it
    cgroup_version: int | None = None  # 2 (memory.max) or 1 (memory.limit_in_bytes)
    # The smallest memory limit on the way from its cgroup up to the root (a parent's binds a
    # child's too); None: no limit is set.
    limit_bytes: int | None = field(default=None, metadata={"min": 1})  # what shares are taken of
    limit_from: str | None = None  # the file that set it: "memory.max of /path" (cgroup paths)
    read_ns: int | None = None  # CLOCK_MONOTONIC of this reading


@dataclass
class MachineState:
    """What else the machine was doing while the leg was recorded (probes/machine.py). None: not
    available on this machine; `recorded` False (or no `machine` at all): not recorded."""
    recorded: bool = False
    note: str = "not recorded"
    interval_s: float = 0.0
    cpus: int = 0
    windows: int = 0  # windows of about one second behind the lowest and highest figures
    others_cores: float | None = None  # other tasks' CPU time per second, mean over the leg
    others_cores_min: float | None = None
    others_cores_max: float | None = None
    target_cores: float | None = None  # the traced processes' own
    steal_share: float | None = None  # of all CPU time
    psi_cpu_some: float | None = None  # share of the time some task waited for a CPU
    psi_memory_some: float | None = None  # share of the time some task stalled on memory
    psi_memory_full: float | None = None  # ... every task did
    cpu_mhz_min: float | None = None
    cpu_mhz_max: float | None = None
    throttle_events: int | None = None  # thermal throttling over the leg


@dataclass
class ProcessInfo:
    """One recorded process (version 3; a trace of several processes has one per process)."""
    pid: int
    label: str = ""  # how compare groups this process's legs (default: the trace's label)
    comm: str = ""
    executable: str | None = None
    build_id: str | None = None  # the executable's GNU build-id
    profile: str | None = None  # the probe profile its generation matched (probes/points.py)
    exited_ns: int | None = None  # CLOCK_MONOTONIC when the recorder saw it gone (None: ran to the end)
    # /proc/PID/stat starttime (clock ticks after boot): with `pid`, names this process and not a
    # later one the kernel gave the same pid (None: not recorded)
    start_ticks: int | None = None
    memory: ProcessMemory | None = None  # None: not recorded (a trace from before it was)


@dataclass
class GpuInfo:
    """The CUDA copy path as recorded (version 4; only for a recording with a CUDA target)."""
    libraries: list[str] = field(default_factory=list)  # the CUDA runtime/driver libraries probed
    points: list[str] = field(default_factory=list)  # their probe points (probes/cuda.py)
    fault_tracepoints: list[str] = field(default_factory=list)  # where destination faults were counted
    # copy spans whose destination range found no free slot: their faults not counted
    ranges_full: int = field(default=0, metadata={"min": 0})
    # pinned ranges not remembered (too many at once): copies into them count as pageable
    pinned_full: int = field(default=0, metadata={"min": 0})
    # attach mode: memory pinned before the probes were attached is not known to be pinned
    pinned_known_from_start: bool = True


@dataclass
class TraceMeta:
    label: str = ""  # how compare groups legs
    tool_version: str | None = None
    mode: str | None = None  # "launch" or "attach"
    # launch mode: the command line (as long as the kernel let it be: bounded by JSON_MAX alone)
    command: list[str] | None = field(default=None, metadata={"max_items": None})
    pid: int | None = None
    exit_code: int | None = None  # launch mode: the command's exit status
    executable: str | None = None
    objects: list[ObjectInfo] = field(default_factory=list)
    probes: list[ProbeInfo] = field(default_factory=list)
    missing_optional: list[str] = field(default_factory=list)  # optional probe points not found
    kernel: str | None = None  # uname -r
    arch: str | None = None  # uname -m (x86_64, aarch64): the architecture recorded on
    # The kernel's page size in bytes: each fault counted is one page of it (4 KiB on x86-64; 4, 16
    # or 64 KiB on arm64, so fault counts compare only between equal pages). None: not recorded.
    page_size: int | None = field(default=None, metadata={"min": 1})
    host: str | None = None
    # Physical memory, sysconf(_SC_PHYS_PAGES) x page size: what a pool's byte cap of a
    # fraction of host memory reads (llama.cpp PR #201). None: not recorded.
    host_memory_bytes: int | None = field(default=None, metadata={"min": 1})
    clock: str = "CLOCK_MONOTONIC"  # of every *_ns figure
    start_time: str | None = None  # UTC, ISO 8601
    attach_ns: int | None = None  # probes in place
    stop_ns: int | None = None
    first_event_ns: int | None = None
    stop_reason: str | None = None  # interrupted, terminated, duration, target exited
    lost_events: int = field(default=0, metadata={"min": 0})  # ring buffer full
    # returns seen without their entry (attached mid-span): dropped
    partial_spans: int = field(default=0, metadata={"min": 0})
    abandoned_spans: int = field(default=0, metadata={"min": 0})
    open_at_stop: OpenSpans = field(default_factory=OpenSpans)
    attach_retries: int | None = field(default=None, metadata={"min": 0})
    fault_sample_every: int | None = field(default=None, metadata={"min": 0})  # --fault-sample
    fault_slices_timed: int | None = field(default=None, metadata={"min": 0})
    fault_time_definition: str | None = None
    events: int | None = field(default=None, metadata={"min": 0})  # rows in the event table
    sched_counters: SchedCounters | None = None  # None: a version 1 trace
    fault_time: FaultTime | None = None
    # version 3: each traced process (a recording follows at most MAX_PROCESSES)
    processes: list[ProcessInfo] = field(default_factory=list, metadata={"max_items": MAX_PROCESSES})
    # Version 3 (core/stream.py). A finished trace is complete; a stream a killed recorder
    # left is not, and says so in one line.
    complete: bool = True
    cut_short: str | None = None
    # thread events not seen: the kernel's per-thread map was full
    map_full: int = field(default=0, metadata={"min": 0})
    max_threads: int | None = field(default=None, metadata={"min": 0})  # that map's size (--max-threads)
    # threads the map took in, and removed again when they exited
    threads_seen: int | None = field(default=None, metadata={"min": 0})
    threads_pruned: int | None = field(default=None, metadata={"min": 0})
    # most threads in the map at once (sampled at each flush)
    threads_peak: int | None = field(default=None, metadata={"min": 0})
    profile: ProfileInfo | None = None  # version 3: the generation matched; None: not recorded
    # Version 4: the CUDA copy path, for a recording with a CUDA target; None (and no key written):
    # no CUDA library was probed
    gpu: GpuInfo | None = field(default=None, metadata={"omit_none": True})
    machine: MachineState | None = None  # what else the machine was doing; None: not recorded
    # The file's own format stamp as read; write_trace stamps the writer's.
    format: str | None = None
    version: int | None = None
    min_reader_version: int | None = None
    # Keys this version does not know, kept so that reading and writing back loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, metadata={"json": False})

    def to_json(self) -> dict:
        """A JSON-ready dict (unknown keys first, known fields win)."""
        out = dataclasses.asdict(self)
        del out["extra"]
        for f in dataclasses.fields(self):  # "not recorded", said by the key's absence
            if f.metadata.get("omit_none") and out[f.name] is None:
                del out[f.name]
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, data: object) -> TraceMeta:
        """Raises TraceFormatError (one line, naming the field) for a shape this version can't use."""
        return _convert(data, cls, "metadata")


def _convert(value: object, tp: object, where: str, max_items: int | None = LIST_MAX):
    """`value` (parsed JSON) checked against the annotation `tp`, dataclasses built; a list of
    more than `max_items` items refused before its items are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, where, max_items)
    if origin is list:
        (inner,) = typing.get_args(tp)
        items = _expect(value, list, where)
        if max_items is not None and len(items) > max_items:
            raise TraceFormatError(f"{where} lists {len(items)} items, more than the {max_items} a trace has")
        return [_convert(v, inner, f"{where}[{i}]") for i, v in enumerate(items)]
    if origin is dict or tp is dict:
        return dict(_expect(value, dict, where))
    if dataclasses.is_dataclass(tp):
        return _build(tp, _expect(value, dict, where), where)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):  # bool is an int in Python, not in the schema
        raise _wrong(where, int, value)
    if tp is int and isinstance(value, int) and not -INT_LIMIT <= value <= INT_LIMIT:
        raise TraceFormatError(f"{where} is {value}, outside -2^62..2^62")  # no overflow downstream
    return _expect(value, tp, where)


def _build(cls, data: dict, where: str):
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("json", True)}
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}", known[k].metadata.get("max_items", LIST_MAX))
              for k, v in data.items() if k in known}
    for k, v in kwargs.items():  # a size or count the analysis divides by or subtracts from
        low = known[k].metadata.get("min")
        if low is not None and v is not None and v < low:
            raise TraceFormatError(f"{where}.{k} is {v}, below {low}")
    missing = [f.name for f in known.values() if f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TraceFormatError(f"{where} lacks {', '.join(missing)}")
    if "extra" in hints:
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
    return cls(**kwargs)


_NAMES = {int: "an integer", str: "a string", float: "a number", bool: "true or false",
          list: "a list", dict: "an object"}


def _expect(value, tp, where: str):
    if not isinstance(value, tp):
        raise _wrong(where, tp, value)
    return value


def _wrong(where: str, tp, value) -> TraceFormatError:
    got = "null" if value is None else type(value).__name__
    return TraceFormatError(f"{where} should be {_NAMES.get(tp, tp.__name__)}, not {got}")
