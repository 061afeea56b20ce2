"""`ckptrace top`'s frame: one line per process in 80 columns (plain text, no colour), or the
same figures as a JSON document.

Times are on-CPU milliseconds per checkpoint (p50/p99 over the window), the run-queue wait its
median, held memory the checkpoint buffers mapped and not yet unmapped (docs/metrics.md).
"""
from __future__ import annotations

import datetime as dt

from ckptrace.core.terminal import printable
from ckptrace.core.units import ms_short

WIDTH = 79  # a line never reaches the 80th column (some terminals wrap there)
COLUMNS = ("{:>7} {:<10} {:>6} {:>4} {:<11} {:<11} {:<11} {:>5} {:>6}")
# The window's per-checkpoint figures (percentiles in the frame and in --json), which live/top.py keeps.
WINDOW_COLUMNS = ("fill_cpu_ns", "copy_cpu_ns", "fault_ns", "wait_ns")
HEADER = ("PID", "COMM", "CKPT/S", "HIT%", "FILL", "COPY", "FAULT", "WAIT", "HELD")


def size(nbytes: int) -> str:
    """Bytes in at most 6 characters, binary units."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            v = nbytes / (1 << shift)
            return f"{v:.1f}{unit}" if v < 99.95 else f"{v:.0f}{unit}"
    return f"{nbytes}B"


def pair(stat: dict) -> str:
    return f"{ms_short(stat['p50'])}/{ms_short(stat['p99'])}"


def frame_lines(doc: dict, notes: list[str] = ()) -> list[str]:
    """The frame of a frame document (live/top.py's frame()), each line under 80 columns."""
    when = dt.datetime.fromtimestamp(doc["time"]).strftime("%H:%M:%S")
    procs = doc["processes"]
    rate = sum(p["checkpoints_per_s"] for p in procs if not p["exited"])
    head = (f"ckptrace top  {when}  {len(procs)} process{'es' if len(procs) != 1 else ''}  "
            f"ckpt/s {rate:.1f}  every {doc['interval_s']:g} s  lost {doc['lost_events']}")
    over = f"the {doc['window_s']:.1f} s watched" if doc.get("once") else f"the last {doc['window_s']:g} s"
    legend = [f"FILL, COPY, FAULT: on-CPU ms per checkpoint, p50/p99 over {over}",
              "WAIT: run-queue ms per checkpoint, p50; HELD: checkpoint buffers mapped now"]
    lines = [head, *legend, "", COLUMNS.format(*HEADER)]
    for p in procs:
        w = p["window"]
        name = printable(p["comm"])[:10]
        lines.append(COLUMNS.format(
            p["pid"], name, "exited" if p["exited"] else f"{p['checkpoints_per_s']:.1f}",
            f"{100 * p['pool_hits'] / p['checkpoints']:.0f}%" if p["checkpoints"] else "-",
            pair(w["fill_cpu_ns"]), pair(w["copy_cpu_ns"]), pair(w["fault_ns"]), ms_short(w["wait_ns"]["p50"]),
            size(p["held_bytes"])))
    for p in procs:
        if p["fresh_copies"]:  # the GPU hazard a CPU trace sees (analyze's note)
            lines.append(f"{p['pid']}: {p['fresh_copies']} copies into non-resident pages: slow pageable path on CUDA")
    if not procs:
        lines.append(doc.get("waiting") or "no process traced")
    lines += [printable(n) for n in notes]
    return [ln.rstrip()[:WIDTH] for ln in lines]
