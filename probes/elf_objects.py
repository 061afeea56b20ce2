"""One ELF object read (pyelftools, within elfsafe's bounds): its type, machine, build-id and
dynamic table, and the defined functions named like a probe point, found by scanning its symbol
table as arrays and demangling only the names that hold a point's needle."""
from __future__ import annotations

import re
from dataclasses import dataclass

import cxxfilt
import numpy as np
from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import NotPermitted, TargetError
from ckptrace.probes import cuda, elfsafe
from ckptrace.probes.elfsafe import BadObject
from ckptrace.probes.points import POINTS, ProbePoint


_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_BINDINGS = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "GNU_UNIQUE"}
# GCC clone suffixes that are not a function entry: .cold is the outlined unlikely path and
# .part.N the outlined body, both only reached from the real entry (which we probe).
_NOT_ENTRY_CLONES = ("cold", "part")
MAX_MATCHES = 1 << 16  # functions of one object named like a probe point (llama-server's: a few hundred)
MAX_OCCURRENCES = 1 << 20  # of the names' needles in one string table
_CHUNK = 1 << 16  # symbols scanned at once (the scan's temporaries stay a few MiB)


@dataclass
class ElfObject:
    path: str
    build_id: str
    elf_type: str
    klass: int
    machine: str
    needed: list[str]
    rpath: list[str]
    runpath: list[str]
    has_symtab: bool
    has_dynsym: bool
    found: list[tuple[str, ProbePoint]]  # (point name, probe point)
    sizes: dict[int, int]  # st_size of each point found, by address (update_tgt's: to disassemble it)
    candidates: set[str]  # demangled names of defined functions matching a hint
    machine_code: bytes = b""  # e_machine as the file has it (libraries must match the executable's)
    follow: bool = True  # whether its path may end in a symbolic link (a path from /proc/PID/maps may not)


class NotCode(TargetError):
    """An ELF file that holds no code to probe (ET_REL, a core file): a mapped one is passed over."""


def open_object(path: str, follow: bool = True, deadline: float | None = None):
    """(file, BoundedELF); TargetError or NotPermitted for a file that can't be opened at all,
    BadObject for one that is not a regular ELF file within elfsafe's bounds."""
    try:
        return elfsafe.open_elf(path, follow, deadline)
    except FileNotFoundError:
        raise TargetError(f"{path}: no such file; give the path of the program or library") from None
    except PermissionError:
        raise NotPermitted(f"cannot read {path}: run as root or make it readable") from None
    except OSError as e:
        raise BadObject(f"cannot be opened ({e.strerror or e})") from None


def main_object_error(path: str, e: BadObject) -> TargetError:
    """The executable itself unreadable: the one line the command ends with."""
    if isinstance(e, elfsafe.NotRegular):
        return TargetError(f"{path} is {e}: give the path of the program")
    if str(e) == elfsafe.NOT_ELF:
        return TargetError(f"{path} is not an ELF program or library")
    return TargetError(f"{path} is not an ELF program or library that can be read: {e}")


_MAX_NOTE_SOURCE = 1 << 16  # a note section or segment read for the build-id (real ones: bytes)


def _build_id(elf: ELFFile) -> str:
    # Notes live in SHT_NOTE sections; a file with its section headers removed still has PT_NOTE.
    sources = [s for s in elf.iter_sections() if s["sh_type"] == "SHT_NOTE" and s["sh_size"] <= _MAX_NOTE_SOURCE]
    if not sources:
        sources = [s for s in elf.iter_segments() if s["p_type"] == "PT_NOTE" and s["p_filesz"] <= _MAX_NOTE_SOURCE]
    for src in sources:
        for note in src.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                return str(note["n_desc"])
    return ""


def _dynamic(elf: ELFFile) -> tuple[list[str], list[str], list[str]]:
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    dyn = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNAMIC"), None)
    if dyn is None:
        dyn = next((s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"), None)
    if dyn is None:
        return needed, rpath, runpath
    size = dyn["sh_size"] if "sh_size" in dyn.header else dyn["p_filesz"]
    if size > elfsafe.MAX_TABLE:
        raise BadObject(f"its dynamic table claims {size} bytes: more than {elfsafe.MAX_TABLE // elfsafe.MiB} MiB")
    entries = size // elf.structs.Elf_Dyn.sizeof()
    for n, tag in enumerate(dyn.iter_tags()):
        if n >= entries:
            break  # no DT_NULL inside the table: what follows it is no tag
        t = tag.entry.d_tag
        if t == "DT_NEEDED":
            needed.append(tag.needed)
        elif t == "DT_RPATH":
            rpath += [p for p in tag.rpath.split(":") if p]
        elif t == "DT_RUNPATH":
            runpath += [p for p in tag.runpath.split(":") if p]
    return needed, rpath, runpath


def _sym_dtype(elf: ELFFile) -> np.dtype:
    order = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        fields = [("st_name", "u4"), ("st_info", "u1"), ("st_other", "u1"), ("st_shndx", "u2"),
                  ("st_value", "u8"), ("st_size", "u8")]
    else:
        fields = [("st_name", "u4"), ("st_value", "u4"), ("st_size", "u4"), ("st_info", "u1"),
                  ("st_other", "u1"), ("st_shndx", "u2")]
    return np.dtype([(n, order + t) for n, t in fields])


def defined_functions_matching(elf: ELFFile, section, needles: list[bytes]):
    """Yield (raw name, st_value, binding, st_size) of defined functions whose raw name holds a needle.

    pyelftools builds one Python object per symbol (about 25 us each: over a second for a 46k
    symbol .dynsym), so the table is scanned as numpy arrays, _CHUNK symbols at a time, and only
    names containing a needle are decoded. Every size is checked before it is read (elfsafe.table:
    a table claiming more than the file holds, or more than MAX_TABLE, is a BadObject), and the
    string table is indexed by the needles' occurrences only, never one entry per byte."""
    dt = _sym_dtype(elf)
    strtab = elfsafe.table(elf, elf.get_section(section["sh_link"]))
    data = elfsafe.table(elf, section, dt.itemsize)
    if not data or not strtab:
        return
    pos, first, end = _needle_strings(elf, strtab, needles)
    if not len(pos):
        return
    matches = 0
    for at in range(0, len(data), _CHUNK * dt.itemsize):
        elfsafe.check(elf)
        syms = np.frombuffer(data, dtype=dt, offset=at, count=min(_CHUNK, (len(data) - at) // dt.itemsize))
        typ = syms["st_info"] & 0xF
        off = syms["st_name"].astype(np.int64)
        # The first occurrence at or after the name's start, in the same string (no NUL between).
        j = np.minimum(np.searchsorted(pos, off), len(pos) - 1)
        keep = (((typ == _STT_FUNC) | (typ == _STT_GNU_IFUNC)) & (syms["st_shndx"] != 0)
                & (syms["st_value"] != 0) & (off < len(strtab)) & (pos[j] >= off) & (first[j] <= off)
                & (end[j] >= 0) & (end[j] - off <= elfsafe.MAX_NAME))
        hits = np.flatnonzero(keep)
        matches += len(hits)
        if matches > MAX_MATCHES:
            raise BadObject(f"more than {MAX_MATCHES} functions named like a probe point")
        for k in hits:
            raw = strtab[off[k]:end[j[k]]].decode("utf-8", "replace")
            yield (raw, int(syms["st_value"][k]), _BINDINGS.get(int(syms["st_info"][k]) >> 4, "OTHER"),
                   int(syms["st_size"][k]))


def _needle_strings(elf: ELFFile, strtab: bytes, needles: list[bytes]):
    """Sorted offsets of every occurrence of a needle in the string table, with the start of the
    string each lies in and that string's end (its NUL; -1: unterminated). Linear in the table."""
    found: set[int] = set()
    for needle in needles:
        i = strtab.find(needle)
        while i >= 0:
            found.add(i)
            if len(found) > MAX_OCCURRENCES:
                raise BadObject(f"its string table holds over {MAX_OCCURRENCES} names like a probe point's")
            i = strtab.find(needle, i + 1)
    pos = sorted(found)
    first, end = [0] * len(pos), [-1] * len(pos)
    prev, start = 0, 0
    for n, p in enumerate(pos):  # the last NUL between the previous occurrence and this one
        if n % 65536 == 0:
            elfsafe.check(elf)
        i = strtab.rfind(b"\0", prev, p)
        start = i + 1 if i >= 0 else start
        first[n], prev = start, p
    nxt, stop = len(strtab), -1
    for n in range(len(pos) - 1, -1, -1):  # the first NUL between this occurrence and the next
        i = strtab.find(b"\0", pos[n], nxt)
        stop = i if i >= 0 else stop
        end[n], nxt = stop, pos[n]
    return (np.asarray(pos, dtype=np.int64), np.asarray(first, dtype=np.int64),
            np.asarray(end, dtype=np.int64))


def demangle(raw: str) -> str:
    name = raw.split("@", 1)[0]  # symbol versions in static .symtab
    if not name.startswith("_Z"):
        return name
    try:
        return cxxfilt.demangle(name)
    except cxxfilt.InvalidName:
        return name


def qualified_name(demangled: str) -> str:
    """The function's qualified name: text before the parameter list, without a return type."""
    s = re.sub(r"\[abi:[^\]]*\]", "", demangled.split(" [clone ", 1)[0])  # libc++'s ABI tags
    s = s.replace("(anonymous namespace)", "\0")
    depth, cut, last_space = 0, len(s), -1
    for i, c in enumerate(s):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
        elif c == " " and depth == 0:
            last_space = i  # template functions demangle with their return type first
    return s[last_space + 1:cut].replace("\0", "(anonymous namespace)")


def read_object(path: str, follow: bool = True, deadline: float | None = None) -> ElfObject:
    """One object's probe points. TargetError/NotPermitted: it can't be opened; NotCode: an ELF
    file with no code; BadObject: anything else wrong with it, whatever the parser raised."""
    f, elf = open_object(path, follow, deadline)
    with f:
        try:
            return _object_of(path, elf, follow)
        except TargetError:
            raise
        except Exception as e:  # the file is the target's: what it makes the parser raise stays here
            raise elfsafe.unreadable(e) from None


def _machine_bytes(elf: ELFFile) -> bytes:
    elf.stream.seek(18)
    return elf.stream.read(2)


def _object_of(path: str, elf: ELFFile, follow: bool) -> ElfObject:
    etype = elf["e_type"]
    if etype not in ("ET_EXEC", "ET_DYN"):
        raise NotCode(f"{path} is an ELF {etype} file, not a program or shared library")
    build_id = _build_id(elf)
    needed, rpath, runpath = _dynamic(elf)
    symtab = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_SYMTAB"), None)
    dynsym = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM"), None)
    section = symtab if symtab is not None else dynsym
    obj = ElfObject(path, build_id, etype, elf.elfclass, elf["e_machine"], needed, rpath,
                  runpath, symtab is not None, dynsym is not None, [], {}, set(),
                  machine_code=_machine_bytes(elf), follow=follow)
    if section is None:
        return obj
    needles = sorted({p.needle for p in POINTS} | {h.encode() for p in POINTS for h in p.hints})
    gpu = cuda.is_library(path)  # the CUDA points are looked for in the CUDA libraries only
    if gpu:
        needles = sorted(set(needles) | {b"cuMem", b"cudaMem", b"cudaMalloc", b"Synchronize", b"cudaHost", b"cudaFreeHost"})
    seen: set[tuple[str, int]] = set()
    for raw, value, binding, size in defined_functions_matching(elf, section, needles):
        base, _, suffix = raw.partition(".")
        if suffix and any(part in _NOT_ENTRY_CLONES for part in suffix.split(".")):
            continue
        dem = demangle(raw)
        qual = qualified_name(dem)
        matched = False
        for p in POINTS:
            if qual != p.qualified or (p.name, value) in seen:
                continue
            if p.params and not dem.split(" [clone ", 1)[0].endswith(p.params):
                continue  # another overload (resize(n, value) is not the growth update_tgt calls)
            offset = elfsafe.file_offset(elf, value)
            if offset is None:
                continue
            seen.add((p.name, value))  # aliases at one address: one probe
            obj.found.append((p.name, ProbePoint(p.point, dem, raw, path, value, offset,
                                                 build_id, binding)))
            obj.sizes[value] = max(size, obj.sizes.get(value, 0))
            matched = True
        name = raw.split("@", 1)[0]
        if gpu and name in cuda.POINTS and (name, value) not in seen \
                and (offset := elfsafe.file_offset(elf, value)) is not None:
            seen.add((name, value))
            obj.found.append((name, ProbePoint(name, name, raw, path, value, offset, build_id, binding)))
            matched = True
        if not matched:
            obj.candidates.add(dem)
    return obj
