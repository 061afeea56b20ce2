"""How a recording stops on a signal: while it starts, the start undoes itself (`Interrupted`,
nothing recorded); once its output is opened, the signal is noted and the trace is written."""
from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from ckptrace.core import stopping

if TYPE_CHECKING:
    from ckptrace.probes.drain import Drain

# Each stops a recording the same way, the trace written; the reason recorded is the value.
STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup",
                signal.SIGQUIT: "quit"}


class Interrupted(KeyboardInterrupt):
    """A stop signal while the recording was starting (resolving, compiling, attaching): what was
    set up is undone, nothing was recorded; the exit status is a shell's for that signal. A
    KeyboardInterrupt, so no `except Exception` on the way (a library's) takes it for a failure."""

    def __init__(self, signum: int, command: bool):
        name = signal.Signals(signum).name
        super().__init__(f"{STOP_SIGNALS.get(signum, 'stopped')} ({name}) while starting, before the output "
                         f"was opened: nothing was recorded{', the command was not run' if command else ''}")
        self.exit_code = stopping.exit_code(signum)


def interruption(exc: BaseException) -> Interrupted | None:
    """The Interrupted behind `exc`, if any: a signal handler's raise inside library code can come
    out wrapped (Python 3.11 wraps one raised during a class body's `__set_name__`, as in a
    dataclass defined by a lazy import, in a RuntimeError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, Interrupted):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class Stopping:
    """The stop signals of one recording, from its first instant. While it starts, the first one
    raises Interrupted where the start is (a compile, an attach, a wait for --comm: each undoes
    itself), once; from the moment the output is opened they are noted and the session stops at
    its next poll, writing the trace. A signal the CLI held before (core/stopping.py) counts."""

    def __init__(self, command: bool):
        self.command = command
        self.signum: int | None = None
        self.raising = True
        self.session: Drain | None = None
        # A dropped SSH session (SIGHUP) or Ctrl-\\ (SIGQUIT) stops like Ctrl-C: the trace is
        # written. Under nohup (SIGHUP ignored) a hangup still leaves the recording running.
        signals = stopping.held() or [s for s in STOP_SIGNALS
                                      if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        self.old = {s: signal.signal(s, self) for s in signals}
        if stopping.pending() is not None:
            self.signum = stopping.pending()

    def __call__(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.session is not None:
            self.session.request_stop(signum, frame)
        elif self.raising:
            self.raising = False  # once: the start undoes itself on the way out
            raise Interrupted(signum, self.command)

    def started(self) -> None:
        """The output is about to be opened: from now a signal is noted (the trace is written).
        Interrupted if one came (and was swallowed on the way) before."""
        self.raising = False
        if self.signum is not None:
            raise Interrupted(self.signum, self.command)

    def attach(self, session: Drain) -> None:
        self.session = session
        if self.signum is not None:
            session.request_stop(self.signum, None)

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)
