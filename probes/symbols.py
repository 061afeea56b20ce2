"""Find every probe point (object, vaddr, file offset, build-id) in a binary or a live process."""
from __future__ import annotations

import os
import shutil
import time

from ckptrace.core.errors import NotPermitted, SymbolError, TargetError
from ckptrace.core.terminal import printable
from ckptrace.probes.elf_objects import NotCode, read_object
from ckptrace.probes.elfsafe import BadObject
from ckptrace.probes.libraries import RESOLVE_S, Notes, is_map_link, maps_objects, objects_of_binary
from ckptrace.probes.plan import ProbePlan, build_plan
from ckptrace.probes.target import process_of, unreadable

__all__ = ["resolve_binary", "resolve_pid", "verify_with_bcc"]


def _locate(path: str) -> str:
    if not os.path.exists(path) and "/" not in path:
        found = shutil.which(path)
        if found:
            return os.path.abspath(found)
    return os.path.abspath(path)


def resolve_binary(path: str, note=None) -> ProbePlan:
    """Resolve every probe point in an executable and the libraries it needs (DT_NEEDED). A
    library that can't be read is left out, said through note(text) (a line to print)."""
    target = _locate(path)
    notes = Notes(note, time.monotonic() + RESOLVE_S)
    objects = objects_of_binary(target, notes)
    return build_plan(target, None, objects, notes)


def resolve_pid(pid: int, note=None) -> ProbePlan:
    """Resolve every probe point in the ELF objects a live process (or a thread's) has mapped.
    An object that can't be read is left out, said through note(text) (a line to print); the
    executable's own is the error."""
    pid, _ = process_of(pid)  # a kernel thread, a zombie, no such PID: one true line
    notes = Notes(note, time.monotonic() + RESOLVE_S)
    paths = maps_objects(pid, notes)
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
            objects.append(read_object(path, follow=is_map_link(path), deadline=notes.deadline))
        except NotCode:
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
    return build_plan(exe, pid, objects, notes)


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
