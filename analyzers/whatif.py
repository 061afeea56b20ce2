"""What would a pool do? Replay one pool-off recording's checkpoint buffers against a pool policy.

A pool-off recording holds every checkpoint buffer's life: the `mmap` inside the checkpoint's fill
that made it (its size, its address), the `munmap` that returned it, and what the fill cost (on
CPU, wall, page faults). A pool changes only where a buffer comes from and where it goes, so each
process's buffers are replayed in time order against the policy:

- **get**: a checkpoint whose fill mapped a buffer asks the pool for one of its size (`bytes`, the
  state size: what the vector holds). A *hit* (best fit: the smallest pooled buffer at least that
  large, llama.cpp PR #201's rule; `fit="exact"`: only one of exactly that size, as ckptrace's
  sample llama-server patch) saves the fill and its faults: the hit costs what a measured hit
  costs (the recording's checkpoints that mapped no buffer: the median of their fills, 0 when it
  has none, as a hit's resize has nothing to fill). A *miss* keeps its measured cost.
- **put**: the munmap that returned a checkpoint's buffer hands it to the pool instead (PR #201
  pools a checkpoint's buffers when it is destroyed). The pool declines a buffer below the size
  floor or above the byte cap; when full (count cap, or byte cap with it) it displaces its
  smallest buffers, and only ones smaller than the incoming buffer, else declines without
  displacing anything (`evict="none"`: a full pool declines). A buffer a checkpoint's own growth
  returned (an munmap inside its fill) is put back only when that checkpoint's get hit (PR #201:
  "the caller's undersized buffer is offered back"); on a miss the growth frees it.
- **trim**: when the process has been idle `trim_idle_ns` (no update_slots call, else no
  checkpoint; the server's task loop trims after a second with nothing to do), everything pooled
  is freed. A process that exited takes its pool with it ("released at exit"). Trims on
  out-of-memory recovery are not predicted (a recording shows no failed allocation).

Memory: predicted held bytes = the recording's held bytes (analyzers/memory.py) + what the pool
keeps mapped that the recording had returned; predicted RSS likewise from the `rss` rows. Pooled
bytes count as the pool counts them (vector sizes, what its caps compare); pooled *mapped* bytes
are the pages it keeps (a mapping is the size plus glibc's page).

Not seen, so not replayed: a checkpoint buffer glibc served from its heap (no mmap: at most its
mmap threshold, below the 32 MiB floor), buffers mapped before an attach. Among pooled buffers
of one size, which one a get takes changes no count or pooled byte (only held bytes, when their
mappings differ).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from array import array
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ckptrace.core.errors import AnalysisError
from ckptrace.core.meta import ProcessInfo, TraceMeta
from ckptrace.core.terminal import printable
from ckptrace.core.units import MIB

from .memory import BUFFER_PHASES, held_series, rss_series
from .requests import overlap

FITS = ("best", "exact")
EVICTIONS = ("smallest", "none")
MMAP_THRESHOLD_MAX = 32 * MIB  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on LP64: larger always maps
SECOND = 1_000_000_000


@dataclass(frozen=True)
class Policy:
    """A pool's rules. `cap` is bytes (an int) or a fraction of host memory (a float in (0, 1])."""
    cap: int | float = 1 / 16
    count: int = 64
    floor: int = 32 * MIB
    evict: str = "smallest"
    trim_idle_ns: int | None = SECOND  # None: never trimmed when idle
    fit: str = "best"
    name: str = "pr201"

    def cap_bytes(self, host_memory: int | None, where: str = "the trace") -> int:
        """The byte cap in bytes; a fraction needs the host's memory, recorded in the trace."""
        if isinstance(self.cap, int):
            return self.cap
        if host_memory is None:
            raise AnalysisError(f"{where} does not record the host's memory (recorded before ckptrace kept it), "
                                f"so a byte cap of {self.cap:g} of it is unknown: give --cap-bytes in bytes")
        return int(host_memory * self.cap)

    def describe(self, cap_bytes: int | None = None) -> str:
        """One line: the rules as given."""
        cap = (f"{fraction_text(self.cap)} of host memory" if isinstance(self.cap, float) else mib_text(self.cap))
        if cap_bytes is not None and isinstance(self.cap, float):
            cap += f" ({mib_text(cap_bytes)})"
        trim = "never" if self.trim_idle_ns is None else f"after {self.trim_idle_ns / SECOND:g} s idle"
        return (f"byte cap {cap}, count cap {self.count}, floor {mib_text(self.floor)}, "
                f"{'displace the smallest smaller buffers when full' if self.evict == 'smallest' else 'decline when full'}, "
                f"{'best fit' if self.fit == 'best' else 'exact size'}, trim {trim}")


# llama.cpp PR #201's pool as its review left it, which the sample pool-on builds run
# (samples/workload/common.cpp, samples/llama-server/pool.patch): 1/16 of sysconf's physical
# memory, 64 buffers, a 32 MiB floor (glibc's largest mmap threshold), smallest-first displacement
# of smaller buffers only, trim after a second idle.
POLICIES = {"pr201": Policy()}
SWEEPABLE = {"cap-bytes": "cap", "count": "count", "floor": "floor", "trim-idle": "trim_idle_ns"}


def fraction_text(f: float) -> str:
    inv = 1 / f
    return f"1/{inv:.0f}" if abs(inv - round(inv)) < 1e-9 and inv >= 2 else f"{f:g}"


def mib_text(b: int | float | None) -> str:
    if b is None:
        return "-"
    if abs(b) >= 1 << 30:
        return f"{b / (1 << 30):.2f} GiB"
    return f"{b / MIB:.1f} MiB"


# --- what the recording holds -----------------------------------------------------------------

@dataclass
class ReplayInput:
    """One process's buffers as the recording saw them, independent of any policy."""
    pid: int
    label: str
    gets: pd.DataFrame  # one row per checkpoint that mapped a buffer (GET_COLUMNS)
    releases: pd.DataFrame  # [t_ns, seq, get, how]: each buffer's end: put / own (its growth) / free
    trims_at: dict[int | None, np.ndarray]  # trim_idle_ns -> trim times (filled on demand)
    activity: np.ndarray  # [[start, end], ...] of idle-ending spans, sorted by start
    end_ns: int  # the process's exit (exited) or the recording's stop
    exited: bool
    held_off: pd.DataFrame  # [t_ns, held_bytes]
    rss_off: pd.DataFrame  # [t_ns, rss_bytes]
    hit_cost: dict  # cpu_ns, ns, faults of a hit (measured, or 0)
    hit_cost_source: str
    no_buffer: int  # checkpoints that mapped no buffer (not gets)
    reused: int  # of those, not speculative and above the mmap threshold: a pool's hits (a pool-on recording)
    host_memory: int | None
    memory: object | None  # ProcessMemory
    fill_cpu_recorded: bool


GET_COLUMNS = {"t_ns": "int64", "seq": "int64", "ckpt": "int64", "bytes": "int64", "mapped": "int64",
               "draft": "bool", "fill_cpu_ns": "Int64", "fill_ns": "int64", "fill_faults": "int64",
               "fill_start_ns": "int64"}


def replay_input(analysis, info: ProcessInfo | None = None, first_fills: pd.Series | None = None) -> ReplayInput:
    """The policy-free part of a replay, from one process's analysis (analyzers.analyze_trace or
    analyze_processes): its checkpoints, its kept memory rows and iterations, its metadata
    (`first_fills`: ckpt -> its first fill's start, where the analysis read the file batch by batch)."""
    meta: TraceMeta = analysis.trace.meta
    info = info or (meta.processes[0] if meta.processes else ProcessInfo(pid=meta.pid or 0))
    ck = analysis.checkpoints
    # Only the columns read, in time order: a copy of the whole memory group or checkpoint table
    # per buffer cost more than the replay (whatif at 10M events: issue 39).
    mem = analysis.rows.of_group("memory")
    kind, phase = _labels(mem["kind"]), _labels(mem["phase"])
    order = np.lexsort((np.arange(len(mem)), np.where(kind == "munmap", mem["start_ns"], mem["end_ns"])))
    kind, phase = kind[order], phase[order]
    t = np.where(kind == "munmap", mem["start_ns"].to_numpy()[order], mem["end_ns"].to_numpy()[order])
    ckpt = mem["ckpt"].to_numpy()[order]
    nbytes = mem["bytes"].to_numpy("int64")[order]
    addr = mem["addr"].to_numpy("uint64")[order]
    old = {c: mem[c].to_numpy(dtype)[order] for c, dtype in (("old_addr", "uint64"), ("old_bytes", "int64"))
           if c in mem}

    # Each checkpoint's buffer: its largest mapping made in its fill (or its own span).
    buffer = (kind == "mmap") & np.isin(phase, ["fill", "checkpoint"]) & (ckpt != 0)
    by_ckpt = ck[["ckpt", "bytes", "draft", "fill_cpu_ns", "fill_ns", "fill_faults", "start_ns"]].set_index("ckpt")
    rows = np.flatnonzero(buffer & np.isin(ckpt, by_ckpt.index.to_numpy()))
    if len(rows):
        cand = pd.DataFrame({"row": rows, "ckpt": ckpt[rows], "mapped": nbytes[rows]})
        rows = cand.sort_values(["ckpt", "mapped", "row"], ascending=[True, False, True]
                                ).drop_duplicates("ckpt")["row"].sort_values().to_numpy()
    c = by_ckpt.loc[ckpt[rows]]
    fill_start = _fill_starts(analysis, by_ckpt["start_ns"], ckpt[rows], first_fills)
    state = c["bytes"].to_numpy("int64")
    gets = pd.DataFrame({
        "t_ns": t[rows], "seq": rows, "ckpt": ckpt[rows],
        "bytes": np.where(state > 0, state, np.maximum(nbytes[rows] - 4096, 1)), "mapped": nbytes[rows],
        "draft": c["draft"].to_numpy(bool), "fill_cpu_ns": pd.array(c["fill_cpu_ns"].array, dtype="Int64"),
        "fill_ns": c["fill_ns"].to_numpy("int64"), "fill_faults": c["fill_faults"].to_numpy("int64"),
        "fill_start_ns": fill_start}).astype(GET_COLUMNS)
    del c, by_ckpt
    releases = _lifetimes(kind, phase, t, ckpt, addr, nbytes, old, rows)

    others = ck[~ck["ckpt"].isin(gets["ckpt"])]
    # A checkpoint above glibc's largest mmap threshold that mapped nothing reused a buffer it had
    # (or a pool's): a measured hit. Smaller ones may have come from the heap: not hits.
    large = others[others["bytes"] > MMAP_THRESHOLD_MAX]
    hit_cost, source = _hit_cost(large)
    iters = analysis.iterations
    # On the codes: astype(str) made a string per iteration (about 60 bytes each, issue 39).
    slots = iters[(iters["boundary"] == "update_slots").to_numpy()] if len(iters) else iters
    spans = slots if len(slots) else ck
    activity = np.column_stack([spans["start_ns"].to_numpy("int64"), spans["end_ns"].to_numpy("int64")]) \
        if len(spans) else np.zeros((0, 2), "int64")
    activity = activity[np.argsort(activity[:, 0], kind="stable")]
    exited = info.exited_ns is not None
    end = info.exited_ns if exited else (meta.stop_ns or int(max(t.max() if len(t) else 0,
                                                                  activity[:, 1].max() if len(activity) else 0)))
    held = held_series(analysis.rows.of_group("memory"))
    held = held[held["pid"] == info.pid] if held["pid"].nunique() > 1 else held
    rss = rss_series(analysis.rows.of_group("memory"))
    rss = rss[rss["pid"] == info.pid] if rss["pid"].nunique() > 1 else rss
    return ReplayInput(
        pid=info.pid, label=info.label or analysis.trace.label, gets=gets, releases=releases, trims_at={},
        activity=activity, end_ns=int(end), exited=exited,
        held_off=held[["t_ns", "held_bytes"]].reset_index(drop=True),
        rss_off=rss[["t_ns", "rss_bytes"]].reset_index(drop=True),
        hit_cost=hit_cost, hit_cost_source=source, no_buffer=int(len(others)),
        reused=int((~large["spec"].to_numpy(bool)).sum()),
        host_memory=meta.host_memory_bytes, memory=info.memory,
        fill_cpu_recorded=bool(len(gets) == 0 or gets["fill_cpu_ns"].notna().all()))


def _labels(column: pd.Series) -> np.ndarray:
    """A column as str objects, as astype(str) gives them; a categorical's rows share its
    categories' strings (astype(str) made one per row: about 60 bytes each)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).to_numpy()
    names = np.array([str(c) for c in column.cat.categories] + [np.nan], dtype=object)
    return names[column.cat.codes.to_numpy()]  # code -1 (NA): the last, NaN as astype(str) leaves it


def _fill_starts(analysis, starts: pd.Series, ckpts: np.ndarray, first: pd.Series | None = None) -> np.ndarray:
    """Each checkpoint's first fill start (its own start, `starts` by ckpt, where no fill row is at hand)."""
    out = starts.loc[ckpts].to_numpy("int64", copy=True)
    ev = analysis.trace.events
    if first is None and ev is not None and len(ckpts):
        first = first_fill_starts(ev.loc[(ev["kind"] == "fill").to_numpy(), ["ckpt", "start_ns"]])
    if first is not None and len(ckpts):
        known = np.isin(ckpts, first.index.to_numpy())
        out[known] = first.loc[ckpts[known]].to_numpy("int64")
    return out


def first_fill_starts(fills: pd.DataFrame) -> pd.Series:
    """ckpt -> the earliest start of its fill rows."""
    return fills.groupby("ckpt")["start_ns"].min()


def _lifetimes(kind, phase, t, ckpt, addr, nbytes, old: dict, gets: np.ndarray) -> pd.DataFrame:
    """How each get's buffer ended, walking the rows in time order: an munmap of exactly its range
    is a put (or, inside a checkpoint's fill, its growth returning its old storage: "own"), any other
    munmap, mapping or move over part of it frees it ("free"). A buffer alive at the end has no row."""
    is_get = np.zeros(len(kind), bool)
    is_get[gets] = True  # gets: row numbers, ascending (their index: searchsorted)
    lo = int(addr[gets].min()) if len(gets) else 0
    hi = int((addr[gets] + nbytes[gets].astype("uint64")).max()) if len(gets) else 0
    old_addr = old.get("old_addr", np.zeros(len(kind), "uint64"))
    old_bytes = old.get("old_bytes", np.zeros(len(kind), "int64"))
    live: dict[int, tuple[int, int]] = {}  # start -> (end, get index)
    # A column each, 8 bytes a row: a tuple of ints per release was about 200 (issue 39).
    out_t, out_seq, out_get, out_grower = (array("q") for _ in range(4))
    out_how: list[str] = []

    def release(ts: int, i: int, g: int, how: str, grower: int) -> None:
        out_t.append(ts)
        out_seq.append(i)
        out_get.append(g)
        out_how.append(how)
        out_grower.append(grower)
    # Only rows that can touch a buffer's range are walked (a long recording maps much else); a
    # buffer moved by mremap may land anywhere an mremap put something (as memory.py's walk).
    end = addr + nbytes.astype("uint64")
    remap = kind == "mremap"
    if remap.any() and len(gets):
        lo, hi = min(lo, int(addr[remap].min())), max(hi, int(end[remap].max()))
    near = np.isin(kind, ["mmap", "munmap", "mremap"]) & (end > lo) & (addr < hi)
    near |= (kind == "mremap") & (old_addr + old_bytes.astype("uint64") > lo) & (old_addr < hi)
    near[gets] = True
    for i in np.flatnonzero(near):
        a, b = int(addr[i]), int(addr[i]) + int(nbytes[i])
        k = kind[i]
        if k == "mmap" and is_get[i]:
            for s in [s for s, (e, _) in live.items() if s < b and e > a]:  # placed over one: gone
                release(int(t[i]), int(i), live.pop(s)[1], "free", 0)
            live[a] = (b, int(np.searchsorted(gets, i)))
            continue
        if k == "mremap" and old_addr[i]:
            oa, ob = int(old_addr[i]), int(old_addr[i]) + int(old_bytes[i])
            if oa in live and live[oa][0] == ob:  # a buffer moved or resized whole: still the same buffer
                live[a] = (b, live.pop(oa)[1])
                continue
            a, b = min(a, oa), max(b, ob)
        if b <= lo or a >= hi or not live:
            continue
        hit = [s for s, (e, _) in live.items() if s < b and e > a]
        for s in hit:
            e, g = live.pop(s)
            whole = k == "munmap" and s == a and e == b
            how = ("own" if phase[i] == "fill" else "put") if whole else "free"
            release(int(t[i]), int(i), g, how, int(ckpt[i]) if how == "own" else 0)
    return pd.DataFrame({"t_ns": np.array(out_t, "int64"), "seq": np.array(out_seq, "int64"),
                         "get": np.array(out_get, "int64"), "how": np.array(out_how, dtype=object),
                         "grower": np.array(out_grower, "int64")}).astype(
        {"t_ns": "int64", "seq": "int64", "get": "int64", "how": "object", "grower": "int64"})


def _hit_cost(no_buffer: pd.DataFrame) -> tuple[dict, str]:
    """What a hit costs: the median fill of the checkpoints above the mmap threshold that mapped no
    buffer (a hit, or the checkpoint's own buffer), 0 when the recording has none (a hit's resize
    has nothing to fill)."""
    if not len(no_buffer):
        return {"cpu_ns": 0, "ns": 0, "faults": 0}, "no hit in the recording to measure: a hit's resize has nothing to fill"
    cpu = no_buffer["fill_cpu_ns"].dropna()
    return ({"cpu_ns": int(np.median(cpu)) if len(cpu) else 0, "ns": int(np.median(no_buffer["fill_ns"])),
             "faults": int(np.median(no_buffer["fill_faults"]))},
            f"median of the recording's {len(no_buffer)} checkpoints above 32 MiB that mapped no buffer")


def trim_times(inp: ReplayInput, idle_ns: int | None) -> np.ndarray:
    """When an idle trim would run: `idle_ns` after the end of activity when nothing started
    again by then, up to the process's end (none past the recording)."""
    if idle_ns is None or not len(inp.activity):
        return np.zeros(0, "int64")
    if idle_ns not in inp.trims_at:
        start, end = inp.activity[:, 0], np.maximum.accumulate(inp.activity[:, 1])
        nxt = np.r_[start[1:], np.iinfo("int64").max]
        due = end + idle_ns
        inp.trims_at[idle_ns] = due[(nxt > due) & (due <= inp.end_ns)]
    return inp.trims_at[idle_ns]


# --- the replay ----------------------------------------------------------------------------------

OUTCOME_COLUMNS = {"ckpt": "int64", "t_ns": "int64", "bytes": "int64", "draft": "bool", "outcome": "object",
                   "fill_cpu_ns": "Int64", "fill_ns": "int64", "fill_faults": "int64", "saved_cpu_ns": "Int64",
                   "saved_ns": "int64", "saved_faults": "int64"}
POOLED_COLUMNS = {"t_ns": "int64", "event": "object", "bytes": "int64", "pooled_bytes": "int64",
                  "pooled_mapped_bytes": "int64", "pooled_buffers": "int64", "extra_bytes": "int64"}


@dataclass
class Replay:
    """One process replayed against one policy."""
    pid: int
    label: str
    policy: Policy
    cap_bytes: int
    summary: dict
    outcomes: pd.DataFrame  # one row per get (OUTCOME_COLUMNS)
    pooled: pd.DataFrame  # one row per change of the pool (POOLED_COLUMNS); extra_bytes: held beyond the recording's
    held: pd.DataFrame = field(default_factory=pd.DataFrame)  # [t_ns, recorded_bytes, predicted_bytes]
    limit: dict | None = None  # the cgroup limit check (memory_limit.memory_limit_check), set by predict
    requests: pd.DataFrame | None = None  # TTFT saved per request (ttft_saved), when a request file exists
    input: ReplayInput | None = field(default=None, repr=False)  # what was replayed (for sweeps, ttft_saved)
    analysis: object | None = field(default=None, repr=False)  # the process's analysis, when predict() made it


def simulate(inp: ReplayInput, policy: Policy, where: str = "the trace") -> Replay:
    """Replay `inp` against `policy` (the module docstring's rules)."""
    _check(policy)
    cap = policy.cap_bytes(inp.host_memory, where)
    trims = trim_times(inp, policy.trim_idle_ns)
    pool = _Pool(inp, policy, cap)
    for t, what, i in _walk(*_events(inp, trims)):
        if what == 0:
            pool.get(t, i)
        elif what == 1:
            pool.release(t, i)
        elif what == 2:
            pool.trim(t)
        elif pool.buffers:  # the process exited: its pool went with it
            pool.n["released_at_exit_bytes"] = pool.drop_all(t, "exit")
    return _replay(inp, policy, cap, pool)


def _events(inp: ReplayInput, trims: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(time, what, index, order) of the replay's events. What: 0 a get, 1 a release, 2 a trim, 3
    the exit. Gets at their mmap's return, releases at their munmap's entry, in trace order at one
    time; a trim after anything at its time; the exit last. Sorted as arrays and walked a chunk at
    a time: a tuple per event cost ~100 bytes (issue 39)."""
    gets, rel = inp.gets, inp.releases
    ends = [inp.end_ns] if inp.exited else []
    ev_t = np.concatenate([gets["t_ns"].to_numpy("int64"), rel["t_ns"].to_numpy("int64"),
                           np.asarray(trims, "int64"), np.asarray(ends, "int64")])
    ev_s = np.concatenate([gets["seq"].to_numpy("int64"), rel["seq"].to_numpy("int64"),
                           np.full(len(trims), 1 << 62, "int64"), np.full(len(ends), np.iinfo("int64").max)])
    ev_what = np.repeat(np.arange(4, dtype="int8"), [len(gets), len(rel), len(trims), len(ends)])
    ev_i = np.concatenate([np.arange(len(gets)), np.arange(len(rel)), np.zeros(len(trims) + len(ends), "int64")])
    return ev_t, ev_what, ev_i, np.lexsort((ev_i, ev_what, ev_s, ev_t))


class _Pool:
    """The pool as the replay goes: its buffers, the recording's live buffers, the counts, the
    high-water marks and the log of its changes."""

    def __init__(self, inp: ReplayInput, policy: Policy, cap: int):
        gets, rel = inp.gets, inp.releases
        self.policy, self.cap = policy, cap
        self.size, self.mapped, self.ck_of = (_ints(gets[c]) for c in ("bytes", "mapped", "ckpt"))
        self.rel_get, self.rel_grower = _ints(rel["get"]), _ints(rel["grower"])
        self.rel_how = rel["how"].tolist()
        self.buffers: list[tuple[int, int, int]] = []  # (size, id, mapped), sorted: best fit is a bisect
        self.live: dict[int, tuple[int, int, int]] = {}  # get -> (size, id, mapped) of the buffer it holds
        self.outcome = [""] * len(gets)
        self.hit_of_ckpt: dict[int, bool] = {}
        self.n = {"hits": 0, "misses": 0, "puts": 0, "accepted": 0, "declined_floor": 0, "declined_cap": 0,
                  "declined_full": 0, "evictions": 0, "evicted_bytes": 0, "trims": 0, "trimmed_bytes": 0,
                  "freed_by_growth": 0, "released_at_exit_bytes": 0}
        self.pooled = self.pooled_mapped = self.extra = 0
        self.hwm = {"bytes": 0, "mapped": 0, "buffers": 0, "bytes_at_ns": None}
        # The pool's changes, a column each (8 bytes a figure, not a tuple of objects per change).
        self.log_cols = {c: array("q") for c in POOLED_COLUMNS if c != "event"}
        self.log_event: list[str] = []

    def log(self, t: int, event: str, b: int) -> None:
        self.log_event.append(event)
        for c, v in (("t_ns", t), ("bytes", b), ("pooled_bytes", self.pooled),
                     ("pooled_mapped_bytes", self.pooled_mapped), ("pooled_buffers", len(self.buffers)),
                     ("extra_bytes", self.extra)):
            self.log_cols[c].append(v)

    def drop_all(self, t: int, event: str) -> int:
        gone = self.pooled
        self.extra -= self.pooled_mapped
        self.buffers.clear()
        self.pooled = self.pooled_mapped = 0
        self.log(t, event, gone)
        return gone

    def get(self, t: int, i: int) -> None:
        """Get `i` asks the pool for a buffer of its size."""
        want, pool = self.size[i], self.buffers
        j = bisect.bisect_left(pool, (want, -1, -1))
        if j < len(pool) and (self.policy.fit == "best" or pool[j][0] == want):
            s, bid, m = pool.pop(j)
            self.pooled -= s
            self.pooled_mapped -= m
            self.live[i] = (want, bid, m)  # the vector now holds `want` bytes of it
            self.extra -= self.mapped[i]  # the recording mapped a fresh buffer here; the pool did not
            self.outcome[i] = "hit"
            self.n["hits"] += 1
            self.log(t, "hit", s)
        else:
            self.live[i] = (want, i, self.mapped[i])
            self.outcome[i] = "miss"
            self.n["misses"] += 1
        self.hit_of_ckpt[self.ck_of[i]] = self.outcome[i] == "hit"

    def release(self, t: int, i: int) -> None:
        """Release `i`: a buffer's end in the recording, offered to the pool unless a growth frees it."""
        g, how = self.rel_get[i], self.rel_how[i]
        s, bid, m = self.live.pop(g)
        self.extra += self.mapped[g]  # the recording returned its buffer here
        if how == "own" and not self.hit_of_ckpt.get(self.rel_grower[i], False):
            how = "free"  # a growth on a miss frees its old storage
            self.n["freed_by_growth"] += 1
        if how == "free":
            self.extra -= m
            return
        self.n["puts"] += 1
        reason = _refuse(self.buffers, self.pooled, s, self.cap, self.policy)
        if reason:
            self.n[f"declined_{reason}"] += 1
            self.extra -= m
            self.log(t, f"declined ({reason})", s)
            return
        self.put(t, s, bid, m)

    def put(self, t: int, s: int, bid: int, m: int) -> None:
        """A buffer the pool accepts: the smallest displaced, only smaller ones, as few as make room."""
        pool, n, hwm = self.buffers, self.n, self.hwm
        k, held = 0, self.pooled
        while (len(pool) - k >= self.policy.count or held + s > self.cap) and k < len(pool) and pool[k][0] < s:
            held -= pool[k][0]
            k += 1
        for es, _, em in pool[:k]:
            self.pooled -= es
            self.pooled_mapped -= em
            self.extra -= em
            n["evictions"] += 1
            n["evicted_bytes"] += es
            self.log(t, "evicted", es)
        del pool[:k]
        bisect.insort(pool, (s, bid, m))
        self.pooled += s
        self.pooled_mapped += m
        n["accepted"] += 1
        self.log(t, "put", s)
        if self.pooled > hwm["bytes"]:
            hwm["bytes"], hwm["bytes_at_ns"] = self.pooled, t
        hwm["mapped"] = max(hwm["mapped"], self.pooled_mapped)
        hwm["buffers"] = max(hwm["buffers"], len(pool))

    def trim(self, t: int) -> None:
        """An idle trim: everything pooled freed."""
        if self.buffers:
            self.n["trims"] += 1
            self.n["trimmed_bytes"] += self.drop_all(t, "trim")

    def pooled_frame(self) -> pd.DataFrame:
        """The log of the pool's changes as POOLED_COLUMNS (its columns handed over, not copied twice)."""
        return pd.DataFrame({c: self.log_event if c == "event" else np.frombuffer(self.log_cols.pop(c), "int64")
                             for c in POOLED_COLUMNS}).astype(POOLED_COLUMNS)


def _replay(inp: ReplayInput, policy: Policy, cap: int, pool: _Pool) -> Replay:
    """The Replay of a finished walk: outcomes, the pool's log, the summary and held memory."""
    out = _outcomes(inp.gets, pool.outcome, inp)
    pooled_df = pool.pooled_frame()
    summary = _summary(inp, policy, cap, pool.n, pool.hwm, out, pool.pooled, len(pool.buffers))
    r = Replay(inp.pid, inp.label, policy, cap, summary, out, pooled_df, input=inp)
    r.held = _held(inp, pooled_df)
    peak = r.held["predicted_bytes"].max() if len(r.held) else None
    summary["held_hwm_bytes"] = int(peak) if peak is not None and not pd.isna(peak) else None
    summary["recorded_held_hwm_bytes"] = int(inp.held_off["held_bytes"].max()) if len(inp.held_off) else 0
    return r


def _ints(column: pd.Series) -> array:
    """A column as Python ints on access, 8 bytes each held (a list of ints: about 36)."""
    out = array("q")
    out.frombytes(column.to_numpy("int64").tobytes())
    return out


def _walk(t: np.ndarray, what: np.ndarray, i: np.ndarray, order: np.ndarray, chunk: int = 65536):
    """(time, what, index) of the events in `order`, as Python ints, a chunk at a time."""
    for k in range(0, len(order), chunk):
        at = order[k:k + chunk]
        yield from zip(t[at].tolist(), what[at].tolist(), i[at].tolist())


def _check(policy: Policy) -> None:
    if policy.fit not in FITS or policy.evict not in EVICTIONS:
        raise AnalysisError(f"a pool policy fits {'/'.join(FITS)} and evicts {'/'.join(EVICTIONS)}")
    if policy.count < 0 or policy.floor < 0 or (isinstance(policy.cap, int) and policy.cap < 0):
        raise AnalysisError("a pool's caps and floor are at least 0")
    if isinstance(policy.cap, float) and not 0 < policy.cap <= 1:
        raise AnalysisError(f"a byte cap as a fraction of host memory lies in (0, 1], not {policy.cap:g}")


def _refuse(pool: list, pooled: int, s: int, cap: int, policy: Policy) -> str | None:
    """Why the pool declines a buffer of `s` bytes now (floor, cap, full), or None."""
    if s < policy.floor:
        return "floor"
    if s > cap:
        return "cap"
    if len(pool) < policy.count and pooled + s <= cap:
        return None
    if policy.evict == "none" or policy.count == 0:
        return "full"
    k, held = 0, pooled
    while (len(pool) - k >= policy.count or held + s > cap) and k < len(pool) and pool[k][0] < s:
        held -= pool[k][0]
        k += 1
    return "full" if len(pool) - k >= policy.count or held + s > cap else None


def _outcomes(gets: pd.DataFrame, outcome: list[str], inp: ReplayInput) -> pd.DataFrame:
    hit = np.array([o == "hit" for o in outcome], bool)
    cost = inp.hit_cost
    cpu = pd.array(gets["fill_cpu_ns"].array, dtype="Int64")
    return pd.DataFrame({
        "ckpt": gets["ckpt"], "t_ns": gets["t_ns"], "bytes": gets["bytes"], "draft": gets["draft"],
        "outcome": outcome, "fill_cpu_ns": cpu, "fill_ns": gets["fill_ns"], "fill_faults": gets["fill_faults"],
        "saved_cpu_ns": pd.array(np.where(hit, 1, 0), dtype="Int64") * (cpu - cost["cpu_ns"]),
        "saved_ns": np.where(hit, gets["fill_ns"].to_numpy() - cost["ns"], 0),
        "saved_faults": np.where(hit, gets["fill_faults"].to_numpy() - cost["faults"], 0),
    }).astype(OUTCOME_COLUMNS)


def _summary(inp: ReplayInput, policy: Policy, cap: int, n: dict, hwm: dict, out: pd.DataFrame,
             pooled_end: int, buffers_end: int) -> dict:
    gets = len(out)
    cpu_saved = out["saved_cpu_ns"]
    fill_cpu = out["fill_cpu_ns"]
    return {
        "pid": inp.pid, "label": inp.label, "policy": policy.name, "policy_text": policy.describe(cap),
        "cap_bytes": cap, "count_cap": policy.count, "floor_bytes": policy.floor, "evict": policy.evict,
        "fit": policy.fit, "trim_idle_ns": policy.trim_idle_ns,
        "gets": gets, **{k: n[k] for k in ("hits", "misses")},
        "hit_rate": n["hits"] / gets if gets else None,
        "not_gets": inp.no_buffer, "reused_buffers": inp.reused,
        **{k: v for k, v in n.items() if k not in ("hits", "misses")},
        "pooled_hwm_bytes": hwm["bytes"], "pooled_hwm_ns": hwm["bytes_at_ns"],
        "pooled_hwm_mapped_bytes": hwm["mapped"], "pooled_hwm_buffers": hwm["buffers"],
        "pooled_end_bytes": pooled_end, "pooled_end_buffers": buffers_end,
        "faults_avoided": int(out["saved_faults"].sum()),
        "fill_faults_recorded": int(out["fill_faults"].sum()),
        "fill_cpu_saved_ns": int(cpu_saved.sum()) if inp.fill_cpu_recorded else None,
        "fill_cpu_recorded_ns": int(fill_cpu.sum()) if inp.fill_cpu_recorded else None,
        "fill_saved_ns": int(out["saved_ns"].sum()), "fill_recorded_ns": int(out["fill_ns"].sum()),
        "hit_cost": dict(inp.hit_cost), "hit_cost_source": inp.hit_cost_source,
        "exited": inp.exited,
    }


def step_frame(frames: list[tuple[pd.DataFrame, str, str]]) -> pd.DataFrame:
    """Step functions [t_ns, value] summed at each time any of them changes (each one's last value
    at a time counts; before its first row a function is 0)."""
    times = np.unique(np.concatenate([f["t_ns"].to_numpy("int64") for f, _, _ in frames] + [np.zeros(0, "int64")]))
    out = {"t_ns": times}
    for f, col, name in frames:
        t = f["t_ns"].to_numpy("int64")
        v = f[col].to_numpy("int64")
        at = np.searchsorted(t, times, side="right") - 1
        out[name] = np.where(at >= 0, v[np.maximum(at, 0)], 0) if len(t) else np.zeros(len(times), "int64")
    return pd.DataFrame(out)


def _held(inp: ReplayInput, pooled: pd.DataFrame) -> pd.DataFrame:
    """[t_ns, recorded_bytes, predicted_bytes]: held checkpoint-buffer bytes as recorded and with the pool."""
    s = step_frame([(inp.held_off, "held_bytes", "recorded_bytes"), (pooled, "extra_bytes", "extra")])
    s["predicted_bytes"] = s["recorded_bytes"] + s["extra"]
    return s.drop(columns="extra")


# --- requests --------------------------------------------------------------------------------

REQUEST_SAVED_COLUMNS = {"request": "int64", "ttft_ns": "Int64", "hits_in_window": "Int64",
                         "saved_ns": "Int64", "predicted_ttft_ns": "Int64"}


def ttft_saved(r: Replay, inp: ReplayInput, request_rows: pd.DataFrame) -> pd.DataFrame:
    """Per request (analyzers.requests.request_table's rows): the fill time the hits would save
    inside its TTFT window (a hit's fill, less a hit's cost, for the part of the fill inside the
    window; a checkpoint on the server thread stalls every request in flight, so one hit can
    shorten several), and the TTFT less that. An estimate: it assumes nothing else moves. NA
    where the request has no breakdown (not wholly inside the recording, or failed)."""
    out = r.outcomes
    hits = out["outcome"].to_numpy() == "hit"
    fills = pd.DataFrame({"start_ns": inp.gets["fill_start_ns"].to_numpy()[hits],
                          "end_ns": inp.gets["fill_start_ns"].to_numpy()[hits] + out["fill_ns"].to_numpy()[hits]})
    ok = request_rows["in_recording"].to_numpy(bool) & request_rows["ttft_ns"].notna().to_numpy()
    ws = request_rows["start_ns"].to_numpy("int64")
    we = request_rows["first_token_ns"].to_numpy("int64", na_value=0)
    _, met, _, part = overlap(ws, np.where(ok, we, ws), fills,
                               {"saved": out["saved_ns"].to_numpy("float64")[hits]})
    saved = pd.array(np.rint(part["saved"]).astype("int64"), dtype="Int64")
    saved[~ok] = pd.NA
    ttft = pd.array(request_rows["ttft_ns"].array, dtype="Int64")
    return pd.DataFrame({"request": request_rows["request"].to_numpy("int64"), "ttft_ns": ttft,
                         "hits_in_window": pd.arrays.IntegerArray(np.where(ok, met, 0).astype("int64"), ~ok),
                         "saved_ns": saved, "predicted_ttft_ns": ttft - saved}).astype(REQUEST_SAVED_COLUMNS)


def ttft_summary(table: pd.DataFrame) -> dict:
    """p50/p90/p99 of TTFT as recorded and as predicted, and the mean saving, over the requests
    with a breakdown."""
    ok = table["saved_ns"].notna()
    q = lambda s, p: float(np.percentile(s.to_numpy("float64"), p)) if len(s) else None  # noqa: E731
    rec, pred, saved = table.loc[ok, "ttft_ns"], table.loc[ok, "predicted_ttft_ns"], table.loc[ok, "saved_ns"]
    return {"requests": int(len(table)), "with_breakdown": int(ok.sum()),
            **{f"ttft_p{p}_ns": q(rec, p) for p in (50, 90, 99)},
            **{f"predicted_ttft_p{p}_ns": q(pred, p) for p in (50, 90, 99)},
            "mean_saved_ns": float(saved.mean()) if len(saved) else None}


# --- sweeps ----------------------------------------------------------------------------------

SWEEP_COLUMNS = {"value": "object", "cap_bytes": "int64", "gets": "int64", "hits": "int64", "evictions": "int64",
                 "trims": "int64", "pooled_hwm_bytes": "int64", "held_hwm_bytes": "Int64",
                 "faults_avoided": "int64", "fill_cpu_saved_ns": "Int64", "fill_saved_ns": "int64"}


def sweep(inp: ReplayInput, policy: Policy, param: str, values: list, where: str = "the trace") -> pd.DataFrame:
    """One replay per value of one policy field (SWEEPABLE's names: cap-bytes, count, floor,
    trim-idle), the others as `policy` has them: one row each (SWEEP_COLUMNS)."""
    if param not in SWEEPABLE:
        raise AnalysisError(f"--sweep takes {', '.join(SWEEPABLE)}, not {param!r}")
    rows = []
    for v in values:
        s = simulate(inp, dataclasses.replace(policy, **{SWEEPABLE[param]: v}), where).summary
        rows.append({"value": v, **{c: s[c] for c in SWEEP_COLUMNS if c != "value"}})
    return pd.DataFrame(rows, columns=list(SWEEP_COLUMNS)).astype(SWEEP_COLUMNS)


def default_caps(inp: ReplayInput, policy: Policy, steps: int = 12) -> list[int]:
    """Byte caps for the dashboard's curve: 0, then whole multiples of the largest buffer a get
    asked for, up to the policy's own cap or the most the recording ever freed at once (past
    that nothing changes), about `steps` of them."""
    if not len(inp.gets):
        return [0]
    unit = int(inp.gets["bytes"].max())
    try:
        top = policy.cap_bytes(inp.host_memory)
    except AnalysisError:
        top = unit * 64
    reach = unit * max(1, min(policy.count, len(inp.gets)))
    top = max(unit, min(top, reach))
    k = max(1, math.ceil(top / unit / steps))
    return sorted({0, *range(unit, top + 1, unit * k), top})
