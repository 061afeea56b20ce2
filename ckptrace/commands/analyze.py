"""`ckptrace analyze`: per-checkpoint and per-iteration breakdown of one trace, as text, JSON or CSV."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import click
import pandas as pd

from ckptrace.errors import CkptraceError
from ckptrace.meta import TraceMeta
from ckptrace.terminal import echo, printable
from ckptrace.trace import read_trace, time_origin

WIDTH = 80
MIB = 1 << 20


def ms(ns) -> str:
    return "-" if ns is None or (isinstance(ns, float) and math.isnan(ns)) else f"{ns / 1e6:.2f}"


def wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts of plain Python values (to_dict unboxes numpy scalars)."""
    return df.to_dict("records")


def analysis_json(analysis) -> dict:
    return {"trace": analysis.trace.meta.to_json(), "checkpoints": records(analysis.checkpoints),
            "iterations": records(analysis.iterations), "summary": analysis.summary}


def _duration_s(meta: TraceMeta, events: pd.DataFrame) -> float | None:
    start, stop = meta.attach_ns, meta.stop_ns
    if start is not None and stop is not None and stop > start:
        return (stop - start) / 1e9
    if len(events):
        return (int(events["end_ns"].max()) - int(events["start_ns"].min())) / 1e9
    return None


def header_lines(analysis) -> list[str]:
    t, s = analysis.trace, analysis.summary
    meta, ev = t.meta, t.events
    dur = _duration_s(meta, ev)
    lines = [wrap(f"trace {printable(t.path or '-')}")]
    parts = [f"label {printable(t.label)}", f"pid {meta.pid if meta.pid is not None else '-'}",
             f"duration {dur:.2f} s" if dur is not None else "duration -",
             f"lost events {s['lost_events']}"]
    lines.append(wrap("   ".join(parts)))
    lines.append(wrap(f"{s['checkpoints']} checkpoints ({s['pool_hits']} pool hits, "
                      f"{s['draft_checkpoints']} draft, {s['unassigned_checkpoints']} in no iteration) "
                      f"on {analysis.checkpoints['tid'].nunique()} thread(s); {s['iterations']} iterations "
                      f"({s['prefill_iterations']} prefill, {s['decode_iterations']} decode)"))
    return lines


def checkpoint_lines(analysis, limit: int | None) -> list[str]:
    ck = analysis.checkpoints
    if not len(ck):
        return ["No checkpoints in this trace (was update_tgt probed and called?)."]
    t0 = time_origin(analysis.trace.meta, analysis.trace.events)
    shown = ck if limit is None else ck.head(limit)
    # Column formatting is vectorised; only the final join walks the (bounded) rows.
    cols = {
        "ckpt": shown["ckpt"].astype(str) + shown["draft"].map({True: "d", False: ""}),
        "iter": shown["iter"].astype(str).where(shown["iter"] != 0, "-"),
        "at s": ((shown["start_ns"] - t0) / 1e9).map("{:.3f}".format),
        "total": (shown["total_ns"] / 1e6).map("{:.2f}".format),
        "fill": (shown["fill_ns"] / 1e6).map("{:.2f}".format),
        "copy": (shown["copy_ns"] / 1e6).map("{:.2f}".format),
        "fault": (shown["fault_ns"] / 1e6).map("{:.2f}".format),
        "faults": shown["faults"].astype(str),
        "MiB": (shown["bytes"] / MIB).map("{:.1f}".format),
        "mm/un": shown["mmaps"].astype(str) + "/" + shown["munmaps"].astype(str),
        "hit": shown["pool_hit"].map({True: "yes", False: "no"}),
    }
    minimum = {"ckpt": 4, "iter": 5, "at s": 7, "faults": 7, "MiB": 6, "mm/un": 5}
    widths = {k: max(len(k), minimum.get(k, 8 if k != "hit" else 3), int(v.str.len().max()) if len(v) else 0)
              for k, v in cols.items()}
    head = " ".join(k.rjust(widths[k]) for k in cols)
    body = pd.Series([""] * len(shown), index=shown.index, dtype="str")
    for i, (k, v) in enumerate(cols.items()):
        if len(shown):
            body = body + (" " if i else "") + v.astype("str").str.rjust(widths[k])
    lines = ["Checkpoints (times in ms; d = draft; mm/un = mmaps/munmaps inside)", head, *body.tolist()]
    if len(shown) < len(ck):
        lines.append(f"... {len(ck) - len(shown)} more (--all shows every row)")
    return lines


def iteration_lines(analysis) -> list[str]:
    it = analysis.iterations
    if not len(it):
        return ["No iterations (no update_slots or llama_decode events): checkpoints are unassigned."]
    g = it.groupby("kind", observed=False).agg(
        n=("iter", "size"), med=("span_ns", "median"), total=("span_ns", "sum"), fill=("fill_ns", "sum"),
        copy=("copy_ns", "sum"), other=("other_ns", "sum"), ck=("checkpoints", "sum"))
    bounds = ", ".join(sorted(it["boundary"].astype(str).unique()))
    lines = [f"Iterations (times in ms; boundary: {bounds})",
             f"{'kind':8} {'count':>6} {'median':>9} {'total':>10} {'fill':>9} {'copy':>9} {'other':>10} {'ckpts':>6}"]
    for kind, r in g.iterrows():  # two rows at most: prefill, decode
        lines.append(f"{kind:8} {int(r['n']):>6} {ms(r['med'] if r['n'] else None):>9} {ms(r['total']):>10} "
                     f"{ms(r['fill']):>9} {ms(r['copy']):>9} {ms(r['other']):>10} {int(r['ck']):>6}")
    return lines


def summary_lines(s: dict) -> list[str]:
    names = {"checkpoint_fill_ns": "fill", "checkpoint_copy_ns": "copy", "checkpoint_fault_ns": "fault",
             "checkpoint_total_ns": "checkpoint total", "prefill_iteration_ns": "prefill iteration"}
    lines = ["Summary (ms)", f"{'':18} {'count':>6} {'mean':>9} {'median':>9} {'p90':>9} {'p99':>9}"]
    for key, name in names.items():
        d = s["stats"][key]
        lines.append(f"{name:18} {d['count']:>6} {ms(d['mean']):>9} {ms(d['median']):>9} "
                     f"{ms(d['p90']):>9} {ms(d['p99']):>9}")
    share = s["checkpoint_share_of_prefill"]
    rate = s["pool_hit_rate"]
    figures = [
        f"checkpoint share of prefill time: {share * 100:.1f}%" if share is not None
        else "checkpoint share of prefill time: - (no prefill iterations)",
        f"pool hit rate: {rate * 100:.0f}% ({s['pool_hits']} of {s['checkpoints']})" if rate is not None
        else "pool hit rate: -",
        f"state copied: {s['checkpoint_bytes'] / MIB:.1f} MiB",
    ]
    if s["faults_per_mib"] is not None:
        figures.append(f"per MiB of state: {s['faults_per_mib']:.1f} faults, {s['ns_per_mib'] / 1e6:.3f} ms "
                       f"(fill {s['fill_ns_per_mib'] / 1e6:.3f}, copy {s['copy_ns_per_mib'] / 1e6:.3f})")
    every = s.get("fault_sample_every")
    figures.append("fault time: " + ("measured" + (f" (in 1 of {every} 0.25 s slices)" if every and every != 1 else "")
                                     if s["fault_time_measured"] else "not measured"))
    lines += [wrap(f) for f in figures]
    lines.append(wrap(("reliability: ok, " if s["reliable"] else "reliability: WARNING: ") + s["reliability"]))
    lines += [wrap("note: " + n) for n in s["notes"]]
    return lines


def render_report(analysis, limit: int | None = 20) -> str:
    blocks = [header_lines(analysis), checkpoint_lines(analysis, limit), iteration_lines(analysis),
              summary_lines(analysis.summary)]
    return "\n\n".join("\n".join(b) for b in blocks)


def write_csv(analysis, directory: str) -> list[Path]:
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        paths = [d / "checkpoints.csv", d / "iterations.csv"]
        analysis.checkpoints.to_csv(paths[0], index=False)
        analysis.iterations.to_csv(paths[1], index=False)
    except OSError as e:
        raise CkptraceError(f"cannot write CSV files to {d}: {e.strerror or e}; choose a writable --csv DIR") from None
    return paths


@click.command("analyze", epilog="""\b
Examples:
  ckptrace analyze off.parquet
  ckptrace analyze off.parquet --all
  ckptrace analyze off.parquet --json | jq '.summary.stats.checkpoint_fill_ns'
  ckptrace analyze off.parquet --csv out/
""")
@click.argument("trace", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print {trace, checkpoints, iterations, summary} as JSON.")
@click.option("--csv", "csv_dir", metavar="DIR", help="Also write checkpoints.csv and iterations.csv into DIR.")
@click.option("--all", "show_all", is_flag=True, help="List every checkpoint, not only the first --rows.")
@click.option("--rows", type=click.IntRange(min=0), default=20, show_default=True,
              help="Checkpoints listed before '... N more'.")
def command(trace, as_json, csv_dir, show_all, rows):
    """Per-checkpoint and per-iteration breakdown of one trace.

    Each checkpoint is split into fill (the resize's zero fill), copy (the state copy) and other;
    fault time is the part of fill and copy spent on page faults. Iterations are update_slots
    calls (or llama_decode calls when update_slots was not probed), prefill when they made a
    checkpoint or carried prompt tokens.
    """
    from ckptrace.analyzers import analyze_trace

    analysis = analyze_trace(read_trace(trace))
    if csv_dir:
        paths = write_csv(analysis, csv_dir)
        if not as_json:
            click.echo(f"wrote {printable(paths[0])} and {printable(paths[1])}", err=True)
    if as_json:
        click.echo(json.dumps(analysis_json(analysis), default=str, allow_nan=False))
    else:
        echo(render_report(analysis, None if show_all else rows))
