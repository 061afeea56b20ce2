"""Reading an ELF file that a traced process maps: hostile input, every size checked before it is read.

`record --pid`, `serve --comm` and `symbols --pid` read each ELF file the target maps, and a
process maps whatever its user likes (a file of theirs, mapped as data). So a file is opened only
when it is a regular file (O_PATH first, fstat, then reopened through /proc/self/fd: no FIFO or
device is ever opened, not even for a moment), and pyelftools (the parser) reads it through a
stream that refuses what no real program needs: counts and sizes past the file's end or above
the bounds below, more than MAX_READ bytes in all, longer than TIME_S. What goes wrong is a
BadObject for that one file, never an exception out of the parser (docs/security.md).
"""
from __future__ import annotations

import io
import os
import stat
import time

from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import TargetError

MiB = 1 << 20
# A real llama-server's largest table is about 1 MiB (libllama-common's .strtab); the bounds
# leave a hundred times that, and keep what a hostile file can make us hold to a few of them.
MAX_SECTIONS = 1 << 14  # linked programs have a few dozen
MAX_SEGMENTS = 1 << 12  # and about a dozen program headers
MAX_TABLE = 128 * MiB  # one symbol, string, relocation or dynamic table, or one read
MAX_CODE = 16 * MiB  # one function disassembled (update_tgt is a few KiB)
MAX_READ = 512 * MiB  # everything read of one file
MAX_NAME = 16 << 10  # a symbol name longer than this is not decoded
TIME_S = 10.0  # reading one file (the sample's libraries take milliseconds)
_SHF_COMPRESSED = 0x800


class BadObject(TargetError):
    """One file that can't be read as an ELF program or library: str() says what is wrong (one
    line, without the file's name: the caller names it)."""


class NotRegular(BadObject):
    """A FIFO, device, socket, directory or (not followed) symbolic link: never opened."""

    def __init__(self, mode: int, what: str = "not a regular file"):
        super().__init__(f"{kind(mode)}, {what}")
        self.mode = mode

    @property
    def device(self) -> bool:
        return stat.S_ISCHR(self.mode) or stat.S_ISBLK(self.mode)


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, follow: bool = True) -> tuple[io.BufferedReader, os.stat_result]:
    """The file at `path` opened for reading, and its fstat, only when it is a regular file.

    O_PATH opens nothing (a FIFO's open would block, a device's has side effects); the regular
    file it names is then reopened through /proc/self/fd, which reaches that same inode however
    the path changes meanwhile. follow=False: a symbolic link as the last component is refused
    (a path the kernel gave, /proc/PID/maps, has none). OSError (ENOENT, EACCES...) as open's;
    BadObject for anything but a regular file."""
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    pfd = os.open(path, flags)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(st.st_mode)
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except FileNotFoundError:  # no /proc here: open the path itself, never blocking, and check again
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
                         | (0 if follow else os.O_NOFOLLOW))
    finally:
        os.close(pfd)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise NotRegular(now.st_mode, "not the regular file it was a moment before")
        return os.fdopen(fd, "rb"), now
    except BaseException:
        os.close(fd)
        raise


class Stream:
    """A read-only file as pyelftools reads it (seek, tell, read), bounded: the file's size is
    its size when opened (what it grows by later is not read), one read is at most MAX_TABLE
    bytes, all reads together at most MAX_READ, and none starts after the deadline."""

    def __init__(self, f: io.BufferedReader, size: int, deadline: float):
        self.f, self.size, self.deadline = f, size, deadline
        self.pos, self.left = 0, MAX_READ
        self.limit_s = max(0.0, deadline - time.monotonic())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise BadObject(f"not read in the {self.limit_s:.3g} s it was given")

    def read(self, n: int | None = -1) -> bytes:
        self.check()
        avail = max(0, self.size - self.pos)
        n = avail if n is None or n < 0 else min(n, avail)
        if n > MAX_TABLE:
            raise BadObject(f"a read of {n} bytes at offset {self.pos:#x}: more than {MAX_TABLE // MiB} MiB")
        self.left -= n
        if self.left < 0:
            raise BadObject(f"more than {MAX_READ // MiB} MiB of it read")
        self.f.seek(self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data


def check(elf) -> None:
    """Past the deadline: BadObject (a plain ELFFile has none)."""
    c = getattr(elf.stream, "check", None)
    if c is not None:
        c()


class BoundedELF(ELFFile):
    """pyelftools' ELFFile whose section and program headers are read once, each checked against
    the file's size and the bounds above before anything they point at is read; iter_sections,
    get_section and iter_segments serve those checked headers."""

    def __init__(self, stream: Stream):
        super().__init__(stream)
        size = stream.size
        shsize, phsize = self.structs.Elf_Shdr.sizeof(), self.structs.Elf_Phdr.sizeof()
        self._headers: list = []
        self._sections: list = []
        self._segments: list = []
        if self["e_shoff"]:
            if self["e_shentsize"] != shsize:
                raise BadObject(f"section headers of {self['e_shentsize']} bytes, not {shsize}")
            if self["e_shoff"] + shsize > size:
                raise BadObject(f"its section headers at offset {self['e_shoff']:#x} start past the end "
                                f"of the file ({size} bytes)")
            n = super().num_sections()  # e_shnum, or (0: more than 0xff00) section 0's sh_size
            if n > MAX_SECTIONS:
                raise BadObject(f"it claims {n} sections (at most {MAX_SECTIONS} are read)")
            if self["e_shoff"] + n * shsize > size:
                raise BadObject(f"its {n} section headers at offset {self['e_shoff']:#x} end past the end "
                                f"of the file ({size} bytes)")
            for i in range(n):
                h = super()._get_section_header(i)
                if (h["sh_type"] not in ("SHT_NOBITS", "SHT_NULL") and h["sh_size"]
                        and h["sh_offset"] + h["sh_size"] > size):
                    raise BadObject(f"section {i} ({h['sh_type']}) at offset {h['sh_offset']:#x}, "
                                    f"{h['sh_size']} bytes, ends past the end of the file ({size} bytes)")
                self._headers.append(h)
            if n:
                k = self.get_shstrndx()
                if not 0 <= k < n or self._headers[k]["sh_type"] != "SHT_STRTAB":
                    raise BadObject(f"its section names' table (section {k}) is not a string table")
                names = self._headers[k]["sh_size"]
                for i, h in enumerate(self._headers):
                    if h["sh_name"] >= max(names, 1):
                        raise BadObject(f"section {i}'s name at {h['sh_name']:#x} lies past its names' table "
                                        f"({names} bytes)")
            self._sections = [self._make_section(h) for h in self._headers]  # names read, bounded
        if self["e_phoff"] or self["e_phnum"]:
            if self["e_phentsize"] != phsize:
                raise BadObject(f"program headers of {self['e_phentsize']} bytes, not {phsize}")
            n = super().num_segments()  # e_phnum, or (PN_XNUM) section 0's sh_info
            if n > MAX_SEGMENTS:
                raise BadObject(f"it claims {n} program headers (at most {MAX_SEGMENTS} are read)")
            if self["e_phoff"] + n * phsize > size:
                raise BadObject(f"its {n} program headers at offset {self['e_phoff']:#x} end past the end "
                                f"of the file ({size} bytes)")
            headers = [self._get_segment_header(i) for i in range(n)]
            for i, h in enumerate(headers):
                if h["p_filesz"] and h["p_offset"] + h["p_filesz"] > size:
                    raise BadObject(f"program header {i} ({h['p_type']}) at offset {h['p_offset']:#x}, "
                                    f"{h['p_filesz']} bytes, ends past the end of the file ({size} bytes)")
            self._segments = [self._make_segment(h) for h in headers]

    # pyelftools reaches headers only through these: each answers from the checked lists.
    def num_sections(self) -> int:
        return len(self._headers)

    def get_section(self, n: int, type=None):
        if not isinstance(n, int) or not 0 <= n < len(self._headers):
            raise BadObject(f"a link to section {n}, of {len(self._headers)}")
        if len(self._sections) <= n:  # while the sections are being made (a link to a later one)
            return super().get_section(n, type)
        s = self._sections[n]
        if type and s["sh_type"] not in type:
            raise BadObject(f"section {n} is {s['sh_type']}, expected {', '.join(type)}")
        return s

    def _get_section_header(self, n: int):
        if self._headers and not 0 <= n < len(self._headers):
            raise BadObject(f"a link to section {n}, of {len(self._headers)}")
        return self._headers[n] if n < len(self._headers) else super()._get_section_header(n)

    def iter_sections(self, type: str | None = None):
        for s in self._sections:
            if type is None or s["sh_type"] == type:
                yield s

    def num_segments(self) -> int:
        return len(self._segments)

    def get_segment(self, n: int):
        return self._segments[n]

    def iter_segments(self, type: str | None = None):
        for s in self._segments:
            if type is None or s["p_type"] == type:
                yield s


NOT_ELF = "not an ELF file"


def open_elf(path: str, follow: bool = True, deadline: float | None = None) -> tuple[io.BufferedReader, ELFFile]:
    """(the open file, a BoundedELF reading it, which stops at `deadline` or TIME_S from now,
    whichever is sooner); OSError from the open, BadObject for a file that is not a regular file
    or not an ELF file these bounds admit. The caller closes the file."""
    f, st = open_regular(path, follow)
    try:
        head = f.read(20)
        if len(head) < 4 or head[:4] != b"\x7fELF":
            raise BadObject(NOT_ELF)
        if len(head) < 20 or head[4] not in (1, 2) or head[5] not in (1, 2):
            raise BadObject("not an ELF file (an unknown class or byte order)")
        need = 64 if head[4] == 2 else 52
        if st.st_size < need:
            raise BadObject(f"truncated: {st.st_size} bytes, less than an ELF header ({need})")
        until = time.monotonic() + TIME_S
        return f, BoundedELF(Stream(f, st.st_size, until if deadline is None else min(until, deadline)))
    except BadObject:
        f.close()
        raise
    except Exception as e:  # whatever the parser raises on a file it can't read
        f.close()
        raise unreadable(e) from None


def unreadable(e: Exception) -> BadObject:
    if isinstance(e, BadObject):
        return e
    if isinstance(e, MemoryError):
        return BadObject("it needs more memory than there is to read")
    text = str(e).strip().splitlines()
    return BadObject(f"not readable as ELF ({type(e).__name__}{': ' + text[0][:200] if text else ''})")


def table(elf, section, entsize: int | None = None) -> bytes:
    """A section's bytes, read whole once they are known to be in the file, uncompressed and at
    most MAX_TABLE bytes (and, given entsize, a whole number of entries of that size)."""
    size, off = section["sh_size"], section["sh_offset"]
    name = section.name or f"a {section['sh_type']} section"
    if section["sh_type"] == "SHT_NOBITS" or not size:
        return b""
    if section["sh_flags"] & _SHF_COMPRESSED:
        raise BadObject(f"{name} is compressed (a table never is)")
    if entsize is not None and (section["sh_entsize"] != entsize or size % entsize):
        raise BadObject(f"{name}: {size} bytes of {section['sh_entsize']}-byte entries, not of {entsize}")
    if size > MAX_TABLE:
        raise BadObject(f"{name} claims {size} bytes: more than the {MAX_TABLE // MiB} MiB a table may have")
    if off + size > elf.stream_len:
        raise BadObject(f"{name} at offset {off:#x}, {size} bytes, ends past the end of the file "
                        f"({elf.stream_len} bytes)")
    elf.stream.seek(off)
    data = elf.stream.read(size)
    if len(data) != size:
        raise BadObject(f"{name}: {len(data)} of its {size} bytes read (the file shrank?)")
    return data


def file_offset(elf, vaddr: int) -> int | None:
    """The file offset of `vaddr` in an executable PT_LOAD (None: not mapped code). Only executable
    segments: a uprobe on anything else never fires (bcc refuses them too)."""
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD" or not seg["p_flags"] & 1:
            continue
        if seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_memsz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    return None


def read_code(elf, vaddr: int, size: int) -> bytes | None:
    """`size` bytes at `vaddr` from the executable PT_LOAD holding them (None: not mapped code, or
    the file shorter than its segment says). A function whose symbol claims more than MAX_CODE
    bytes is a hostile file's: BadObject."""
    if size > MAX_CODE:
        raise BadObject(f"a function at {vaddr:#x} claims {size} bytes: more than {MAX_CODE // MiB} MiB of code")
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD" or not seg["p_flags"] & 1:
            continue
        lo = seg["p_vaddr"]
        if lo <= vaddr and vaddr + size <= lo + seg["p_filesz"]:
            elf.stream.seek(vaddr - lo + seg["p_offset"])
            data = elf.stream.read(size)
            return data if len(data) == size else None
    return None
