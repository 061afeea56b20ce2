"""spans.py's lookups and group reductions against plain loops, on ids and rows in order and not
(the tables take fast paths when ids are consecutive or increasing and rows come in order)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers.spans import Groups, Ids, by_start, kind_mask

IDS = {"consecutive": np.arange(5, 12), "increasing": np.array([2, 3, 7, 8, 20]),
       "unordered": np.array([8, 2, 20, 3, 7]), "none": np.zeros(0, "int64")}


@pytest.mark.parametrize("name", IDS)
def test_ids_find_each_position_or_minus_one(name):
    ids = IDS[name]
    of = np.array([0, 2, 3, 5, 7, 8, 11, 12, 20, 21, -4])
    where = {int(v): i for i, v in enumerate(ids)}
    assert Ids(ids).find(of).tolist() == [where.get(int(v), -1) for v in of]


AT = {"in order": np.array([0, 0, 2, 2, 2, 4]), "out of order": np.array([4, 0, 2, 0, 2, 2]),
      "some in no group": np.array([-1, 0, 4, -1, 0, 2]), "none": np.zeros(0, "int64"),
      "one row each": np.array([1, 3, 5]), "one row in every group": np.arange(6),
      "one row in every group, out of order": np.array([5, 0, 3, 1, 2, 4]), "every group": np.array([0, 1, 1, 2, 3, 4, 5])}


@pytest.mark.parametrize("name", AT)
def test_groups_reduce_each_group_exactly(name):
    at, n = AT[name], 6
    big = 2 ** 62  # int64 sums stay exact (no float on the way)
    values = (np.arange(len(at)) + 1) * big // 8
    na = np.arange(len(at)) % 3 == 1
    g = Groups(at, n)
    rows_of = [[i for i in range(len(at)) if at[i] == k] for k in range(n)]
    assert g.count.tolist() == [len(r) for r in rows_of]
    assert g.has.tolist() == [bool(r) for r in rows_of]
    assert g.sum(values).tolist() == [sum(int(values[i]) for i in r) for r in rows_of]
    assert g.max(values).tolist() == [max((int(values[i]) for i in r), default=0) for r in rows_of]
    assert g.any(na).tolist() == [any(na[i] for i in r) for r in rows_of]
    zero = np.arange(n) % 2 == 0  # a group without rows: 0 where zero, NA elsewhere
    got = g.sum_na(pd.arrays.IntegerArray(values, na), zero)
    want = [None if any(na[i] for i in r) else sum(int(values[i]) for i in r) if r else 0 if zero[k] else None
            for k, r in enumerate(rows_of)]
    assert [None if v is pd.NA else int(v) for v in got] == want
    # New arrays, never the caller's: changing the parts changes no sum.
    sums = g.sum(values), g.sum_na(pd.arrays.IntegerArray(values, np.zeros(len(at), bool)), zero)
    want = [s.copy() for s in sums]
    values[:] = 1
    for s, w in zip(sums, want):
        assert s.tolist() == w.tolist()


def test_by_start_sorts_by_start_then_thread_only_when_needed():
    ordered = pd.DataFrame({"start_ns": [1, 2, 2, 5], "tid": [9, 1, 3, 0], "x": [0, 1, 2, 3]}, index=[7, 6, 5, 4])
    out = by_start(ordered)
    assert out["x"].tolist() == [0, 1, 2, 3] and out.index.tolist() == [0, 1, 2, 3]
    mixed = pd.DataFrame({"start_ns": [5, 2, 2, 1, 2], "tid": [0, 3, 1, 9, 1], "x": [0, 1, 2, 3, 4]})
    assert by_start(mixed)["x"].tolist() == [3, 2, 4, 1, 0]  # stable among equal (start, tid)


def test_kind_mask_of_several_kinds():
    kinds = pd.Categorical(["mmap", "rss", "munmap", "mmap", None], categories=["mmap", "munmap", "rss"])
    ev = pd.DataFrame({"kind": kinds})
    assert kind_mask(ev, "mmap", "munmap").tolist() == [True, False, True, True, False]
    assert kind_mask(ev, "mmap", "restore").tolist() == [True, False, False, True, False]
    assert kind_mask(ev.astype({"kind": object}), "munmap").tolist() == [False, False, True, False, False]
