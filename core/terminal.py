"""Text that reaches a terminal: anything from a trace or a user is made printable first.

A trace label, path or command line can hold escape sequences (clear screen, window title,
OSC 52 clipboard writes) or bidi controls that reorder what the reader sees. `printable()`
shows every character that `str.isprintable()` rejects as a visible escape (`\\x1b`,
`\\u202e`), on a terminal or not: a pipe or a log file is read on a terminal later. Every bidi
control (U+202A..U+202E, U+2066..U+2069, U+200E, U+200F, U+061C) is a format character, which
isprintable() rejects. The HTML dashboard, Markdown and the timeline exports use the same function.

A label (from --label, a trace's metadata, a process name) is also cut to LABEL_MAX characters
where a report shows it (`shown_label()`); the full label stays in the data (--json, CSV, the
trace).
"""
from __future__ import annotations

import hashlib

import click


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(code: int) -> str:
    if chr(code) in _NAMED:
        return _NAMED[chr(code)]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


class _Table(dict):
    """str.translate table filled on first sight of each character (fast on long reports)."""

    def __init__(self, keep: str):
        super().__init__({ord(c): c for c in keep})

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        out = ch if ch.isprintable() else _escape(code)
        self[code] = out
        return out


_FIELD = _Table("")
_LINES = _Table("\n")


def printable(value, *, lines: bool = False) -> str:
    """`str(value)` with every non-printable character escaped visibly.

    A field (label, path, command, error message) also has its newlines and tabs escaped, so
    it can't forge a line of output; `lines=True` keeps newlines for a whole rendered report.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return text.translate(_LINES if lines else _FIELD)


def echo(text: str = "", *, err: bool = False) -> None:
    """click.echo of a whole rendered text, made printable (newlines kept)."""
    click.echo(printable(text, lines=True), err=err)


LABEL_MAX = 48  # characters a label takes in a report, cut or not


def shown_label(value) -> str:
    """A label as reports show it: printable(), and at most LABEL_MAX characters. A longer one
    keeps its start and ends in `~` and 6 hex digits of its hash, so two long labels that differ
    only further on still read as two."""
    text = printable(value)
    if len(text) <= LABEL_MAX:
        return text
    digest = hashlib.sha256(str(value).encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{text[:LABEL_MAX - 7]}~{digest}"
