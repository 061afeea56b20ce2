"""Files anyone may hand over, read as hostile input (issue 22): request files bounded before they
are parsed and with no key twice, a recording's stream whose batches claim more rows than its size
allows refused before they are decoded, and a mapped file whose name holds a newline.

Memory is judged by the command's peak RSS (a fresh parent's RUSAGE_CHILDREN): the CLI's own
imports take about 150 MiB here, so each bound below leaves room for them and for the bounded
work, and is far under what the unbounded read took before (given in each test).
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from pathlib import Path

import pytest

from ckptrace.core.requests_file import MAX_BYTES, MAX_REQUESTS, MAX_VALUES
from helpers import assert_one_line_error, ckptrace, ckptrace_peak

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
OFF1 = SAMPLES / "1-pool-off.parquet"


# --- request files --------------------------------------------------------------------------

def a_request(i: int) -> dict:
    return {"request": i, "client": 0, "prompt_tokens": 64, "start_unix_ns": 1, "start_ns": 10 ** 12 + i,
            "ttft_ns": 1000, "total_ns": 2000, "status": "ok", "predicted_tokens": 4}


def test_a_request_file_drive_writes_at_its_most_is_read(tmp_path):
    """drive --requests' most (100,000 requests) fits every bound: the bounds refuse no real file."""
    from ckptrace.core.requests_file import read_requests, requests_json
    import pandas as pd

    rows = [a_request(i) for i in range(MAX_REQUESTS)]
    for r in rows:  # the widest values drive writes
        r.update(start_unix_ns=(1 << 62) - 1, total_ns=(1 << 40), status="error: ConnectionResetError, again")
    f = tmp_path / "most.json"
    f.write_text(requests_json(pd.DataFrame(rows)))
    assert f.stat().st_size <= MAX_BYTES
    assert len(read_requests(f)) == MAX_REQUESTS


@pytest.mark.parametrize("doc,key", [
    ('[{"request": 0, "request": 1, "client": 0, "prompt_tokens": 1, "start_unix_ns": 1, "start_ns": 1, '
     '"ttft_ns": 1, "total_ns": 2, "status": "ok"}]', "request"),
    # the second status would win in json.loads: the file says two things
    ('[{"request": 0, "client": 0, "prompt_tokens": 1, "start_unix_ns": 1, "start_ns": 1, "ttft_ns": 1, '
     '"total_ns": 2, "status": "ok", "status": "error: x"}]', "status"),
    ('[{"request": 0, "client": 0, "prompt_tokens": 1, "start_unix_ns": 1, "start_ns": 1, "ttft_ns": 1, '
     '"total_ns": 2, "status": "ok", "extra": {"a": 1, "a": 2}}]', "a"),  # inside a field drive does not know
])
@pytest.mark.parametrize("how", ["analyze", "compare"])
def test_a_key_twice_in_an_object_is_one_line(tmp_path, doc, key, how):
    f = tmp_path / "twice.json"
    f.write_text(doc)
    args = (["analyze", OFF1, "--requests", f] if how == "analyze" else
            ["compare", OFF1, SAMPLES / "2-pool-on.parquet", "--requests", f, "--requests", "-"])
    assert_one_line_error(ckptrace(*args), f"holds the key {key!r} twice", code=1)


def test_a_file_past_the_byte_bound_is_refused_unread(tmp_path):
    f = tmp_path / "big.json"
    with open(f, "w") as out:
        out.write('[{"status": "')
        out.write("x" * MAX_BYTES)
        out.write('"}]')
    r, peak_kib = ckptrace_peak("analyze", OFF1, "--requests", f)
    assert_one_line_error(r, f"is too large for a request file (at most {MAX_BYTES >> 20} MiB)", code=1)
    assert peak_kib < 300 << 10


@pytest.mark.parametrize("shape", ["objects", "lists", "values", "keys"])
def test_a_small_file_of_many_values_is_refused_before_it_is_parsed(tmp_path, shape):
    """30 MiB of `{},` parsed took 915 MiB of peak RSS (a 256 MiB file, then allowed, would take
    about 6 GB); counted first, it is refused at about 260 MiB (the CLI's own 134 and the count)."""
    n = 30 << 20
    body = {"objects": b"{}," * (n // 3), "lists": b"[]," * (n // 3), "values": b"0," * (n // 2),
            "keys": b"{" + b"".join(b'"%x":0,' % i for i in range(n // 10)) + b'"z":0},'}[shape]
    f = tmp_path / "many.json"
    f.write_bytes(b"[" + body + b"{}]")
    r, peak_kib = ckptrace_peak("analyze", OFF1, "--requests", f)
    assert_one_line_error(r, "more than a request file holds", code=1)
    assert peak_kib < 400 << 10, peak_kib


@pytest.mark.parametrize("shape", ["objects", "keys", "floats"])
def test_at_the_count_bounds_parsing_costs_bounded_memory(tmp_path, shape):
    """The most a file may hold of each kind, parsed: a bounded cost (measured 226, 566 and 205
    MiB of peak RSS), and then one line for what is not a request."""
    per = MAX_VALUES // MAX_REQUESTS
    if shape == "objects":  # MAX_REQUESTS objects of `per` keys each: the most of both
        obj = "{" + ",".join(f'"k{j}":{j}' for j in range(per)) + "}"
        text = "[" + ",".join([obj] * MAX_REQUESTS) + "]"
    elif shape == "keys":  # one object of nearly MAX_VALUES distinct keys
        text = '[{' + ",".join(f'"{i:x}":0' for i in range(MAX_VALUES - 1)) + '}]'
    else:
        text = "[" + ",".join(["1.5"] * MAX_VALUES) + "]"
    f = tmp_path / "bounds.json"
    f.write_text(text)
    r, peak_kib = ckptrace_peak("analyze", OFF1, "--requests", f)
    assert_one_line_error(r, code=1)
    assert "more than a request file holds" not in r.stderr  # within the bounds: parsed, then refused
    assert peak_kib < 700 << 10, peak_kib


# --- a recording's stream: claims checked before a batch is decoded --------------------------

def stream_file(path: Path, rows: int = 0, kinds: pa.Array | None = None, level: int | None = None) -> Path:
    """A stream trace, as a killed recorder leaves, of `rows` copies of one real event in one batch
    (`kinds`: its kind column's dictionary instead), zstd-compressed as the recorder writes it."""
    from ckptrace.core.stream import IPC_OPTIONS
    from ckptrace.core.trace import read_trace, to_batch, trace_schema

    t = read_trace(OFF1)
    t.meta.complete = False
    schema = trace_schema(t.meta, pandas_attrs=False)
    one = to_batch(t.events.iloc[:1], schema.remove_metadata())
    if kinds is not None:
        field = one.schema.field("kind")
        one = one.set_column(0, field, pa.DictionaryArray.from_arrays(
            pa.array([0], field.type.index_type), kinds, ordered=field.type.ordered))
    batch = pa.Table.from_batches([one] * max(rows, 1)).combine_chunks().to_batches(max_chunksize=1 << 40)[0]
    options = IPC_OPTIONS if level is None else pa.ipc.IpcWriteOptions(
        compression=pa.Codec("zstd", compression_level=level))
    with pa.ipc.new_stream(path, schema, options=options) as w:
        w.write_batch(batch)
    return path


def test_a_small_stream_claiming_millions_of_rows_is_refused_before_its_batch_is_decoded(tmp_path):
    """4M events in one batch: 5 MiB of zstd stream. Decoded, then found too many, it took 717 MiB
    of peak RSS; counted from the batch's header first, it is refused at the CLI's own size."""
    f = stream_file(tmp_path / "bomb.parquet", rows=4_000_000)
    assert f.stat().st_size < 8 << 20
    for how in (["analyze", f], ["export", f, "-o", tmp_path / "out.pftrace"]):
        r, peak_kib = ckptrace_peak(*how)
        line = assert_one_line_error(r, "more than", "events in a stream of", "refused before decoding", code=1)
        assert "4000000" not in line  # said before the batch was read whole
        assert peak_kib < 300 << 10, (how[0], peak_kib)
    assert not (tmp_path / "out.pftrace").exists()


def test_a_stream_whose_dictionary_decompresses_to_gigabytes_is_refused_before_it_is_decoded(tmp_path):
    """The kind column's dictionary, 50M empty strings: 400 MB of offsets in 24 KB of zstd. Decoded,
    this file took 2035 MiB of peak RSS (and the line said a column had the wrong type)."""
    n = 50_000_000
    kinds = pa.LargeStringArray.from_buffers(n, pa.py_buffer(np.zeros(n + 1, np.int64)), pa.py_buffer(b""))
    f = stream_file(tmp_path / "dict-bomb.parquet", kinds=kinds, level=19)
    del kinds
    assert f.stat().st_size < 64 << 10
    r, peak_kib = ckptrace_peak("analyze", f)
    assert_one_line_error(r, "batches that decompress to more than 256 MiB", "refused before decoding", code=1)
    assert peak_kib < 300 << 10, peak_kib


@pytest.mark.parametrize("damage", ["negative rows", "buffer outside the body", "negative length"])
def test_a_damaged_batch_header_is_one_line(tmp_path, damage):
    """Batch headers edited in place (their flatbuffer fields found by the reader's own walk).
    Before, a batch claiming -5 rows or a buffer past its body was analyzed as if whole (exit 0)."""
    import struct

    from ckptrace.core import stream

    f = stream_file(tmp_path / "t.parquet", rows=10)
    data = bytearray(f.read_bytes())
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(bytes(data)))
    at = 0
    while True:  # the record batch message: 0xFFFFFFFF, its metadata length, the metadata, its body
        m = reader.read_next_message()
        if m.type == "record batch":
            break
        at += 8 + m.metadata.size + (m.body.size if m.body is not None else 0)
    meta_at = at + 8
    mv = memoryview(bytes(data[meta_at:meta_at + m.metadata.size]))
    batch = stream._field_table(mv, stream._field_table(mv, struct.unpack_from("<I", mv, 0)[0], 2), None)
    if damage == "negative rows":
        struct.pack_into("<q", data, meta_at + stream._field_pos(mv, batch, 0), -5)
    else:
        vec = stream._field_pos(mv, batch, 2)
        vec += struct.unpack_from("<I", mv, vec)[0]
        field = 0 if damage == "buffer outside the body" else 1
        struct.pack_into("<q", data, meta_at + vec + 4 + 8 * field + 16, 1 << 40 if field == 0 else -1)
    f.write_bytes(bytes(data))
    r = ckptrace("analyze", f)
    assert_one_line_error(r, "damaged", code=1)


# --- a mapped file whose name holds a newline --------------------------------------------------

# A folder name that /proc/PID/maps shows as `w\0127f00...` on one line: a newline, then what
# looks like a whole mapping line of its own.
NEWLINE_DIR = "w\n7f0000000000-7f0000001000 r-xp 00000000 fe:00 1 x"


@pytest.mark.ebpf
@pytest.mark.parametrize("lookalike", [False, True], ids=["newline", "newline-and-lookalike"])
def test_a_library_mapped_by_a_name_with_a_newline_is_traced_by_that_file(require_root_ebpf, workload,
                                                                         nobody_dir, lookalike):
    """User nobody runs the sample workload from a folder whose name holds a newline (its RUNPATH
    is $ORIGIN: every library it maps has that name too). record --pid traces every checkpoint
    its truth counts, from those very files. With `lookalike`, nobody also made the folder named
    as /proc/PID/maps shows the first (a backslash, 012), holding copies of the same libraries:
    the shown name reaches them, but they are other files (other inodes) and are never taken for
    the mapped ones. Before: the first case found no probe points (its libraries 'cannot be
    reached': one error line); the second resolved every probe point in the lookalike copies."""
    import shutil
    import subprocess

    from ckptrace.core.trace import read_trace
    from helpers import AS_NOBODY, go, recorder, started, truth_count

    folders = [nobody_dir / NEWLINE_DIR] + ([nobody_dir / NEWLINE_DIR.replace("\n", "\\012")] if lookalike else [])
    for d in folders:
        d.mkdir()
        for f in ("ckpt-workload", "libsample-server.so", "libsample-common.so", "libsample-llama.so"):
            shutil.copy2(Path(workload).with_name(f), d / f)
        subprocess.run(["chown", "-R", "65534:65534", d], check=True)
    truth = nobody_dir / "truth.jsonl"
    out = nobody_dir.parent / f"{nobody_dir.name}.parquet"
    ours = lambda objects: {o for o in objects if "libsample" in o or o.endswith("ckpt-workload")}  # noqa: E731
    try:
        with started([*AS_NOBODY, folders[0] / "ckpt-workload", "--wait-signal", "--truth", truth, "--iterations",
                      "3"], ready="ready pid=", cwd="/") as (w, _):
            maps = Path(f"/proc/{w.pid}/maps").read_text()
            assert "w\\0127f0000000000-7f0000001000 r-xp 00000000 fe:00 1 x/libsample-server.so" in maps
            s = ckptrace("symbols", "--pid", w.pid, "--json")
            assert s.returncode == 0, s.stderr
            objects = ours(p["object"] for p in json.loads(s.stdout)["points"])
            assert objects and all(o.startswith(f"{folders[0]}/") for o in objects), objects
            with recorder(out, "--pid", w.pid) as rec:
                go(w)
                assert w.wait(120) == 0
                assert rec.wait(120) == 0, rec.stderr.read()
        t = read_trace(out)
        assert (t.events["kind"] == "checkpoint").sum() == truth_count(truth) > 0
        objects = ours(o.path for o in t.meta.objects)
        assert len(objects) == 4 and all(o.startswith(f"{folders[0]}/") for o in objects), objects
    finally:
        out.unlink(missing_ok=True)
