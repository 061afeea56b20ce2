"""Units shared by every layer, so a figure means the same thing everywhere: the sizes a user
writes, and one formatter per unit and style for what is printed (ms, MiB, percent). A formatter's
"-" is a figure not recorded."""
from __future__ import annotations

import math

MIB = 1 << 20  # bytes

# Size suffixes a user may write: K, M, G, T as powers of 1024 (as free(1) and ls -h mean them),
# with or without "iB"/"B".
_SIZE_UNITS = {"": 1, "b": 1, **{p + s: 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "b", "ib")}}


def parse_bytes(text: str) -> int:
    """A size: `123`, `48MiB`, `1.5G`, `512k` (powers of 1024). ValueError with the reason."""
    s = text.strip().lower().replace("_", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num):]
    if unit not in _SIZE_UNITS or not num:
        raise ValueError(f"{text!r} is not a size (a number of bytes, or with K, M, G or T, e.g. 48MiB)")
    try:
        value = float(num) * _SIZE_UNITS[unit] if "." in num or "e" in num else int(num) * _SIZE_UNITS[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a size (a number of bytes, or with K, M, G or T, e.g. 48MiB)") from None
    if not 0 <= value < 1 << 62:
        raise ValueError(f"{text!r} is out of range (0 to 2^62 bytes)")
    return int(value)


def parse_bytes_or_fraction(text: str) -> int | float:
    """A size (parse_bytes: an int), or a fraction of something written `0.0625`, `1/16` or
    `6.25%` (a float in (0, 1]). A bare integer is bytes."""
    s = text.strip()
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            f = float(a) / float(b)
        elif s.endswith("%"):
            f = float(s[:-1]) / 100
        elif s.replace(".", "", 1).isdigit() and "." in s:
            f = float(s)
        else:
            return parse_bytes(s)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is neither a size (48MiB) nor a fraction (1/16, 0.0625, 6.25%)") from None
    if not 0 < f <= 1:
        raise ValueError(f"{text!r} as a fraction lies outside (0, 1]")
    return f


def missing(v) -> bool:
    """None, NaN or pandas' NA: a figure not recorded."""
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN is the one number unequal to itself
    except TypeError:  # pandas' NA, whose truth is ambiguous
        return True


def ms(ns, digits: int = 2) -> str:
    """Nanoseconds as milliseconds, `digits` decimals, no unit (a table's column says it); "-" for
    None or NaN (pandas' NA is written as pandas writes it: ms_na says "-" for it too)."""
    return "-" if ns is None or (isinstance(ns, float) and math.isnan(ns)) else f"{ns / 1e6:.{digits}f}"


def ms_na(ns, digits: int = 2) -> str:
    """ms, with "-" for pandas' NA too (a nullable column's cell)."""
    return "-" if missing(ns) else f"{ns / 1e6:.{digits}f}"


def ms_short(ns: float | None) -> str:
    """Nanoseconds as milliseconds in at most 5 characters (3 significant digits), "-" for none:
    a live frame's narrow columns."""
    if ns is None:
        return "-"
    v = ns / 1e6
    if v < 9.995:
        return f"{v:.2f}"
    if v < 99.95:
        return f"{v:.1f}"
    if v < 99999.5:
        return f"{v:.0f}"
    return f"{v / 1000:.0f}s"


def ms_signed(ns: float) -> str:
    """Nanoseconds as a signed change in milliseconds, two decimals, with the unit: '+1.25 ms'."""
    return f"{ns / 1e6:+.2f} ms"


def ms_change(v: float) -> str:
    """A signed change already in milliseconds, with the unit: one decimal under 10 ms ('+2.5 ms',
    '+2976 ms')."""
    return f"{v:+.1f} ms" if abs(v) < 10 else f"{v:+.0f} ms"


def mib(b, digits: int = 1) -> str:
    """Bytes as MiB, `digits` decimals, no unit; "-" for none."""
    return "-" if missing(b) else f"{b / MIB:.{digits}f}"


def mib_said(b, digits: int = 1) -> str:
    """Bytes as MiB with the unit, in a sentence: '96.0 MiB'."""
    return f"{mib(b, digits)} MiB"


def pct_change(x: float) -> str:
    """A signed change in percent, as compare's tables show it: one decimal under 1000%, whole
    percent to 10000%, then thousands ('+12k%'); "-" for NaN, '+inf%'/'-inf%' for a change from 0."""
    if not math.isfinite(x):
        return "-" if math.isnan(x) else ("+inf%" if x > 0 else "-inf%")
    if abs(x) >= 10_000:
        return f"{x / 1000:+.0f}k%"
    return f"{x:+.1f}%" if abs(x) < 1000 else f"{x:+.0f}%"


def pct_of(part, whole) -> str:
    """part of whole in percent, one decimal: '12.5%' (whole not 0)."""
    return f"{part / whole * 100:.1f}%"
