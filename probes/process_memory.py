"""What a process may hold: its resident memory, its cgroup's memory limit, and the host's memory.

A pool whose byte cap is a fraction of host memory (llama.cpp PR #201: 1/16 of
sysconf(_SC_PHYS_PAGES)) does not look at the container's limit: a 4 GiB pod on a 256 GiB host
could pool 16 GiB. The recorder stores these readings in the trace (core/meta.py
ProcessMemory, TraceMeta.host_memory_bytes) so `whatif`, `analyze` and `compare` can say when
pooled bytes plus RSS would come near the limit.

The limit is the smallest one set on the way from the process's cgroup up to its hierarchy's
root, since a parent's limit binds its children: cgroup v2's `memory.max`, or where the memory
controller sits on a v1 hierarchy, `memory.limit_in_bytes` ("max", or v1's page-rounded
LONG_MAX, is no limit). The hierarchy is found through /proc/self/mountinfo, so a cgroup
namespace's or a hybrid layout's mount point is the one read.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ckptrace.core.meta import INT_LIMIT, ProcessMemory

PROC = Path("/proc")
V1_UNLIMITED = INT_LIMIT  # v1 writes "no limit" as LONG_MAX rounded down to a page


def host_memory_bytes() -> int | None:
    """Physical memory as sysconf reports it (what the pool's cap reads), None if unknown."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def read_process_memory(pid: int) -> ProcessMemory | None:
    """The process's RSS, peak RSS and cgroup memory limit now; None when it has gone."""
    try:
        status = (PROC / str(pid) / "status").read_text()
        groups = (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    kib = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM") and value.strip().endswith("kB"):
            kib[key] = int(value.split()[0]) * 1024
    mem = ProcessMemory(rss_bytes=kib.get("VmRSS"), rss_peak_bytes=kib.get("VmHWM"), read_ns=time.monotonic_ns())
    where = memory_cgroup(groups, mounts())
    if where is not None:
        version, path, point, root = where
        mem.cgroup, mem.cgroup_version = path, version
        found = smallest_limit(point, root, path, version)
        if found is not None:
            mem.limit_bytes, mem.limit_from = found
    return mem


def mounts() -> list[tuple[str, str, str, str]]:
    """(root within the filesystem, mount point, fstype, super options) of each mount we see."""
    out = []
    try:
        text = (PROC / "self" / "mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or sep < 5:
            continue
        out.append((_unescape(fields[3]), _unescape(fields[4]), fields[sep + 1], fields[sep + 3]))
    return out


def memory_cgroup(groups: str, mounted: list[tuple[str, str, str, str]]) -> tuple[int, str, Path, str] | None:
    """(version, cgroup path, its hierarchy's mount point, the mount's root within the hierarchy)
    of the hierarchy with the memory controller: a v1 hierarchy listing `memory`, else the v2
    one if its root offers `memory`."""
    lines = [ln.split(":", 2) for ln in groups.splitlines() if ln.count(":") >= 2]
    for hid, controllers, path in lines:
        if hid != "0" and "memory" in controllers.split(","):
            for root, point, fstype, opts in mounted:
                if fstype == "cgroup" and "memory" in opts.split(","):
                    return 1, path, Path(point), root
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":
            for root, point, fstype, _ in mounted:
                if fstype == "cgroup2" and "memory" in _read(Path(point) / "cgroup.controllers").split():
                    return 2, path, Path(point), root
    return None


def smallest_limit(point: Path, root: str, path: str, version: int) -> tuple[int, str] | None:
    """(bytes, "FILE of PATH") of the smallest limit from cgroup `path` up to the top of what
    the mount at `point` (the hierarchy's `root`) shows; None when none is set."""
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    top = "" if root == "/" else root.rstrip("/")
    if top and not (path == top or path.startswith(top + "/")):
        return None  # outside what this mount shows
    parts = [p for p in path[len(top):].split("/") if p]
    best = None
    for depth in range(len(parts), -1, -1):
        value = _read(point.joinpath(*parts[:depth]) / name).strip()
        # 0 (no memory at all) is left out as a reader of the trace takes a limit of 1 byte or more
        if value.isdigit() and 0 < int(value) < V1_UNLIMITED and (best is None or int(value) < best[0]):
            best = (int(value), f"{name} of {top + ''.join('/' + p for p in parts[:depth]) or '/'}")
    return best


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (a space is \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
