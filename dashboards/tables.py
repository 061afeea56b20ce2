"""The dashboard's table panels: the recordings' metadata, the analyzer summary and the page's
header, with the text their cells show (a summary figure in its unit, a summary key as a name,
long text wrapped: plotly tables do not wrap)."""
from __future__ import annotations

import math
import os
import textwrap

import numpy as np

from ckptrace.core.meta import TraceMeta
from ckptrace.core.terminal import shown_label
from ckptrace.core.units import MIB

from ckptrace.analyzers.metrics import METRICS as REGISTRY, label

from .figure import Panel, table_figure
from .legs import Leg, plain

def _fault_timing(meta: TraceMeta) -> str:
    """How the leg's fault time was measured: the recorder's method, else the legacy interval."""
    ft = meta.fault_time
    if ft is not None and ft.method != "none":
        return f"{ft.method}: {ft.definition}"
    every = meta.fault_sample_every
    if every:
        return ("legacy service interval, every fault timed" if every == 1
                else f"legacy service interval, faults timed in 1 of {every} 0.25 s slices")
    return "not recorded (fault counts only)"


def _sched(meta: TraceMeta) -> str:
    sc = meta.sched_counters
    if sc is None:
        return "not recorded (trace format 1)"
    return ("recorded: " if sc.recorded else "not recorded: ") + sc.note


# -- metadata and summary tables -----------------------------------------------------------------

def _lines(items, escape: bool = True) -> str:
    """Items as lines of one table cell; escape=False for items that are plain() already."""
    items = list(items)
    return "<br>".join(plain(x) if escape else x for x in items) if items else "-"


def _or_dash(value) -> str:
    return "-" if value is None or value == "" else plain(value)


def _recording_s(meta: TraceMeta) -> str:
    stop, begin = meta.stop_ns, meta.first_event_ns or meta.attach_ns
    if stop is not None and begin is not None and stop >= begin:
        return f"{(stop - begin) / 1e9:.2f} s"
    return "-"


def metadata_panel(legs: list[Leg]) -> Panel:
    width = max(40, 140 // max(1, len(legs)))  # characters per cell line: plotly tables do not wrap
    def row(name, fn):
        return name, [fn(leg) for leg in legs]

    def probes(leg):
        return _lines(f"{p.point}: {p.symbol} in {os.path.basename(p.object)}" for p in leg.meta.probes)

    def builds(leg):
        return _lines(f"{os.path.basename(o.path)} {o.build_id or '(no build-id)'}" for o in leg.meta.objects)

    def get(key):
        return lambda leg: _or_dash(getattr(leg.meta, key))

    def cmd(leg):
        return plain(" ".join(leg.meta.command) if leg.meta.command else "-")

    rows = [
        row("label", lambda leg: leg.arm_name),
        row("file", lambda leg: plain(leg.analysis.trace.path or "-")),
        row("mode", get("mode")),
        row("command", cmd),
        row("pid / exit code", lambda leg: f"{_or_dash(leg.meta.pid)} / {_or_dash(leg.meta.exit_code)}"),
        row("build-ids", builds),
        row("kernel", get("kernel")),
        row("host", get("host")),
        row("started (UTC)", get("start_time")),
        row("recording length", lambda leg: _recording_s(leg.meta)),
        row("stop reason", get("stop_reason")),
        row("lost events", get("lost_events")),
        row("partial spans / open at stop",
            lambda leg: plain(f"{leg.meta.partial_spans} / {leg.meta.open_at_stop.total}")),
        row("fault time", lambda leg: _wrap(_fault_timing(leg.meta), width)),
        row("on-CPU time and wait", lambda leg: _wrap(_sched(leg.meta), width)),
        row("probe points", probes),
        row("checkpoints / prefill iterations",
            lambda leg: f"{len(leg.checkpoints):,} / {len(leg.prefill):,}"),
        row("ckptrace", get("tool_version")),
    ]
    return Panel(table_figure("Recordings", ["", *[leg.name for leg in legs]], rows))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _fmt_summary(key: str, v) -> str:
    """A summary figure with its unit: times in ms, bytes in MiB, shares and rates in %, counts
    as whole numbers, yes/no, and "not recorded" for none."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "not recorded"
    if isinstance(v, (int, float, np.integer, np.floating)):
        whole = isinstance(v, (int, np.integer))
        v = float(v)
        if not math.isfinite(v):
            return "-"
        name = key.rsplit(".", 1)[-1]
        if key.rsplit(".", 1)[0].endswith("_ns") and not key.endswith((".count", ".not_recorded")):
            return f"{v / 1e6:,.3f} ms"
        if name.endswith("_ns_per_mib") or name == "ns_per_mib":
            return f"{v / 1e6:,.3f} ms per MiB"
        if name.endswith("_bytes"):
            return f"{v / MIB:,.1f} MiB"
        if name.endswith(("_share", "_rate")) or name.startswith("checkpoint_share"):
            return f"{100 * v:.1f}%"
        if name.endswith("_per_mib"):
            return f"{v:,.1f} per MiB"
        if name.endswith("_s"):
            return f"{v:,.2f} s"
        return f"{int(v):,}" if whole or v.is_integer() else f"{v:,.3f}"
    if isinstance(v, (list, tuple)):
        return _lines(v) if v else "none"
    return plain(v)


# Summary keys whose words alone would mislead: the rate analyze counts over every checkpoint is
# not the dashboard's (and the headline's) rate after the warm-up.
SUMMARY_NAMES = {"pool_hit_rate": "pool hit rate, warm-up included", "ns_per_mib": "checkpoint time per MiB",
                 "checkpoint_bytes": "checkpoint state copied",
                 "checkpoint_share_of_prefill": "checkpoint share of prefill time",
                 "wait_share": "checkpoints' share waiting for a CPU",
                 "prefill_wait_share": "prefill iterations' share waiting for a CPU"}
# Unit suffixes a summary key ends in: the cell shows the unit (_fmt_summary), the name says none.
_UNIT_SUFFIXES = (("_ns_per_mib", " time per MiB"), ("_per_mib", " per MiB"), ("_bytes", ""), ("_ns", ""),
                  ("_s", ""))


def summary_name(key: str) -> str:
    """A flattened summary key as a reader's name: a distribution by its metric's one label
    (metrics.py) and its statistic, 'ckpt fill, p90'; other keys in words, without the unit
    suffix their cell's unit replaces."""
    parts = key.split(".")
    if parts[0] == "stats" and len(parts) == 3 and parts[1] in REGISTRY:
        return f"{label(parts[1])}, {parts[2].replace('_', ' ')}"
    words = []
    for p in parts:
        if p in SUMMARY_NAMES:
            words.append(SUMMARY_NAMES[p])
            continue
        for suffix, said in _UNIT_SUFFIXES:
            if p.endswith(suffix) and len(p) > len(suffix):
                p = p[:-len(suffix)] + said
                break
        words.append(p.replace("_", " "))
    return ": ".join(words)


def summary_panel(legs: list[Leg]) -> Panel:
    flat = [_flatten(leg.summary) for leg in legs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    if not keys:
        return Panel(None, "the analyses carry no summary")
    rows = [(summary_name(k), [_fmt_summary(k, f[k]) if k in f else "-" for f in flat]) for k in keys]
    return Panel(table_figure("Analyzer summary (as computed by ckptrace analyze; times in ms, sizes in MiB)",
                               ["", *[leg.name for leg in legs]], rows, first_width=1.6))


def header_panel(title: str, legs: list[Leg], comparison, notes: list[str]) -> Panel:
    rows = [("traces", [_lines((f"{leg.name} ({len(leg.checkpoints):,} checkpoints)" for leg in legs), escape=False)])]
    if comparison is not None:
        rows.append(("comparison", [f"{plain(shown_label(comparison.candidate))} (candidate) against "
                                    f"{plain(shown_label(comparison.baseline))} (baseline)"]))
        if getattr(comparison, "explanation", ""):
            rows.append(("result", [_wrap(comparison.explanation)]))
        if getattr(comparison, "samples", ""):
            rows.append(("samples", [_wrap(comparison.samples)]))
        if getattr(comparison, "machine", None):
            rows.append(("machine", [_wrap(comparison.machine["said"])]))
        for w in getattr(comparison, "warnings", []) or []:
            rows.append(("warning", [_wrap(w)]))
    for note in notes:
        rows.append(("note", [_wrap(note, escape=False)]))
    fig = table_figure(plain(title), ["", ""], rows, first_width=0.25)
    fig.update_traces(header=dict(height=0, values=["", ""], fill_color="white", line_color="white"))
    return Panel(fig)


def _wrap(text: str, width: int = 150, escape: bool = True) -> str:
    """Break long text into lines for a table cell (plotly tables do not wrap)."""
    lines = textwrap.wrap(str(text), width, break_long_words=False, break_on_hyphens=False) or [""]
    return "<br>".join(plain(x) if escape else x for x in lines)
