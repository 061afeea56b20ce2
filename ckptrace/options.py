"""Click options several commands share (commands never import one another)."""
from __future__ import annotations

import click


def _warmup_value(ctx, param, value):
    """--warmup N|auto, checked (analyzers/warmup.py)."""
    from ckptrace.analyzers.warmup import parse_warmup

    try:
        return parse_warmup(value)
    except ValueError as e:
        raise click.BadParameter(str(e).removeprefix("--warmup takes "), ctx, param) from None


# compare, dashboard and demo: each thread's warm-up, left out of compare's metrics.
warmup_option = click.option(
    "--warmup", default="auto", show_default=True, callback=_warmup_value, metavar="N|auto",
    help="Each thread's warm-up, left out of the metrics and reported apart: its first N prefill "
         "iterations, or auto (through the first that made a checkpoint). 0: none.")
