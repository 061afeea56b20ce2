"""The timeline (timeline.py) as Chrome Trace Event JSON, for DevTools' Performance panel, Catapult and older tools.

The JSON object form: `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`.
- `ph: "M"` names each process (`process_name`, `process_sort_index` in leg order) and thread.
- `ph: "X"` is a slice: `ts` and `dur` in microseconds (CLOCK_MONOTONIC, with three decimals, so
  nanoseconds survive), `cat` the row kind (`ckptrace.fill`...), `args` its figures.
- `ph: "C"` is a counter sample: held checkpoint memory and RSS per process, page faults of the
  fill/copy/restore copy spans per thread (its own counter name, since JSON counters belong to a process).
- The metadata slice is on a thread of its own named "ckptrace recording" (a tid far above every
  real one); slices that would cross another's boundary go to one "overlapping" thread per thread.
"""
from __future__ import annotations

import json

from .timeline import Process, Slice, Timeline, fault_counter_name

CATEGORY = "ckptrace"
SPARE_TID = (1 << 31) - 1  # extra threads count down from here: far above any real or moved id


def chrome_writer(timeline: Timeline):
    """A function writing `timeline` as Trace Event JSON into a binary file object."""
    def write(f) -> None:
        doc = {"traceEvents": chrome_events(timeline), "displayTimeUnit": "ns",
               "otherData": {"clock": timeline.clock, "producer": "ckptrace export"}}
        f.write(json.dumps(doc, allow_nan=False, separators=(",", ":")).encode())
    return write


def chrome_events(timeline: Timeline) -> list[dict]:
    events: list[dict] = []
    spare = iter(range(SPARE_TID, 0, -1))  # ids of the extra threads, unique in the file
    for proc in timeline.processes:
        events += _process(proc, spare)
    return events


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _process(proc: Process, spare) -> list[dict]:
    pid = proc.pid
    out = [_meta("process_name", pid, None, {"name": proc.name}),
           _meta("process_sort_index", pid, None, {"sort_index": proc.leg})]
    tid = next(spare)
    out.append(_meta("thread_name", pid, tid, {"name": "ckptrace recording"}))
    out.append(_slice(pid, tid, proc.recording))
    for lane in proc.lanes:
        tid = next(spare)
        out.append(_meta("thread_name", pid, tid, {"name": lane.name}))
        out += [_slice(pid, tid, s) for s in lane.slices]
    for th in proc.threads:
        out.append(_meta("thread_name", pid, th.tid, {"name": th.name}))
        out += [_slice(pid, th.tid, s) for s in th.slices]
        if th.overlapping:
            tid = next(spare)
            out.append(_meta("thread_name", pid, tid, {"name": f"{th.name} {th.real_tid} (overlapping spans)"}))
            out += [_slice(pid, tid, s) for s in th.overlapping]
        name = fault_counter_name(th.real_tid)
        out += [{"ph": "C", "name": name, "pid": pid, "ts": _us(ts), "args": {"faults": v}} for ts, v in th.faults]
    for c in proc.counters:
        out += [{"ph": "C", "name": c.name, "pid": pid, "ts": _us(ts), "args": {c.unit: v}} for ts, v in c.points]
    return out


def _meta(name: str, pid: int, tid: int | None, args: dict) -> dict:
    ev = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _slice(pid: int, tid: int, s: Slice) -> dict:
    return {"ph": "X", "name": s.name, "cat": f"{CATEGORY}.{s.kind}", "pid": pid, "tid": tid,
            "ts": _us(s.ts), "dur": _us(s.end - s.ts), "args": s.args}
