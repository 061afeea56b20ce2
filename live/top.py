"""`ckptrace top`: running processes' checkpoints, live, a frame every interval.

The kernel side, its load and the attach are `serve`'s (live/session.py), and each batch is folded
as serve folds it (probes/fold.py: analyze's definitions). What this keeps per process: totals
since it was attached, the checkpoints folded in the last interval (their rate) and those of the
last window (their percentiles). A frame (renderers/top.py) is drawn every interval: in place on
a terminal (`q` or Ctrl-C quits), one after another elsewhere (like `top -b`), or once (--once),
as text or JSON, after one interval or when every process has exited.
"""
from __future__ import annotations

import os
import select
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ckptrace.core.errors import CkptraceError
from ckptrace.probes.fold import ProcessFold
from ckptrace.probes.target import processes_named, start_time
from ckptrace.core.terminal import printable
from ckptrace.live.lifecycle import LiveSession, check_targets
from ckptrace.renderers.top import WINDOW_COLUMNS

DRAIN_S = 0.25  # the ring buffer is drained this often (and `q` read), whatever the interval
MAX_WINDOW_CHECKPOINTS = 100_000  # per process: the window's memory stays bounded at any rate
NOTES_SHOWN = 3
# Plain ANSI (VT100) only: home, clear to end of line, clear below; the cursor hidden while drawing.
HOME, EOL, BELOW, HIDE, SHOW = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[?25l", "\x1b[?25h"


@dataclass
class TopOptions:
    pids: tuple[int, ...] = ()
    comm: str | None = None
    interval_s: float = 1.0
    window_s: float = 10.0
    once: bool = False
    as_json: bool = False
    ringbuf_pages: int = 512


class _Process:
    """One attached process's figures (see the module docstring)."""

    def __init__(self, target):
        self.target = target
        self.fold = ProcessFold(target.plan.fill_probed)
        self.attached_ns = time.monotonic_ns()
        self.checkpoints = self.pool_hits = self.fresh_copies = self.restores = self.in_interval = 0
        self.window: deque[tuple[float, dict[str, np.ndarray]]] = deque()  # (when folded, columns)
        self.exited_at: float | None = None

    def add(self, batch, now: float) -> None:
        folded = self.fold.fold(batch.events, batch.fault_ns, batch.sched_recorded)
        folded.apply_held()
        ck = folded.checkpoints
        n = len(ck["bytes"])
        self.checkpoints += n
        self.pool_hits += int(ck["pool_hit"].sum())
        self.fresh_copies += int((ck["fresh_bytes"] > 0).sum())
        self.restores += folded.restores
        self.in_interval += n
        if n:
            self.window.append((now, {c: ck[c] for c in WINDOW_COLUMNS}))

    def figures(self, now: float, opts: TopOptions, interval: float) -> dict:
        """The frame document's entry for this process; starts its next interval."""
        while self.window and (now - self.window[0][0] > opts.window_s if not opts.once else False):
            self.window.popleft()
        while sum(len(c["wait_ns"]) for _, c in self.window) > MAX_WINDOW_CHECKPOINTS:
            self.window.popleft()
        cols = {c: np.concatenate([w[c] for _, w in self.window]) if self.window else np.empty(0)
                for c in WINDOW_COLUMNS}
        t = self.target
        doc = {"pid": t.pid, "comm": t.comm, "start_ticks": t.start, "attached_ns": self.attached_ns,
               "exited": self.exited_at is not None, "checkpoints": self.checkpoints, "pool_hits": self.pool_hits,
               "fresh_copies": self.fresh_copies, "restores": self.restores,
               "checkpoints_per_s": self.in_interval / interval if interval > 0 else 0.0,
               "window": {"checkpoints": int(len(cols["wait_ns"])), **{c: _stat(v) for c, v in cols.items()}},
               "held_bytes": self.fold.buffers.held, "peak_held_bytes": self.fold.peak_bytes}
        self.in_interval = 0
        return doc


def _stat(values: np.ndarray) -> dict:
    """count, p50, p99 (numpy's linear percentiles, as analyze's summary) of the recorded values."""
    v = values[values >= 0]
    if not len(v):
        return {"count": 0, "p50": None, "p99": None}
    p50, p99 = np.percentile(v, [50, 99])
    return {"count": int(len(v)), "p50": float(p50), "p99": float(p99)}


class _Terminal:
    """Interactive output: frames drawn in place, `q` read from the keyboard (cbreak mode)."""

    def __init__(self, out):
        self.out = out
        self.saved = None
        if sys.stdin.isatty():
            import termios
            import tty

            self.fd = sys.stdin.fileno()
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        self.out.write(HIDE + HOME + BELOW)

    def quit_pressed(self, timeout: float) -> bool:
        if self.saved is None:
            time.sleep(timeout)
            return False
        if select.select([self.fd], [], [], timeout)[0]:
            return os.read(self.fd, 64).lower().find(b"q") >= 0
        return False

    def draw(self, lines: list[str]) -> None:
        self.out.write(HOME + "".join(f"{ln}{EOL}\n" for ln in lines) + BELOW)
        self.out.flush()

    def close(self) -> None:
        self.out.write(SHOW)
        self.out.flush()
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def top(opts: TopOptions, out=None) -> int:
    """Run until `q`, a stop signal, --once's interval, or (with --pid) every process has exited."""
    out = out or sys.stdout
    check_targets(opts.pids, opts.comm, "top")
    interactive = not opts.once and not opts.as_json and out.isatty()
    from ckptrace.live.session import attach_given

    screen = None
    view = _View(opts, out, interactive)
    with LiveSession() as live:
        # A compile (a cold cache: seconds) is said, on a terminal or not, and counts in no window.
        view.probes = live.start(opts.ringbuf_pages, status=sys.stderr.isatty(), preload=opts.comm is not None,
                                 compile_line=True)
        attach_given(opts.pids, view.attach, view.note, "showing", "show")
        view.t0 = time.monotonic()  # the first interval (--once's window) from the probes being in
        if not interactive:
            what = (", ".join(f"PID {p.target.pid} ({p.target.comm}, {p.target.probes} uprobes)" for p in view.procs.values())
                    if opts.pids else f"every process named {printable(opts.comm)!r}")
            view.say(f"ckptrace: top: {what}, {'one frame after' if opts.once else 'a frame every'} "
                     f"{opts.interval_s:g} s" + ("" if opts.once else "; Ctrl-C to stop"))
        if opts.comm:
            view.scan()
        if interactive:
            screen = _Terminal(out)
            live.on_exit(screen.close)
        return view.run(live.stop, screen)


class _View:
    """The attached processes, the drain loop and the frames."""

    def __init__(self, opts: TopOptions, out, interactive: bool):
        self.opts, self.out, self.interactive = opts, out, interactive
        self.probes = None
        self.procs: dict[int, _Process] = {}  # pid -> the process now holding it
        self.refused: set[tuple[int, int | None]] = set()
        self.notes: deque[str] = deque(maxlen=NOTES_SHOWN)
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(printable(text, lines=True), file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        line = f"ckptrace: note: {text}"
        if self.interactive:
            self.notes.append(line)  # on the screen: a line on stderr would be drawn over
        else:
            self.say(line)

    def attach(self, pid: int) -> None:
        t = self.probes.attach(pid)
        self.procs[t.pid] = _Process(t)

    def scan(self) -> None:
        """--comm: attach the processes of the name not shown yet (one that can't be is said once)."""
        for pid in processes_named(self.opts.comm):
            held = self.procs.get(pid)
            if (held is None or held.exited_at is not None) and (pid, start_time(pid)) not in self.refused:
                start = start_time(pid)
                try:
                    self.attach(pid)
                except (CkptraceError, OSError) as e:  # e.g. it exited while being attached
                    self.refused.add((pid, start))
                    self.note(f"not showing PID {pid}: {e if isinstance(e, CkptraceError) else e.strerror or e}")

    def _drain(self) -> None:
        now = time.monotonic()
        gone = [p for p in self.procs.values() if p.exited_at is None and not p.target.alive()]
        batch = self.probes.batch()  # after listing the gone: it holds their last events
        if batch is not None:
            for pid, part in batch.by_pid().items():
                proc = self.procs.get(pid)
                if proc is not None and proc.exited_at is None:
                    proc.add(part, now)
        for p in gone:
            p.exited_at = now
            self.probes.detach(p.target)

    def frame(self, interval: float) -> dict:
        now = time.monotonic()
        for pid in [pid for pid, p in self.procs.items()
                    if p.exited_at is not None and now - p.exited_at > max(self.opts.window_s, self.opts.interval_s)
                    and not self.opts.once]:
            del self.procs[pid]
        doc = {"time": time.time(), "interval_s": self.opts.interval_s, "once": self.opts.once,
               "window_s": self.opts.window_s if not self.opts.once else round(now - self.t0, 3),
               "elapsed_s": round(now - self.t0, 3), "monotonic_ns": time.monotonic_ns(),
               "lost_events": self.probes.lost(),
               "processes": [p.figures(now, self.opts, interval) for p in self.procs.values()]}
        if not self.procs and self.opts.comm:
            doc["waiting"] = f"waiting for a process named {printable(self.opts.comm)}"
        return doc

    def show(self, doc: dict, screen) -> None:
        from ckptrace.renderers.top import frame_lines

        if self.opts.as_json:
            import json

            from ckptrace.renderers.json import versioned  # pandas: loaded only for --json

            self.out.write(json.dumps(versioned(doc)) + "\n")
        elif screen is not None:
            screen.draw(frame_lines(doc, list(self.notes)))
            return
        else:
            self.out.write("\n".join(frame_lines(doc)) + "\n\n")
        self.out.flush()

    def run(self, stop: list[str], screen) -> int:
        opts = self.opts
        last = self.t0
        next_frame = self.t0 + opts.interval_s
        if screen is not None:
            self.show(self.frame(0.0), screen)  # the header at once: the first figures after one interval
        while not stop:
            wait = min(DRAIN_S, max(0.0, next_frame - time.monotonic()))
            if screen is not None and screen.quit_pressed(wait):
                break
            if screen is None:
                time.sleep(wait)
            self._drain()
            everyone_gone = bool(opts.pids) and all(p.exited_at is not None for p in self.procs.values())
            now = time.monotonic()
            if now < next_frame and not everyone_gone:
                continue
            if opts.comm:
                self.scan()
            if everyone_gone and not opts.once:
                self.note("every process exited; stopping")
            doc = self.frame(now - last if not opts.once else now - self.t0)
            last = now
            next_frame = max(next_frame + opts.interval_s, now + DRAIN_S)
            self.show(doc, screen)
            if opts.once or everyone_gone:
                return 0
        return 0
