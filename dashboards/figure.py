"""What every dashboard panel is made of: `Panel` (a figure, or why it is omitted, and its
notes) and the page's one style, for charts (`layout`) and tables (`table_figure`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from .legs import plain

TEMPLATE = "plotly_white"
ROW_PX = 22  # table line height used to size table figures


@dataclass
class Panel:
    figure: go.Figure | None
    omitted: str = ""  # why there is no figure
    notes: list[str] = field(default_factory=list)


def layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title=dict(text=title, x=0.01), height=height,
                      margin=dict(l=70, r=30, t=70, b=50), legend=dict(orientation="h", y=-0.12))
    return fig


def table_figure(title: str, header: list[str], rows: list[tuple[str, list[str]]], first_width=1.2) -> go.Figure:
    """A two-dimensional table: rows of (row name, one cell per column). Cells must be plain()."""
    lines = [max(str(c).count("<br>") + 1 for c in cells) for _, cells in rows]
    fig = go.Figure(go.Table(
        columnwidth=[first_width] + [2] * (len(header) - 1),
        header=dict(values=header, fill_color="#EEE", align="left"),
        cells=dict(values=[[plain(r) for r, _ in rows]] + [[cells[i] for _, cells in rows]
                                                           for i in range(len(header) - 1)],
                   align="left", height=ROW_PX, fill_color=[["#FAFAFA"] * len(rows)] + [["white"] * len(rows)])))
    # A cell line is about 16 px; a row is at least ROW_PX. Plotly tables scroll if this is short.
    return layout(fig, title, 130 + sum(ROW_PX + 4 + 18 * (n - 1) for n in lines))
