"""The probe plan: the points of the generation a target matches, found in its objects (the
memset and state-copy call sites where a function is inlined), what is missing and what that costs."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import NotPermitted, SymbolError, TargetError
from ckptrace.core.meta import ObjectInfo, ProfileInfo  # the trace records these as they are
from ckptrace.probes import callsites, cuda, elfsafe
from ckptrace.probes.elf_objects import ElfObject, defined_functions_matching, open_object, qualified_name
from ckptrace.probes.libraries import RESOLVE_S, Notes
from ckptrace.probes.points import (CALL_POINTS, CALL_SITE_FILL, FILL_POINTS, GROWTH_POINTS, ITERATION_POINTS,
                                    NO_DISASSEMBLER_NOTE, NO_FILL_NOTE, NO_ITERATION_NOTE, POINT, POINTS, PROFILE,
                                    SAVE_POINTS, ProbePoint, Profile, cost_of, probed_points, profile_info, rank)
from ckptrace.probes.symbols_text import missing_message


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


def _fill_call_points(obj: ElfObject, profile: Profile) -> list[ProbePoint]:
    """The memset calls in this object's fill sites (update_tgt/update_dft; ik's create_checkpoint):
    fill_call at each call, fill_call_end at the instruction after it (the ends first: attached
    before the calls they close). Read where the growth is inlined or not the fill at all."""
    owners = [pp for name, pp in obj.found if name in profile.fill_sites]
    return _call_points(obj, owners, callsites.FILL_CALLEES, CALL_POINTS)


def _save_call_points(obj: ElfObject, profile: Profile) -> list[ProbePoint]:
    """The state copies of a prompt save inlined into the profile's save caller (get_available_slot):
    save_call at each call to its state copy there, save_call_end after it. None where the save is
    a call."""
    owners = [pp for name, pp in obj.found if name == profile.save_caller]
    return _call_points(obj, owners, (profile.save_callee,), SAVE_POINTS)


def _call_points(obj: ElfObject, owners: list[ProbePoint], callees: tuple[str, ...],
                 names: tuple[str, str]) -> list[ProbePoint]:
    if not owners:
        return []
    f, elf = open_object(obj.path, obj.follow)
    with f:
        try:
            return _call_points_in(elf, obj, owners, callees, names) if callsites.supported(elf) else []
        except (TargetError, ModuleNotFoundError):  # no capstone: said by the caller
            raise
        except Exception as e:  # changed since it was read, or code capstone can't take: contained
            raise elfsafe.unreadable(e) from None


def _call_points_in(elf: ELFFile, obj: ElfObject, owners: list[ProbePoint], callees: tuple[str, ...],
                    names: tuple[str, str]) -> list[ProbePoint]:
    section = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_SYMTAB"), None) or \
        next(s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM")
    funcs = {value: raw.split("@", 1)[0] for raw, value, _, _ in
             defined_functions_matching(elf, section, [c.encode() for c in callees])
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


def _contained(notes: Notes, objects: list[ElfObject], read) -> list[ProbePoint]:
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


def build_plan(target: str, pid: int | None, objects: list[ElfObject], notes: Notes | None = None) -> ProbePlan:
    notes = notes or Notes(None, time.monotonic() + RESOLVE_S)
    plan = ProbePlan(target=target, pid=pid, objects=[ObjectInfo(o.path, o.build_id) for o in objects])
    found = {name for o in objects for name, _ in o.found if name not in cuda.POINTS}
    profile, agrees = rank(found)
    probed = probed_points(profile, found)
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
    plan.profile = profile_info(profile, agrees, found)
    missing_required = [r for r in profile.required if r not in found]
    if missing_required:
        raise SymbolError(missing_message(profile, agrees, missing_required, found, objects, pid, len(notes.items)))
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
