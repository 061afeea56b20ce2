"""One row per checkpoint: its fill, copy and fault time, on-CPU time and wait, fault counts and syscalls.

- `fill_ns`/`copy_ns`: the whole (wall) time in the resize (`_M_default_append`) and in the state
  copy (`llama_state_seq_get_data_ext`) rows carrying the checkpoint's id, faults included;
  several rows of a kind add up. `other_ns = total_ns - fill_ns - copy_ns`.
- `cpu_ns`/`wait_ns` (the checkpoint's own span), `fill_cpu_ns`, `copy_cpu_ns`, `fill_wait_ns`,
  `copy_wait_ns`: the thread's on-CPU time and run-queue wait (runnable, waiting for a CPU) over
  those spans, from the trace's `cpu_ns`/`wait_ns`. Blocked time is wall - cpu - wait. NA when
  not recorded (trace format 1, or a kernel without the counters); 0 for a fill that did not
  happen (pool hit) when the checkpoint's own span was recorded.
- `buffer`: what the destination buffer's pages did (core/rules.py `checkpoint_rules`, the
  one definition): "grown" (a fill ran), "reused" (no fill, the copy took no faults, the
  destination not mapped by this checkpoint: a pool hit), "fresh" (no fill, the copy faulted
  every page in), "partial" (no fill, the copy faulted some pages in), "touched" (no fill, no
  copy faults, but the destination was mapped while the checkpoint was open).
- `pool_hit`: `buffer` is "reused". `fresh_bytes`: the bytes the copy wrote into pages it faulted
  in (copy faults x 4 KiB, at most its bytes): on a CUDA context, the slow pageable path.
- An update_tgt/update_dft call that made no state copy (update_dft without a draft model
  returns at once) saved nothing and is not a checkpoint: it is left out.
- Fault time (`fill_fault_ns`, `copy_fault_ns`, `fault_ns` = their sum): the whole cost of the
  span's page faults to the thread, as the recorder measured it (the trace's `fault_ns`, see its
  `fault_time` metadata). A span with faults but no measured fault time gets an estimate:
  `faults x` the median ns per fault of the measured spans of the same kind (fill or copy) in the
  same trace, so a few slow warm-up spans do not set it; never clamped, so an estimate above its
  span's time shows as such. A span without faults costs 0. `fault_source` says which applies to
  the checkpoint as a whole: "measured", "estimated" (at least one span estimated), "none" (no
  faults) or "not recorded" (a span with faults, and no measured span of its kind to estimate
  from: fault time NA).
- `faults`: the whole checkpoint's fault count; `fill_faults`/`copy_faults` those of its spans.
- `mmaps`/`munmaps`: syscalls made while the checkpoint was open on its thread.
- `iter`: the iteration it falls in (see spans.py), 0 when none.
- `spec`: made for a speculative round (an update_tgt outside create_checkpoint, trace format 3).
- `on_device`: a copy of it was made with LLAMA_STATE_SEQ_FLAGS_ON_DEVICE (trace format 5): its
  state stays in device buffers and the host buffer holds only their headers, so its `bytes` are
  not host memory (the server's checkpoints copy to the host: PARTIAL_ONLY).
- `create_bytes`: what the create_checkpoint span it lies in saved in all (its update_tgt and
  update_dft copies and the speculative state, data_spec): what the server logs as the
  checkpoint's size; NA outside a create span.
- `fill_source`: "measured" (the growth was probed: a fill row, or none for a pool hit) or
  "derived" (a build with the growth inlined, no probe point: see the trace's `profile`). A derived
  fill is the checkpoint's total minus its copy, in wall time, on-CPU time, wait and faults; its
  other_ns is then 0 (folded into the fill), its fill fault time not recorded (NA), and it
  grew when the checkpoint faulted outside its copies.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.errors import AnalysisError
from ckptrace.core.trace import STATE_FLAG_ON_DEVICE, empty_frame
from ckptrace.core.validate import increasing

from .events import KindRows, kind_rows
from ckptrace.core.rules import BUFFER_CLASSES, checkpoint_rules, enclosing, mapped_destination, saved  # noqa: F401
from .spans import CLOCK_COLUMNS, NA_INT, Groups, Ids, assign_iterations, by_start, kind_mask
from .sums import SUM_MAX, bound, bound_table, checked_product

# Each buffer class in words (the dashboard's hover, docs/metrics.md).
BUFFER_SAID = {"reused": "reused, resident (pool hit)", "grown": "grown (a fill ran)",
               "fresh": "fresh, no fill (the copy faulted its pages in)",
               "partial": "partly resident (the copy faulted some pages in)",
               "touched": "fresh, pre-touched before the copy"}
FAULT_SOURCES = ["none", "measured", "estimated", "not recorded"]  # a checkpoint takes the last of its spans'
FILL_SOURCES = ["measured", "derived", "not recorded"]

CHECKPOINT_COLUMNS: dict[str, object] = {
    "ckpt": np.dtype("int64"),
    "tid": np.dtype("int32"),
    "iter": np.dtype("int64"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "total_ns": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "draft": np.dtype("bool"),
    "fill_ns": np.dtype("int64"),
    "copy_ns": np.dtype("int64"),
    "other_ns": np.dtype("int64"),
    **CLOCK_COLUMNS,
    "fill_fault_ns": NA_INT,
    "copy_fault_ns": NA_INT,
    "fault_ns": NA_INT,
    "fault_source": pd.CategoricalDtype(FAULT_SOURCES),
    "fill_faults": np.dtype("int64"),
    "copy_faults": np.dtype("int64"),
    "faults": np.dtype("int64"),
    "mmaps": np.dtype("int64"),
    "munmaps": np.dtype("int64"),
    "buffer": pd.CategoricalDtype(BUFFER_CLASSES),
    "pool_hit": np.dtype("bool"),
    "fresh_bytes": np.dtype("int64"),
    "spec": np.dtype("bool"),
    "fill_source": pd.CategoricalDtype(FILL_SOURCES),
    "on_device": np.dtype("bool"),
    "create_bytes": NA_INT,
}


def _spans(rows: pd.DataFrame, kind: str) -> dict[str, object]:
    """A kind's rows with their fault time resolved: measured, estimated or none (see docstring).
    An estimate (faults x ns per fault, a float) past 2^62 ns is refused, never converted (a
    float past 2^63 would read as INT64_MIN)."""
    faults = rows["faults"].to_numpy("int64")
    fault = pd.array(rows["fault_ns"], dtype=NA_INT, copy=False)
    fault_na = np.asarray(fault.isna())
    fault_ns = fault.to_numpy("int64", na_value=0)
    some = faults > 0
    measured = ~fault_na & some
    missing = fault_na & some
    rate = float(np.median(fault_ns[measured] / faults[measured])) if measured.any() else None
    if rate is not None and missing.any():
        fault_ns[missing] = checked_product(faults[missing] * rate, f"the estimated fault time of a {kind} "
                                            f"({int(faults[missing].max())} faults x {rate:.6g} ns per fault)",
                                            SUM_MAX)
    fault_ns[~some] = 0
    source = np.select([measured, faults == 0, missing & (rate is not None)], [1, 0, 2], default=3)
    return {"ckpt": rows["ckpt"].to_numpy(), "ns": rows["end_ns"].to_numpy() - rows["start_ns"].to_numpy(),
            "faults": faults, "source": source, "fault_ns": pd.arrays.IntegerArray(fault_ns, missing & (rate is None)),
            "cpu_ns": rows["cpu_ns"].array, "wait_ns": rows["wait_ns"].array}


def checkpoint_table(rows: KindRows | pd.DataFrame, spans: pd.DataFrame, fill_probed: bool = True,
                     creates: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per checkpoint (CHECKPOINT_COLUMNS), sorted by start_ns; `spans` from iteration_spans(rows);
    `fill_probed` False (no growth probe in the build) derives the fill (see the docstring); `creates`:
    the create rows (tid, start_ns, end_ns, bytes) for create_bytes (None: the rows' own)."""
    rows = kind_rows(rows)
    ck = rows.of("checkpoint")
    if not len(ck):
        return empty_frame(CHECKPOINT_COLUMNS)
    if not increasing(ck["ckpt"].to_numpy()):  # ids in order (the recorder's counter) are unique
        dup = ck["ckpt"].duplicated()
        if dup.any():
            raise AnalysisError(
                f"checkpoint id {int(ck['ckpt'][dup].iloc[0])} appears on {int(dup.sum()) + 1} checkpoint rows: "
                "ids must be unique within a trace; analyze each recording separately")

    fills, copies = _spans(rows.of("fill"), "fill"), _spans(rows.of("copy"), "copy")
    # A checkpoint's figures add its fill's and its copy's (fault_ns = fill's + copy's, other_ns =
    # total - fill - copy): bounded together, so every sum below, and each of those, is exact.
    for c in ("ns", "faults", "fault_ns", "cpu_ns", "wait_ns"):
        bound(f"the fill and copy rows' {'times (end_ns - start_ns)' if c == 'ns' else c}", fills[c], copies[c])
    ids = Ids(ck["ckpt"].to_numpy())
    # An update that copied no state saved nothing: llama-server calls update_dft on every
    # checkpoint, and without a draft model it returns at once. Not a checkpoint.
    copy_at = ids.find(copies["ckpt"])
    kept = saved(np.bincount(copy_at[copy_at >= 0], minlength=len(ck)))
    if not kept.any():
        return empty_frame(CHECKPOINT_COLUMNS)
    if not kept.all():
        new_pos = np.where(kept, np.cumsum(kept) - 1, -1)  # each checkpoint row's row in the table, -1 if left out
        first, last = np.flatnonzero(kept)[[0, -1]]
        # Only the first or last left out (cut off at attach or stop): a view, not a copy of every row.
        ck = (ck.iloc[first:last + 1] if kept[first:last + 1].all() else ck.loc[kept]).reset_index(drop=True)
        ids = Ids(ck["ckpt"].to_numpy())
        copy_at = np.where(copy_at >= 0, new_pos[np.maximum(copy_at, 0)], -1)
    n = len(ck)
    # The rows' own columns, shared as Series: pandas 3 copies them if the table is ever written to.
    t: dict[str, object] = {c: ck[c] for c in ("ckpt", "tid", "start_ns", "end_ns", "bytes", "draft", "faults",
                                               "spec", "iter", "cpu_ns", "wait_ns")}
    t["total_ns"] = ck["end_ns"].to_numpy() - ck["start_ns"].to_numpy()

    # No span of a kind: nothing of it happened, 0 where the checkpoint's own clocks were recorded.
    zero_if_recorded = {"fault_ns": np.ones(n, bool),
                        "cpu_ns": ck["cpu_ns"].notna().to_numpy(), "wait_ns": ck["wait_ns"].notna().to_numpy()}
    source = {}
    for name, parts, at in (("fill", fills, ids.find(fills["ckpt"])), ("copy", copies, copy_at)):
        g = Groups(at, n)
        if name == "fill":
            fill_rows = g.count
        t[f"{name}_ns"] = g.sum(parts["ns"], None)  # None: bounded above
        t[f"{name}_faults"] = g.sum(parts["faults"], None)
        source[name] = g.max(parts["source"])
        for c in ("fault_ns", "cpu_ns", "wait_ns"):  # a sum is NA when a part is (not recorded)
            t[f"{name}_{c}"] = g.sum_na(parts[c], zero_if_recorded[c], None)
    t["fault_ns"] = t["fill_fault_ns"] + t["copy_fault_ns"]  # NA + x is NA
    t["fault_source"] = pd.Categorical.from_codes(np.maximum(source["fill"], source["copy"]),
                                                  dtype=CHECKPOINT_COLUMNS["fault_source"])

    # Syscalls made while the checkpoint was open, counted on the memory group's kind codes.
    memory = rows.of_group("memory")
    at = ids.find(memory["ckpt"].to_numpy())
    for kind in ("mmap", "munmap"):
        t[f"{kind}s"] = np.bincount(at[kind_mask(memory, kind) & (at >= 0)], minlength=n).astype("int64", copy=False)

    maps = kind_mask(memory, "mmap") & (at >= 0)
    copy_rows = rows.of("copy")
    mapped = mapped_destination(copy_at, copy_rows["addr"].to_numpy(), copy_rows["bytes"].to_numpy(), at[maps],
                                memory["addr"].to_numpy()[maps], memory["bytes"].to_numpy()[maps], n)
    rules = checkpoint_rules(t["total_ns"], ck["faults"].to_numpy(), t["copy_ns"], t["copy_faults"], fill_rows,
                             t["fill_ns"], t["fill_faults"], t["mmaps"], ck["bytes"].to_numpy(), mapped, fill_probed)
    t["buffer"] = pd.Categorical.from_codes(rules.pop("buffer"), dtype=CHECKPOINT_COLUMNS["buffer"])
    t.update(rules)
    t["fill_source"] = pd.Categorical.from_codes(np.zeros(n, "int8"), dtype=CHECKPOINT_COLUMNS["fill_source"])
    flags = rows.of("copy")["state_flags"].to_numpy("int64")
    t["on_device"] = Groups(copy_at, n).any((flags & STATE_FLAG_ON_DEVICE) != 0)
    t["create_bytes"] = _create_bytes(ck, rows.of_group("memory") if creates is None else creates)
    t["iter"] = assign_iterations(t, spans)
    t = pd.DataFrame({c: t[c] for c in CHECKPOINT_COLUMNS}, copy=False)
    if not fill_probed:
        _derive_fill(t)
        bound_table(t, DERIVED, "checkpoints")
    bound_table(t, SUMMED, "checkpoints")
    return by_start(t)


def _create_bytes(ck: pd.DataFrame, events: pd.DataFrame) -> pd.arrays.IntegerArray:
    """Each checkpoint's enclosing create span's bytes (on its thread), NA when none encloses it."""
    cr = events.loc[kind_mask(events, "create"), ["tid", "start_ns", "end_ns", "bytes"]].reset_index(drop=True)
    if not len(cr):
        return pd.arrays.IntegerArray(np.zeros(len(ck), "int64"), np.ones(len(ck), bool))
    at = enclosing(ck, cr)
    return pd.arrays.IntegerArray(cr["bytes"].to_numpy("int64")[np.maximum(at, 0)], at < 0)


# The columns of the table that later sums read (summary.py, iterations.py, the renderers and
# dashboards), bounded once built (sums.py), so a sum over any of its rows is exact. Several in one
# tuple are bounded together. The fill's and copy's figures are sums of parts bounded together
# above; a derived fill's are not (DERIVED). Counts (faults, mmaps) need no check: the
# validator's ranges bound their sums (core/validate.py).
SUMMED = [("total_ns",), ("bytes",), ("other_ns",), ("cpu_ns",), ("wait_ns",)]
DERIVED = [("fill_ns", "copy_ns"), ("fill_cpu_ns", "copy_cpu_ns"), ("fill_wait_ns", "copy_wait_ns")]


def _derive_fill(t: pd.DataFrame) -> None:
    """The rest of a derived fill (checkpoint_rules made its time, faults and class): its clocks,
    the checkpoint's less its copy's; its fault time not recorded (in place)."""
    for c in ("cpu_ns", "wait_ns"):
        t[f"fill_{c}"] = (t[c] - t[f"copy_{c}"]).astype(NA_INT)
    t["fill_fault_ns"] = pd.array([pd.NA] * len(t), dtype=NA_INT)
    t["fault_ns"] = t["fill_fault_ns"] + t["copy_fault_ns"]
    t["fault_source"] = np.where(t["fill_faults"] > 0, "not recorded", t["fault_source"].astype(str))
    t["fill_source"] = "derived"
    for c in ("fault_source", "fill_source", "other_ns"):
        t[c] = t[c].astype(CHECKPOINT_COLUMNS[c])
