"""The trace while it is being recorded: an Arrow IPC stream at the `-o` path, appended as it goes.

A recorder writes one record batch per flush (every 0.5 s when there were events) into a file whose schema
carries the trace metadata with `complete: false`. The stream format needs no footer: a reader
takes every batch up to the last complete one, so whatever stops the recorder (SIGKILL, the OOM
killer, a crash) leaves a readable, cut-short trace. Each batch carries the kernel counters as of
its flush in its custom metadata, so the cut-short trace knows its lost events too. A clean stop
replaces the stream, batch by batch, with the finished Parquet trace (probes/finish.py).

Chosen by measurement (docs/design.md): appending a 50-row batch to a zstd IPC stream costs about
40 us of CPU; a Parquet segment of the same rows about 740 us, and a Parquet file is unreadable
until its footer is written.
"""
from __future__ import annotations

import io
import json
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ckptrace.core.errors import TraceFormatError
from ckptrace.core.meta import TraceMeta
from ckptrace.core.output import OutputError, create_in_place
from ckptrace.core.terminal import printable

if TYPE_CHECKING:  # a recorder writes its stream without pandas (core/columns.py)
    import pandas as pd

STREAM_MAGIC = b"\xff\xff\xff\xff"  # an IPC stream's first message starts with this continuation marker
PARQUET_MAGIC = b"PAR1"
PROGRESS_KEY = "ckptrace_progress"  # per batch: the kernel counters at its flush
CUT_SHORT = ("the recorder stopped before finishing the trace (killed, crashed or out of disk); "
             "this is what it had flushed")
IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def is_stream(path: str | os.PathLike) -> bool:
    """Whether the file at `path` starts like an Arrow IPC stream (a Parquet trace starts 'PAR1')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 4, 0) == STREAM_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


class Recording:
    """The stream a recorder writes: at `path` itself (a regular file, put there now by the safe
    writer's rules), or, where `path` is a FIFO, a terminal or stdout, an unnamed spool file that
    the finished trace is written from."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema):
        self.writer = StreamWriter(schema)
        head = self.writer.pending()
        fd = create_in_place(path, head, what="trace")  # the header is in before the name points at it
        self.in_place = fd is not None
        self.fd = fd if fd is not None else _spool()
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino) if self.in_place else None  # what the finished trace replaces
        try:
            self.writer.start(self.fd, written=len(head) if self.in_place else 0)
        except StreamFull as e:  # the spool's folder is full: say so before recording
            os.close(self.fd)
            raise OutputError(f"cannot write the trace's spool file in {tempfile.gettempdir()}: "
                              f"{e.strerror}", e.errno) from None

    def read(self) -> pa.ipc.RecordBatchStreamReader:
        """The stream as written so far, read from the open file (whatever happened to its name)."""
        return pa.ipc.open_stream(pa.OSFile(f"/proc/self/fd/{self.fd}"))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _spool() -> int:
    folder = tempfile.gettempdir()
    try:
        return os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        fd, name = tempfile.mkstemp(prefix="ckptrace-spool-", dir=folder)
        os.unlink(name)
        return fd


class StreamFull(OSError):
    """A batch could not be appended (disk full, I/O error); the file ends at the previous batch."""


class StreamWriter:
    """Appends record batches to an open file descriptor, each in one piece or not at all."""

    def __init__(self, schema: pa.Schema):
        self.fd = -1
        self.buf = io.BytesIO()
        self.writer = pa.ipc.new_stream(self.buf, schema, options=IPC_OPTIONS)
        # pyarrow writes the schema (and the kind/phase dictionaries) with the first batch: an
        # empty one now puts them in the file's header, so the file is a readable trace from the start.
        empty = schema.remove_metadata()  # (pa.nulls: pyarrow's from_pylist would load pandas)
        self.writer.write_batch(pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in empty], schema=empty))
        self.size = 0
        self.batches = 0

    def pending(self) -> bytes:
        """What is written but not yet out (the header, before start)."""
        return self.buf.getvalue()

    def start(self, fd: int, written: int) -> None:
        """Out to `fd` from now on; its first `written` bytes are what pending() gave."""
        self.fd = fd
        if written:
            self.size = written
            self.buf.seek(0)
            self.buf.truncate()
        else:
            self._out()

    def append(self, batch: pa.RecordBatch, progress: dict) -> None:
        self.writer.write_batch(batch, custom_metadata={PROGRESS_KEY: json.dumps(progress)})
        self._out()
        self.batches += 1

    def _out(self) -> None:
        data = memoryview(self.buf.getbuffer())
        try:
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError as e:
            # Cut the half-written batch off: the file stays a stream readable to its last batch.
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass  # a reader still stops at the last complete batch
            raise StreamFull(e.errno, e.strerror) from None
        finally:
            del data
            self.buf.seek(0)
            self.buf.truncate()
        self.size += done


def batches(reader: pa.ipc.RecordBatchStreamReader) -> Iterator[tuple[pa.RecordBatch, dict]]:
    """Each batch with its progress record (an ArrowException at a cut-off last batch)."""
    while True:
        try:
            batch, md = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return
        raw = md.get(PROGRESS_KEY.encode()) if md is not None else None
        try:
            progress = json.loads(raw) if raw else {}
        except ValueError:
            progress = {}
        yield batch, progress if isinstance(progress, dict) else {}


def open_stream(path: str | os.PathLike, source: pa.NativeFile) -> pa.ipc.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError) as e:
        raise TraceFormatError(f"{printable(path)}: a cut-short trace whose header is unreadable "
                               f"({_first_line(e)})") from None


def check_claims(path: str | os.PathLike, data: pa.Buffer, budget_rows: int, budget_bytes: int) -> None:
    """Before any batch of the stream in `data` is decoded: the rows its record batches claim and
    the bytes all its batches' buffers decompress to, summed, stay within the budgets. Read from
    each message's header (an Arrow flatbuffer) and the length prefix of each compressed buffer;
    nothing is decompressed. A few KiB of zstd can claim gigabytes of zeros."""
    shown = printable(path)
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    rows = size = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return
        except (pa.ArrowException, OSError):
            return  # a torn last message: the decoding pass reads up to it and says so
        if message.type not in ("record batch", "dictionary"):
            continue
        try:
            n, unpacked = _claims(message.metadata, message.body, message.type == "dictionary")
        except (struct.error, ValueError) as e:
            raise TraceFormatError(f"{shown}: a batch's header is damaged ({e})") from None
        rows, size = rows + n, size + unpacked
        if rows > budget_rows or size > budget_bytes:
            what = (f"more than {budget_rows} events" if rows > budget_rows else
                    f"batches that decompress to more than {budget_bytes >> 20} MiB")
            raise TraceFormatError(f"{shown}: {what} in a stream of {_size(path)}, refused before decoding: "
                                   "a damaged or hostile trace?")


def _claims(meta: pa.Buffer, body: pa.Buffer | None, dictionary: bool) -> tuple[int, int]:
    """(rows, bytes once decompressed) that a record batch or dictionary message claims.

    The Arrow format's Message.fbs: Message {version, header_type, header, bodyLength, ...};
    RecordBatch {length, nodes, buffers: [Buffer {offset, length}], compression};
    DictionaryBatch {id, data: RecordBatch, isDelta}. With compression, each buffer starts with
    its decompressed length as an int64 (-1: stored as it is)."""
    m = memoryview(meta)
    batch = _field_table(m, _field_table(m, struct.unpack_from("<I", m, 0)[0], 2), 1 if dictionary else None)
    rows = _field_scalar(m, batch, 0, "<q")
    compressed = _field_pos(m, batch, 3) is not None
    at = _field_pos(m, batch, 2)
    total = 0
    if at is not None:
        vec = at + struct.unpack_from("<I", m, at)[0]
        view = memoryview(body) if body is not None else memoryview(b"")
        for k in range(struct.unpack_from("<I", m, vec)[0]):
            offset, length = struct.unpack_from("<qq", m, vec + 4 + 16 * k)
            if offset < 0 or length < 0 or offset + length > len(view):
                raise ValueError("a buffer lies outside the message's body")
            raw = struct.unpack_from("<q", view, offset)[0] if compressed and length >= 8 else -1
            if raw < -1:
                raise ValueError("a negative decompressed length")
            total += length if raw == -1 else raw
    if rows < 0:
        raise ValueError("a negative row count")
    return (0 if dictionary else rows), total


def _field_pos(m: memoryview, table: int, field: int) -> int | None:
    """Where a flatbuffer table's field is (None: absent, its default), via the table's vtable."""
    vtable = table - struct.unpack_from("<i", m, table)[0]
    if 4 + 2 * field + 2 > struct.unpack_from("<H", m, vtable)[0]:
        return None
    off = struct.unpack_from("<H", m, vtable + 4 + 2 * field)[0]
    return table + off if off else None


def _field_scalar(m: memoryview, table: int, field: int, fmt: str) -> int:
    at = _field_pos(m, table, field)
    return 0 if at is None else struct.unpack_from(fmt, m, at)[0]


def _field_table(m: memoryview, table: int, field: int | None) -> int:
    """The table a field points to (field None: the table itself)."""
    if field is None:
        return table
    at = _field_pos(m, table, field)
    if at is None:
        raise ValueError("a batch message without its header")
    return at + struct.unpack_from("<I", m, at)[0]


def read_stream_table(path: str | os.PathLike, reader: pa.ipc.RecordBatchStreamReader, budget_rows: int
                      ) -> tuple[pa.Table, dict, str | None]:
    """Every complete batch of a stream trace as one table, the last batch's progress record, and
    a note when the end was cut off mid-batch (read up to the batch before it). check_claims has
    bounded what the batches claim before this decodes them; this bound is the second check."""
    got, progress, torn, rows = [], {}, None, 0
    it = batches(reader)
    while True:
        try:
            batch, prog = next(it)
        except StopIteration:
            break
        except (pa.ArrowException, OSError) as e:
            torn = f"a half-written last batch was dropped ({_first_line(e)})"
            break
        rows += batch.num_rows
        if rows > budget_rows:
            raise TraceFormatError(f"{printable(path)}: more than {budget_rows} events in a stream of "
                                   f"{_size(path)}: a damaged or hostile trace?")
        got.append(batch)
        progress = prog
    return pa.Table.from_batches(got, schema=reader.schema), progress, torn


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _size(path) -> str:
    try:
        return f"{Path(path).stat().st_size >> 10} KiB"
    except OSError:
        return "? KiB"


def cut_short_meta(meta: TraceMeta, progress: dict, torn: str | None, events: pd.DataFrame) -> TraceMeta:
    """A stream's metadata completed from its last progress record: counters as of the last flush."""
    meta.complete = False
    note = CUT_SHORT
    last = int(events["end_ns"].max()) if len(events) else None
    origin = meta.attach_ns or (int(events["start_ns"].min()) if len(events) else None)
    if last is not None and origin:
        note += f" ({(last - origin) / 1e9:.1f} s after the probes went in)"
    if torn:
        note += f"; {torn}"
    meta.cut_short = note
    for key in ("lost_events", "partial_spans", "abandoned_spans", "map_full", "threads_seen",
                "threads_pruned", "threads_peak"):
        value = progress.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 and hasattr(meta, key):
            setattr(meta, key, value)
    meta.events = int(len(events))
    meta.first_event_ns = int(events["start_ns"].min()) if len(events) else None
    if meta.stop_reason is None:
        meta.stop_reason = "cut short"
    return meta
