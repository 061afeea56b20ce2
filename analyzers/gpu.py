"""The CUDA copy path: one row per state copy that made CUDA calls, and a summary by destination.

Only for a trace recorded with a CUDA target (its metadata `gpu`; trace format 4): a trace without
one has no table, no summary and no key in `analyze --json`. From the copy rows' gpu_* columns
(probes/cuda.py, checkpoint.bpf.c):
- `copy_ns`: the state copy (llama_state_seq_get_data_ext), entry to return, as `copy` everywhere;
- `enqueue_ns`: time inside its CUDA copy calls (cudaMemcpyAsync and friends). For pageable host
  memory the driver returns only when the copy is done, so this is the whole staged copy; for
  pinned memory it is the enqueue alone;
- `sync_ns`: time inside its synchronize calls (cudaStreamSynchronize...): waiting for the device;
- `host_ns = copy_ns - enqueue_ns - sync_ns`: the copy's own host-side work between the calls;
- `dst`: where its device-to-host copies went: "pinned" (into ranges the process registered or
  allocated pinned while traced), "pageable_fresh" (pageable, and a page of the destination
  faulted during the copy: not yet resident), "pageable_resident" (pageable, no fault), "mixed"
  (pinned and pageable), "none" (no device-to-host copy);
- `dst_faults`: page faults on the destination range while the copy was open, by any thread of the
  process; `driver_faults` those taken by other threads than the copy's (the driver's workers,
  which the copy row's own `faults` never sees); `faults`: the copy's own thread's.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.errors import TraceFormatError
from ckptrace.core.trace import empty_frame

from .spans import NA_INT

DST_CLASSES = ["none", "pinned", "pageable_resident", "pageable_fresh", "mixed"]

GPU_COPY_COLUMNS: dict[str, object] = {
    "ckpt": np.dtype("int64"),  # 0: a prompt save's copy
    "pid": np.dtype("int32"),
    "tid": np.dtype("int32"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "copy_ns": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "gpu_copies": np.dtype("int64"),
    "gpu_bytes": np.dtype("int64"),
    "pinned_bytes": np.dtype("int64"),
    "pageable_bytes": np.dtype("int64"),
    "enqueue_ns": np.dtype("int64"),
    "syncs": np.dtype("int64"),
    "sync_ns": np.dtype("int64"),
    "host_ns": np.dtype("int64"),
    "cpu_ns": NA_INT,
    "dst": pd.CategoricalDtype(DST_CLASSES),
    "dst_faults": np.dtype("int64"),
    "driver_faults": np.dtype("int64"),
    "faults": np.dtype("int64"),
}
# Each destination's figures in the summary: medians of these per copy, sums of the fault counts.
MEDIANS = ("copy_ns", "enqueue_ns", "sync_ns", "host_ns")


GPU_FIELDS = ("copies", "bytes", "pinned_bytes", "pageable_bytes", "enqueue_ns", "syncs", "sync_ns", "dst_faults",
              "driver_faults")


def gpu_copy_table(copies: pd.DataFrame, where: str = "the trace") -> pd.DataFrame:
    """One row per copy row (the analysis' `copy` rows, with the gpu_* columns) that made a CUDA
    call (GPU_COPY_COLUMNS), in trace order. The recorder writes every gpu_* figure of such a row:
    one missing is a damaged trace (TraceFormatError naming `where`), not a 0."""
    rows = copies.loc[(copies["gpu_copies"].fillna(0) > 0).to_numpy()]
    if not len(rows):
        return empty_frame(GPU_COPY_COLUMNS)
    missing = [f"gpu_{c}" for c in GPU_FIELDS if rows[f"gpu_{c}"].isna().any()]
    if missing:
        raise TraceFormatError(f"{where}: {int(rows[missing].isna().any(axis=1).sum())} copy rows with CUDA calls "
                               f"lack {', '.join(missing)} (the recorder writes them all): trace is damaged")
    g = {c: rows[f"gpu_{c}"].to_numpy("int64") for c in GPU_FIELDS}
    span = rows["end_ns"].to_numpy() - rows["start_ns"].to_numpy()
    pinned, pageable = g["pinned_bytes"] > 0, g["pageable_bytes"] > 0
    dst = np.select([pinned & pageable, pinned, pageable & (g["dst_faults"] > 0), pageable], [4, 1, 3, 2], default=0)
    own = {c: rows[c].to_numpy() for c in ("ckpt", "pid", "tid", "start_ns", "end_ns", "bytes", "faults")}
    t = {**own, "copy_ns": span, "gpu_copies": g["copies"], "gpu_bytes": g["bytes"],
         "pinned_bytes": g["pinned_bytes"], "pageable_bytes": g["pageable_bytes"], "enqueue_ns": g["enqueue_ns"],
         "syncs": g["syncs"], "sync_ns": g["sync_ns"], "host_ns": span - g["enqueue_ns"] - g["sync_ns"],
         "cpu_ns": rows["cpu_ns"].array, "dst": pd.Categorical.from_codes(dst, dtype=GPU_COPY_COLUMNS["dst"]),
         "dst_faults": g["dst_faults"], "driver_faults": g["driver_faults"]}
    return pd.DataFrame({c: t[c] for c in GPU_COPY_COLUMNS}).astype(GPU_COPY_COLUMNS)


def gpu_summary(table: pd.DataFrame) -> dict:
    """Per destination class with copies: how many, bytes, the median copy / enqueue / wait / host
    time, summed fault counts; and the ratio the GPU check compares (fresh / resident copy time)."""
    by_dst = []
    for dst in DST_CLASSES:
        rows = table[table["dst"] == dst]
        if not len(rows):
            continue
        by_dst.append({"dst": dst, "copies": len(rows), "bytes": int(rows["bytes"].sum()),
                       **{f"median_{c}": float(rows[c].median()) for c in MEDIANS},
                       "dst_faults": int(rows["dst_faults"].sum()), "driver_faults": int(rows["driver_faults"].sum())})
    med = {d["dst"]: d["median_copy_ns"] for d in by_dst}
    ratio = (med["pageable_fresh"] / med["pageable_resident"]
             if med.get("pageable_fresh") and med.get("pageable_resident") else None)
    return {"copies": len(table), "by_dst": by_dst, "fresh_over_resident": ratio}
