"""`ckptrace serve`: a Prometheus exporter of checkpoint metrics for running processes."""
from __future__ import annotations

import click

from ckptrace.live.serve import DEFAULT_LISTEN
from ckptrace.options import seconds


@click.command(epilog=f"""\b
Examples:
  # one server, metrics at http://{DEFAULT_LISTEN}/metrics
  ckptrace serve --pid $(pidof llama-server)
  # several servers, on another port
  ckptrace serve --pid 4242 --pid 4243 --listen 127.0.0.1:9465
  # every llama-server, those running and those started later
  ckptrace serve --comm llama-server
  # scraped from other hosts: listen on every address (IPv4)
  ckptrace serve --pid 4242 --listen 0.0.0.0:9464
  # port 0: the kernel picks a free port; the ready line says which
  ckptrace serve --pid 4242 --listen 127.0.0.1:0
""")
@click.option("-p", "--pid", "pids", type=click.IntRange(min=1), multiple=True,
              help="A running process to serve metrics for (repeat for several).")
@click.option("--comm", default=None,
              help="Serve every process with this name (/proc/PID/comm, 15 characters at most), those "
                   "running and those that start later.")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="ADDRESS:PORT to serve /metrics on; only 127.0.0.1 unless you give another address.")
@click.option("--label", default="", help="The `label` of every series (default: the process name).")
@click.option("--ringbuf-pages", type=click.IntRange(min=1, max=1 << 18), default=512, show_default=True,
              help="Size of the BPF ring buffer (one, shared by every process served) in 4 KiB pages, a power of two.")
@click.option("--hint-after", type=seconds(), default=30.0, show_default=True,
              help="With --comm: say so if no such process has appeared after this many seconds.")
@click.option("--duration", type=seconds(), default=None,
              help="Stop after this many seconds (default: until Ctrl-C or SIGTERM).")
def command(pids, comm, listen, label, ringbuf_pages, hint_after, duration):
    """Serve Prometheus metrics of the checkpoints of running processes at /metrics.

    Histograms per checkpoint (fill, copy, fault, on-CPU and wait seconds; bytes), counters
    (checkpoints, faults, pool hits, restores, lost events) and held checkpoint memory, labelled
    by pid, label and build_id. Runs until Ctrl-C or SIGTERM; a process that exits is served
    once more, then its series end; with --pid it stops when every process has exited, with
    --comm it keeps serving the name's new processes. Needs root.
    """
    from ckptrace.live.serve import ServeOptions, serve

    if bool(pids) == bool(comm):
        raise click.UsageError("give --pid PID (one or more) or --comm NAME")
    if ringbuf_pages & (ringbuf_pages - 1):
        raise click.BadParameter(f"must be a power of two, got {ringbuf_pages}", param_hint="--ringbuf-pages")
    serve(ServeOptions(pids=tuple(dict.fromkeys(pids)), comm=comm, listen=listen, label=label,
                       ringbuf_pages=ringbuf_pages, hint_after_s=hint_after, duration_s=duration))
