"""What a TTFT change is made of: the part the traced checkpoint path explains, and the rest.

compare judges each TTFT percentile (ttft_p50_ms, ttft_p90_ms, ttft_p99_ms) like any metric, and
then holds the verdict to two rules, because a percentile of a dozen requests or a change the
trace cannot see is not a finding about the candidate:
- **Enough requests for the percentile.** A pQ is judged only when each arm has at least
  `min_requests(Q)` completed requests: MIN_TAIL of them beyond it on its far side, that is
  MIN_TAIL * 100 / min(Q, 100 - Q): p50 10, p90 50, p99 500. (A p90 of 12 requests is one
  request.) Fewer: `too few samples`, figures kept.
- **What the traced path explains.** Each request's TTFT window holds `stall_ns`, its time in
  checkpoints and restores (analyzers/requests.py), and `rest = ttft - stall`, everything else
  (queueing, the prompt's decode, sampling, HTTP, the machine). The change of a percentile splits
  exactly into `explained = change - outside` and `outside = pQ(rest of the candidate) - pQ(rest of
  the baseline)`: how much of the change would vanish if neither arm had stalled. Since no
  request's rest is further from its TTFT than its largest stall, |explained| is at most the two
  arms' largest stalls added. A faster or slower verdict stands only where the traced path
  explains at least half of the change, in its direction; otherwise it reads `not judged`, and
  the row's `why` gives both parts.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ckptrace.core.units import ms_change

MIN_TAIL = 5  # requests beyond a percentile, on its far side, that judging it needs
TTFT_COLUMNS = {"metric": "str", "percentile": "int64", "min_requests": "int64", "requests_baseline": "int64",
                "requests_candidate": "int64", "baseline_ms": "float64", "candidate_ms": "float64",
                "change_ms": "float64", "baseline_rest_ms": "float64", "candidate_rest_ms": "float64",
                "explained_ms": "float64", "outside_ms": "float64", "stall_max_baseline_ms": "float64",
                "stall_max_candidate_ms": "float64"}
OUTSIDE = "queueing, decode, the machine"


def min_requests(q: int) -> int:
    """The fewest completed requests per arm a p`q` is judged on."""
    return math.ceil(MIN_TAIL * 100 / min(q, 100 - q))


def _pct(x: np.ndarray, q: int) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan  # linear, as compare's statistic


def split(name: str, q: int, base: tuple[np.ndarray, np.ndarray], cand: tuple[np.ndarray, np.ndarray]) -> dict:
    """One TTFT_COLUMNS row: `base` and `cand` are (TTFT ms, stall ms) of each arm's requests."""
    (bt, bs), (ct, cs) = base, cand
    b, c = _pct(bt, q), _pct(ct, q)
    br, cr = _pct(bt - bs, q), _pct(ct - cs, q)
    return {"metric": name, "percentile": q, "min_requests": min_requests(q), "requests_baseline": len(bt),
            "requests_candidate": len(ct), "baseline_ms": b, "candidate_ms": c, "change_ms": c - b,
            "baseline_rest_ms": br, "candidate_rest_ms": cr, "explained_ms": (c - b) - (cr - br),
            "outside_ms": cr - br, "stall_max_baseline_ms": float(bs.max()) if len(bs) else math.nan,
            "stall_max_candidate_ms": float(cs.max()) if len(cs) else math.nan}


def table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(TTFT_COLUMNS)).astype(TTFT_COLUMNS)


def too_few(s: dict) -> str | None:
    """Why the percentile can't be judged on these requests, or None."""
    n = min(s["requests_baseline"], s["requests_candidate"])
    if n >= s["min_requests"]:
        return None
    arm = "the baseline" if s["requests_baseline"] == n else "the candidate"
    return (f"a p{s['percentile']} is judged on at least {s['min_requests']} requests per arm ({MIN_TAIL} beyond "
            f"it); {arm} has {n}")


def explained_said(s: dict) -> str:
    """'TTFT change +2976 ms, of which the checkpoint path explains -34 ms; the rest (+3010 ms) lies
    outside the traced path (queueing, decode, the machine)'."""
    said = f"of which the checkpoint path explains {ms_change(s['explained_ms'])}"
    if abs(s["outside_ms"]) > abs(s["explained_ms"]):
        said += f"; the rest ({ms_change(s['outside_ms'])}) lies outside the traced path ({OUTSIDE})"
    return said


def unsupported(s: dict) -> str | None:
    """Why a faster/slower verdict of this change is not one the stall accounting supports, or None."""
    change, explained = s["change_ms"], s["explained_ms"]
    if not (math.isfinite(change) and math.isfinite(explained)) or change == 0:
        return None
    if np.sign(explained) == np.sign(change) and abs(explained) >= abs(change) / 2:
        return None
    return f"TTFT p{s['percentile']} {ms_change(change)}, {explained_said(s)}"
