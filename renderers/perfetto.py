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
  checkpoint memory, RSS) or the thread (page faults of its fill / copy spans); the metadata slice
  is on a "ckptrace recording" track under the process.
- One packet sequence; track uuids are assigned in order, so the same input gives the same bytes.
"""
from __future__ import annotations

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from .timeline import Counter, Process, Slice, Timeline

MONOTONIC = pb.BuiltinClock.BUILTIN_CLOCK_MONOTONIC  # 3
SEQUENCE_ID = 1
CATEGORY = "ckptrace"
UNITS = {"bytes": pb.CounterDescriptor.UNIT_SIZE_BYTES, "count": pb.CounterDescriptor.UNIT_COUNT}


def perfetto_writer(timeline: Timeline):
    """A function writing `timeline` as a Perfetto trace into a binary file object."""
    def write(f) -> None:
        _Writer(StreamingTraceProtoBuilder(f)).timeline(timeline)
    return write


class _Writer:
    def __init__(self, builder: StreamingTraceProtoBuilder):
        self.builder = builder
        self.last_uuid = 0

    def packet(self, ts: int | None = None) -> pb.TracePacket:
        p = self.builder.create_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        if ts is not None:
            p.timestamp = ts
            p.timestamp_clock_id = MONOTONIC
        return p

    def track(self, parent: int | None = None, name: str | None = None) -> pb.TracePacket:
        """A descriptor packet with a fresh uuid; the caller fills it in and writes it."""
        self.last_uuid += 1
        p = self.packet()
        p.track_descriptor.uuid = self.last_uuid
        if parent is not None:
            p.track_descriptor.parent_uuid = parent
        if name is not None:
            p.track_descriptor.name = name
        return p

    def write(self, p: pb.TracePacket) -> int:
        self.builder.write_packet(p)
        return p.track_descriptor.uuid

    def timeline(self, timeline: Timeline) -> None:
        p = self.packet()
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.clock_snapshot.primary_trace_clock = MONOTONIC
        clock = p.clock_snapshot.clocks.add()
        clock.clock_id = MONOTONIC
        clock.timestamp = min((proc.recording.ts for proc in timeline.processes), default=0)
        self.write(p)
        for proc in timeline.processes:
            self.process(proc)

    def process(self, proc: Process) -> None:
        p = self.track()
        p.track_descriptor.process.pid = proc.pid
        p.track_descriptor.process.process_name = proc.name
        puuid = self.write(p)
        self.slices(self.write(self.track(puuid, "ckptrace recording")), [proc.recording])
        for th in proc.threads:
            p = self.track()
            t = p.track_descriptor.thread
            t.pid, t.tid, t.thread_name = proc.pid, th.tid, th.name
            tuuid = self.write(p)
            self.slices(tuuid, th.slices)
            for s in th.overlapping:  # each on a track of its own: they need not nest among themselves
                self.slices(self.write(self.track(puuid, f"{th.name} {th.real_tid}: overlapping {s.name}")), [s])
            if th.faults:
                self.counter(tuuid, Counter(f"page faults in fill/copy (tid {th.real_tid})", "count", th.faults))
        for c in proc.counters:
            self.counter(puuid, c)

    def slices(self, track: int, slices: list[Slice]) -> None:
        """Begin and end events in nesting order: a slice ends before its parent does."""
        open_ends: list[int] = []
        for s in slices:
            while open_ends and open_ends[-1] <= s.ts:
                self.end(track, open_ends.pop())
            p = self.packet(s.ts)
            e = p.track_event
            e.type = pb.TrackEvent.TYPE_SLICE_BEGIN
            e.track_uuid = track
            e.name = s.name
            e.categories.append(f"{CATEGORY}.{s.kind}")
            for key, value in s.args.items():
                _annotate(e.debug_annotations.add(), key, value)
            self.write(p)
            open_ends.append(s.end)
        while open_ends:
            self.end(track, open_ends.pop())

    def end(self, track: int, ts: int) -> None:
        p = self.packet(ts)
        p.track_event.type = pb.TrackEvent.TYPE_SLICE_END
        p.track_event.track_uuid = track
        self.write(p)

    def counter(self, parent: int, c: Counter) -> None:
        p = self.track(parent, c.name)
        p.track_descriptor.counter.unit = UNITS[c.unit]
        uuid = self.write(p)
        for ts, value in c.points:
            p = self.packet(ts)
            p.track_event.type = pb.TrackEvent.TYPE_COUNTER
            p.track_event.track_uuid = uuid
            p.track_event.counter_value = int(value)
            self.write(p)


def _annotate(a: pb.DebugAnnotation, key: str, value) -> None:
    a.name = key
    if isinstance(value, bool):
        a.bool_value = value
    elif isinstance(value, int):
        a.int_value = value
    elif isinstance(value, float):
        a.double_value = value
    else:
        a.string_value = str(value)
