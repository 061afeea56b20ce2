"""The timeline (timeline.py) as a Perfetto protobuf trace: TrackEvents, written with the `perfetto`
package's trace builder and its own protos.

- Every event packet carries `timestamp_clock_id = 3` (BUILTIN_CLOCK_MONOTONIC): ckptrace's
  times are CLOCK_MONOTONIC as the kernel read them, so the file lines up with a system trace
  taken at the same time, whose clock snapshots relate MONOTONIC to its own trace clock.
- The file opens with a ClockSnapshot naming MONOTONIC (trace processor drops packets of a clock
  no snapshot names). It makes MONOTONIC the primary trace clock, so the file also opens alone
  with the times as recorded.
- Tracks: a process track per (leg, pid) with a thread track per thread; slices are TYPE_SLICE_BEGIN
  / TYPE_SLICE_END pairs in nesting order; counters are counter tracks under the process (held
  checkpoint memory, RSS) or the thread (page faults of its fill / copy / restore copy spans); the metadata slice
  is on a "ckptrace recording" track under the process.
- One packet sequence; event names, categories and argument names are interned (each string
  once, then its id), packets are written 10,000 at a time (serialized traces concatenate into one
  trace); track uuids are assigned in order, so the same input gives the same bytes.
"""
from __future__ import annotations

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from .timeline import Counter, Process, Slice, Timeline, fault_counter_name, recordings

MONOTONIC = pb.BuiltinClock.BUILTIN_CLOCK_MONOTONIC  # 3
SEQUENCE_ID = 1
CHUNK = 10_000  # packets built in memory before they are written
CATEGORY = "ckptrace"
VALUE_FIELDS = {bool: "bool_value", int: "int_value", float: "double_value", str: "string_value"}
UNITS = {"bytes": pb.CounterDescriptor.UNIT_SIZE_BYTES, "count": pb.CounterDescriptor.UNIT_COUNT}


def perfetto_writer(timeline: Timeline):
    """A function writing `timeline` as a Perfetto trace into a binary file object."""
    def write(f) -> None:
        w = _Writer(f)
        w.timeline(timeline)
        w.flush()
    return write


class _Writer:
    def __init__(self, f):
        self.f = f
        self.chunk = TraceProtoBuilder()
        self.pending = 0
        self.last_uuid = 0
        # Interned strings (one sequence): event names, categories, argument names -> iid.
        self.interned: dict[str, dict[str, int]] = {"event_names": {}, "event_categories": {},
                                                    "debug_annotation_names": {}}

    def packet(self, ts: int | None = None) -> pb.TracePacket:
        if self.pending >= CHUNK:
            self.flush()
        self.pending += 1
        p = self.chunk.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        if ts is not None:
            p.timestamp = ts
            p.timestamp_clock_id = MONOTONIC
            p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        return p

    def flush(self) -> None:
        """Serialized traces concatenate into one trace: write the packets built so far."""
        if self.pending:
            self.f.write(self.chunk.serialize())
            self.chunk, self.pending = TraceProtoBuilder(), 0

    def iid(self, p: pb.TracePacket, table: str, value: str) -> int:
        """The string's interning id, first defined in the packet that uses it."""
        ids = self.interned[table]
        if value not in ids:
            ids[value] = len(ids) + 1
            entry = getattr(p.interned_data, table).add()
            entry.iid, entry.name = ids[value], value
        return ids[value]

    def track(self, parent: int | None = None, name: str | None = None) -> pb.TracePacket:
        """A descriptor packet with a fresh uuid; the caller fills it in."""
        self.last_uuid += 1
        p = self.packet()
        p.track_descriptor.uuid = self.last_uuid
        if parent is not None:
            p.track_descriptor.parent_uuid = parent
        if name is not None:
            p.track_descriptor.name = name
        return p

    def timeline(self, timeline: Timeline) -> None:
        p = self.packet()
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.clock_snapshot.primary_trace_clock = MONOTONIC
        clock = p.clock_snapshot.clocks.add()
        clock.clock_id = MONOTONIC
        clock.timestamp = min((rec.ts for rec in recordings(timeline)), default=0)
        for proc in timeline.processes:
            self.process(proc)

    def process(self, proc: Process) -> None:
        p = self.track()
        p.track_descriptor.process.pid = proc.pid
        p.track_descriptor.process.process_name = proc.name
        p.track_descriptor.process.cmdline.extend(proc.cmdline)
        puuid = p.track_descriptor.uuid
        self.slices(self.track(puuid, "ckptrace recording").track_descriptor.uuid, [proc.recording])
        for lane in proc.lanes:
            self.slices(self.track(puuid, lane.name).track_descriptor.uuid, lane.slices)
        for th in proc.threads:
            p = self.track()
            t = p.track_descriptor.thread
            t.pid, t.tid, t.thread_name = proc.pid, th.tid, th.name
            tuuid = p.track_descriptor.uuid
            self.slices(tuuid, th.slices)
            for s in th.overlapping:  # each on a track of its own: they need not nest among themselves
                self.slices(self.track(puuid, f"{th.name} {th.real_tid}: overlapping {s.name}").track_descriptor.uuid,
                            [s])
            if th.faults:
                self.counter(tuuid, Counter(fault_counter_name(th.real_tid), "count", th.faults))
        for c in proc.counters:
            self.counter(puuid, c)

    def slices(self, track: int, slices: list[Slice]) -> None:
        """Begin and end events in nesting order: a slice ends before its parent does."""
        open_ends: list[int] = []
        arg_ids = self.interned["debug_annotation_names"]
        for s in slices:
            while open_ends and open_ends[-1] <= s.ts:
                self.end(track, open_ends.pop())
            p = self.packet(s.ts)
            e = p.track_event
            e.type = pb.TrackEvent.TYPE_SLICE_BEGIN
            e.track_uuid = track
            e.name_iid = self.iid(p, "event_names", s.name)
            e.category_iids.append(self.iid(p, "event_categories", f"{CATEGORY}.{s.kind}"))
            add = e.debug_annotations.add
            for key, value in s.args.items():
                a = add()
                a.name_iid = arg_ids[key] if key in arg_ids else self.iid(p, "debug_annotation_names", key)
                setattr(a, VALUE_FIELDS.get(type(value), "string_value"),
                        value if type(value) in VALUE_FIELDS else str(value))
            open_ends.append(s.end)
        while open_ends:
            self.end(track, open_ends.pop())

    def end(self, track: int, ts: int) -> None:
        e = self.packet(ts).track_event
        e.type = pb.TrackEvent.TYPE_SLICE_END
        e.track_uuid = track

    def counter(self, parent: int, c: Counter) -> None:
        p = self.track(parent, c.name)
        p.track_descriptor.counter.unit = UNITS[c.unit]
        uuid = p.track_descriptor.uuid
        for ts, value in c.points:
            e = self.packet(ts).track_event
            e.type = pb.TrackEvent.TYPE_COUNTER
            e.track_uuid = uuid
            e.counter_value = int(value)
