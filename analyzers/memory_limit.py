"""The cgroup memory-limit check: would pooled bytes plus RSS come near the process's cgroup memory
limit, as the trace recorded it? A replay (whatif.py's simulator) against a policy, then the peak
of recorded RSS plus what the pool keeps beyond the recording. `analyze`, `compare` and `whatif`
report it."""
from __future__ import annotations

import dataclasses

from ckptrace.core.meta import ProcessInfo
from ckptrace.core.terminal import printable

from .whatif import POLICIES, Replay, ReplayInput, step_frame, mib_text, replay_input, simulate

NEAR_LIMIT = 0.9  # pooled bytes plus RSS at this share of the cgroup limit or more: a warning


def memory_limit_check(inp: ReplayInput, r: Replay) -> dict | None:
    """Pooled bytes plus RSS against the process's cgroup memory limit (None when no limit was
    recorded): the peak of recorded RSS + what the pool keeps beyond the recording, at each time
    (with no RSS rows, the recorded peak RSS + the most the pool kept). `near`: at NEAR_LIMIT or more."""
    mem = inp.memory
    if mem is None or mem.limit_bytes is None:
        return None
    if len(inp.rss_off):
        s = step_frame([(inp.rss_off, "rss_bytes", "rss"), (r.pooled, "extra_bytes", "extra")])
        total = s["rss"] + s["extra"]
        at = int(total.to_numpy().argmax())
        peak, rss_peak = int(total.iat[at]), int(s["rss"].max())
    else:
        rss_peak = mem.rss_peak_bytes or mem.rss_bytes or 0
        extra = int(r.pooled["extra_bytes"].max()) if len(r.pooled) else 0
        peak = rss_peak + max(extra, 0)
    share = peak / mem.limit_bytes
    return {"limit_bytes": mem.limit_bytes, "limit_from": mem.limit_from, "cgroup_version": mem.cgroup_version,
            "rss_peak_bytes": rss_peak, "predicted_peak_bytes": peak, "share": share, "near": share >= NEAR_LIMIT,
            "cap_bytes": r.cap_bytes, "cap_exceeds_headroom": r.cap_bytes > mem.limit_bytes - rss_peak}


def limit_warning(label: str, r: Replay) -> str | None:
    """One line when pooled bytes plus RSS would come near the cgroup limit, else None (printable:
    the cgroup's path comes from the trace)."""
    lim = r.limit
    if not lim or not lim["near"]:
        return None
    cap = f"its byte cap ({r.policy.describe(r.cap_bytes).split(', ')[0].removeprefix('byte cap ')})"
    return (f"{label}: with a {r.policy.name} pool, pooled bytes plus RSS would reach "
            f"{mib_text(lim['predicted_peak_bytes'])}, {lim['share'] * 100:.0f}% of its cgroup memory limit "
            f"({mib_text(lim['limit_bytes'])}, {printable(lim['limit_from'])}): the pool could be OOM-killed with it; "
            f"{cap} does not look at that limit")


def limit_report(analysis, info: ProcessInfo | None = None) -> dict | None:
    """`analyze`'s and `compare`'s check of one process against its cgroup memory limit: the
    limit check (memory_limit_check) of a replay against PR #201's policy, with its `warning`
    (None when not near), or None when the trace recorded no limit for the process."""
    meta = analysis.trace.meta
    info = info or (meta.processes[0] if len(meta.processes) == 1 else None)
    if info is None or info.memory is None or info.memory.limit_bytes is None:
        return None
    policy = POLICIES["pr201"]
    if meta.host_memory_bytes is None:  # the cap is unknown: the limit against RSS alone
        policy = dataclasses.replace(policy, cap=0)
    r = simulate(replay_input(analysis, info), policy)
    r.limit = memory_limit_check(r.input, r)
    label = f"pid {info.pid} ({printable(info.label or analysis.trace.label)})"
    return {**r.limit, "pooled_hwm_bytes": r.summary["pooled_hwm_bytes"], "warning": limit_warning(label, r)}


def limit_warnings(analysis) -> list[str]:
    """Every warning of an analysis' limit checks (its own, and each process's)."""
    found = [analysis.memory.get("limit")] + [p["memory"].get("limit") for p in analysis.processes]
    return list(dict.fromkeys(lim["warning"] for lim in found if lim and lim.get("warning")))
