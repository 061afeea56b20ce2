"""Units shared by every layer, so a figure means the same thing everywhere."""
from __future__ import annotations

MIB = 1 << 20  # bytes
