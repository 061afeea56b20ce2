"""Which ELF objects a target loads: a program's libraries as ld.so finds them (DT_NEEDED through
RPATH, LD_LIBRARY_PATH, RUNPATH, ld.so.cache, ld.so.conf, the default folders, for the program's
own architecture) and the ggml backends it dlopens, or the files a live process maps, each reached
by its device and inode; and the notes on the objects left out."""
from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass

from ckptrace.core.errors import NotPermitted, TargetError
from ckptrace.core.terminal import printable
from ckptrace.probes import elfsafe
from ckptrace.probes.elf_objects import ElfObject, main_object_error, read_object
from ckptrace.probes.elfsafe import BadObject
from ckptrace.probes.target import unreadable


# Every file a target maps is read, and any user's process maps what it likes: a file that can't be
# read within elfsafe's bounds is noted and left out, the rest searched (docs/security.md).
RESOLVE_S = 30.0  # all of one target's objects (the sample's 5 take 0.1 s); each one: elfsafe.TIME_S
MAX_NOTES = 8  # notes on objects not searched, then one line counting the rest


class Notes:
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


def _origin(obj: ElfObject, is_exe: bool) -> str:
    # ld.so takes the executable's origin from /proc/self/exe (symlinks resolved) and a
    # library's from the path it was loaded by.
    return os.path.dirname(os.path.realpath(obj.path) if is_exe else os.path.abspath(obj.path))


def _find_library(name: str, loader: ElfObject, exe: ElfObject, loader_is_exe: bool,
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


def _not_found(loader: str, exe: ElfObject, n: int) -> str:
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


def objects_of_binary(path: str, notes: Notes) -> list[ElfObject]:
    try:
        exe = read_object(path, deadline=notes.deadline)
    except BadObject as e:
        raise main_object_error(path, e) from None
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
            obj = read_object(real, follow=False, deadline=notes.deadline)  # realpath: no link left
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
# The files a live process maps


def maps_objects(pid: int, notes: Notes) -> list[str]:
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


def is_map_link(path: str) -> bool:
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
        f, _ = elfsafe.open_regular(chosen, follow=is_map_link(chosen))
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
