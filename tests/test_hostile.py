"""Hostile input and hostile places, as an SRE would try them: one clear line or correct behaviour.

Each test is one case of issue 9 (or one of the same kind): the file a user hands over, the folder
written into, the terminal printed on, the signal received, the server talked to.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from ckptrace.terminal import printable

CLI = [sys.executable, "-m", "ckptrace"]
ESC = "\x1b"
# Clear screen, window title, OSC 52 clipboard write, bidi override, C1 CSI, a line forged.
NASTY = "a\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\u202eb\x9b31m\nverdict: faster"


def run(args, **kw):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


def assert_one_error_line(r):
    assert r.returncode != 0
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ckptrace: error: "), r.stderr
    assert ESC not in r.stdout + r.stderr
    return lines[0]


# --- terminal -------------------------------------------------------------------------------

def test_printable_shows_every_control_visibly():
    out = printable(NASTY)
    assert out.isprintable()
    assert out == ("a\\x1b[2J\\x1b]0;owned\\x07\\x1b]52;c;ZWNobyBoaQ==\\x07\\u202eb\\x9b31m"
                   "\\nverdict: faster")


def test_printable_keeps_plain_text_and_report_lines():
    assert printable("pool-off, 32 slots: 48.1 MiB ± 2 µs") == "pool-off, 32 slots: 48.1 MiB ± 2 µs"
    assert printable("row 1\nrow 2\x1b[H", lines=True) == "row 1\nrow 2\\x1b[H"
    assert printable("tab\there") == "tab\\there"
    assert printable(42) == "42"


def test_printable_shows_undecodable_path_bytes_as_bytes():
    import os
    name = os.fsdecode(b"trace-\xff\x1b.parquet")
    assert printable(name) == "trace-\\xff\\x1b.parquet"
    printable(name).encode("utf-8")  # no lone surrogate left to crash an echo


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["nope"], ["analyze"], ["analyze", "--bogus", "x"],
                                  ["record", "--pid", "notanumber", "-o", "x"],
                                  ["compare", "--seed", "x", "a", "b"]])
def test_usage_errors_are_one_line(args):
    line = assert_one_error_line(run(args))
    assert "--help" in line


def test_error_naming_a_hostile_path_is_printable(tmp_path):
    line = assert_one_error_line(run(["analyze", tmp_path / NASTY]))
    assert "\\x1b]52;" in line


# --- labels and metadata from a trace reach the terminal made printable ---------------------

def relabeled(src, dst, label, **meta):
    """A real sample trace with another label (and metadata): what a colleague might hand over."""
    import dataclasses

    from ckptrace.trace import read_trace, write_trace
    t = read_trace(src)
    write_trace(dst, t.events, dataclasses.replace(t.meta, label=label, **meta))
    return dst


SAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "samples" / "traces"


@pytest.fixture(scope="module")
def nasty_legs(tmp_path_factory):
    d = tmp_path_factory.mktemp("nasty")
    return [relabeled(SAMPLES / "1-pool-off.parquet", d / "1.parquet", NASTY, command=[NASTY]),
            relabeled(SAMPLES / "2-pool-on.parquet", d / "2.parquet", "on" + NASTY),
            relabeled(SAMPLES / "3-pool-off.parquet", d / "3.parquet", NASTY)]


@pytest.mark.parametrize("how", [["analyze"], ["analyze", "--all"], ["analyze", "--json"],
                                 ["compare"], ["compare", "--json"]])
def test_no_escape_byte_from_a_trace_reaches_the_terminal(nasty_legs, how):
    legs = nasty_legs[:1] if how[0] == "analyze" else nasty_legs
    r = run([*how, *legs])
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert ESC not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    assert "verdict: faster" not in [ln.strip() for ln in out.splitlines()]  # no forged line
    if "--json" not in how:
        assert "\\x1b]52;" in r.stdout  # shown, visibly
