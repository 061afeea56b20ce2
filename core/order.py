"""Whether numpy arrays are in order: the checks before a sort or a binary search, shared by the
trace's validation (core/validate.py) and the numpy rules analyze and the live tools share
(core/rules.py), without pandas."""
from __future__ import annotations

import numpy as np


def in_order(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether rows are sorted by `major`, then `minor` (a check is far cheaper than a sort)."""
    if len(major) < 2:
        return True
    if major[0] == major[-1]:  # one group (e.g. one thread): sorted iff the minor never decreases
        return bool((major == major[0]).all()) and increasing(minor, strict=False)
    if not increasing(major, strict=False):
        return False
    return bool(((major[1:] != major[:-1]) | (minor[1:] >= minor[:-1])).all())


def increasing(values: np.ndarray, strict: bool = True) -> bool:
    """Whether `values` never decrease (strict: always increase, so none appears twice), e.g. ids
    in the order the recorder's counters gave them."""
    return len(values) < 2 or bool(((values[1:] > values[:-1]) if strict else (values[1:] >= values[:-1])).all())
