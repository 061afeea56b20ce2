"""stdout and stderr as a command finds them: maybe closed, full, or a pipe nobody reads any more.

- A command started with fd 0, 1 or 2 closed (`>&-`) gets /dev/null there first, so no file it
  opens later (a trace's stream, a BPF object, a library it reads) takes that number and gets
  written into by a print or by libbcc's chatter.
- stdout is the command's result. A write there that fails is the command's failure: for a reader
  that went away (`| head -1`, EPIPE) exit 141 quietly, as a filter killed by SIGPIPE does; for
  anything else (`>/dev/full`, a closed stdout, EIO) one `ckptrace: error: cannot write to
  stdout` line and exit 1. A closed stdout is refused as an `-o /dev/stdout` too.
- stderr carries progress, notes and errors. A write there that fails is dropped, and the exit
  status stays the command's own: 0 when it did its job, its error's code when not.
So neither stream can make a command print a traceback, and `record` writes its trace before
anything it prints on stdout: a recording is kept whatever happens to them (probes/rescue.py).
"""
from __future__ import annotations

import errno
import io
import os
import sys

EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a filter whose reader left
_closed: set[int] = set()  # standard fds that were closed when the command started


class StdoutFailed(Exception):
    """A write to stdout failed (not an OSError, so no handler meant for files catches it)."""

    def __init__(self, error: OSError):
        super().__init__(error.strerror or str(error))
        self.errno = error.errno
        self.note = ""  # what the command had done, said with the error (record: the trace written)


class PipeClosed(Exception):
    """An output written into a pipe (`-o /dev/stdout`, a FIFO) whose reader went away: exit 141.
    Not a BrokenPipeError: click turns any EPIPE OSError into a bare exit 1."""


class _Stdout(io.FileIO):
    """fd 1, whose write failures are StdoutFailed; after the first, the rest is dropped."""
    failed = False

    def write(self, data):
        if _Stdout.failed:
            return len(data)
        try:
            if 1 in _closed:
                raise OSError(errno.EBADF, "it was closed when ckptrace started")
            return super().write(data)
        except OSError as e:
            _Stdout.failed = True
            raise StdoutFailed(e) from None


class _Stderr(io.FileIO):
    """fd 2, where what can't be written is dropped."""

    def write(self, data):
        if 2 in _closed:
            return len(data)
        try:
            return super().write(data)
        except OSError:
            return len(data)


def guard() -> None:
    """At the start of a command: /dev/null on closed standard fds; sys.stdout and sys.stderr as
    the rules above."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            _closed.add(fd)
    sys.stdout = _text(_Stdout(1, "w", closefd=False), sys.stdout)
    sys.stderr = _text(_Stderr(2, "w", closefd=False), sys.stderr)


def _text(raw: io.FileIO, was) -> io.TextIOWrapper:
    """A text stream over `raw` encoded as `was` was (None: Python found the fd closed)."""
    tty = raw.isatty()
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=getattr(was, "encoding", None) or "utf-8",
                            errors=getattr(was, "errors", None) or "backslashreplace",
                            line_buffering=tty, write_through=not tty and raw.fileno() == 2)


def closed(fd: int) -> bool:
    """Whether standard fd `fd` was closed when the command started (it holds /dev/null now)."""
    return fd in _closed


def finish() -> None:
    """Before the command exits: what stdout still buffers is written now, so its failure is
    StdoutFailed here and not an 'Exception ignored' at interpreter exit."""
    sys.stdout.flush()
