"""The rest of the checkpoint state path (trace format 3): restores, prompt saves and evictions.

- Restores, one row each: a `restore` span (`load_tgt`/`load_dft`, `draft` true for dft; ik_llama.cpp's
  `apply_checkpoint`) with the `restore_copy` rows (`llama_state_seq_set_data_ext`, ik's
  `llama_state_seq_set_data`) inside it on its thread, `source` "checkpoint"; and a `restore_copy`
  made outside any restore (the prompt cache, a slot restore), `source` "other", its own copy. A
  restore that copied nothing (`load_dft` without a draft model returns at once) restored nothing
  and is left out. `restored` (trace format 5): what the call reported: load_*'s bool where it
  returns one (build 11549 on), else whether every copy read all it was given (set_data returns
  the bytes it read, 0 on failure); NA when nothing reported it. `copy_ns`, `copy_cpu_ns`, `copy_faults`,
  `copy_fault_ns` are the copies'; `cpu_ns`, `wait_ns`, `faults` the whole span's (NA when not
  recorded). `iter`: the iteration it falls in (spans.py), 0 when none.
- Prompt saves, one row each: a `prompt_save` span (`server_slot::prompt_save`, the prompt cache)
  with the `copy` rows inside it on its thread (`llama_state_seq_get_data_ext`; ckpt 0, phase
  `prompt_save`), their figures as a restore's, `source` "call"; and a save inlined into its caller
  (no span: its copy, a `copy` row of ckpt 0 outside any prompt_save, taken at the call site),
  `source` "inlined", its own copy. `bytes`: what its copies wrote.
- Slot files, one row each (trace format 5): a `slot_save` (`llama_state_seq_save_file`) or
  `slot_restore` (`llama_state_seq_load_file`) span, `action` save|restore, `bytes` what the call
  wrote or read (a restore's first call reads only the file's token count), `ok` whether it
  returned any. Build 11549 then appends (on save) or reads (on restore) the slot's checkpoints
  after that payload, outside the call: the server's own `n_written`/`n_read` counts both.
- Evictions: the `munmap` rows made inside a `create` span (`create_checkpoint`) on its thread
  before that create's first checkpoint began: old checkpoints erased to make room; and those
  made inside a `restore` span outside its copies (ik_llama.cpp's `apply_checkpoint` erases the
  checkpoints a shorter prompt invalidated; upstream's load_tgt frees nothing). `why`: "room" or
  "invalidated".
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ckptrace.core.trace import empty_frame

from ckptrace.core.rules import enclosing, restored  # noqa: F401 (also read from here)
from .spans import NA_INT, assign_iterations, kind_mask, select
from .sums import bound, bound_table

RESTORE_SOURCES = ["checkpoint", "other"]
RESTORE_COLUMNS: dict[str, object] = {
    "tid": np.dtype("int32"),
    "iter": np.dtype("int64"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "total_ns": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "draft": np.dtype("bool"),
    "source": pd.CategoricalDtype(RESTORE_SOURCES),
    "copy_ns": np.dtype("int64"),
    "copy_cpu_ns": NA_INT,
    "copy_faults": np.dtype("int64"),
    "copy_fault_ns": NA_INT,
    "cpu_ns": NA_INT,
    "wait_ns": NA_INT,
    "faults": np.dtype("int64"),
    "restored": pd.BooleanDtype(),
}
PROMPT_SAVE_SOURCES = ["call", "inlined"]
PROMPT_SAVE_COLUMNS: dict[str, object] = {c: (pd.CategoricalDtype(PROMPT_SAVE_SOURCES) if c == "source" else t)
                                          for c, t in RESTORE_COLUMNS.items() if c not in ("draft", "restored")}
EVICTION_WHY = ["room", "invalidated"]
SLOT_FILE_COLUMNS: dict[str, object] = {
    "tid": np.dtype("int32"),
    "iter": np.dtype("int64"),
    "start_ns": np.dtype("int64"),
    "end_ns": np.dtype("int64"),
    "total_ns": np.dtype("int64"),
    "action": pd.CategoricalDtype(["save", "restore"]),
    "bytes": np.dtype("int64"),
    "ok": np.dtype("bool"),
    "cpu_ns": NA_INT,
    "wait_ns": NA_INT,
    "faults": np.dtype("int64"),
}
EVICTION_COLUMNS: dict[str, object] = {
    "tid": np.dtype("int32"),
    "start_ns": np.dtype("int64"),
    "bytes": np.dtype("int64"),
    "addr": np.dtype("uint64"),
    "create_start_ns": np.dtype("int64"),
    "why": pd.CategoricalDtype(EVICTION_WHY),
}
_SPAN_COLS = ["tid", "iter", "start_ns", "end_ns", "bytes", "draft", "faults", "cpu_ns", "wait_ns", "fault_ns",
              "phase", "outcome"]
O_OK, O_FAILED = 1, 2  # trace.OUTCOMES


def restore_table(events: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """One row per restore (RESTORE_COLUMNS), sorted by start_ns; `spans` from iteration_spans."""
    rc = select(events, kind_mask(events, "restore_copy"), _SPAN_COLS).reset_index(drop=True)
    if not len(rc):
        return empty_frame(RESTORE_COLUMNS)
    rs = select(events, kind_mask(events, "restore"), _SPAN_COLS).reset_index(drop=True)
    spans_part, rc = _with_copies(rs, rc)  # a restore without a copy restored nothing
    parts = [spans_part.assign(source="checkpoint"), _alone(rc, "other")]
    t = pd.concat(parts, ignore_index=True)
    # its own report where it made one (a bool load_*), else its copies' (each read all it was given)
    g = rc[rc["parent"] >= 0].groupby("parent")["outcome"]
    by_copies = pd.Series(np.where(g.max() == O_FAILED, O_FAILED, np.where(g.min() == O_OK, O_OK, 0)), index=g.max().index)
    own = t["outcome"].to_numpy("int64")
    from_copies = np.zeros(len(t), "int64")
    n_spans = len(spans_part)
    from_copies[:n_spans] = by_copies.reindex(spans_part.index).fillna(0).to_numpy("int64")
    outcome = np.where(own > 0, own, from_copies)
    t["restored"] = pd.array(np.where(outcome == O_OK, True, False), dtype="boolean")
    t.loc[outcome == 0, "restored"] = pd.NA
    return _finish(t, spans, RESTORE_COLUMNS)


def prompt_save_table(events: pd.DataFrame, copies: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """One row per prompt save with a state copy (PROMPT_SAVE_COLUMNS), sorted by start_ns; `events`
    holds the prompt_save rows, `copies` the copy rows (a checkpoint's, ckpt > 0, are not its)."""
    own = select(copies, (copies["ckpt"] == 0).to_numpy(), ["tid", "iter", "start_ns", "end_ns", "bytes", "faults",
                                                                "cpu_ns", "wait_ns", "fault_ns"]).reset_index(drop=True)
    if not len(own):
        return empty_frame(PROMPT_SAVE_COLUMNS)
    ps = select(events, kind_mask(events, "prompt_save"), _SPAN_COLS).reset_index(drop=True)
    saves, own = _with_copies(ps, own)
    parts = [saves.assign(source="call"), _alone(own, "inlined")]
    return _finish(pd.concat(parts, ignore_index=True), spans, PROMPT_SAVE_COLUMNS)


def _with_copies(outer: pd.DataFrame, copies: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The `outer` spans that hold copies on their thread, each with its copies' copy_ns,
    copy_faults, copy_cpu_ns and copy_fault_ns (NA when a part was not measured); and `copies`
    with `parent` (its outer span's position, -1 for none) and `ns`."""
    copies = copies.assign(parent=enclosing(copies, outer), ns=copies["end_ns"] - copies["start_ns"])
    for c in ("ns", "faults", "cpu_ns", "fault_ns"):  # summed per span below: exact (sums.py)
        bound(f"the state copies' {'times (end_ns - start_ns)' if c == 'ns' else c}", copies[c].array)
    g = copies[copies["parent"] >= 0].groupby("parent")
    per = pd.DataFrame({"copy_ns": g["ns"].sum(), "copy_faults": g["faults"].sum()})
    for c, src in (("copy_cpu_ns", "cpu_ns"), ("copy_fault_ns", "fault_ns")):
        per[c] = g[src].agg(lambda v: v.sum() if v.notna().all() else pd.NA)
    return outer.join(per, how="inner"), copies


def _alone(copies: pd.DataFrame, source: str) -> pd.DataFrame:
    """The copies outside any outer span (after _with_copies), each a row of its own."""
    alone = copies[copies["parent"] < 0]
    return alone.assign(source=source, copy_ns=alone["ns"], copy_faults=alone["faults"],
                        copy_cpu_ns=alone["cpu_ns"], copy_fault_ns=alone["fault_ns"])


def _finish(t: pd.DataFrame, spans: pd.DataFrame, columns: dict[str, object]) -> pd.DataFrame:
    if not len(t):
        return empty_frame(columns)
    t["total_ns"] = t["end_ns"] - t["start_ns"]
    for c in ("copy_cpu_ns", "copy_fault_ns"):
        t[c] = t[c].astype(NA_INT)
    t["iter"] = assign_iterations(t, spans)
    t = t[list(columns)].astype(columns)
    # Summed later (the report, compare): exact (sums.py).
    bound_table(t, [("bytes",), ("total_ns",), ("cpu_ns",), ("wait_ns",)],
                "restores" if columns is RESTORE_COLUMNS else "prompt saves")
    return t.sort_values(["start_ns", "tid"], kind="stable").reset_index(drop=True)


def slot_file_table(events: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """One row per slot file save or load (SLOT_FILE_COLUMNS), sorted by start_ns."""
    mask = kind_mask(events, "slot_save") | kind_mask(events, "slot_restore")
    if not mask.any():
        return empty_frame(SLOT_FILE_COLUMNS)
    t = select(events, mask, [*_SPAN_COLS, "kind"]).reset_index(drop=True)
    t["total_ns"] = t["end_ns"] - t["start_ns"]
    t["action"] = np.where(t["kind"].astype(str) == "slot_save", "save", "restore")
    t["ok"] = t["outcome"].to_numpy("int64") == O_OK
    t["iter"] = assign_iterations(t, spans)
    t = t[list(SLOT_FILE_COLUMNS)].astype(SLOT_FILE_COLUMNS)
    bound_table(t, [("bytes",), ("total_ns",), ("cpu_ns",), ("wait_ns",)], "slot files")
    return t.sort_values(["start_ns", "tid"], kind="stable").reset_index(drop=True)


def eviction_table(events: pd.DataFrame) -> pd.DataFrame:
    """The munmaps each create_checkpoint made before its first checkpoint, and each restore span
    outside its copies (EVICTION_COLUMNS; `create_start_ns`: the enclosing span's start)."""
    parts = [_room(events), _invalidated(events)]
    t = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else None
    if t is None:
        return empty_frame(EVICTION_COLUMNS)
    bound("the evictions' bytes", t["bytes"].to_numpy())  # summed by the report: exact (sums.py)
    return t[list(EVICTION_COLUMNS)].astype(EVICTION_COLUMNS).sort_values("start_ns", kind="stable") \
        .reset_index(drop=True)


def _room(events: pd.DataFrame) -> pd.DataFrame:
    cr = events.loc[kind_mask(events, "create"), ["tid", "start_ns", "end_ns"]].reset_index(drop=True)
    if not len(cr):  # read first: the munmaps (many in a pool-off trace) matter only within creates
        return cr
    mu = events.loc[kind_mask(events, "munmap") & (events["phase"] == "create").to_numpy(),
                    ["tid", "start_ns", "end_ns", "bytes", "addr"]].reset_index(drop=True)
    if not len(mu):
        return mu
    parent = enclosing(mu, cr)
    ck = events.loc[kind_mask(events, "checkpoint"), ["tid", "start_ns", "end_ns"]].reset_index(drop=True)
    ck_parent = enclosing(ck, cr)
    first_ck = pd.Series(ck["start_ns"].to_numpy()).groupby(ck_parent).min()
    before = np.array([p >= 0 and s < first_ck.get(p, np.iinfo("int64").max)
                       for p, s in zip(parent, mu["start_ns"].to_numpy())], dtype=bool)
    return mu[before].assign(create_start_ns=cr["start_ns"].to_numpy()[parent[before]], why="room")


def _invalidated(events: pd.DataFrame) -> pd.DataFrame:
    """munmaps in a restore span's own time (phase restore: outside its copies)."""
    rs = events.loc[kind_mask(events, "restore"), ["tid", "start_ns", "end_ns"]].reset_index(drop=True)
    if not len(rs):
        return rs
    mu = events.loc[kind_mask(events, "munmap") & (events["phase"] == "restore").to_numpy(),
                    ["tid", "start_ns", "end_ns", "bytes", "addr"]].reset_index(drop=True)
    parent = enclosing(mu, rs) if len(mu) else np.zeros(0, "int64")
    inside = parent >= 0
    return mu[inside].assign(create_start_ns=rs["start_ns"].to_numpy()[parent[inside]], why="invalidated")
