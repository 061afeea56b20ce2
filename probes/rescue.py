"""Where the finished trace goes, so nothing recorded is lost: to -o, or, when -o can't take
it (disk full, folder gone, a FIFO or pipe whose reader left), into the first folder with room,
with one line saying where and why."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ckptrace.core.errors import TargetError
from ckptrace.core.meta import TraceMeta
from ckptrace.core.output import OutputError, write_new, write_output
from ckptrace.core.stdio import PipeClosed
from ckptrace.core.stream import Recording
from ckptrace.core.terminal import printable
from ckptrace.probes.finish import finisher

if TYPE_CHECKING:
    from ckptrace.probes.drain import Drain

def fifo_writer(path: Path) -> int | None:
    """-o names a FIFO: a write end opened now without waiting (held until the trace is written,
    so its reader sees no end of file before it), or one line when nothing reads it: the write at
    the end would wait in open() for a reader, deaf to Ctrl-C, the recording done. None otherwise."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return None
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise TargetError(f"{printable(str(path))}: a FIFO that no process reads: start its reader "
                              "first (e.g. cat FIFO > trace.parquet), or give a file path") from None
        return None  # gone or not ours to open: check_output and the write say what is wrong


def _fifo_has_reader(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        return True
    except OSError:
        return False


def write_trace(path: Path, out: Recording, session: Drain, meta: TraceMeta,
                fifo: int | None = None) -> tuple[Path, str | None]:
    """The finished trace from the stream, in place of the stream (or rescued elsewhere). `fifo`:
    -o is a FIFO we hold open; its reader must still be there, else the trace is rescued (opening
    it would wait, the recording done, for a reader that may never come)."""
    write, n = finisher(out, session, meta)
    if fifo is not None and not _fifo_has_reader(path):
        written, failures = _rescue(write)
        gone = f"cannot write the trace {printable(str(path))}: its reader went away"
        if written is None:
            raise TargetError(f"{gone}; no copy could be saved either ({'; '.join(failures)}): "
                              f"the recording ({n} events) is lost")
        return written, gone
    return _write_or_rescue(path, write, n, own=out.identity)


def rescue_full(path: Path, out: Recording, session: Drain, meta: TraceMeta) -> tuple[Path | None, str]:
    """The disk filled while streaming: the stream at `path` stays (cut short, readable); the whole
    recording goes to a rescue folder if one has room. Returns the copy and the one-line error."""
    shown = printable(str(path))
    head = f"cannot write the trace {shown}: {session.full.strerror or 'write failed'}; recording stopped"
    write, n = finisher(out, session, meta)
    written, failures = _rescue(write)
    if written is None:
        return None, (f"{head}: {shown} holds the {session.rows} events written before, as a cut-short trace; "
                      f"the {session.dropped} after them are lost: no copy could be saved ({'; '.join(failures)})")
    return written, (f"{head}; the whole recording ({n} events) was saved to {written}; {shown} holds the "
                     f"first {session.rows}, as a cut-short trace")


def _write_or_rescue(path: Path, write, rows: int, own: tuple[int, int] | None = None) -> tuple[Path, str | None]:
    """Write the trace; if that fails (disk full, folder gone, another recorder writing at `path`
    now), write it where there is room. `own`: the stream it replaces (st_dev, st_ino). Returns
    where it went and why not to `path` (None when it did)."""
    try:
        return write_output(path, write, what="trace", own=own), None
    except OutputError as e:
        first = e
    except PipeClosed:  # -o /dev/stdout or a FIFO whose reader left: keep the recording
        first = OutputError(f"cannot write the trace {printable(str(path))}: its reader went away (broken pipe)")
    written, failures = _rescue(write)
    if written is None:
        raise TargetError(f"{first}; no copy could be saved either ({'; '.join(failures)}): "
                          f"the recording ({rows} events) is lost")
    return written, str(first)


def _rescue(write) -> tuple[Path | None, list[str]]:
    """The trace written into the first folder with room: its path, or None and each folder's failure."""
    failures = []
    for folder in dict.fromkeys([tempfile.gettempdir(), "/dev/shm", "/var/tmp", "/tmp"]):
        try:
            return write_new(folder, "ckptrace-rescued-", ".parquet", write, what="rescued trace"), failures
        except OutputError as e:
            failures.append(f"{folder}: {e.reason}")
    return None, failures
