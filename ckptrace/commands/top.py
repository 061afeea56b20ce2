"""`ckptrace top`: a live view of running processes' checkpoints, like perf top."""
from __future__ import annotations

import click

from ckptrace.options import Finite


@click.command(epilog="""\b
Examples:
  # one server, refreshed every second; q or Ctrl-C quits
  ckptrace top --pid $(pidof llama-server)
  # every llama-server, those running and those started later, every 2 s
  ckptrace top --comm llama-server --interval 2
  # one frame after 10 s, for a script (JSON: nanoseconds, counts)
  ckptrace top --pid 4242 --once --interval 10 --json
  # frames one after another into a log, percentiles over the last minute
  ckptrace top --pid 4242 --window 60 > top.log
""")
@click.option("-p", "--pid", "pids", type=click.IntRange(min=1), multiple=True,
              help="A running process to show (repeat for several).")
@click.option("--comm", default=None,
              help="Show every process with this name (/proc/PID/comm, 15 characters at most), those running "
                   "and those that start later.")
@click.option("-i", "--interval", type=Finite(min=0.1, max=3600), default=1.0, show_default=True,
              metavar="SECONDS", help="Seconds between frames (with --once: how long to watch).")
@click.option("--window", type=Finite(min=0.1, max=86400), default=10.0, show_default=True,
              metavar="SECONDS", help="The percentiles cover the checkpoints of the last this many seconds "
                                      "(with --once: all of them).")
@click.option("--once", is_flag=True, help="Print one frame after one interval (or when every process has "
                                           "exited) and exit. The interval counts from the moment the probes are "
                                           "attached (a first run's compile is said, and not in it).")
@click.option("--json", "as_json", is_flag=True, help="Print each frame as one line of JSON (with --once: one "
                                                      "document).")
@click.option("--ringbuf-pages", type=click.IntRange(min=1, max=1 << 18), default=512, show_default=True,
              help="Size of the BPF ring buffer in 4 KiB pages, a power of two.")
def command(pids, comm, interval, window, once, as_json, ringbuf_pages):
    """Show the checkpoints of running processes live, refreshed every interval.

    Per process: checkpoints per second, pool hit share, the fill's, copy's and page faults'
    on-CPU milliseconds per checkpoint (p50/p99 over the window), the median run-queue wait, and
    the checkpoint buffers held. On a terminal the frame is redrawn in place (80 columns, no
    colour; q or Ctrl-C quits); otherwise frames follow each other, as with top -b. With --pid it
    stops when every process has exited. Figures are analyze's (docs/metrics.md). Needs root.
    """
    from ckptrace.live.top import TopOptions, top

    if bool(pids) == bool(comm):
        raise click.UsageError("give --pid PID (one or more) or --comm NAME")
    if ringbuf_pages & (ringbuf_pages - 1):
        raise click.BadParameter(f"must be a power of two, got {ringbuf_pages}", param_hint="--ringbuf-pages")
    top(TopOptions(pids=tuple(dict.fromkeys(pids)), comm=comm, interval_s=interval, window_s=window, once=once,
                   as_json=as_json, ringbuf_pages=ringbuf_pages))
