"""The trace's metadata a recording writes: what is known once the probes are in (`trace_meta`,
in the stream's header), then what it learned by its end (`note_stop`)."""
from __future__ import annotations

import datetime as dt
import platform
import socket
import time
from typing import TYPE_CHECKING

from ckptrace import __version__
from ckptrace.core.meta import GpuInfo, ObjectInfo, OpenSpans, ProbeInfo, TraceMeta
from ckptrace.core.stream import CUT_SHORT
from ckptrace.probes import arch
from ckptrace.probes.loader import C_GPU_RANGES_FULL, C_PINNED_FULL, gpu_fault_events
from ckptrace.probes.process_memory import host_memory_bytes

if TYPE_CHECKING:
    from ckptrace.probes.drain import Drain
    from ckptrace.probes.record_session import RecordOptions
    from ckptrace.probes.targets import Targets

# The legacy per-fault interval (--fault-sample; fault_timed, fault_timed_ns). fault_ns is
# fault_time.py's and needs none of it; measured here this interval is about half the whole cost.
FAULT_TIME_DEFINITION = (
    "per timed fault: exceptions:page_fault_user to the next kmem:rss_stat on the same thread "
    "(the new page accounted); a lower bound without trap entry/exit or hypervisor faults. "
    "Faults are timed during one 0.25 s slice in every fault_sample_every slices"
)


def trace_meta(opts: RecordOptions, targets: Targets, command: list[str] | None,
               attach_retries: int) -> TraceMeta:
    """The trace's metadata as known once the probes are in; note_stop adds the rest. Objects,
    probes and missing points are the union over the processes (each one's are in `processes`)."""
    plans = [t.plan for t in targets]
    one = targets[0] if len(targets) == 1 else None
    return TraceMeta(
        tool_version=__version__,
        label=opts.label,
        mode="launch" if command else "attach",
        command=list(command) if command else None,
        pid=one.pid if one else None,
        executable=one.plan.target if one else None,
        objects=list(dict.fromkeys(ObjectInfo(o.path, o.build_id) for pl in plans for o in pl.objects)),
        probes=list(dict.fromkeys(ProbeInfo(p.point, p.symbol, p.object, p.vaddr, p.offset, p.build_id)
                                  for pl in plans for p in pl.points)),
        missing_optional=sorted({m for pl in plans for m in pl.missing_optional}),
        # several processes: one profile when they all matched the same (each one's is in `processes`)
        profile=plans[0].profile if len({pl.profile.name for pl in plans}) == 1 else None,
        kernel=platform.release(),
        arch=platform.machine(),
        page_size=arch.page_size(),
        host=socket.gethostname(),
        host_memory_bytes=host_memory_bytes(),
        start_time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        attach_ns=time.monotonic_ns(),
        attach_retries=attach_retries,
        fault_sample_every=opts.fault_sample,
        fault_time_definition=FAULT_TIME_DEFINITION if opts.fault_sample else None,
        complete=False,  # what the stream says until the finished trace replaces it
        cut_short=CUT_SHORT,
        max_threads=opts.max_threads,
        gpu=_gpu_info(plans, attached=command is None, source=opts.gpu_fault_source),
    )


def _gpu_info(plans, attached: bool, source: str = "") -> GpuInfo | None:
    """The CUDA copy path as it will be recorded; None for a recording of no CUDA target."""
    points = [p for pl in plans for p in pl.gpu_points]
    if not points:
        return None
    return GpuInfo(libraries=list(dict.fromkeys(p.object for p in points)),
                   points=list(dict.fromkeys(p.point for p in points)),
                   fault_tracepoints=gpu_fault_events(source), pinned_known_from_start=not attached)


def note_stop(meta: TraceMeta, session: Drain, stop_reason: str) -> None:
    """What the recording learned by its end: counters, spans left open, how it stopped."""
    open_ckpt, open_iter = session.open_spans()
    for key, value in session.progress().items():
        if hasattr(meta, key):
            setattr(meta, key, value)
    meta.first_event_ns = session.first_ns
    meta.stop_reason = stop_reason
    meta.open_at_stop = OpenSpans(open_ckpt, open_iter)
    meta.fault_slices_timed = session.fault_slices
    meta.events = session.rows
    if meta.gpu is not None:
        c = session.counters()
        meta.gpu.ranges_full, meta.gpu.pinned_full = c[C_GPU_RANGES_FULL], c[C_PINNED_FULL]
