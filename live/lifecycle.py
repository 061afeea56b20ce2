"""The live views' lifecycle, top's and serve's alike: the targets checked before anything loads,
the stop signals noted as a flag while the probes run, the probes loaded once, and everything put
back at the end (the probes closed, the signals' handlers from before)."""
from __future__ import annotations

import signal

from ckptrace.core import stopping
from ckptrace.core.errors import TargetError
from ckptrace.core.terminal import printable
from ckptrace.probes.target import process_of


def check_targets(pids: tuple[int, ...], comm: str | None, verb: str) -> None:
    """--pid or --comm, one of them, checked before anything loads: a missing pid, a kernel thread,
    a zombie or more processes than the program follows is a TargetError now, not after the BPF
    compile. `verb`: the command as the error names it (top, serve)."""
    if bool(pids) == bool(comm):
        raise TargetError("give --pid PID (one or more) or --comm NAME")
    if comm and ("/" in comm or len(comm.encode()) > 255):
        raise TargetError(f"--comm takes a process name (as in /proc/PID/comm), got {printable(comm)!r}")
    from ckptrace.probes.loader import MAX_TARGETS  # the loader (bcc's runtime) loads after the checks

    if len(pids) > MAX_TARGETS:
        raise TargetError(f"{len(pids)} processes: {verb} follows at most {MAX_TARGETS} at once")
    for pid in pids:
        process_of(pid)


class LiveSession:
    """From `with` to its end: core/stopping.py's live stop signals noted in `stop` (their names).
    At the end, what `on_exit` was given is closed first (serve's socket, top's terminal), then the
    probes `start()` loaded, then the signals get their handlers from before back."""

    def __init__(self):
        self.stop: list[str] = []
        self.probes = None
        self._closers: list = []
        self._before: dict = {}

    def __enter__(self) -> LiveSession:
        self._before = {s: signal.signal(s, self._note) for s in stopping.LIVE_STOPS}
        return self

    def _note(self, signum, frame) -> None:
        self.stop.append(signal.Signals(signum).name)

    def start(self, ringbuf_pages: int, **kw):
        """The recorder's program loaded once for every process (live/session.py's LiveProbes)."""
        from ckptrace.live.session import LiveProbes

        self.probes = LiveProbes(ringbuf_pages, **kw)
        return self.probes

    def on_exit(self, close) -> None:
        self._closers.append(close)

    def __exit__(self, *exc) -> None:
        for close in self._closers:
            close()
        if self.probes is not None:
            self.probes.close()
        for s, h in self._before.items():
            signal.signal(s, h)
