"""A Parquet file's page headers, read without decompressing a page: what each page inflates to.

A column chunk's size in the footer is the writer's word; each page's own header says how many
bytes the reader allocates to decompress it (a few KiB of zstd can claim 2 GiB). So a reader that
must bound its memory before decoding walks the page headers of every chunk it will read: each
header is a Thrift compact-protocol struct (PageHeader, parquet.thrift), followed by its
compressed page. Only the three sizes are taken; every other field is skipped unparsed.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

HEADER_MAX = 64 << 10  # ckptrace's pages' headers are under 100 bytes; statistics can't hide a page here
_FIRST_READ = 256
_DEPTH_MAX = 16  # nested structs in a header (a data page header's statistics is 2 deep)


class PageError(ValueError):
    """A page header that can't be read, or pages that don't fill their column chunk."""


@dataclass
class ChunkPages:
    pages: int = 0
    uncompressed: int = 0  # the sum of the headers' uncompressed sizes: what decompressing allocates
    largest: int = 0  # the largest one page claims


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.depth = data, 0, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise EOFError
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise PageError("a varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise EOFError
        self.pos += n

    def value(self, t: int) -> None:
        """Skip one value of compact type `t`."""
        if t in (1, 2):  # a boolean field: its value is the type
            return
        if t == 3:
            self.skip(1)
        elif t in (4, 5, 6):
            self.varint()
        elif t == 7:
            self.skip(8)
        elif t == 8:
            self.skip(self.varint())
        elif t in (9, 10):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.value(3 if elem in (1, 2) else elem)  # booleans in a list are a byte each
        elif t == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.value(kv >> 4)
                    self.value(kv & 0x0F)
        elif t == 12:
            self.struct(None)
        else:
            raise PageError(f"Thrift type {t} in a page header")

    def struct(self, want: dict[int, int] | None) -> None:
        """Skip a struct, keeping the integer fields `want` names (field id -> value)."""
        self.depth += 1
        if self.depth > _DEPTH_MAX:
            raise PageError("a page header nested too deep")
        last = 0
        while True:
            head = self.byte()
            if head == 0:  # STOP
                self.depth -= 1
                return
            t, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            if want is not None and last in want and t == 5:
                want[last] = self.zigzag()
            else:
                self.value(t)


def page_header(source: pa.NativeFile, offset: int, limit: int) -> tuple[int, int, int]:
    """The page header at `offset` (not past `limit`): (its length, the compressed page's size,
    the page's uncompressed size)."""
    n = _FIRST_READ
    while True:
        data = source.read_at(min(n, limit - offset), offset)
        fields = {2: -1, 3: -1}
        r = _Reader(data)
        try:
            r.struct(fields)
        except EOFError:
            if len(data) >= min(HEADER_MAX, limit - offset):
                what = "runs past its column chunk" if len(data) < HEADER_MAX else f"is over {HEADER_MAX >> 10} KiB"
                raise PageError(f"a page header at byte {offset} {what}") from None
            n *= 4
            continue
        uncompressed, compressed = fields[2], fields[3]
        if uncompressed < 0 or compressed < 0:
            raise PageError(f"the page header at byte {offset} has no sizes, or negative ones")
        return r.pos, compressed, uncompressed


def chunk_pages(source: pa.NativeFile, column: pq.ColumnChunkMetaData, size: int) -> ChunkPages:
    """Every page of one column chunk, walked header to header over the bytes the footer gives it."""
    start = column.dictionary_page_offset if column.has_dictionary_page and column.dictionary_page_offset \
        else column.data_page_offset
    end = start + column.total_compressed_size
    if start < 4 or column.total_compressed_size < 0 or end > size:
        raise PageError(f"a column chunk at bytes {start}..{end} lies outside the {size}-byte file")
    out = ChunkPages()
    pos = start
    while pos < end:
        length, compressed, uncompressed = page_header(source, pos, end)
        pos += length + compressed
        out.pages += 1
        out.uncompressed += uncompressed
        out.largest = max(out.largest, uncompressed)
    if pos != end:
        raise PageError(f"the pages of a column chunk end at byte {pos}, not at {end} as the footer says")
    return out
