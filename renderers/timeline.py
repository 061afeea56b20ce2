"""The timeline every export format draws: processes, thread tracks of nested slices, counters.

One model, two writers (perfetto.py: protobuf TrackEvents; chrome.py: Trace Event JSON), so both
formats show the same slices with the same names and figures.

- One process per (leg, pid): a leg is one trace file. When a pid (or a thread id) was already
  used by an earlier leg (the same trace given twice, traces from two machines), that leg's ids
  are moved above Linux's largest pid (2^22) so the viewers keep the legs apart; the real ids
  stay in the names and arguments.
- Thread tracks hold slices, nested as the calls were: iteration (update_slots, or decode to
  decode) > (create_checkpoint >) checkpoint > fill / copy > mmap / munmap. Checkpoints and iterations come from the
  analysis (the same rows, ids and figures `analyze --json` gives); every other span kind is
  exported row by row. A slice that would cross another's boundary (never seen: the kernel emits
  properly nested calls per thread) goes to an "overlapping" track beside its thread rather than
  being cut.
- Counters: the page faults of each fill / copy / restore copy span on its thread (its fault count
  while it runs, 0 between), the bytes held in checkpoint buffers per process, and RSS where
  recorded.
- A metadata slice per process covering the recording: label, file, build-id, lost events and
  whether the recording was cut short (then the slice's name says so: what is there is exported).
- With a request file (`ckptrace drive -o`): each answered request's time to first token as a
  slice on request lanes of the process the requests went to (a leg's one process, else the one
  named by --requests-pid), with analyze --requests' breakdown.

Every string from a trace or a request file (labels, process names, paths, hosts, statuses) is
made printable (core/terminal.py: control and bidi characters shown as escapes), and a label
or process name in a track or slice name is cut to LABEL_MAX characters: the viewers show them.

Times stay CLOCK_MONOTONIC nanoseconds, as recorded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ckptrace.analyzers.memory import held_series, rss_series
from ckptrace.core.terminal import printable, shown_label

SYNTHETIC_BASE = 1 << 22  # above PID_MAX_LIMIT: no real pid or tid is ever this large
# Outer before inner when two slices start and end together.
NEST_RANK = {"iteration": 0, "create": 1, "checkpoint": 2, "restore": 2, "prompt_save": 2,
             "slot_save": 2, "slot_restore": 2,
             "decode": 3, "spec_state": 3, "fill": 4, "copy": 4, "restore_copy": 4,
             "mmap": 5, "munmap": 5, "mremap": 5}
SLICE_NAMES = {"fill": "fill", "copy": "copy", "decode": "llama_decode", "create": "create_checkpoint",
               "restore": "restore", "restore_copy": "restore copy", "spec_state": "speculative state",
               "prompt_save": "prompt save", "slot_save": "slot save", "slot_restore": "slot restore",
               "mmap": "mmap", "munmap": "munmap", "mremap": "mremap"}
# Row columns shown as a raw slice's arguments, by kind (others: DEFAULT_ARGS).
RAW_ARGS = {
    "fill": ["ckpt", "bytes", "faults", "cpu_ns", "wait_ns", "fault_ns"],
    "copy": ["ckpt", "bytes", "addr", "faults", "cpu_ns", "wait_ns", "fault_ns"],
    "decode": ["iter", "tokens", "prompt_tokens", "faults", "cpu_ns", "wait_ns"],
    "mmap": ["bytes", "addr", "phase", "ckpt"],
    "munmap": ["bytes", "addr", "phase", "ckpt"],
    "mremap": ["bytes", "addr", "phase", "ckpt"],
}
DEFAULT_ARGS = ["ckpt", "bytes", "draft", "faults", "cpu_ns", "wait_ns", "fault_ns"]
FROM_ANALYSIS = ("checkpoint", "iteration")  # exported from the analysis tables, not raw rows
POINT_KINDS = ("rss",)  # rows that are a value at an instant, not a span
FAULT_SPANS = ("fill", "copy", "restore_copy")  # innermost spans whose faults the counter shows


def fault_counter_name(tid: int) -> str:
    """The name of a thread's fault counter (the real tid: counters have no thread id of their own)."""
    return f"page faults in fill/copy/restore (tid {tid})"
CHECKPOINT_ARGS = ["ckpt", "iter", "bytes", "total_ns", "fill_ns", "copy_ns", "other_ns", "cpu_ns", "wait_ns",
                   "fill_cpu_ns", "copy_cpu_ns", "fill_wait_ns", "copy_wait_ns", "fault_ns", "fill_fault_ns",
                   "copy_fault_ns", "fault_source", "faults", "fill_faults", "copy_faults", "mmaps", "munmaps",
                   "buffer", "fresh_bytes", "pool_hit", "draft", "spec"]
REQUEST_ARGS = ["request", "client", "status", "ttft_ns", "stall_ns", "ckpt_ns", "ckpt_fill_ns", "ckpt_copy_ns",
                "ckpt_other_ns", "ckpt_create_ns", "ckpt_fault_ns", "ckpt_cpu_ns", "ckpt_wait_ns", "restore_ns",
                "restore_copy_ns", "rest_ns", "est_ttft_without_fill_ns", "checkpoints", "cut_spans", "prompt_tokens",
                "predicted_tokens"]
ITERATION_ARGS = ["iter", "kind", "span_ns", "checkpoints", "bytes", "fill_ns", "copy_ns", "fault_ns", "other_ns",
                  "cpu_ns", "wait_ns", "tokens", "prompt_tokens", "faults", "mmaps", "munmaps"]


@dataclass(slots=True)  # one per exported span: no __dict__ each
class Slice:
    ts: int
    end: int
    name: str
    kind: str  # the row kind it came from: the category in both formats
    args: dict


@dataclass
class Thread:
    tid: int  # as exported (moved above SYNTHETIC_BASE when the id was taken by an earlier leg)
    real_tid: int
    name: str
    slices: list[Slice]  # properly nested, in begin order (outer first)
    overlapping: list[Slice] = field(default_factory=list)  # slices that would cross a boundary
    faults: list[tuple[int, int]] = field(default_factory=list)  # counter points (ts, faults)


@dataclass
class Counter:
    name: str
    unit: str  # "bytes" or "count"
    points: list[tuple[int, int]]  # (ts, value), in time order; the value holds until the next


@dataclass
class Lane:
    """A track of slices that belong to no thread (requests), none overlapping another."""
    name: str
    slices: list[Slice]


@dataclass
class Process:
    leg: int  # 0-based position on the command line
    pid: int  # as exported
    real_pid: int
    name: str
    threads: list[Thread]
    counters: list[Counter]
    recording: Slice  # the metadata slice
    lanes: list[Lane] = field(default_factory=list)
    cmdline: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    processes: list[Process]
    clock: str = "CLOCK_MONOTONIC"


def build_timeline(analyses, paths, requests=None, request_pids=None) -> Timeline:
    """The timeline of each analysed trace (`analyzers.Analysis`), legs in command-line order;
    `requests`: per leg, its request table (analyzers/requests.py) or None; `request_pids`: per
    leg, the process its requests went to (None: the leg's first process)."""
    taken: set[int] = set()
    processes = []
    for leg, (analysis, path) in enumerate(zip(analyses, paths)):
        first = len(processes)
        events = _with_pids(analysis.trace.events, analysis.trace.meta)
        pids = events["pid"].to_numpy("int64")
        ids = set(pids) | set(int(t) for t in events["tid"].unique())
        shift = SYNTHETIC_BASE * (leg + 1) if ids & taken else 0
        taken |= {i + shift for i in ids}
        held, rss = held_series(events), rss_series(events)
        # A trace with no events still gets its process, for its metadata track.
        for pid in sorted(set(pids.tolist()) or {int(analysis.trace.meta.pid or 0)}):
            processes.append(_process(analysis, events, path, leg, pid, pids, shift, held, rss))
        if requests is not None and requests[leg] is not None:
            pid = request_pids[leg] if request_pids else None
            server = next((p for p in processes[first:] if p.real_pid == pid), processes[first])
            server.lanes = request_lanes(requests[leg])  # the leg's server (its first process unless named)
    return Timeline(processes)


def request_lanes(table: pd.DataFrame) -> list[Lane]:
    """Each answered request's TTFT window (send to first token) as a slice with its breakdown;
    concurrent requests go to lanes, each to the first lane free at its start."""
    done = table.loc[table["first_token_ns"].notna()].sort_values(["start_ns", "request"], kind="stable")
    lanes: list[Lane] = []
    ends: list[int] = []
    for (ts, end), args in zip(zip(done["start_ns"].tolist(), done["first_token_ns"].tolist()),
                               row_args(done, REQUEST_ARGS)):
        s = Slice(int(ts), int(end), f"request {args['request']}", "request", args)
        free = next((i for i, e in enumerate(ends) if e <= s.ts), None)
        if free is None:
            lanes.append(Lane(f"requests: time to first token ({len(lanes) + 1})", []))
            ends.append(0)
            free = len(lanes) - 1
        lanes[free].slices.append(s)
        ends[free] = s.end
    return lanes


def _with_pids(events: pd.DataFrame, meta) -> pd.DataFrame:
    """Events whose `pid` is 0 (none recorded for the row) get the trace's pid: one process."""
    none = events["pid"].to_numpy() == 0
    if none.any() and meta.pid:
        events = events.assign(pid=np.where(none, np.int32(meta.pid), events["pid"].to_numpy()))
    return events


def _process(analysis, events: pd.DataFrame, path, leg: int, pid: int, pids: np.ndarray, shift: int,
             held: pd.DataFrame, rss: pd.DataFrame) -> Process:
    trace = analysis.trace
    events = events.loc[pids == pid]
    tids = set(int(t) for t in events["tid"].unique())
    comm = shown_label(process_comm(trace.meta, pid))
    slices: dict[int, list[Slice]] = {t: [] for t in tids}
    faults: dict[int, list[tuple[int, int]]] = {t: [] for t in tids}
    for name, frame, cols in (("checkpoint", analysis.checkpoints, CHECKPOINT_ARGS),
                              ("iteration", analysis.iterations, ITERATION_ARGS)):
        rows = frame.loc[frame["tid"].isin(tids)]
        names = (np.where(rows["draft"], "draft checkpoint", "checkpoint") if name == "checkpoint"
                 else (rows["kind"].astype(str) + " iteration").to_numpy())
        for tid, ts, end, label, args in zip(rows["tid"].tolist(), rows["start_ns"].tolist(),
                                             rows["end_ns"].tolist(), names.tolist(), row_args(rows, cols)):
            slices[tid].append(Slice(ts, end, label, name, args))
    for kind, rows in events.groupby("kind", observed=True, sort=False):
        if kind in FROM_ANALYSIS or kind in POINT_KINDS:
            continue
        label = SLICE_NAMES.get(kind, str(kind))
        names = np.where(rows["draft"], f"draft {label}", label)
        tid_l, ts_l, end_l = rows["tid"].tolist(), rows["start_ns"].tolist(), rows["end_ns"].tolist()
        for tid, ts, end, name, args in zip(tid_l, ts_l, end_l, names.tolist(),
                                            row_args(rows, RAW_ARGS.get(kind, DEFAULT_ARGS))):
            slices[tid].append(Slice(ts, end, name, kind, args))
        if kind in FAULT_SPANS:
            for tid, ts, end, n in zip(tid_l, ts_l, end_l, rows["faults"].tolist()):
                faults[tid] += [(ts, n), (end, 0)]
    threads = []
    for tid in sorted(t for t in tids if slices[t]):  # a thread with only point rows (RSS) has no track
        nested, overlapping = nest(slices[tid])
        threads.append(Thread(tid + shift, tid, comm, nested, overlapping, sorted(faults[tid])))
    counters = []
    for name, series, col in (("held checkpoint memory", held, "held_bytes"),
                              ("resident memory (RSS)", rss, "rss_bytes")):
        mine_series = series.loc[series["pid"] == pid]
        if len(mine_series):
            counters.append(Counter(name, "bytes", list(zip(mine_series["t_ns"].tolist(), mine_series[col].tolist()))))
    # One process: the leg's label; several: each process's own (PID=LABEL, else NAME#RANK).
    label = trace.label if len(set(pids.tolist())) <= 1 else \
        next((p.label for p in trace.meta.processes if p.pid == pid and p.label), f"{comm} {pid}")
    name = f"{shown_label(label)} ({printable(os.path.basename(str(path)))})"
    if shift:
        name += f", pid {pid}"
    proc = next((p for p in trace.meta.processes if p.pid == pid), None)
    exe = (proc and proc.executable) or trace.meta.executable
    cmdline = trace.meta.command if trace.meta.command and pid == trace.meta.pid else [exe] if exe else []
    return Process(leg, pid + shift, pid, name, threads, counters, recording_slice(trace, path, pid, events),
                   cmdline=[printable(c) for c in cmdline])


def nest(slices: list[Slice]) -> tuple[list[Slice], list[Slice]]:
    """Slices in begin order (outer first), and those that would cross an open slice's end."""
    order = sorted(slices, key=lambda s: (s.ts, -s.end, NEST_RANK.get(s.kind, 9)))
    nested, overlapping, stack = [], [], []
    for s in order:
        while stack and stack[-1] <= s.ts:
            stack.pop()
        if stack and s.end > stack[-1]:
            overlapping.append(s)
            continue
        nested.append(s)
        stack.append(s.end)
    return nested, overlapping


def row_args(frame: pd.DataFrame, cols: list[str]) -> list[dict]:
    """Each row's figures as plain values, column by column; not recorded (NA) ones are left out,
    never shown as 0."""
    columns = []
    for c in cols:
        if c not in frame.columns:
            continue
        col = frame[c]
        if c == "addr":
            values = [f"0x{int(v):x}" for v in col.tolist()]
        elif isinstance(col.dtype, pd.CategoricalDtype) or col.dtype == object:
            values = [None if v is None or v is pd.NA else printable(v) for v in col.astype(object).tolist()]
        else:
            values = col.astype(object).where(col.notna(), None).tolist()
        columns.append((c, values))
    return [{c: v[i] for c, v in columns if v[i] is not None} for i in range(len(frame))]


def process_comm(meta, pid: int) -> str:
    """The process's command name: from `processes` metadata where recorded, else the executable."""
    proc = next((p for p in meta.processes if p.pid == pid), None)
    return (proc and proc.comm) or os.path.basename((proc and proc.executable) or meta.executable or "") or "thread"


def _build_id(meta, pid: int) -> str | None:
    proc = next((p for p in meta.processes if p.pid == pid), None)
    exe = (proc and proc.executable) or meta.executable
    return (proc and proc.build_id) or next((o.build_id for o in meta.objects if o.path == exe), None)


def recording_slice(trace, path, pid: int, events: pd.DataFrame) -> Slice:
    meta = trace.meta
    start = meta.attach_ns or meta.first_event_ns or (int(events["start_ns"].min()) if len(events) else 0)
    end = meta.stop_ns or (int(events["end_ns"].max()) if len(events) else start)
    complete, note = meta.complete, meta.cut_short or ""
    flags = []
    if not complete:
        flags.append("cut short")
    if meta.lost_events:
        flags.append(f"{meta.lost_events} lost events")
    name = f"recording: {shown_label(trace.label)}" + (f" ({', '.join(flags)})" if flags else "")
    args = {"label": trace.label, "file": os.path.basename(str(path)), "pid": pid,
            "build_id": _build_id(meta, pid), "lost_events": meta.lost_events, "complete": complete,
            "cut_short": note if not complete else None, "stop_reason": meta.stop_reason, "mode": meta.mode,
            "executable": meta.executable, "kernel": meta.kernel, "host": meta.host,
            "start_time": meta.start_time, "clock": meta.clock, "trace_version": meta.version,
            "tool_version": meta.tool_version, "events": int(len(events))}
    return Slice(int(start), int(max(end, start)), name, "recording",
                 {k: printable(v) if isinstance(v, str) else v for k, v in args.items() if v is not None})


def recordings(timeline: Timeline) -> list[Slice]:
    """Each process's recording slice (a streamed timeline has them before its processes are made)."""
    made = getattr(timeline, "recordings", None)
    return made if made is not None else [p.recording for p in timeline.processes]


def process_count(timeline: Timeline) -> int:
    plans = getattr(timeline, "plans", None)
    return len(plans) if plans is not None else len(timeline.processes)


def slice_count(timeline: Timeline) -> int:
    """Every slice the writers emit: each process's recording slice, its request lanes' slices,
    and its threads' nested and overlapping ones (a streamed timeline counts them as they are
    written: call it after writing)."""
    counted = getattr(timeline, "counted", None)
    if counted is not None:
        return counted.n
    return sum(1 + sum(len(lane.slices) for lane in p.lanes)
               + sum(len(t.slices) + len(t.overlapping) for t in p.threads) for p in timeline.processes)


def recording_notes(timeline: Timeline) -> list[str]:
    """One line per leg whose recording is incomplete: exported as it is, marked in its metadata."""
    notes = []
    for rec in recordings(timeline):
        a = rec.args
        if (not a["complete"] or a["lost_events"]) and not any(n.startswith(a["file"] + ":") for n in notes):
            what = ([f"cut short ({a['cut_short']})" if a.get("cut_short") else "cut short"]
                    if not a["complete"] else []) + ([f"{a['lost_events']} lost events"] if a["lost_events"] else [])
            notes.append(f"{a['file']}: {' and '.join(what)}: exported what was recorded, marked on its "
                         "'ckptrace recording' track")
    return notes
