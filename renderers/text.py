"""Text reports for a terminal, 80 columns: `analyze` (one trace) and `compare` (A/B/A legs)."""
from __future__ import annotations

import math
import textwrap

import pandas as pd

from ckptrace.analyzers.metrics import CPU, METRICS, POOL
from ckptrace.analyzers.summary import WAIT_WARN_SHARE
from ckptrace.core.meta import TraceMeta
from ckptrace.core.terminal import printable, shown_label
from ckptrace.core.trace import time_origin
from ckptrace.core.units import MIB, mib, mib_said, ms, ms_na, pct_change

WIDTH = 80
FAULT_MARK = {"measured": "", "estimated": "*", "none": "", "not recorded": ""}


def ms_column(ns: pd.Series) -> pd.Series:
    """A column of ns as ms strings, 2 decimals; "-" where not recorded (NA)."""
    v = pd.Series(ns).astype("Float64") / 1e6
    return v.map(lambda x: "-" if x is pd.NA else f"{x:.2f}").astype("str")  # str even when empty


def wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False)


def _duration_s(meta: TraceMeta, rows) -> float | None:
    start, stop = meta.attach_ns, meta.stop_ns
    if start is not None and stop is not None and stop > start:
        return (stop - start) / 1e9
    if rows.start_ns is not None:
        return (rows.end_ns - rows.start_ns) / 1e9
    return None


def header_lines(analysis) -> list[str]:
    t, s = analysis.trace, analysis.summary
    meta = t.meta
    dur = _duration_s(meta, analysis.rows)
    lines = [wrap(f"trace {printable(t.path or '-')}")]
    pid = (f"{len(analysis.processes)} processes" if len(analysis.processes) > 1
           else f"pid {meta.pid if meta.pid is not None else '-'}")
    parts = [f"label {shown_label(t.label)}", pid,
             f"duration {dur:.2f} s" if dur is not None else "duration -",
             f"lost events {s['lost_events']}"]
    lines.append(wrap("   ".join(parts)))
    lines.append(wrap(f"{s['checkpoints']} checkpoints ({s['pool_hits']} pool hits, "
                      f"{s['draft_checkpoints']} draft, {s['unassigned_checkpoints']} in no iteration) "
                      f"on {analysis.checkpoints['tid'].nunique()} thread(s); {s['iterations']} iterations "
                      f"({s['prefill_iterations']} prefill, {s['decode_iterations']} decode)"))
    return lines


BUFFER_LEGEND = ("buffer: reused = a pool hit (no fill, the copy faulted nothing), grown = a fill ran, fresh = no fill "
                 "and the copy faulted every page in, partial = some, touched = mapped and touched before the copy")


def checkpoint_lines(analysis, limit: int | None) -> list[str]:
    ck = analysis.checkpoints
    if not len(ck):
        return ["No checkpoints in this trace (was update_tgt probed and called?)."]
    t0 = time_origin(analysis.trace.meta, analysis.rows.start_ns)
    shown = ck if limit is None else ck.head(limit)
    # Column formatting is vectorised; only the final join walks the (bounded) rows.
    cols = {
        "ckpt": shown["ckpt"].astype(str) + shown["draft"].map({True: "d", False: ""})
        + shown["spec"].map({True: "s", False: ""}),
        "iter": shown["iter"].astype(str).where(shown["iter"] != 0, "-"),
        "at s": ((shown["start_ns"] - t0) / 1e9).map("{:.3f}".format),
        "total": ms_column(shown["total_ns"]),
        "fill": ms_column(shown["fill_ns"]) + (shown["fill_source"] == "derived").map({True: "~", False: ""}),
        "copy": ms_column(shown["copy_ns"]),
        "fault": ms_column(shown["fault_ns"]) + shown["fault_source"].map(FAULT_MARK).astype(str),
        "cpu": ms_column(shown["cpu_ns"]),
        "wait": ms_column(shown["wait_ns"]),
        "faults": shown["faults"].astype(str),
        "MiB": (shown["bytes"] / MIB).map("{:.1f}".format),
        "buffer": shown["buffer"].astype(str),
    }
    minimum = {"ckpt": 4, "iter": 4, "at s": 6, "faults": 6, "MiB": 5, "buffer": 6}
    widths = {k: max(len(k), minimum.get(k, 6), int(v.str.len().max()) if len(v) else 0)
              for k, v in cols.items()}
    head = " ".join(k.rjust(widths[k]) for k in cols)
    body = pd.Series([""] * len(shown), index=shown.index, dtype="str")
    for i, (k, v) in enumerate(cols.items()):
        if len(shown):
            body = body + (" " if i else "") + v.astype("str").str.rjust(widths[k])
    # The legend names only the marks this table shows.
    marks = [("d = draft", shown["draft"].any()), ("s = speculative round", shown["spec"].any()),
             ("fill ~ derived: the growth is inlined in this build, total - copy",
              (shown["fill_source"] == "derived").any())]
    fault = "fault: the faults' whole cost" + (", * estimated" if (shown["fault_source"] == "estimated").any() else "")
    missing = any(v.eq("-").any() for k, v in cols.items() if k in ("total", "fill", "copy", "fault", "cpu", "wait"))
    legend = "; ".join(["ms"] + [m for m, on in marks if on] + [fault, "cpu: on CPU, wait: waiting for a CPU",
                                                                  BUFFER_LEGEND]
                       + (["- = not recorded"] if missing else []))
    lines = [wrap(f"Checkpoints ({legend})"), head, *body.tolist()]
    if len(shown) < len(ck):
        lines.append(f"... {len(ck) - len(shown)} more (--all shows every row)")
    return lines


def state_path_lines(analysis) -> list[str]:
    """Restores, prompt saves, evictions (trace format 3) and slot files (4), when the recording saw any."""
    rs, ev, ps, sf = analysis.restores, analysis.evictions, analysis.prompt_saves, analysis.slot_files
    if all(t is None or not len(t) for t in (rs, ev, ps, sf)):
        return []
    lines = ["State path"]
    if rs is not None and len(rs):
        from_ckpt = int((rs["source"] == "checkpoint").sum())
        lines.append(wrap(
            f"restores: {len(rs)} ({from_ckpt} of a checkpoint, {len(rs) - from_ckpt} other: prompt cache or "
            f"slot), {mib_said(rs['bytes'].sum())} put back; mean {ms(rs['total_ns'].mean())} ms, "
            f"of which copy {ms(rs['copy_ns'].mean())} ms, {rs['copy_faults'].sum()} copy faults", "  "))
    if ps is not None and len(ps):
        lines.append(wrap(
            f"prompt saves: {len(ps)}, {mib_said(ps['bytes'].sum())} copied to the prompt cache; mean "
            f"{ms(ps['total_ns'].mean())} ms, of which copy {ms(ps['copy_ns'].mean())} ms, "
            f"{ps['copy_faults'].sum()} copy faults", "  "))
    if ev is not None and len(ev):
        room = int((ev["why"] == "room").sum())
        lines.append(wrap(f"evictions: {len(ev)} buffers unmapped ({room} in create_checkpoint before its "
                          f"checkpoint, {len(ev) - room} invalidated in a restore), {mib_said(ev['bytes'].sum())}",
                          "  "))
    if sf is not None and len(sf):
        parts = []
        for action, verb in (("save", "written"), ("restore", "read")):
            rows = sf[sf["action"] == action]
            if len(rows):
                failed = int((~rows["ok"]).sum())
                parts.append(f"{len(rows)} {action} calls, {mib_said(rows['bytes'].sum())} {verb}, mean "
                             f"{ms(rows['total_ns'].mean())} ms" + (f", {failed} failed" if failed else ""))
        lines.append(wrap("slot files: " + "; ".join(parts), "  "))
    return lines


def gpu_lines(analysis) -> list[str]:
    """The CUDA copy path (a trace recorded with a CUDA target): the state copies by destination."""
    from ckptrace.analyzers.gpu import gpu_summary

    table = analysis.gpu
    if table is None:
        return []
    if not len(table):
        return [wrap("CUDA copy path: no state copy made a CUDA call (the CUDA libraries were probed)")]
    s = gpu_summary(table)
    lines = [wrap("CUDA copy path (state copies by where their device-to-host copies went; medians in ms; "
                  "enqueue: in the copy calls, wait: in the synchronize calls, host: the rest of the copy; "
                  "faults on the destination, by any thread and by the driver's)"),
             f"{'dst':17} {'copies':>6} {'MiB':>7} {'copy':>8} {'enqueue':>8} {'wait':>8} {'host':>7} "
             f"{'faults':>7} {'driver':>7}"]
    for d in s["by_dst"]:
        lines.append(f"{d['dst']:17} {d['copies']:>6} {d['bytes'] / d['copies'] / MIB:>7.1f} "
                     f"{ms(d['median_copy_ns']):>8} {ms(d['median_enqueue_ns']):>8} "
                     f"{ms(d['median_sync_ns']):>8} {ms(d['median_host_ns']):>7} "
                     f"{d['dst_faults']:>7} {d['driver_faults']:>7}")
    if s["fresh_over_resident"] is not None:
        lines.append(f"pageable fresh / resident copy time: {s['fresh_over_resident']:.1f}x (medians)")
    gpu = analysis.trace.meta.gpu
    if gpu is not None and not gpu.pinned_known_from_start:
        lines.append(wrap("note: attached to a running process: memory it pinned before the probes were in "
                          "counts as pageable"))
    if gpu is not None and (gpu.ranges_full or gpu.pinned_full):
        lines.append(wrap(f"note: {gpu.ranges_full} copies without their destination's faults, "
                          f"{gpu.pinned_full} pinned ranges not remembered (the kernel side's tables were full)"))
    return lines


def iteration_lines(analysis) -> list[str]:
    it = analysis.iterations
    if not len(it):
        return ["No iterations (no update_slots or llama_decode events): checkpoints are unassigned."]
    g = it.groupby("kind", observed=False).agg(
        n=("iter", "size"), med=("span_ns", "median"), total=("span_ns", "sum"), fill=("fill_ns", "sum"),
        copy=("copy_ns", "sum"), other=("other_ns", "sum"), ck=("checkpoints", "sum"))
    bounds = ", ".join(sorted(it["boundary"].astype(str).unique()))
    lines = [f"Iterations (ms; boundary: {bounds})",
             f"{'kind':8} {'count':>6} {'median':>9} {'total':>10} {'fill':>9} {'copy':>9} {'other':>10} {'ckpts':>6}"]
    for kind, r in g.iterrows():  # two rows at most: prefill, decode
        lines.append(f"{kind:8} {int(r['n']):>6} {ms(r['med'] if r['n'] else None):>9} {ms(r['total']):>10} "
                     f"{ms(r['fill']):>9} {ms(r['copy']):>9} {ms(r['other']):>10} {int(r['ck']):>6}")
    for kind, rows in it.groupby("kind", observed=True):
        ok = rows["cpu_ns"].notna() & rows["wait_ns"].notna()
        if ok.any():
            wall = int(rows.loc[ok, "span_ns"].sum())
            lines.append(wrap(f"{kind}: on CPU {ms(int(rows.loc[ok, 'cpu_ns'].sum()))}, waiting for a CPU "
                              f"{ms(int(rows.loc[ok, 'wait_ns'].sum()))} of {ms(wall)} wall"
                              + (f" ({int(ok.sum())} of {len(rows)} recorded)" if not ok.all() else "")))
    return lines


def summary_lines(s: dict) -> list[str]:
    names = {n: m.label for n, m in METRICS.items() if m.summary}  # the metric table's (analyzers/metrics.py)
    lines = ["Summary (ms; count: values recorded)",
             f"{'':18} {'count':>6} {'mean':>9} {'median':>9} {'p90':>9} {'p99':>9}"]
    for key, name in names.items():
        d = s["stats"][key]
        if (METRICS[key].kind == CPU or key == "checkpoint_wait_ns") and not d["count"]:
            continue  # on-CPU time and wait not recorded: one note below says so
        lines.append(f"{name:18} {d['count']:>6} {ms(d['mean']):>9} {ms(d['median']):>9} "
                     f"{ms(d['p90']):>9} {ms(d['p99']):>9}")
    share = s["checkpoint_share_of_prefill"]
    rate = s["pool_hit_rate"]
    figures = [
        f"checkpoint share of prefill time: {share * 100:.1f}%" if share is not None
        else "checkpoint share of prefill time: - (no prefill iterations)",
        f"pool hit rate: {rate * 100:.0f}% ({s['pool_hits']} of {s['checkpoints']})" if rate is not None
        else "pool hit rate: -",
        "buffers: " + (", ".join(f"{k} {v}" for k, v in s["buffers"].items() if v) or "-"),
        f"state copied: {mib_said(s['checkpoint_bytes'])}",
    ]
    if s["faults_per_mib"] is not None:
        figures.append(f"per MiB of state: {s['faults_per_mib']:.1f} faults, {s['ns_per_mib'] / 1e6:.3f} ms "
                       f"(fill {s['fill_ns_per_mib'] / 1e6:.3f}, copy {s['copy_ns_per_mib'] / 1e6:.3f})")
    src = s["fault_sources"]
    method = (s.get("fault_time") or {}).get("method") if isinstance(s.get("fault_time"), dict) else None
    figures.append("fault time (checkpoints): " + ", ".join(f"{n} {k}" for k, n in src.items() if n)
                   + (f"; method: {printable(method)}" if method else ""))
    for what, key in (("checkpoints", "wait_share"), ("prefill iterations", "prefill_wait_share")):
        if s.get(key) is not None and s[key] <= WAIT_WARN_SHARE:  # above it, a note says so and what to do
            figures.append(f"{what} waited for a CPU {s[key] * 100:.1f}% of their wall time")
    lines += [wrap(f) for f in figures]
    lines.append(wrap(("reliability: ok, " if s["reliable"] else "reliability: WARNING: ") + s["reliability"]))
    lines += [wrap("note: " + n) for n in s["notes"]]
    return lines


def memory_lines(m: dict, t0: int, limit: int | None = 20) -> list[str]:
    """Checkpoint buffers held (mmap'ed during a checkpoint until munmap'ed) and RSS."""
    if not m["buffers_mapped"] and m["peak_rss_bytes"] is None:
        return [wrap("Memory: no checkpoint buffer was mapped while recording; RSS not recorded.")]
    lines = ["Memory (checkpoint buffers: mapped during a checkpoint, held until unmapped)"]
    peak_at = f" at {(m['peak_held_ns'] - t0) / 1e9:.3f} s" if m["peak_held_ns"] is not None else ""
    lines.append(wrap(f"held at peak {mib_said(m['peak_held_bytes'])}{peak_at}; at the end {mib_said(m['end_held_bytes'])}; "
                      f"{m['buffers_mapped']} buffers mapped ({mib_said(m['buffer_bytes_mapped'])}), "
                      f"{mib_said(m['released_bytes'])} returned in {len(m['releases'])} releases"))
    lines.append(wrap("RSS at peak: " + (mib_said(m["peak_rss_bytes"]) + f" ({m['rss_samples']} changes recorded)"
                                         if m["peak_rss_bytes"] is not None else "- (not recorded)")))
    lim = m.get("limit")
    if lim:
        lines.append(wrap(f"cgroup memory limit {mib_said(lim['limit_bytes'])} ({printable(lim['limit_from'])}): with a "
                          f"PR #201 pool, pooled bytes plus RSS would reach {mib_said(lim['predicted_peak_bytes'])} "
                          f"({lim['share'] * 100:.0f}% of it; `ckptrace whatif` says more)"))
        if lim["warning"]:
            lines.append(wrap("WARNING: " + lim["warning"]))
    rel = m["releases"] if limit is None else m["releases"].head(limit)
    if len(rel):
        lines.append(f"{'released at s':>13} {'pid':>7} {'tid':>7} {'MiB':>8} {'held after':>10}  phase")
        for r in rel.to_dict("records"):
            lines.append(f"{(r['t_ns'] - t0) / 1e9:>13.3f} {r['pid']:>7} {r['tid']:>7} {mib(r['bytes']):>8} "
                         f"{mib(r['held_after_bytes']):>10}  {printable(r['phase'])}")
        if len(rel) < len(m["releases"]):
            lines.append(f"... {len(m['releases']) - len(rel)} more releases (--all shows every row)")
    return lines


def request_lines(table: pd.DataFrame, s: dict, limit: int | None) -> list[str]:
    """`analyze --requests`: each request's TTFT split, then the distributions over requests."""
    shown = table if limit is None else table.head(limit)
    cols = {"req": shown["request"].astype(str), "ttft": ms_column(shown["ttft_ns"]),
            "ckpts": shown["checkpoints"].astype("string").fillna("-"),
            "ckpt": ms_column(shown["ckpt_ns"]), "fill": ms_column(shown["ckpt_fill_ns"]),
            "copy": ms_column(shown["ckpt_copy_ns"]), "fault": ms_column(shown["ckpt_fault_ns"]),
            "restore": ms_column(shown["restore_ns"]), "rest": ms_column(shown["rest_ns"]),
            "no-fill~": ms_column(shown["est_ttft_without_fill_ns"])}
    widths = {k: max(len(k), 5, int(v.str.len().max()) if len(v) else 0) for k, v in cols.items()}
    lines = [wrap("Requests (ms): time to first token = checkpoint time inside the window (create_checkpoint "
                  "spans whole, evictions included, else the checkpoint: fill, copy, other; fault is part of "
                  "fill and copy) + restore + rest; no-fill~ is an ESTIMATE: "
                  "ttft - fill; - = no breakdown (failed, or not wholly inside the recording)"),
             " ".join(k.rjust(widths[k]) for k in cols)]
    rows = zip(*(v.astype(str).tolist() for v in cols.values()))
    lines += [" ".join(x.rjust(widths[k]) for k, x in zip(cols, r)) for r in rows]
    if len(shown) < len(table):
        lines.append(f"... {len(table) - len(shown)} more (--all shows every row)")
    names = {"ttft_ns": "ttft", "stall_ns": "stall (ckpt+restore)", "ckpt_ns": "checkpoint",
             "ckpt_fill_ns": "fill", "restore_ns": "restore", "est_ttft_without_fill_ns": "ttft no fill (est.)"}
    lines += ["", f"Requests: {s['completed']} of {s['requests']} completed, {s['with_breakdown']} with a breakdown",
              f"{'(ms)':20} {'count':>6} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}"]
    for key, name in names.items():
        d = s["stats"][key]
        lines.append(f"{name:20} {d['count']:>6} {ms(d['median']):>9} {ms(d['p90']):>9} "
                     f"{ms(d['p99']):>9} {ms(d['mean']):>9}")
    lines += [wrap("note: " + n) for n in s["notes"]]
    return lines


def process_lines(processes: list[dict]) -> list[str]:
    """One row per process of a several-process recording: its own checkpoints, times, memory."""
    mean = lambda s, k: ms(s["stats"][k]["mean"])  # noqa: E731
    lines = [wrap("Processes (each its own breakdown: analyze --json 'processes'; ms are means; "
                  "MiB at peak; * exited before the recording stopped)"),
             f"{'pid':>7} {'label':16} {'ckpts':>5} {'hits':>5} {'fill':>8} {'copy':>8} {'total':>8} "
             f"{'held':>7} {'RSS':>7}"]
    for p in processes:
        s, m = p["summary"], p["memory"]
        label = printable(p["label"])
        label = label if len(label) <= 16 else label[:15] + "~"
        lines.append(f"{p['pid']:>7} {label:16} {s['checkpoints']:>5} {s['pool_hits']:>5} "
                     f"{mean(s, 'checkpoint_fill_ns'):>8} {mean(s, 'checkpoint_copy_ns'):>8} "
                     f"{mean(s, 'checkpoint_total_ns'):>8} {mib(m['peak_held_bytes']):>7} "
                     f"{mib(m['peak_rss_bytes']):>7}" + ("*" if p.get("exited_ns") else ""))
    return lines


def analysis_report(analysis, limit: int | None = 20, requests: pd.DataFrame | None = None) -> str:
    t0 = time_origin(analysis.trace.meta, analysis.rows.start_ns)
    blocks = [header_lines(analysis)]
    if len(analysis.processes) > 1:
        blocks.append(process_lines(analysis.processes))
    blocks += [checkpoint_lines(analysis, limit), iteration_lines(analysis),
               summary_lines(analysis.summary), memory_lines(analysis.memory, t0, limit)]
    state = state_path_lines(analysis)
    if state:
        blocks.insert(-2, state)
    gpu = gpu_lines(analysis)
    if gpu:
        blocks.insert(-2, gpu)
    if requests is not None:
        blocks.append(request_lines(requests, analysis.summary["requests"], limit))
    return "\n\n".join("\n".join(b) for b in blocks)


# compare

# Row names: each metric's label with its unit (analyzers/metrics.py).
NAMES = {n: m.heading for n, m in METRICS.items()}


def value_text(x: float, unit: str) -> str:
    if math.isnan(x):
        return "-"
    if unit == "ns":
        return ms(x)
    if unit in ("ms", "tok/s"):  # TTFT runs to minutes on a loaded machine; tokens/s to fractions
        return f"{x:.2f}" if abs(x) < 1000 else (f"{x:.1f}" if abs(x) < 100_000 else f"{x:.0f}")
    return f"{x:.0f}"


def _arm_line(c, arm: str) -> str:
    legs = c.legs.loc[c.legs["arm"] == arm]
    nums = ", ".join(str(n) for n in legs["leg"].tolist())
    label = c.baseline if arm == "baseline" else c.candidate
    return (f"{arm} {shown_label(label)}: leg{'s' if len(legs) > 1 else ''} {nums} ({int(legs['checkpoints'].sum())} "
            f"checkpoints, {int(legs['prefill_iterations'].sum())} prefill iterations)")


# Verdicts shortened in the 80-column tables (the JSON and the lines under a table say them whole).
SHORT_VERDICTS = {"too few samples": "too few"}


def _metric_lines(rows: list[dict], first: str, name_of, width: int = 17) -> tuple[list[str], list[str]]:
    """The verdict table (one line per row) and the notes for rows without a percentage."""
    w = max([15, *(len(name_of(m)) for m in rows)])  # 16 still fits 80 columns with the longest verdict
    lines = [f"{first:{w}} {'baseline':>8} {'candidate':>9} {'change':>7} {'95% interval':>16} {'drift':>6} verdict"]
    notes = []
    for m in rows:
        interval = (f"[{pct_change(m['ci_low_pct'])[:-1]}, {pct_change(m['ci_high_pct'])[:-1]}]"
                    if math.isfinite(m["ci_low_pct"]) or math.isinf(m["ci_low_pct"]) else "-")
        name = name_of(m)
        lines.append(f"{name:{w}} {value_text(m['baseline_value'], m['unit']):>8} "
                     f"{value_text(m['candidate_value'], m['unit']):>9} {pct_change(m['change_pct']):>7} {interval:>16} "
                     f"{pct_change(m['drift_pct']).lstrip('+'):>6} {SHORT_VERDICTS.get(m['verdict'], m['verdict'])}")
        if math.isnan(m["change_pct"]) and not math.isnan(m["diff"]):
            u = "ms" if m["unit"] == "ns" else m["unit"]
            notes.append(f"{name.strip()}: the baseline {m['statistic']} is 0, so no percentage; the candidate's "
                         f"is {value_text(m['diff'], m['unit'])} {u} higher, interval "
                         f"[{value_text(m['diff_ci_low'], m['unit'])}, {value_text(m['diff_ci_high'], m['unit'])}] {u}")
    return lines, notes


POOL_NAMES = {n: METRICS[n].label for n in POOL}
POOL_CLASS = {"hits": "hit", "misses": "miss", "cold hits": "cold hit", "cold misses": "cold miss"}


def _pool_lines(c) -> list[str]:
    legs = c.legs
    rates = "; ".join(f"leg {int(r['leg'])} {r['pool_hits']} of {r['checkpoints']}" for r in legs.to_dict("records"))
    lines = ["", wrap(f"pool hits: {rates}. Hits and misses apart, warm and cold (in the warm-up) apart, each "
                      "against the baseline's of the same class (medians; the baseline's own hits or misses when "
                      "it has hits too; a class it lacks is shown, not judged):")]
    rows = [{**m, "unit": "ns"} for m in c.pool.to_dict("records")]
    table, notes = _metric_lines(rows, "class", lambda m: f"{POOL_CLASS[m['class']]} {POOL_NAMES[m['metric']]}")
    return lines + table + [wrap(n) for n in notes]


def _ttft_lines(c) -> list[str]:
    """Each TTFT percentile's change split by the traced checkpoint path (analyzers/ttft.py), and
    why a TTFT row was not judged."""
    t = getattr(c, "ttft", None)
    if t is None or not len(t):
        return []
    from ckptrace.analyzers.ttft import OUTSIDE

    need = ", ".join(f"{int(r['min_requests'])}{' requests per arm' if i == 0 else ''} for a p{int(r['percentile'])}"
                     for i, r in enumerate(t.to_dict("records")))
    lines = ["", wrap("time to first token: each percentile's change split into what the traced checkpoint path "
                      "explains (checkpoint and restore time inside each request's TTFT, before against after) and "
                      f"the rest ({OUTSIDE}); ms; a percentile is judged on at least {need}:"),
             f"{'metric':15} {'requests':>9} {'baseline':>8} {'candidate':>9} {'change':>8} {'ckpt path':>9} {'rest':>8}"]
    for r in t.to_dict("records"):
        lines.append(f"{NAMES.get(r['metric'], r['metric']):15} "
                     f"{str(r['requests_baseline']) + '/' + str(r['requests_candidate']):>9} "
                     f"{r['baseline_ms']:8.2f} {r['candidate_ms']:9.2f} {r['change_ms']:+8.2f} "
                     f"{r['explained_ms']:+9.2f} {r['outside_ms']:+8.2f}")
    m = c.metrics
    for r in m[(m["sample"] == "request") & (m["why"] != "")].to_dict("records"):
        lines.append(wrap(f"{NAMES.get(r['metric'], r['metric'])}: {r['verdict']}: {r['why']}"))
    return lines


def _warmup_lines(c) -> list[str]:
    """Each arm's warm-up, left out of the metrics above: its iterations and cold checkpoints."""
    from ckptrace.analyzers.warmup import described

    w = c.warmup
    if w is None or not len(w) or not w["warmup_iterations"].sum() and not w["cold_checkpoints"].sum():
        return ["", wrap(f"warm-up: {described(c.warmup_setting)}: nothing left out")]
    lines = ["", wrap(f"warm-up ({described(c.warmup_setting)}; --warmup N|auto), left out of the metrics above "
                      "(means, ms; cold: checkpoints made in it):"),
             f"{'arm':10} {'iterations':>10} {'wall':>9} {'on CPU':>9} {'cold ckpts':>10} {'hits':>5} "
             f"{'wall':>9} {'on CPU':>9}"]
    for r in w.to_dict("records"):
        lines.append(f"{r['arm']:10} {r['warmup_iterations']:>10} {ms(r['warmup_iteration_ns']):>9} "
                     f"{ms(r['warmup_iteration_cpu_ns']):>9} {r['cold_checkpoints']:>10} {r['cold_hits']:>5} "
                     f"{ms(r['cold_total_ns']):>9} {ms(r['cold_total_cpu_ns']):>9}")
    return lines


def _memory_table(c) -> list[str]:
    """What the candidate costs: each leg's peak, arms' means (single figures, no interval)."""
    names = {"held_peak_mib": "held ckpt MiB", "rss_peak_mib": "RSS MiB"}
    lines = ["", wrap("memory at peak (one figure per leg, arms' mean; drift: spread of the baseline legs; "
                      "held: checkpoint buffers mapped and not yet unmapped)"),
             f"{'metric':15} {'baseline':>8} {'candidate':>9} {'change':>9} {'drift':>7}  per leg"]
    for r in c.memory.to_dict("records"):
        f = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"  # noqa: E731
        change = "-" if math.isnan(r["change_mib"]) else f"{r['change_mib']:+.1f}"
        legs = " ".join(f(v) for v in r["legs_mib"])
        lines.append(wrap(f"{names.get(r['metric'], r['metric']):15} {f(r['baseline_value']):>8} "
                          f"{f(r['candidate_value']):>9} {change:>9} {f(r['drift_mib']):>7}  {legs}"))
    return lines


def gate_said(rows: pd.DataFrame) -> str:
    """The rows that tripped `compare --fail-on`, each with its change and interval, on one line."""
    out = []
    for m in rows.to_dict("records"):
        if math.isfinite(m["change_pct"]):
            how = (f"{pct_change(m['change_pct'])}, 95% interval [{pct_change(m['ci_low_pct'])}, {pct_change(m['ci_high_pct'])}]")
        else:
            how = f"{value_text(m['diff'], m['unit'])} {'ms' if m['unit'] == 'ns' else m['unit']} more than a baseline of 0"
        out.append(f"{m['metric']} {m['verdict']} ({how})")
    return "; ".join(out)


def unjudged_said(rows: pd.DataFrame, name=str) -> str:
    """The metrics the gate looked at and could not judge, each with its verdict and why."""
    from ckptrace.analyzers.compare_text import UNJUDGED_WHY

    return "; ".join(f"{name(m['metric'])} ({m['verdict']}: "
                     f"{m.get('why') or UNJUDGED_WHY.get(m['verdict'], 'no verdict')})"
                     for m in rows.to_dict("records"))


def compare_report(c) -> str:
    lines = []
    if c.headline:
        from ckptrace.analyzers.headline import sentence

        lines += [wrap(sentence(c.headline, c.candidate, c.baseline, printable)), ""]
        if c.headline.get("fresh_copies"):
            from ckptrace.analyzers.headline import fresh_copies_said

            lines += [wrap(fresh_copies_said(c.headline["fresh_copies"], printable)), ""]
    lines += [wrap(_arm_line(c, "baseline")), wrap(_arm_line(c, "candidate")),
              wrap(f"samples: {c.samples}, after each thread's warm-up; each arm is summarised by its "
                   f"{c.statistic}; 95% bootstrap intervals of the change ({c.n_boot} resamples, seed {c.seed})")]
    if c.machine:
        lines.append(wrap(c.machine["said"]))
    lines.append("")
    table, notes = _metric_lines(c.metrics.to_dict("records"), "metric", lambda m: NAMES.get(m["metric"], m["metric"]))
    lines += table + [wrap(n) for n in notes] + _ttft_lines(c)
    if c.pool is not None and len(c.pool):
        lines += _pool_lines(c)
    lines += _warmup_lines(c)
    if c.memory is not None and len(c.memory):
        lines += _memory_table(c)
    lines += ["", wrap(c.explanation)]
    if c.warnings:
        lines.append("")
        lines += [wrap("warning: " + w) for w in c.warnings]
    return "\n".join(lines)


def load_report(df: pd.DataFrame, requested: int, ttft_ms: dict[str, float]) -> str:
    """`ckptrace drive`: one row per request sent, then the TTFT percentiles (ms) of those that
    succeeded. Statuses quote the server: made printable."""
    t0 = int(df["start_ns"].min()) if len(df) else 0
    lines = [f"{'req':>4} {'client':>6} {'prompt_tok':>10} {'start_ms':>9} {'ttft_ms':>9} "
             f"{'total_ms':>9}  status"]
    for r in df.itertuples(index=False):
        lines.append(f"{r.request:>4} {r.client:>6} {r.prompt_tokens:>10} {(r.start_ns - t0) / 1e6:>9.1f} "
                     f"{ms_na(r.ttft_ns, 1):>9} {ms_na(r.total_ns, 1):>9}  {printable(r.status)}")
    n_ok = int((df["status"] == "ok").sum())
    lines.append(f"{n_ok} of {requested} requests ok, {len(df)} sent; TTFT ms: "
                 f"p50 {ttft_ms['p50']:.1f}  p90 {ttft_ms['p90']:.1f}  p99 {ttft_ms['p99']:.1f}")
    return "\n".join(lines)
