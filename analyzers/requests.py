"""What the host stalls cost each request: its time to first token split into checkpoint, restore and the rest.

A request's TTFT window is [start_ns, start_ns + ttft_ns] on CLOCK_MONOTONIC, the trace's clock
(`ckptrace drive` takes start_ns just before it connects). Every span of the trace that
intersects the window counts for the time of the intersection only: a checkpoint that started
before the request was sent and ended inside its window counts from the send on. llama-server
makes checkpoints on its one server thread, between the batches of every slot, so a checkpoint
stalls every request in flight, not only the one whose prompt it saves.
- `ckpt_ns`: time inside the window in checkpoint spans: each `create` span (upstream's
  create_checkpoint: evicting old checkpoints, update_tgt, update_dft, the speculative state) as
  a whole, and each checkpoint (update_tgt / update_dft) outside any create span (a speculative
  round's, or a build whose create_checkpoint was not probed); a checkpoint inside a create span
  counts once, as part of it. Split into `ckpt_fill_ns`, `ckpt_copy_ns` (time in the fills and
  copies inside the window) and `ckpt_other_ns` (the rest), of which `ckpt_create_ns` is
  create_checkpoint's own time outside its checkpoints (unmapping the evicted ones, stashing the
  speculative state). `ckpt_fault_ns`: the fills' and copies'
  fault time; `ckpt_cpu_ns`, `ckpt_wait_ns`: each create span's (else checkpoint's) on-CPU time
  and run-queue wait; each the span's measured figure times the share of the span inside the
  window: exact for a span wholly inside, prorated for one cut by the window's edge (`cut_spans`
  counts those). NA where not recorded, never 0.
- `restore_ns`, `restore_copy_ns`: time inside the window in `restore` spans (the server loading
  a checkpoint back) and in their state copies (`restore_copy`, part of `restore_ns`; a copy
  outside any restore span, where load_tgt was not probed, counts as restore time itself). NA
  when the trace's probes could not see restores (recorded before they existed).
- `stall_ns = ckpt_ns + restore_ns` (restores counted when recorded); `rest_ns = ttft_ns - stall_ns`:
  everything else (queueing, the prompt's own decode, sampling, HTTP).
- `est_ttft_without_fill_ns = ttft_ns - ckpt_fill_ns`: an *estimate* of the TTFT had no
  checkpoint zero-filled memory (what a buffer pool aims at); it assumes nothing else moves.
A request whose window is not wholly inside the recording (or that failed: no first token) has
no breakdown (NA): the trace did not see all of its window. Requests none of whose windows meet
the recording are a file from another run: AnalysisError, one line.
A request file carries no pid: in a trace of several processes the caller names the process the
requests went to (`request_process`) and only its spans count.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.errors import AnalysisError
from ckptrace.core.terminal import printable
from ckptrace.core.trace import Trace, time_origin

from .spans import NA_INT, kind_mask, select
from .state_path import enclosing
from .summary import describe
from .sums import bound

REQUEST_COLUMNS: dict[str, object] = {
    "request": np.dtype("int64"),
    "client": NA_INT,
    "status": "string",
    "start_ns": np.dtype("int64"),
    "first_token_ns": NA_INT,  # start_ns + ttft_ns: the window's end
    "ttft_ns": NA_INT,
    "in_recording": np.dtype("bool"),
    "checkpoints": NA_INT,  # checkpoint spans meeting the window
    "cut_spans": NA_INT,  # of those (and restores), cut by the window's edge
    "ckpt_ns": NA_INT,
    "ckpt_fill_ns": NA_INT,
    "ckpt_copy_ns": NA_INT,
    "ckpt_other_ns": NA_INT,
    "ckpt_create_ns": NA_INT,  # part of ckpt_other_ns: create_checkpoint outside its checkpoints
    "ckpt_fault_ns": NA_INT,
    "ckpt_cpu_ns": NA_INT,
    "ckpt_wait_ns": NA_INT,
    "restore_ns": NA_INT,
    "restore_copy_ns": NA_INT,
    "stall_ns": NA_INT,
    "rest_ns": NA_INT,
    "est_ttft_without_fill_ns": NA_INT,
    "prompt_tokens": NA_INT,
    "predicted_tokens": NA_INT,
    "total_ns": NA_INT,
}
# Summary distributions (p50 = median, p90, p99) over the requests with a breakdown.
SUMMARY_FIGURES = ("ttft_ns", "stall_ns", "ckpt_ns", "ckpt_fill_ns", "restore_ns", "est_ttft_without_fill_ns")
# Probe points whose presence means restores were watched (probes/points.py names).
RESTORE_POINTS = frozenset({"load_tgt", "load_dft", "state_restore"})
BLOCK = 4_000_000  # window x span cells per step: about 32 MB of overlaps at a time


def recording_range(trace: Trace) -> tuple[int, int]:
    """[start, end] of what the trace watched: probes in place (or first event) to stop (or last event)."""
    ev, meta = trace.events, trace.meta
    start = time_origin(meta, ev)
    end = meta.stop_ns or (int(ev["end_ns"].max()) if len(ev) else start)
    return int(start), int(max(end, start))


def request_process(trace: Trace, choice: str | None, source: str = "") -> int | None:
    """The pid whose spans count for a request file (`--requests-pid PID|LABEL`, or `pid:N` /
    `label:NAME` to say which), None for a one-process trace. A request file carries no pid, so a
    trace of several processes needs the choice; a choice naming no process of the trace, several,
    or one by pid and another by label, is an AnalysisError."""
    from ckptrace.core.terminal import printable

    from .processes import process_info, process_label

    infos = process_info(trace)
    name = printable(source or trace.path or trace.label)
    listed = ", ".join(f"{p.pid} ({printable(process_label(p))})" for p in infos)
    if choice is None:
        if len(infos) <= 1:
            return None
        raise AnalysisError(
            f"{name} holds {len(infos)} processes ({listed}) and a request file carries no pid: name the one the "
            "requests went to with --requests-pid PID|LABEL")
    kind, _, rest = choice.partition(":")
    pid_form, label_form = (kind == "pid", kind == "label") if rest else (False, False)
    wanted = rest if pid_form or label_form else choice
    by_pid = [] if label_form else [p for p in infos if str(p.pid) == wanted.strip()]
    by_label = [] if pid_form else [p for p in infos if process_label(p) == wanted
                                    or (len(infos) == 1 and wanted == trace.label)]
    if by_pid and by_label and {p.pid for p in by_pid} != {p.pid for p in by_label}:
        raise AnalysisError(
            f"--requests-pid {printable(choice)} is ambiguous in {name}: the pid of {by_pid[0].pid} "
            f"({printable(process_label(by_pid[0]))}) and the label of {by_label[0].pid}: write "
            f"pid:{printable(wanted)} or label:{printable(wanted)}")
    found = by_pid or by_label
    if len(found) != 1:
        what = "names no process of" if not found else f"names {len(found)} processes of"
        raise AnalysisError(f"--requests-pid {printable(choice)} {what} {name} (its processes: {listed or 'none'})")
    return found[0].pid if len(infos) > 1 else None


def request_pids(traces: list[Trace], requests: list | None, choices: tuple[str, ...]) -> list[int | None]:
    """Per leg, request_process of its trace: `choices` holds one --requests-pid for every leg (a
    process label is the same in each) or one per leg; a leg without a request file gets None."""
    out: list[int | None] = []
    for i, trace in enumerate(traces):
        if requests is None or requests[i] is None:
            out.append(None)
            continue
        choice = choices[0] if len(choices) == 1 else choices[i] if choices else None
        out.append(request_process(trace, choice, source=f"leg {i + 1} ({trace.path or trace.label})"))
    return out


def process_analysis(analysis, pid: int | None):
    """The analysis of one process of the trace (`pid`; None: the analysis as it is), for a
    comparison of the process the requests went to."""
    if pid is None:
        return analysis
    from . import analyze_trace
    from .processes import process_traces

    return analyze_trace(next(sub for info, sub in process_traces(analysis.trace) if info.pid == pid))


def restores_recorded(trace: Trace) -> bool:
    """Whether this trace could see restores: it has restore rows, or a restore probe was attached."""
    return bool(kind_mask(trace.events, "restore", "restore_copy").any()
                or any(p.point in RESTORE_POINTS for p in trace.meta.probes))


def overlap(ws: np.ndarray, we: np.ndarray, spans: pd.DataFrame, values: dict[str, np.ndarray]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Per window: summed overlap (ns), spans met, spans cut, and sum of overlap x each value's
    per-ns rate (NaN where a met span's value is NaN)."""
    n = len(ws)
    total, met, cut = np.zeros(n, "int64"), np.zeros(n, "int64"), np.zeros(n, "int64")
    out = {k: np.zeros(n) for k in values}
    if not len(spans) or not n:
        return total, met, cut, out
    ss, se = spans["start_ns"].to_numpy("int64"), spans["end_ns"].to_numpy("int64")
    length = np.maximum(se - ss, 1).astype("float64")
    rates = {k: v / length for k, v in values.items()}
    step = max(1, BLOCK // len(ss))
    for i in range(0, n, step):
        a, b = ws[i:i + step, None], we[i:i + step, None]
        ov = np.clip(np.minimum(b, se) - np.maximum(a, ss), 0, None)  # int64, exact
        meets = ov > 0
        total[i:i + step] = ov.sum(axis=1)
        met[i:i + step] = meets.sum(axis=1)
        cut[i:i + step] = (meets & ((ss < a) | (se > b))).sum(axis=1)
        for k, r in rates.items():
            bad = np.isnan(r)
            out[k][i:i + step] = np.where((meets & bad).any(axis=1), np.nan, ov @ np.where(bad, 0.0, r))
    return total, met, cut, out


def _clocks(spans: pd.DataFrame) -> dict[str, np.ndarray]:
    """The spans' on-CPU time and run-queue wait, NaN where not recorded."""
    return {c: spans[f"{c}_ns"].to_numpy("float64", na_value=np.nan) for c in ("cpu", "wait")}


def _na_int(x: np.ndarray, keep: np.ndarray) -> pd.arrays.IntegerArray:
    """Rounded to whole ns; NA where not `keep` or NaN."""
    x = np.asarray(x, dtype="float64")
    mask = ~keep | np.isnan(x)
    return pd.arrays.IntegerArray(np.rint(np.where(mask, 0, x)).astype("int64"), mask)


def request_table(requests: pd.DataFrame, analysis, source: str = "request file", pid: int | None = None
                  ) -> pd.DataFrame:
    """One row per request (REQUEST_COLUMNS), by the rules in the module docstring.

    `requests`: ckptrace.core.requests_file.read_requests(); `analysis`: analyze_trace() of the trace
    recorded while they ran; `pid`: the process they went to (request_process), None for all.
    `source` names the request file in the error line."""
    trace = analysis.trace
    lo, hi = recording_range(trace)
    ok = (requests["status"] == "ok").to_numpy() & requests["ttft_ns"].notna().to_numpy()
    start = requests["start_ns"].to_numpy("int64")
    ttft = requests["ttft_ns"].to_numpy("float64", na_value=np.nan)
    end = start + np.where(ok, np.nan_to_num(ttft), 0).astype("int64")
    last = start + requests["total_ns"].to_numpy("float64", na_value=0).astype("int64")
    if not ((start <= hi) & (np.maximum(end, last) >= lo)).any():
        raise AnalysisError(
            f"{source}: none of its {len(requests)} requests ran while {trace.path or trace.label} was recorded "
            f"(requests {_span_s(start.min(), max(end.max(), last.max()))}, recording {_span_s(lo, hi)} on "
            "CLOCK_MONOTONIC): a request file from another run, or from before a reboot?")
    inside = ok & (start >= lo) & (end <= hi)

    ck = analysis.checkpoints
    ev = trace.events
    if pid is not None:
        ev = ev.loc[(ev["pid"] == pid).to_numpy()]
        ck = ck.loc[ck["tid"].isin(ev["tid"].unique()).to_numpy()]  # a tid is one process's
    cols = ["ckpt", "start_ns", "end_ns"]
    fills = select(ev, kind_mask(ev, "fill"), cols)
    copies = select(ev, kind_mask(ev, "copy"), cols)
    by_id = ck.set_index("ckpt")
    # Keep only fills and copies of the checkpoints analyze kept (an update that copied nothing is none).
    fills, copies = fills[fills["ckpt"].isin(by_id.index)], copies[copies["ckpt"].isin(by_id.index)]

    def per_span(part: pd.DataFrame, value: str, whole: str) -> np.ndarray:
        """A checkpoint's figure spread over its spans of a kind in proportion to their time."""
        v = by_id[value].reindex(part["ckpt"]).to_numpy("float64", na_value=np.nan)
        w = by_id[whole].reindex(part["ckpt"]).to_numpy("float64")
        return v * (part["end_ns"] - part["start_ns"]).to_numpy("float64") / np.maximum(w, 1)

    ws, we = start, end
    # Checkpoint time: create spans whole, and the checkpoints outside them.
    creates = select(ev, kind_mask(ev, "create"), ["tid", "start_ns", "end_ns", "cpu_ns", "wait_ns"])
    in_create = enclosing(ck, creates) >= 0
    cr_total, _, cr_cut, cr_vals = overlap(ws, we, creates, _clocks(creates))
    lone_total, _, lone_cut, lone_vals = overlap(ws, we, ck.loc[~in_create], _clocks(ck.loc[~in_create]))
    nested_total = overlap(ws, we, ck.loc[in_create], {})[0]
    ck_met = overlap(ws, we, ck, {})[1]
    ck_total = cr_total + lone_total
    fill_total, _, _, fill_vals = overlap(ws, we, fills, {"fault": per_span(fills, "fill_fault_ns", "fill_ns")})
    copy_total, _, _, copy_vals = overlap(ws, we, copies, {"fault": per_span(copies, "copy_fault_ns", "copy_ns")})
    watched = restores_recorded(trace)
    restore = select(ev, kind_mask(ev, "restore"), ["tid", "start_ns", "end_ns"])
    restore_copy = select(ev, kind_mask(ev, "restore_copy"), ["tid", "start_ns", "end_ns"])
    # A copy outside any restore span (a build whose load_tgt was not probed) is restore time of its
    # own; inside one it is part of it (a span row's phase is its own kind: enclosure tells).
    alone = restore_copy[enclosing(restore_copy, restore) < 0]
    # A window's figures add and subtract overlaps with these spans, each at most a span's length:
    # their lengths bounded together (sums.py), every such figure is exact.
    bound(f"{printable(trace.path or trace.label)}: the span lengths a request's breakdown adds",
          *((f["end_ns"] - f["start_ns"]).to_numpy() for f in (creates, ck, fills, copies, restore, restore_copy)))
    rs_total, _, rs_cut, _ = overlap(ws, we, pd.concat([restore, alone]), {})
    rc_total, _, _, _ = overlap(ws, we, restore_copy, {})

    stall = ck_total + (rs_total if watched else 0)
    ttft_i = np.nan_to_num(ttft).astype("int64")
    out = pd.DataFrame({
        "request": requests["request"].to_numpy("int64"),
        "client": requests["client"].array,
        "status": requests["status"].array,
        "start_ns": start,
        "first_token_ns": _na_int(end, ok),
        "ttft_ns": requests["ttft_ns"].array,
        "in_recording": inside,
        "checkpoints": _na_int(ck_met, inside),
        "cut_spans": _na_int(cr_cut + lone_cut + rs_cut, inside),
        "ckpt_ns": _na_int(ck_total, inside),
        "ckpt_fill_ns": _na_int(fill_total, inside),
        "ckpt_copy_ns": _na_int(copy_total, inside),
        "ckpt_other_ns": _na_int(ck_total - fill_total - copy_total, inside),
        "ckpt_create_ns": _na_int(cr_total - nested_total, inside),
        "ckpt_fault_ns": _na_int(fill_vals["fault"] + copy_vals["fault"], inside),
        "ckpt_cpu_ns": _na_int(cr_vals["cpu"] + lone_vals["cpu"], inside),
        "ckpt_wait_ns": _na_int(cr_vals["wait"] + lone_vals["wait"], inside),
        "restore_ns": _na_int(rs_total, inside & watched),
        "restore_copy_ns": _na_int(rc_total, inside & watched),
        "stall_ns": _na_int(stall, inside),
        "rest_ns": _na_int(ttft_i - stall, inside),
        "est_ttft_without_fill_ns": _na_int(ttft_i - fill_total, inside),
        "prompt_tokens": requests["prompt_tokens"].array,
        "predicted_tokens": requests["predicted_tokens"].array,
        "total_ns": requests["total_ns"].array,
    })
    return out.astype(REQUEST_COLUMNS)


def _span_s(a: int, b: int) -> str:
    return f"{a / 1e9:.1f}..{b / 1e9:.1f} s"


def request_summary(table: pd.DataFrame, trace: Trace, pid: int | None = None) -> dict:
    """Counts, and count/mean/median (p50)/p90/p99 in ns of SUMMARY_FIGURES over the requests with
    a breakdown; notes say what was left out and why. `pid`: as given to request_table."""
    n = len(table)
    ok = int((table["status"] == "ok").sum())
    inside = table["in_recording"].to_numpy()
    notes = []
    if ok < n:
        notes.append(f"{n - ok} of {n} requests did not complete (no first token): left out")
    outside = ok - int(inside.sum())
    if outside:
        notes.append(f"{outside} completed requests ran (partly) outside the recording: no breakdown for "
                     "them (the trace did not see their whole window)")
    rows = table.loc[inside]
    if not restores_recorded(trace):
        notes.append("restores not recorded (this trace's probes could not see them): restore_ns is NA and "
                     "rest_ns includes any restore time")
    cut = int(rows["cut_spans"].fillna(0).astype("int64").astype(bool).sum())
    if cut:
        notes.append(f"{cut} requests' windows cut a checkpoint or restore span: only the time inside the window "
                     "counts, and its fault, on-CPU and wait figures are prorated by that share")
    ev = trace.events if pid is None else trace.events.loc[(trace.events["pid"] == pid).to_numpy()]
    tids = ev.loc[kind_mask(ev, "checkpoint"), "tid"].nunique()
    if tids > 1:
        notes.append(f"checkpoints came from {tids} threads: a request's checkpoint time adds up every thread's "
                     "and can exceed its TTFT where they ran at once")
    return {"requests": n, "completed": ok, "with_breakdown": int(inside.sum()), "pid": pid,
            "stats": {f: describe(rows[f]) for f in SUMMARY_FIGURES},
            "estimate": "est_ttft_without_fill_ns = ttft_ns - ckpt_fill_ns: an estimate, it assumes nothing "
                        "else would move without the fill",
            "notes": notes}


# Samples for compare's request metrics (analyzers/compare.py), per leg.

def completed(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that got a first token and ended (status ok)."""
    ok = (requests["status"] == "ok") & requests["ttft_ns"].notna() & requests["total_ns"].notna()
    return requests.loc[ok.to_numpy()]


def ttft_samples_ms(requests: pd.DataFrame) -> np.ndarray:
    """Each completed request's time to first token, in ms."""
    return completed(requests)["ttft_ns"].to_numpy("float64") / 1e6


def throughput_samples(requests: pd.DataFrame) -> np.ndarray:
    """Rows (tokens generated, seconds) of the completed requests, whose sums give the leg's
    throughput: the seconds are each request's share of the leg's wall time (first send to last
    end), in proportion to its own duration, so they add up to that wall time. Resampling rows
    is then a ratio-estimator bootstrap of tokens per second. Empty when a file does not say how
    many tokens were generated (drive before predicted_tokens): not recorded, not 0."""
    done = completed(requests)
    if not len(done) or done["predicted_tokens"].isna().any():
        return np.empty((0, 2))
    start = done["start_ns"].to_numpy("int64")
    dur = done["total_ns"].to_numpy("float64")
    wall_s = float((start + dur.astype("int64")).max() - start.min()) / 1e9
    share = dur / dur.sum() if dur.sum() > 0 else np.full(len(dur), 1.0 / len(dur))
    return np.column_stack([done["predicted_tokens"].to_numpy("float64"), share * wall_s])


def throughput_stat(x: np.ndarray, axis=None) -> np.ndarray | float:
    """Tokens per second of throughput_samples rows (x[..., n, 2]): sum of tokens over sum of seconds."""
    return x[..., 0].sum(axis=-1) / x[..., 1].sum(axis=-1)
