"""Units shared by every layer, so a figure means the same thing everywhere."""
from __future__ import annotations

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


def ms_signed(ns: float) -> str:
    """Nanoseconds as signed milliseconds, two decimals: '+1.25 ms'."""
    return f"{ns / 1e6:+.2f} ms"
