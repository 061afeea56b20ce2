"""Click options several commands share (commands never import one another).

Every float option is a `Finite`: click's FloatRange lets nan through every bound (nan < 0 and
nan > 0 are both false) and inf through any open-ended one, so `--duration nan` would record
forever and `--min-effect inf` would call every change drift. A Finite gives one usage line for
nan, inf, -inf or 1e999 (which parses as inf), and has an upper bound on what the code below can
take (a socket timeout past about 3e11 s overflows a C timeval).
"""
from __future__ import annotations

import math

import click

from ckptrace.analyzers.compare_config import DEFAULTS


def _warmup_value(ctx, param, value):
    """--warmup N|auto, checked (analyzers/warmup.py)."""
    from ckptrace.analyzers.warmup import parse_warmup

    try:
        return parse_warmup(value)
    except ValueError as e:
        raise click.BadParameter(str(e).removeprefix("--warmup takes "), ctx, param) from None


# compare, dashboard and demo: each thread's warm-up, left out of compare's metrics.
warmup_option = click.option(
    "--warmup", default=DEFAULTS.warmup, show_default=True, callback=_warmup_value, metavar="N|auto",
    help="Each thread's warm-up, left out of the metrics and reported apart: its first N prefill "
         "iterations, or auto (through the first that made a checkpoint). 0: none.")


SECONDS_MAX = 1e9  # about 31 years: any duration or timeout a run can mean


class Finite(click.FloatRange):
    """A float in [min, max] (min excluded with min_open), never nan or infinite."""

    def __init__(self, min: float = 0.0, max: float = SECONDS_MAX, min_open: bool = False):
        super().__init__(min=min, max=max, min_open=min_open)

    def convert(self, value, param, ctx):
        rv = value if isinstance(value, float) else click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!s} is not a finite number (give one in the range {self._describe_range()})",
                      param, ctx)
        return super().convert(rv, param, ctx)


def seconds(**kw) -> Finite:
    """A positive number of seconds, at most SECONDS_MAX."""
    return Finite(min=0.0, max=SECONDS_MAX, min_open=True, **kw)


def requests_options(requests_help: str, pid_help: str, *, multiple: bool = True, dest: str = "request_files"):
    """--requests FILE (a leg's request file, `ckptrace drive --json -o FILE`) and --requests-pid
    PID|LABEL (the process its requests went to), in that order; each command says in its own
    help what the requests add. `multiple`: once per trace (compare, dashboard, export, whatif)."""
    def decorate(f):
        f = click.option("--requests-pid", "requests_pid", multiple=multiple, metavar="PID|LABEL", help=pid_help)(f)
        return click.option("--requests", dest, multiple=multiple, metavar="FILE", help=requests_help)(f)
    return decorate
