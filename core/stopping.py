"""Stop signals (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) held as a flag from the CLI's first instant.

Python's own SIGINT handler raises KeyboardInterrupt wherever the program is, and SIGTERM's
default kills it there: a recorder interrupted while it imports, compiles, attaches or opens
its output either printed a traceback or lost the stop. The CLI installs `hold()` when it is
imported; a command that stops on these signals (record) takes what is pending over, any other
gets Python's defaults back (`release()`) before it runs."""
from __future__ import annotations

import signal

STOPS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup",
         signal.SIGQUIT: "quit"}
# What stops the live views (top, serve: live/lifecycle.py); SIGQUIT keeps Python's default there.
LIVE_STOPS = tuple(s for s in STOPS if s != signal.SIGQUIT)
_pending: list[int] = []
_held: dict[int, object] = {}  # signal -> the handler before hold()


def _note(signum, frame) -> None:
    _pending.append(signum)


def hold() -> None:
    """From now, a stop signal is noted, not acted on. A SIGHUP ignored (nohup) stays ignored."""
    for s in STOPS:
        before = signal.getsignal(s)
        if s == signal.SIGHUP and before == signal.SIG_IGN:
            continue
        _held.setdefault(s, before)
        signal.signal(s, _note)


def pending() -> int | None:
    """The first stop signal noted since hold(), if any."""
    return _pending[0] if _pending else None


def release() -> None:
    """The handlers from before hold() again (a command that does not take the signals over)."""
    for s, before in _held.items():
        signal.signal(s, before)
    _held.clear()


def held() -> list[int]:
    """The signals hold() took (to take over: record's handlers go on the same ones)."""
    return list(_held)


def exit_code(signum: int) -> int:
    """A shell's exit status for a stop by this signal."""
    return 128 + signum
