"""What the panels share: one Leg per analysed trace (name, arm, colour), text made safe, sampling.

Text safety: plotly.js renders figure strings (titles, names, ticks, table cells, hover) through
its own small markup language (`<b>`, `<br>`, `<a href>`, entities). A label is data, not markup,
so every string from a trace or the user goes through `plain()`, which escapes `&`, `<` and `>`
as entities plotly.js decodes back to the literal characters when it writes the SVG text node.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ckptrace.analyzers.state_path import PROMPT_SAVE_COLUMNS, RESTORE_COLUMNS
from ckptrace.core.meta import TraceMeta
from ckptrace.core.terminal import printable, shown_label
from ckptrace.core.trace import empty_frame

# Above this many rows per leg, distributions show evenly spaced order statistics and the
# per-iteration panel shows bins: keeps 100k checkpoints well under 10 MB of HTML.
MAX_POINTS = 20_000
MAX_BARS = 1_500

ARM_COLOURS = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#9D755D", "#72B7B2", "#EECA3B", "#FF9DA6"]
PHASE_COLOURS = {"fill": "#4C78A8", "copy": "#F58518", "faults": "#E45756", "wait": "#B279A2", "other": "#BAB0AC",
                 "decode": "#72B7B2", "checkpoint": "#D8D8D8", "restore": "#54A24B", "spec_state": "#9D755D",
                 "prompt_save": "#EECA3B"}
VERDICT_COLOURS = {"faster": "#2E7D32", "slower": "#C62828", "no change": "#757575", "within drift": "#EF8F00",
                   "not judged": "#9E9E9E"}


def plain(text: object) -> str:
    """A string plotly.js shows literally: made printable (control characters and bidi controls
    shown as escapes, core/terminal.py), then its markup characters escaped as entities."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class Leg:
    """One recorded trace as the dashboard shows it. `name` is unique and already plain()."""

    position: int  # 1-based run order
    label: str  # raw label, for grouping only; display through `name`/`arm_name`
    name: str
    arm_name: str
    colour: str
    analysis: object  # ckptrace.analyzers.Analysis

    @property
    def checkpoints(self) -> pd.DataFrame:
        return self.analysis.checkpoints

    @property
    def iterations(self) -> pd.DataFrame:
        return self.analysis.iterations

    @property
    def prefill(self) -> pd.DataFrame:
        it = self.analysis.iterations
        return it.loc[(it["kind"] == "prefill").to_numpy()]

    @property
    def restores(self) -> pd.DataFrame:
        rs = self.analysis.restores
        return rs if rs is not None else empty_frame(RESTORE_COLUMNS)

    @property
    def prompt_saves(self) -> pd.DataFrame:
        ps = self.analysis.prompt_saves
        return ps if ps is not None else empty_frame(PROMPT_SAVE_COLUMNS)

    @property
    def meta(self) -> TraceMeta:
        return self.analysis.trace.meta

    @property
    def summary(self) -> dict:
        return self.analysis.summary or {}


def make_legs(analyses: list, baseline: str | None = None) -> list[Leg]:
    """Legs in run order; arms (labels) coloured in order of appearance, the baseline first."""
    labels = [a.trace.label for a in analyses]
    order = list(dict.fromkeys(([baseline] if baseline in labels else []) + labels))
    colour = {lab: ARM_COLOURS[i % len(ARM_COLOURS)] for i, lab in enumerate(order)}
    repeated = {lab for lab in labels if labels.count(lab) > 1}
    legs = []
    for i, (a, lab) in enumerate(zip(analyses, labels), start=1):
        name = f"{i}: {shown_label(lab)}" if repeated or len(labels) > 1 else shown_label(lab)
        legs.append(Leg(i, lab, plain(name), plain(shown_label(lab)), colour[lab], a))
    return legs


def order_statistics(values: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, bool]:
    """All values, or `limit` evenly spaced order statistics of them (min and max kept).

    Evenly spaced ranks keep the shape of the distribution (every quantile to within 1/limit),
    which an even sample in time would not for bursty traces.
    """
    values = np.asarray(values)
    if len(values) <= limit:
        return values, False
    ranks = np.linspace(0, len(values) - 1, limit).round().astype(np.int64)
    return np.sort(values)[ranks], True


def bin_rows(frame: pd.DataFrame, columns: list[str], limit: int = MAX_BARS) -> tuple[pd.DataFrame, int]:
    """Means of `columns` over runs of k consecutive rows, k chosen so at most `limit` rows remain."""
    k = max(1, -(-len(frame) // limit))
    if k == 1:
        return frame, 1
    group = np.arange(len(frame)) // k
    out = frame[columns].groupby(group).mean()
    out["start_ns"] = frame["start_ns"].groupby(group).min().to_numpy()
    return out.reset_index(drop=True), k


def to_ms(ns) -> np.ndarray:
    """ns -> ms as float32: half the bytes of float64 in the page, ample precision for a plot."""
    return (np.asarray(ns, dtype="float64") / 1e6).astype("float32")
