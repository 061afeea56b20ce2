"""The timeline (timeline.py) as Chrome Trace Event JSON, for DevTools' Performance panel, Catapult and older tools.

The JSON object form: `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`.
- `ph: "M"` names each process (`process_name`, `process_sort_index` in leg order) and thread.
- `ph: "X"` is a slice: `ts` in microseconds since the file's first timestamp and `dur` in
  microseconds, `cat` the row kind (`ckptrace.fill`...), `args` its figures. `otherData.ts_base_ns`
  is that first timestamp (CLOCK_MONOTONIC ns, an integer): absolute ns = ts_base_ns + ts x 1000.
  Why relative: a double holds every ns only below 2^53 ns (104 days); CLOCK_MONOTONIC counts from
  boot, so an absolute `ts` loses nanoseconds on a machine up longer, a relative one stays exact
  (written with up to three decimals) for recordings up to 52 days long.
- `ph: "C"` is a counter sample: held checkpoint memory and RSS per process, page faults of the
  fill/copy/restore copy spans per thread (its own counter name, since JSON counters belong to a process).
- The metadata slice is on a thread of its own named "ckptrace recording" (a tid far above every
  real one); slices that would cross another's boundary go to one "overlapping" thread per thread.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from .timeline import Process, Slice, Timeline, fault_counter_name

CATEGORY = "ckptrace"
SPARE_TID = (1 << 31) - 1  # extra threads count down from here: far above any real or moved id
CHUNK = 10_000  # events turned to text before they are written


def chrome_writer(timeline: Timeline):
    """A function writing `timeline` as Trace Event JSON into a binary file object."""
    def write(f) -> None:
        # Event by event, the same bytes as json.dumps of the whole document: neither the list of
        # events nor the document's text is ever held whole (they took 1.7x the timeline's memory).
        base = ts_base_ns(timeline)
        rest = {"displayTimeUnit": "ns",
                "otherData": {"clock": timeline.clock, "ts_base_ns": base,
                              "ts": "microseconds since ts_base_ns (CLOCK_MONOTONIC ns)",
                              "producer": "ckptrace export"}}
        dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
        f.write(b'{"traceEvents":[')
        chunk: list[str] = []
        for i, event in enumerate(iter_events(timeline, base)):
            chunk.append(("," if i else "") + dumps(event))
            if len(chunk) >= CHUNK:
                f.write("".join(chunk).encode())
                chunk.clear()
        f.write(("".join(chunk) + "]," + dumps(rest)[1:]).encode())
    return write


def ts_base_ns(timeline: Timeline) -> int:
    """The earliest timestamp in the timeline (0 for an empty one): every `ts` is counted from it."""
    if getattr(timeline, "ts_base", None) is not None:  # a streamed timeline: known before its slices
        return timeline.ts_base
    first = []
    for proc in timeline.processes:
        first.append(proc.recording.ts)
        first += [s.ts for lane in proc.lanes for s in lane.slices[:1]]
        for th in proc.threads:
            first += [s[0].ts for s in (th.slices, th.overlapping) if s] + [ts for ts, _ in th.faults[:1]]
        first += [c.points[0][0] for c in proc.counters if c.points]
    return int(min(first, default=0))


def iter_events(timeline: Timeline, base: int = 0) -> Iterator[dict]:
    spare = iter(range(SPARE_TID, 0, -1))  # ids of the extra threads, unique in the file
    for proc in timeline.processes:
        yield from _process(proc, spare, base)


def _us(ns: int) -> float:
    """ns as microseconds; Python's int / int is correctly rounded, so ns < 2^53 / 1000 comes back exact."""
    return ns / 1000


def _process(proc: Process, spare, base: int) -> Iterator[dict]:
    pid = proc.pid
    yield _meta("process_name", pid, None, {"name": proc.name})
    yield _meta("process_sort_index", pid, None, {"sort_index": proc.leg})
    tid = next(spare)
    yield _meta("thread_name", pid, tid, {"name": "ckptrace recording"})
    yield _slice(pid, tid, proc.recording, base)
    for lane in proc.lanes:
        tid = next(spare)
        yield _meta("thread_name", pid, tid, {"name": lane.name})
        yield from (_slice(pid, tid, s, base) for s in lane.slices)
    for th in proc.threads:
        yield _meta("thread_name", pid, th.tid, {"name": th.name})
        yield from (_slice(pid, th.tid, s, base) for s in th.slices)
        if th.overlapping:
            tid = next(spare)
            yield _meta("thread_name", pid, tid, {"name": f"{th.name} {th.real_tid} (overlapping spans)"})
            yield from (_slice(pid, tid, s, base) for s in th.overlapping)
        name = fault_counter_name(th.real_tid)
        yield from ({"ph": "C", "name": name, "pid": pid, "ts": _us(ts - base), "args": {"faults": v}}
                    for ts, v in th.faults)
    for c in proc.counters:
        yield from ({"ph": "C", "name": c.name, "pid": pid, "ts": _us(ts - base), "args": {c.unit: v}}
                    for ts, v in c.points)


def _meta(name: str, pid: int, tid: int | None, args: dict) -> dict:
    ev = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _slice(pid: int, tid: int, s: Slice, base: int) -> dict:
    return {"ph": "X", "name": s.name, "cat": f"{CATEGORY}.{s.kind}", "pid": pid, "tid": tid,
            "ts": _us(s.ts - base), "dur": _us(s.end - s.ts), "args": s.args}
