"""compare's guard rails on the legs themselves, before any figure: one line each.

- **The same recording twice is refused** (AnalysisError): the same file (same device and inode),
  or the same recording under another name (a copy, a relabelled rewrite): its metadata names the
  host, the wall-clock start, the CLOCK_MONOTONIC instant the probes went in and the process, which
  no two recordings share. A leg set against itself has no drift and no change by construction.
  A trace that records none of that (made by hand) is judged by its file alone.
- **Arms the labels or the order contradict** (a warning): compare takes the first leg's label as
  the baseline. When that label reads as a change (`on`, `new`, `after`, `candidate`, ...) and the
  other as its absence (`off`, `old`, `before`, `baseline`, ...), or the candidate has more legs than
  the baseline (B/A/A: A/B/A brackets the candidate with baseline legs), the arms may be swapped.
- **An unbracketed candidate** (a warning): with two or more baseline legs, every candidate leg ran
  after every baseline leg (A/A/B): a drift over time reads as the candidate's change. (With one
  baseline leg compare already says that drift can't be measured.)
- **Different programs or builds** (a warning): legs whose executables differ by name compare two
  programs, not one change; an arm whose legs' build-ids differ mixes builds. A candidate whose
  build differs from the baseline's is what a patch is, and is not warned.
"""
from __future__ import annotations

import os
import re

from ckptrace.core.errors import AnalysisError
from ckptrace.core.meta import TraceMeta
from ckptrace.core.terminal import printable, shown_label

# Words that make a label read as the change, or as its absence (whole words of the label).
CANDIDATE_WORDS = frozenset({"on", "new", "after", "candidate", "cand", "patched", "with", "fixed"})
BASELINE_WORDS = frozenset({"off", "old", "before", "baseline", "base", "unpatched", "without", "stock",
                            "control", "reference"})


def recording_id(meta: TraceMeta) -> tuple | None:
    """What names one recording whatever its file is called (None: the trace records none of it)."""
    if meta.attach_ns is None and meta.start_time is None:
        return None
    return (meta.host, meta.start_time, meta.attach_ns, meta.pid)


def _file_id(path: str | None) -> tuple[int, int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:  # an in-memory trace's name, or a stream already gone
        return None
    return (st.st_dev, st.st_ino)


def check_distinct(legs: list[tuple[str | None, TraceMeta]]) -> None:
    """Refuse a recording given twice: `legs` are (path, metadata) in run order."""
    seen_file: dict[tuple, int] = {}
    seen_rec: dict[tuple, int] = {}
    for j, (path, meta) in enumerate(legs):
        f = _file_id(path)
        rec = recording_id(meta)
        i, what = None, ""
        if f is not None and (f, meta.pid) in seen_file:
            i, what = seen_file[(f, meta.pid)], "file"
        elif rec is not None and rec in seen_rec:
            i, what = seen_rec[rec], "recording"
        if i is not None:
            detail = (f" (a copy: host {printable(meta.host or '?')}, started {printable(meta.start_time or '?')}, "
                      f"pid {meta.pid if meta.pid is not None else '?'})" if what == "recording" else "")
            raise AnalysisError(
                f"leg {j + 1} ({printable(path or meta.label)}) is the same {what} as leg {i + 1} "
                f"({printable(legs[i][0] or legs[i][1].label)}){detail}: a leg set against itself has no drift and "
                "no change by construction; give separate runs")
        if f is not None:
            seen_file[(f, meta.pid)] = j
        if rec is not None:
            seen_rec[rec] = j


def reads_as(label: str) -> int:
    """+1: the label reads as a change; -1: as its absence; 0: neither, or both."""
    words = set(re.split(r"[^a-z0-9]+", str(label).lower()))
    return int(bool(words & CANDIDATE_WORDS)) - int(bool(words & BASELINE_WORDS))


def executables(meta: TraceMeta) -> frozenset[str]:
    """The names of the programs a trace recorded (its processes', else its executable's)."""
    names = {os.path.basename(p.executable) for p in meta.processes if p.executable}
    if not names and meta.executable:
        names = {os.path.basename(meta.executable)}
    return frozenset(names)


def build_ids(meta: TraceMeta) -> tuple[str, ...]:
    return tuple(sorted({o.build_id for o in meta.objects if o.build_id}))


def _legs(idx: list[int]) -> str:
    return f"leg{'s' if len(idx) > 1 else ''} {', '.join(str(i + 1) for i in idx)}"


def leg_warnings(metas: list[TraceMeta], arms: list[str], baseline: str, candidate: str) -> list[str]:
    """The warnings of the module docstring, one line each; `arms` per leg in run order."""
    out = []
    b, c = shown_label(baseline), shown_label(candidate)
    base = [i for i, x in enumerate(arms) if x == "baseline"]
    cand = [i for i, x in enumerate(arms) if x == "candidate"]
    why = []
    if reads_as(baseline) > 0 > reads_as(candidate):
        why.append(f"the labels read the other way ({b} names a change, {c} its absence)")
    if len(cand) > len(base):
        why.append(f"the candidate has more legs than the baseline ({len(cand)} against {len(base)}; "
                   "A/B/A puts baseline legs around the candidate's)")
    if why:
        out.append(f"compare took {b} as the baseline (leg 1's label) and {c} as the candidate, but "
                   + " and ".join(why) + f": if {c} is the baseline, give the legs in run order starting with "
                   f"one of its legs ({c}/{b}/{c})")
    if len(base) >= 2 and min(cand) > max(base):
        many = len(cand) > 1
        out.append(f"the candidate's {_legs(cand)} {'all ' if many else ''}ran after the baseline's {_legs(base)}: "
                   f"nothing brackets {'them' if many else 'it'}, so a drift over time (the machine, its caches, other jobs) reads as the candidate's "
                   "change; record A/B/A, with a baseline leg after the candidate's")
    names = [executables(m) for m in metas]
    if len({n for n in names if n}) > 1:
        said = "; ".join(f"leg {i + 1} {', '.join(printable(x) for x in sorted(n))}" for i, n in enumerate(names) if n)
        out.append(f"the legs ran different executables ({said}): this compares two programs, not one change")
    for arm, idx in (("baseline", base), ("candidate", cand)):
        groups: dict[tuple, list[int]] = {}
        for i in idx:
            groups.setdefault(build_ids(metas[i]), []).append(i)
        if len(groups) > 1:
            said = " against ".join(_legs(g) for g in groups.values())
            out.append(f"{arm} legs were recorded from different builds (build-ids differ: {said}): "
                       + ("drift between them includes the build change" if arm == "baseline"
                          else "the candidate mixes builds, and its spread includes the build change"))
    return out
