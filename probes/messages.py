"""What a recording says on stderr (notes, progress, its start and end lines): one line each,
made printable, and never a reason to stop (a terminal that went away drops them)."""
from __future__ import annotations

import sys

from ckptrace.core.terminal import printable


def note(text: str) -> None:
    """A note from symbol resolution (an object of the target left out, and why)."""
    say(f"ckptrace: note: {text}")


def say(text: str) -> None:
    to_stderr(printable(text, lines=True) + "\n")


def to_stderr(text: str) -> None:
    """Write to stderr; a terminal that went away (hangup: EIO, or a closed pipe) must not stop
    the recording from being finished, so what can't be shown is dropped."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):  # ValueError: stderr already closed
        pass
