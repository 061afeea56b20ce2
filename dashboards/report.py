"""write_dashboard(): analyses (and a comparison) in, one self-contained offline HTML file out.

The page is a fixed skeleton around plotly's own `to_html` output. No string from a trace or
the user is written into the skeleton: labels, titles and metadata reach the page only as
figure data, which plotly serialises as JSON (with `<`, `>` escaped) and plotly.js renders as
SVG text after `legs.plain()` escaped its markup characters. plotly.js is embedded once;
nothing is loaded from the network, so the file opens from disk anywhere.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import plotly.io as pio

from ckptrace.analyzers.summary import gpu_hazard
from ckptrace.core.errors import CkptraceError
from ckptrace.core.output import write_output
from ckptrace.core.terminal import printable

from . import answer, memory, panels, tables
from .figure import Panel
from .legs import make_legs, plain
from .requests import requests_panel
from .whatif import whatif_panel

# Fixed text only: the <title> is not the user's title on purpose (see module docstring).
_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ckptrace report</title>
<style>
body { margin: 12px 20px; background: #fff; font-family: "Open Sans", Verdana, Arial, sans-serif; }
.panel { margin: 0 0 18px 0; border-bottom: 1px solid #e6e6e6; }
</style>
</head>
<body>
"""
_TAIL = "</body>\n</html>\n"

_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def build_panels(analyses: list, comparison=None, title: str = "ckptrace report",
                 notes: Sequence[str] = (), requests: list | None = None) -> list[tuple[str, Panel]]:
    """(panel id, Panel) in page order: the answer, the breakdown, the header, then the rest.
    Panels without a figure are omitted ones.

    `notes`: extra plain-text lines for the header (escaped here), e.g. why there is no comparison.
    `requests`: per leg, its request table (analyzers.requests.request_table) or None; with any,
    the requests panel follows the comparison.
    """
    legs = make_legs(analyses, comparison.baseline if comparison is not None else None)
    first = [("answer", answer.answer_panel(comparison, title)), ("breakdown", answer.breakdown_panel(legs, comparison))]
    body = [
        ("comparison", panels.comparison_panel(comparison) if comparison is not None
         else Panel(None, "one label only: nothing to compare" if len({leg.label for leg in legs}) == 1
                           else "no comparison of these labels")),
        *([("requests", requests_panel(legs, requests))] if requests and any(t is not None for t in requests)
          else []),
        ("iterations", panels.iterations_panel(legs)),
        ("timeline", panels.timeline_panel(legs, comparison.warmup_setting if comparison is not None else "auto")),
        ("distributions", panels.distributions_panel(legs)),
        ("churn", panels.churn_panel(legs, comparison.warmup_setting if comparison is not None else "auto")),
        ("memory", memory.memory_panel(legs)),
        ("whatif", whatif_panel(legs)),
        ("processes", memory.processes_panel(legs)),
        ("summary", tables.summary_panel(legs)),
        ("metadata", tables.metadata_panel(legs)),
    ]
    page_notes = [plain(n) for n in notes] + [n for _, p in first + body for n in p.notes]
    page_notes += [f"{leg.name}: " + gpu_hazard(s["fresh_copy_checkpoints"], s["fresh_copy_bytes"], s["checkpoints"])
                   for leg in legs if (s := leg.analysis.summary)["fresh_copy_checkpoints"]]
    page_notes += [f"{leg.name}: cut short: {plain(leg.meta.cut_short or 'the recorder did not finish this trace')}"
                   for leg in legs if leg.meta.complete is False]
    page_notes += [f"Panel '{pid}' omitted: {p.omitted}." for pid, p in first + body if p.figure is None]
    # The answer first (when there is a comparison), then where the time goes, then the header.
    return first + [("header", tables.header_panel(title, legs, comparison, page_notes))] + body


def render_html(parts: list[tuple[str, Panel]]) -> str:
    html = [_HEAD]
    first = True
    for pid, panel in parts:
        if panel.figure is None:
            continue
        height = int(panel.figure.layout.height or 450)
        div = pio.to_html(panel.figure, full_html=False, include_plotlyjs=first, include_mathjax=False,
                          config=_CONFIG, div_id=f"ckptrace-{pid}", default_height=f"{height}px",
                          default_width="100%", validate=True)
        html.append(f'<div class="panel">\n{div}\n</div>\n')
        first = False
    html.append(_TAIL)
    return "".join(html)


def write_dashboard(analyses: list, comparison, out: Path, title: str = "ckptrace report",
                    notes: Sequence[str] = (), requests: list | None = None) -> Path:
    """Write the dashboard of `analyses` (ckptrace.analyzers.Analysis, in run order) to `out`.

    `comparison` (ckptrace.analyzers.compare.Comparison) or None when there is one label.
    `notes`: plain-text lines shown at the top; `requests`: per leg, its request table or None.
    Written atomically; returns the path written.
    """
    if not analyses:
        raise CkptraceError("no traces to show: give at least one trace file")
    out = Path(out)
    if out.is_dir():
        raise CkptraceError(f"{printable(out)}: is a directory; give a file name such as "
                            f"{printable(out / 'report.html')}")
    data = render_html(build_panels(analyses, comparison, title, notes, requests)).encode("utf-8")
    write_output(out, lambda f: f.write(data), what="report")
    return out
