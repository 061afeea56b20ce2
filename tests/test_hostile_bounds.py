"""Every reader bounded and no output taking a planted file's mode (issue 39, the third hostile pass):
Parquet pages that inflate past the memory bound (with an honest footer or a lying one), a footer
length no trace has, metadata lists no recorder writes, and an output replacing a setuid file of
another user's.

Memory is judged by the command's peak RSS (helpers.ckptrace_peak): the CLI's own imports take
about 150 MiB here; each bound leaves room for them and is far under what the read took before.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import AS_NOBODY, assert_one_line_error, ckptrace, ckptrace_peak, why_nobody_cannot_run_ckptrace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
OFF1 = SAMPLES / "1-pool-off.parquet"
BOMB = 300 << 20  # past the 256 MiB floor of the memory bound, whatever the file's size


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- Parquet pages: what each page inflates to, from its own header -----------------------------

def _page_bomb(path: Path) -> Path:
    """The sample trace whose `phase` column is plain text with one value of BOMB bytes: one data
    page of a few KiB of zstd that inflates to 300 MiB (an honest footer says so too)."""
    table = pq.read_table(OFF1)
    phase = table.column("phase").cast(pa.string()).to_pylist()
    phase[0] = "x" * BOMB
    i = table.schema.get_field_index("phase")
    table = table.set_column(i, "phase", pa.array(phase, pa.large_string()))
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    del table, phase
    return path


def _footer_claim(path: Path, column: str) -> int:
    md = pq.read_metadata(path)
    j = md.schema.names.index(column)
    return md.row_group(0).column(j).total_uncompressed_size


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _lie_in_footer(path: Path, column: str, claim: int) -> None:
    """Rewrite the footer's total_uncompressed_size of `column` (one row group) to `claim`, an
    integer of the same encoded length (Thrift compact: a zigzag varint), in place."""
    honest = _footer_claim(path, column)
    old, new = _varint(honest << 1), _varint(claim << 1)
    assert len(old) == len(new)
    data = bytearray(path.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    at = data.find(old, start)
    assert at > 0 and data.find(old, at + 1) < 0  # the one place it is said
    data[at:at + len(old)] = new
    path.write_bytes(bytes(data))
    assert _footer_claim(path, column) == claim


@pytest.fixture(scope="module")
def page_bomb(tmp_path_factory) -> Path:
    path = _page_bomb(tmp_path_factory.mktemp("bomb") / "page-bomb.parquet")
    assert path.stat().st_size < 1 << 20
    assert _footer_claim(path, "phase") > BOMB
    return path


def test_one_page_inflating_past_the_bound_is_refused_before_it_is_decoded(page_bomb):
    """The page header says 300 MiB: refused before pyarrow allocates it (the footer says so too)."""
    r, peak_kib = ckptrace_peak("analyze", page_bomb)
    line = assert_one_line_error(r, "its pages inflate to 300 MiB, column phase's to 300 MiB",
                                 "a damaged or hostile trace?")
    assert "events would take about" in line
    assert peak_kib < 260 << 10  # the CLI's imports, not the page


def test_a_footer_lying_about_a_page_bomb_is_not_believed(page_bomb, tmp_path):
    """The footer says the column is 128 MiB (under the bound); the page's own header says 300 MiB,
    and that is what decompressing it would allocate."""
    liar = tmp_path / "liar.parquet"
    liar.write_bytes(page_bomb.read_bytes())
    _lie_in_footer(liar, "phase", (1 << 27) + 1)
    r, peak_kib = ckptrace_peak("analyze", liar)
    assert_one_line_error(r, "column phase's to 300 MiB", "a damaged or hostile trace?")
    assert peak_kib < 260 << 10


def test_the_page_walk_reads_a_real_trace_and_refuses_a_chunk_that_does_not_add_up(tmp_path):
    from ckptrace.core import pages

    md = pq.read_metadata(OFF1)
    with pa.OSFile(str(OFF1)) as f:
        for j in range(md.num_columns):
            chunk = md.row_group(0).column(j)
            found = pages.chunk_pages(f, chunk, OFF1.stat().st_size)
            # the footer's size is the pages' plus their headers'
            assert 1 <= found.pages and 0 < found.uncompressed < chunk.total_uncompressed_size
    # the last column chunk one byte shorter than its pages: the walk says so, one line
    data = bytearray(OFF1.read_bytes())
    last = md.row_group(0).column(md.num_columns - 1)
    old, new = _varint(last.total_compressed_size << 1), _varint((last.total_compressed_size - 1) << 1)
    assert len(old) == len(new)
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    positions = [i for i in range(start, len(data)) if data.startswith(old, i)]
    bad = tmp_path / "short.parquet"
    for at in positions:  # the total_compressed_size of the last chunk (ColumnMetaData field 7)
        trial = data[:at] + new + data[at + len(new):]
        bad.write_bytes(bytes(trial))
        if pq.read_metadata(bad).row_group(0).column(md.num_columns - 1).total_compressed_size == \
                last.total_compressed_size - 1:
            break
    else:
        pytest.fail("the chunk's size was not found in the footer")
    assert_one_line_error(ckptrace("analyze", bad), "trace is damaged (column", "not at")


def test_a_sparse_file_with_a_lying_footer_length_is_refused_unread(tmp_path):
    """2.2 GB claimed by the footer length of a sparse 2.3 GB file: pyarrow read it whole before."""
    path = tmp_path / "sparse.parquet"
    claim = 2_200_000_000
    with open(path, "wb") as f:
        f.write(b"PAR1")
        f.seek(2_300_000_000)
        f.write(claim.to_bytes(4, "little") + b"PAR1")
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse: nothing stored
    r, peak_kib = ckptrace_peak("analyze", path)
    assert_one_line_error(r, f"its Parquet footer claims {claim} bytes, over the 64 MiB a trace has")
    assert peak_kib < 260 << 10
    # and one claiming more than the file holds
    small = tmp_path / "small.parquet"
    small.write_bytes(b"PAR1" + b"\0" * 100 + (1000).to_bytes(4, "little") + b"PAR1")
    assert_one_line_error(ckptrace("analyze", small), "footer claims 1000 bytes, more than the file holds")


# --- metadata: lists bounded, a key twice and negative counts refused ----------------------------

def _with_meta(path: Path, raw: bytes) -> Path:
    table = pq.read_table(OFF1)
    md = dict(table.schema.metadata)
    md[b"ckptrace"] = raw
    pq.write_table(table.replace_schema_metadata(md), path)
    return path


def _sample_meta() -> dict:
    return json.loads(pq.read_schema(OFF1).metadata[b"ckptrace"])


def test_metadata_listing_20000_processes_is_refused_at_once(tmp_path):
    """20,000 processes took about 1 GB and 90 s to analyse; a recording follows at most 64."""
    meta = _sample_meta()
    meta["processes"] = [{"pid": 1000 + i, "label": f"p{i}", "comm": "w"} for i in range(20_000)]
    path = _with_meta(tmp_path / "procs.parquet", json.dumps(meta).encode())
    r, peak_kib = ckptrace_peak("analyze", path, timeout=60)
    assert_one_line_error(r, "metadata.processes lists 20000 items, more than the 64 a trace has")
    assert peak_kib < 260 << 10


def test_metadata_past_its_byte_bound_is_refused_unparsed(tmp_path):
    from ckptrace.core.meta import JSON_MAX

    meta = _sample_meta()
    meta["padding"] = "x" * JSON_MAX  # a key this version does not know: kept, so bounded by length
    path = _with_meta(tmp_path / "long.parquet", json.dumps(meta).encode())
    assert_one_line_error(ckptrace("analyze", path), f"over the {JSON_MAX >> 20} MiB a trace has")


def test_rows_of_more_processes_than_a_recording_follows_are_refused(tmp_path):
    """No metadata entry, but 200 distinct pids in the rows: each would be analysed apart."""
    table = pq.read_table(OFF1)
    pids = pa.array([1000 + i % 200 for i in range(table.num_rows)], pa.int32())
    at = table.schema.get_field_index("pid")
    table = table.set_column(at, "pid", pids) if at >= 0 else table.append_column("pid", pids)
    meta = _sample_meta()
    meta["processes"] = []
    md = dict(table.schema.metadata)
    md[b"ckptrace"] = json.dumps(meta).encode()
    path = tmp_path / "pids.parquet"
    pq.write_table(table.replace_schema_metadata(md), path)
    assert_one_line_error(ckptrace("analyze", path), "processes; a recording follows at most 64")


@pytest.mark.parametrize("case", ["key twice", "key twice inside", "lost negative", "partial negative",
                                  "open spans negative"])
def test_a_key_twice_or_a_negative_count_in_metadata_is_one_line(tmp_path, case):
    meta = _sample_meta()
    if case.startswith("key twice"):
        body = json.dumps(meta)[1:-1]
        raw = ("{" + body + ', "lost_events": 5}' if case == "key twice"
               else "{" + body.replace('"open_at_stop": {', '"open_at_stop": {"checkpoints": 9, ', 1) + "}")
        needle = "twice"
    else:
        field = {"lost negative": "lost_events", "partial negative": "partial_spans"}.get(case)
        if field:
            meta[field] = -3
        else:
            meta["open_at_stop"] = {"checkpoints": -1, "iterations": 0}
        raw, needle = json.dumps(meta), "is -" + ("1" if field is None else "3") + ", below 0"
    path = _with_meta(tmp_path / "m.parquet", raw.encode())
    assert_one_line_error(ckptrace("analyze", path), needle)


# --- outputs: the mode comes from the umask, never from the file replaced -----------------------

@pytest.fixture()
def planted(nobody_dir):
    """A file of user nobody's, mode 6777 (setuid, setgid, writable by all), where root will write."""
    if os.geteuid() != 0:
        pytest.skip("needs root (root writes over another user's file)")
    why = why_nobody_cannot_run_ckptrace()
    if why:
        pytest.skip(why)
    path = nobody_dir / "out.html"
    subprocess.run([*AS_NOBODY, "sh", "-c", f"echo planted > '{path}' && chmod 6777 '{path}'"], check=True)
    st = path.stat()
    assert st.st_uid == 65534 and stat.S_IMODE(st.st_mode) == 0o6777
    return path


@pytest.mark.parametrize("how", ["dashboard -o", "export -o", "write_output"])
def test_root_s_output_never_takes_the_mode_of_a_file_it_replaces(planted, how):
    if how == "write_output":
        from ckptrace.core.output import write_output

        write_output(planted, lambda f: f.write(b"ours\n"))
    elif how == "export -o":
        r = ckptrace("export", OFF1, "--format", "chrome", "-o", planted)
        assert r.returncode == 0, r.stderr
    else:
        r = ckptrace("dashboard", OFF1, "-o", planted)
        assert r.returncode == 0, r.stderr
    st = planted.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o666 & ~_umask()  # no setuid, no setgid
    # nobody can no longer rewrite it
    r = subprocess.run([*AS_NOBODY, "sh", "-c", f"echo rewritten-by-nobody > '{planted}'"], capture_output=True, text=True)
    assert r.returncode != 0 and b"rewritten-by-nobody" not in planted.read_bytes()


# --- the low ones: a clear line or the right word ------------------------------------------------

def test_an_output_name_of_255_bytes_is_written_and_one_of_256_is_one_line(tmp_path):
    """The temp name beside the output was the name plus 18 bytes: a legal 255-byte name failed
    with ENAMETOOLONG. A name no filesystem takes is one line."""
    name = "é" * 125 + ".json"  # 255 bytes in UTF-8
    r = ckptrace("export", OFF1, "-o", tmp_path / name)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert_one_line_error(ckptrace("export", OFF1, "-o", tmp_path / ("a" + name)), "File name too long")


def test_a_nul_byte_in_a_path_is_one_line():
    import ckptrace
    from ckptrace.core.errors import CkptraceError
    from ckptrace.core.output import write_output

    for path in ("\x00", "a\x00b"):
        with pytest.raises(CkptraceError, match=r"not a file name \(it holds a NUL byte\)"):
            ckptrace.open(path)
        with pytest.raises(CkptraceError, match=r"not a file name \(it holds a NUL byte\)"):
            write_output(path, lambda f: None)


@pytest.mark.parametrize("mode", ["launch", "attach"])
def test_partial_spans_of_a_launched_target_are_not_said_to_be_from_before_recording(tmp_path, mode):
    """A launched command is held before exec until the probes are in: nothing it entered was missed,
    so a return without its entry is not 'cut off at attach'."""
    meta = _sample_meta()
    meta.update(mode=mode, partial_spans=3)
    r = ckptrace("analyze", _with_meta(tmp_path / "p.parquet", json.dumps(meta).encode()), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    reliability = summary["reliability"]
    assert summary["partial_spans"] == 3
    if mode == "launch":
        assert "3 partial spans (a return seen without its entry) were dropped" in reliability
        assert "cut off at attach" not in reliability
    else:
        assert "3 spans were cut off at attach or stop and dropped (3 partial" in reliability
