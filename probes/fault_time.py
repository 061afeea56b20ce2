"""Fault time: what a span's page faults cost its thread, for every span, with no per-fault program.

Defined as the span's on-CPU time minus the on-CPU time of the same work on pages that are
already resident (a fill zeroes `bytes`, a copy copies `bytes`). The span's on-CPU time is exact
(the kernel side, cpu_ns); the resident time is calibrated by the recorder itself when recording
stops, on buffers of the spans' own sizes, timed on its thread CPU clock. Where the faults are
not most of the span (a few faults in a long copy), the difference would be mostly calibration
noise: fault_ns is left NA there and the analyzer estimates it (its `fault_source`).
"""
from __future__ import annotations

import ctypes
import mmap
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from ckptrace.core.meta import FaultTime

if TYPE_CHECKING:
    import pandas as pd

METHOD = "cpu-minus-resident"
DEFINITION = ("fault_ns = span cpu_ns - on-CPU time of the same work on already-resident pages (fill: "
              "zeroing `bytes`, copy: copying `bytes`), that time calibrated by the recorder on "
              "resident buffers of the spans' sizes when recording stops. Recorded where the "
              "resident time is at most a third of the span's cpu_ns, 0 where the span had no "
              "fault, else NA")
MAX_CAL_BYTES = 128 << 20  # past this, resident time grows linearly with size
MAX_SIZES = 8
SKETCH_SIZES = 4096  # distinct span sizes kept while recording (quantiles past this)
MAX_CARRY = 4096  # checkpoints whose fill/copy came in an earlier batch than the checkpoint row
REPEATS = 3
STRAY_FAULTS = 1  # faults a checkpoint may hold beyond its fill's and copy's: the [uprobes] page, once
RESIDENT_MAX_SHARE = 1 / 3  # calibration error stays under a quarter of what is recorded

_libc = ctypes.CDLL(None)
_libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
_libc.memcpy.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def calibration_sizes(bytes_) -> list[int]:
    """Up to MAX_SIZES sizes spanning the spans' own (quantiles when there are more); `bytes_`
    an array or Series."""
    b = np.asarray(bytes_, dtype="int64")
    sizes = np.unique(np.clip(b[b > 0], 4096, MAX_CAL_BYTES))
    if len(sizes) > MAX_SIZES:
        sizes = np.unique(np.quantile(sizes, np.linspace(0, 1, MAX_SIZES), method="nearest"))
    return [int(s) for s in sizes]


class SizeSketch:
    """The sizes of faulting fills and copies seen so far, bounded: what calibration_sizes needs of a
    recording, kept as it streams by instead of every event."""

    def __init__(self):
        self.sizes = np.empty(0, dtype="int64")

    def add(self, bytes_: np.ndarray) -> None:
        """The sizes of some faulting fills and copies."""
        if not len(bytes_):
            return
        sizes = np.unique(np.concatenate([self.sizes, np.clip(bytes_.astype("int64"), 4096, MAX_CAL_BYTES)]))
        if len(sizes) > SKETCH_SIZES:
            sizes = np.unique(np.quantile(sizes, np.linspace(0, 1, SKETCH_SIZES), method="nearest"))
        self.sizes = sizes

    def calibration_sizes(self) -> list[int]:
        return calibration_sizes(self.sizes)


def calibrate(sizes: list[int]) -> dict[str, list[list[int]]]:
    """Median on-CPU ns to zero, and to copy, each size on resident pages: {"fill": [[size, ns]...],
    "copy": [...]}. Both buffers are touched first (non-zero: private pages, not the zero page)."""
    out: dict[str, list[list[int]]] = {"fill": [], "copy": []}
    if not sizes:
        return out
    n = max(sizes)
    src, dst = mmap.mmap(-1, n), mmap.mmap(-1, n)
    try:
        s_addr = ctypes.addressof(ctypes.c_char.from_buffer(src))
        d_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        _libc.memset(s_addr, 0x5A, n)
        _libc.memset(d_addr, 0xA5, n)
        for size in sizes:
            for kind, work in (("fill", lambda: _libc.memset(d_addr, 0, size)),
                               ("copy", lambda: _libc.memcpy(d_addr, s_addr, size))):
                times = []
                for _ in range(REPEATS):
                    t0 = time.thread_time_ns()
                    work()
                    times.append(time.thread_time_ns() - t0)
                out[kind].append([size, int(statistics.median(times))])
    finally:
        src.close()
        dst.close()
    return out


def resident_ns(points: list[list[int]], bytes_: np.ndarray) -> np.ndarray:
    """Resident time for each size: interpolated between calibrated sizes, linear past the largest."""
    sizes = np.array([p[0] for p in points], dtype="float64")
    ns = np.array([p[1] for p in points], dtype="float64")
    b = bytes_.astype("float64")
    inside = np.interp(b, sizes, ns)
    return np.where(b > sizes[-1], ns[-1] * b / sizes[-1], inside)


def span_fault_ns(events: pd.DataFrame, cal: dict[str, list[list[int]]], carry: dict | None = None) -> pd.Series:
    """fault_ns per row: fills and copies from their cpu_ns, checkpoints as the sum of theirs,
    0 for any span without faults, NA where not measured. Batch by batch, in recording order,
    `carry` (a dict kept between calls) holds the parts of checkpoints whose row is yet to come."""
    import pandas as pd  # at the finish only: a recorder streams without pandas (core/columns.py)

    out = pd.Series(pd.NA, index=events.index, dtype="Int64")
    # A copy made by CUDA calls is not a memcpy of its bytes, nor are its faults all its thread's
    # (the driver's threads write the destination too): not measured, whatever its own count.
    cuda = (events["gpu_copies"].fillna(0) > 0).to_numpy() if "gpu_copies" in events else False
    spans = ~events["kind"].isin(["mmap", "munmap", "mremap"]) & events["cpu_ns"].notna() & ~cuda
    out[spans & (events["faults"] == 0)] = 0
    for kind in ("fill", "copy"):
        rows = events[(events["kind"] == kind) & spans & (events["faults"] > 0)]
        if rows.empty or not cal.get(kind):
            continue
        cpu = rows["cpu_ns"].to_numpy(dtype="float64")
        resident = resident_ns(cal[kind], rows["bytes"].to_numpy())
        ok = resident <= RESIDENT_MAX_SHARE * cpu
        out[rows.index[ok]] = np.round(cpu[ok] - resident[ok]).astype("int64")
    # A checkpoint's faults are its fill's and copy's (nothing else in update_tgt touches new
    # memory) and, once per process, the probes' own page: the first probed instruction stepped
    # out of line faults in the [uprobes] page, after its probe read the counter (a return probe
    # ending the fill, so inside the checkpoint; docs/kernel-facts.md). Where they add up to that
    # and each part is measured, the checkpoint's fault time is their sum.
    parts = events[events["kind"].isin(["fill", "copy"]) & (events["ckpt"] > 0)]
    by_ckpt = pd.DataFrame({"ckpt": parts["ckpt"], "faults": parts["faults"],
                            "fault_ns": out[parts.index], "missing": out[parts.index].isna()})
    agg = by_ckpt.groupby("ckpt").agg(faults=("faults", "sum"), fault_ns=("fault_ns", "sum"),
                                      missing=("missing", "any"))
    if carry is not None:
        agg = _with_carry(agg, carry, events.loc[events["kind"] == "checkpoint", "ckpt"])
    ck = events[(events["kind"] == "checkpoint") & spans & (events["faults"] > 0)]
    a = agg.reindex(ck["ckpt"])
    extra = ck["faults"].to_numpy(dtype="float64") - a["faults"].to_numpy(dtype="float64")  # NaN: no parts
    whole = (extra >= 0) & (extra <= STRAY_FAULTS) & ~a["missing"].fillna(True).to_numpy(dtype=bool)
    out[ck.index[whole]] = a["fault_ns"].to_numpy()[whole].astype("int64")
    return out


def _with_carry(agg: pd.DataFrame, carry: dict, ended: pd.Series) -> pd.DataFrame:
    """`agg` plus the carried parts; the parts of checkpoints not ended in this batch carried on."""
    import pandas as pd

    if carry:
        old = pd.DataFrame.from_dict(carry, orient="index", columns=["faults", "fault_ns", "missing"])
        agg = pd.concat([agg.astype({"fault_ns": "int64"}), old.astype({"fault_ns": "int64"})])
        agg = agg.groupby(level=0).agg(faults=("faults", "sum"), fault_ns=("fault_ns", "sum"),
                                       missing=("missing", "any"))
    pending = agg[~agg.index.isin(ended.to_numpy())].tail(MAX_CARRY)
    carry.clear()
    carry.update({int(k): (int(r.faults), int(r.fault_ns), bool(r.missing)) for k, r in pending.iterrows()})
    return agg


def record_fault_time(events: pd.DataFrame) -> tuple[pd.Series, FaultTime]:
    """fault_ns for every row and the metadata `fault_time` (method, definition, calibration)."""
    import pandas as pd

    if events["cpu_ns"].isna().all():
        return (pd.Series(pd.NA, index=events.index, dtype="Int64"),
                FaultTime(definition="not measured: the on-CPU time was not recorded"))
    faulting = events[events["kind"].isin(["fill", "copy"]) & (events["faults"] > 0)]
    cal, how = calibration(calibration_sizes(faulting["bytes"]))
    return span_fault_ns(events, cal), how


def calibration(sizes: list[int]) -> tuple[dict[str, list[list[int]]], FaultTime]:
    """The resident times of `sizes` and the metadata `fault_time` saying how they were measured."""
    t0 = time.monotonic()
    cal = calibrate(sizes)
    return cal, FaultTime(METHOD, DEFINITION, resident_ns=cal, resident_max_share=round(RESIDENT_MAX_SHARE, 4),
                          calibration_s=round(time.monotonic() - t0, 3))
