"""Sums that can't lie: an int64 sum the analysis makes is bounded before it is made, or refused.

numpy's int64 sums wrap silently past 2^63 - 1 (40,000 checkpoints of 2^48 bytes once printed
"state copied: -6854767804416.0 MiB"). The trace validator (core/validate.py) bounds every
value and the row count, which is enough for counts and tokens (ROWS_MAX x their largest value
stays under 2^63), not for times and bytes: a trace may hold 2^32 rows of 2^48 bytes, or a
thread per 2^62 ns span. So the sums of those are checked here, once per column and before any
group sum of it (`bound`):

- the magnitudes of the values, all of them (several columns together where a row's figure adds
  them, e.g. a checkpoint's fill and copy), must add up to at most SUM_MAX = 2^62. Then every sum
  of any of those values, and that plus or minus one more value of at most 2^62 (a span's
  length: a checkpoint's other_ns = total_ns - fill_ns - copy_ns) lies in -2^63..2^63 - 1:
  exact. More is refused, one line (SumOutOfRange, naming what, by how much and over how many
  rows): a profiler that prints a wrong number is worse than one that refuses.
- the common case costs two passes (min and max): rows x the largest magnitude <= SUM_MAX
  proves it without adding. Otherwise a float64 sum of the magnitudes, far from the limit (its
  rounding is relative, at most 2^-20 here), proves it; near or past the limit the magnitudes are
  added exactly (32-bit halves summed apart, as Python ints), and that decides.

Each table builds its figures from checked sums and bounds the columns later sums read
(checkpoints.py, iterations.py, state_path.py, memory.py), so a report's or dashboard's sum over
any of a table's rows (renderers/text.py, dashboards/) is exact too.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.errors import AnalysisError

SUM_MAX = 1 << 62
FLOAT_SAFE = SUM_MAX * (1 - 2.0 ** -20)  # a float64 sum of magnitudes below this is surely <= SUM_MAX
CHUNK = 1 << 31  # rows per exact partial sum: 2^31 x (2^32 - 1) < 2^64, no uint64 half can wrap


class SumOutOfRange(AnalysisError):
    """A figure's sum would not fit in 64 bits: refused, never printed wrong. `where` (a trace's
    path, once known) leads the message."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(f"{where}: {message}" if where else message)
        self.message, self.where = message, where

    def at(self, where: str | None) -> SumOutOfRange:
        """The same refusal naming `where` (the trace), unless it already names one."""
        return self if self.where or not where else SumOutOfRange(self.message, where)


def ints(values) -> np.ndarray:
    """`values` (numpy, a Series, an IntegerArray) as an int64-compatible numpy array, NA as 0."""
    if isinstance(values, (pd.Series, pd.Index)):
        values = values.array
    if isinstance(values, pd.api.extensions.ExtensionArray):
        if isinstance(values, pd.arrays.NumpyExtensionArray):
            return values.to_numpy()
        return values.to_numpy("int64", na_value=0)
    return np.asarray(values)


def _extremes(values) -> tuple[int, int, int]:
    """(rows, min, max) of `values`, NA left out (0, 0 when all are NA), without a copy."""
    if isinstance(values, (pd.Series, pd.Index)):
        values = values.array
    n = len(values)
    if not n:
        return 0, 0, 0
    if isinstance(values, pd.api.extensions.ExtensionArray) and not isinstance(
            values, pd.arrays.NumpyExtensionArray):
        lo, hi = values.min(skipna=True), values.max(skipna=True)
        if lo is pd.NA:
            return n, 0, 0
        return n, int(lo), int(hi)
    v = np.asarray(values)
    return n, int(v.min()), int(v.max())


def exact_abs_sum(values) -> int:
    """The sum of |v| over int64 `values`, exact (a Python int, unbounded)."""
    v = ints(values)
    total = 0
    for i in range(0, len(v), CHUNK):
        a = np.abs(v[i:i + CHUNK]).view("uint64")  # |-2^63| is 2^63 as uint64
        total += (int((a >> np.uint64(32)).sum(dtype="uint64")) << 32) + int((a & np.uint64(0xFFFFFFFF)).sum(
            dtype="uint64"))
    return total


def exact_sum(values) -> int:
    """The sum of int64 `values`, exact (a Python int, unbounded)."""
    v = ints(values)
    total = 0
    for i in range(0, len(v), CHUNK):
        c = v[i:i + CHUNK].astype("int64", copy=False)
        total += (int((c >> 32).sum(dtype="int64")) << 32) + int((c & 0xFFFFFFFF).sum(dtype="int64"))
    return total


def bound(what: str, *columns) -> None:
    """Refuse unless the magnitudes of the values of `columns` (arrays, Series, IntegerArrays;
    NA counts 0) together add up to at most SUM_MAX, so every sum of them is exact in int64.
    `what` names them in the refusal ("the checkpoints' bytes")."""
    rows, top = 0, 0
    for c in columns:
        n, lo, hi = _extremes(c)
        rows, top = rows + n, max(top, hi, -lo)
    if rows * top <= SUM_MAX:  # Python ints: exact
        return
    arrays = [ints(c) for c in columns]
    if sum(float(np.abs(a).view("uint64").sum(dtype="float64")) for a in arrays) < FLOAT_SAFE:  # |-2^63| too
        return
    total = sum(exact_abs_sum(a) for a in arrays)
    if total <= SUM_MAX:
        return
    signed = any(len(a) and a.min() < 0 for a in arrays)
    raise SumOutOfRange(f"{what} add up to {'a magnitude of ' if signed else ''}{total} over {rows} rows, past "
                        f"2^62 ({SUM_MAX}), the most ckptrace adds so that its figures stay exact in 64 bits: "
                        "refused rather than shown wrong (a damaged or hostile trace?)")


def bound_table(t: pd.DataFrame, summed: list[tuple[str, ...]], name: str) -> None:
    """Bound each group of `summed` columns of table `t` (named `name`, "checkpoints") together."""
    if len(t):
        for cols in summed:
            bound(f"the {name}' {' and '.join(cols)}", *(t[c].array for c in cols))


def checked_sum(values, what: str) -> int:
    """The exact sum of `values` (NA counts 0) as a Python int, refused (SumOutOfRange) where the
    magnitudes add up past SUM_MAX."""
    bound(what, values)
    return int(ints(values).sum(dtype="int64"))


def checked_product(values: np.ndarray, what: str, limit: int = SUM_MAX) -> np.ndarray:
    """Float products (e.g. faults x ns per fault) rounded to int64, refused where one is not
    finite or exceeds `limit` in magnitude (a float past 2^63 would convert to INT64_MIN)."""
    values = np.asarray(values, dtype="float64")
    if len(values):
        worst = float(np.max(np.abs(values)))
        if not np.isfinite(worst) or worst > limit:
            raise SumOutOfRange(f"{what} would be {worst:.6g}, past 2^62 ({limit}): refused rather than shown "
                                "wrong (a damaged or hostile trace?)")
    return np.rint(values).astype("int64")
