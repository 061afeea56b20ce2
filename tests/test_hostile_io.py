"""Hostile places a command runs in and hostile option values (issue 22): two recorders given the
same -o, a closed or full stdout/stderr, and non-finite numbers in every float option. Each is one
clear line and a clear exit status, never a traceback, and no recording is lost.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest

from helpers import assert_one_line_error, ckptrace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
LEGS = [SAMPLES / f for f in ("1-pool-off.parquet", "2-pool-on.parquet", "3-pool-off.parquet")]


# --- non-finite numbers in every float option -----------------------------------------------

# A command line per command around its float option, every other argument valid, so the line
# printed can only be about the option's value.
FLOAT_ARGS = {
    "record": lambda opt, v, tmp: ["record", "-o", tmp / "t.parquet", opt, v, "--", "true"],
    "serve": lambda opt, v, tmp: ["serve", "--pid", "1", "--listen", "127.0.0.1:0", opt, v],
    "drive": lambda opt, v, tmp: ["drive", "http://127.0.0.1:9", "--requests", "1", opt, v],
    "compare": lambda opt, v, tmp: ["compare", *LEGS, opt, v],
}


def float_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every command that takes a float."""
    from ckptrace.cli import COMMANDS

    found = []
    for name in COMMANDS:
        for p in importlib.import_module(f"ckptrace.commands.{name}").command.params:
            if isinstance(p.type, click.types.FloatParamType):
                found.append((name, p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0]))
    return found


def test_every_float_option_refuses_non_finite_values_by_its_type():
    """A new float option is covered too: each is an options.Finite and has a command line below."""
    from ckptrace.options import Finite

    opts = float_options()
    assert len(opts) >= 7, opts
    for name, opt in opts:
        assert name in FLOAT_ARGS, f"{name} {opt}: add a command line to FLOAT_ARGS"
        param = next(p for p in importlib.import_module(f"ckptrace.commands.{name}").command.params
                     if opt in p.opts)
        assert isinstance(param.type, Finite), (name, opt, param.type)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "NaN", "-Infinity"])
@pytest.mark.parametrize("command,option", float_options())
def test_non_finite_numbers_are_one_usage_line(tmp_path, command, option, value):
    r = ckptrace(*FLOAT_ARGS[command](option, value, tmp_path), timeout=60)
    line = assert_one_line_error(r, option, "not a finite number", code=2)
    assert "--help" in line and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing recorded, nothing written


@pytest.mark.parametrize("command,option", float_options())
def test_a_finite_value_too_large_for_the_code_below_is_one_usage_line(tmp_path, command, option):
    """1e300 s overflows a socket timeout's C timeval; every float option has an upper bound."""
    r = ckptrace(*FLOAT_ARGS[command](option, "1e300", tmp_path), timeout=60)
    assert_one_line_error(r, option, "is not in the range", code=2)
