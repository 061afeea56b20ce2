"""What `ckptrace symbols` prints: the plan as a table that fits 80 columns with the generation
matched and what each missing point costs, and the one line a missing required point ends with
(the names nearest to it, the generation it is nearest, whether stripping could explain it)."""
from __future__ import annotations

import difflib
import os
import textwrap
from typing import TYPE_CHECKING

from ckptrace.probes import cuda
from ckptrace.probes.elf_objects import ElfObject
from ckptrace.probes.points import POINT, Profile, has_point

if TYPE_CHECKING:  # the plan imports this module for its error line
    from ckptrace.probes.plan import ProbePlan


def missing_message(profile: Profile, agrees: bool, missing: list[str], found: set[str], objects: list[ElfObject],
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
    have = [r for r in profile.points if has_point(r, found)]
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
