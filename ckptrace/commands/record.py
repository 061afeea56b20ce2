"""`ckptrace record`: trace a live process or a launched command into a trace file."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ckptrace.options import seconds
from ckptrace.core.terminal import printable

from ckptrace.probes.record_session import FAULT_SAMPLE_CHOICES


@click.command(
    # Options end at the command (or at --): its own options are its, and an unknown option
    # before it is refused, never taken for the command.
    context_settings={"allow_interspersed_args": False},
    epilog="""\b
Examples:
  # launch: probes are in place before the command's first instruction
  # (the sample workload: its path from `ckptrace workload`)
  ckptrace record -o off.parquet --label pool-off -- "$(ckptrace workload)" --pool off
  # attach to a running server for 60 s
  ckptrace record -p $(pidof llama-server) -o live.parquet --duration 60
  # two servers at once, each with its own label (PID=LABEL; a comma list works too)
  ckptrace record --pid 4242=east --pid 4343=west -o both.parquet
  # every running llama-server (waits for one if none runs yet)
  ckptrace record --comm llama-server -o fleet.parquet --duration 60
  # also the legacy per-fault service interval, on every fault (costs about 13%: docs/performance.md)
  ckptrace record --fault-sample 1 -o legacy.parquet -- "$(ckptrace workload)"
""",
)
@click.option("-p", "--pid", "pids", multiple=True, metavar="PID[=LABEL]",
              help="Attach to this running process; repeat it or give a comma list for several. "
                   "LABEL names the process in analyze and compare --per-process (default: its name "
                   "and rank, in the order given (by pid for --comm), e.g. llama-server#2).")
@click.option("--comm", metavar="NAME", help="Attach to every process with this name (its /proc/PID/comm) "
              "running when recording starts, or, while there is none, the first to appear. One started "
              "later is not added (serve --comm follows those).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              required=True, help="Trace file: an Arrow stream while recording (a killed recorder leaves it, cut "
                   "short), replaced by the finished Parquet trace at the end. A FIFO needs its reader first.")
@click.option("--label", default="", help="Name of this leg, e.g. pool-off (compare groups legs by it).")
@click.option("--duration", type=seconds(), default=None,
              help="Stop after this many seconds.")
@click.option("--fault-sample", type=click.Choice([str(n) for n in FAULT_SAMPLE_CHOICES]), default="0", show_default=True,
              help="Legacy: also time each page fault's service interval (a lower bound, about "
                   "half the whole cost) during 1 in N slices of 0.25 s (1 = always, about 13% "
                   "overhead on fault-bound code). fault_ns never needs it.")
@click.option("--ringbuf-pages", type=click.IntRange(min=1, max=1 << 18), default=512, show_default=True,
              help="Size of the BPF ring buffer in 4 KiB pages, a power of two (512 = 2 MiB). A full "
                   "buffer drops events and counts them as lost.")
@click.option("--max-threads", type=click.IntRange(min=1, max=1 << 20), default=8192, show_default=True,
              help="Threads of the target the kernel follows at once (an exited thread's entry is "
                   "freed). Events of threads past it are not seen and are counted (map full).")
@click.option("--hint-after", type=seconds(), default=30.0, show_default=True,
              help="Say why, if no checkpoint has been seen after this many seconds.")
@click.option("--rss-step", type=click.IntRange(min=0, max=1 << 20), default=1, show_default=True,
              metavar="MIB", help="Record the process's RSS as a row each time it moved by this "
              "many MiB, read from its counters when a checkpoint or an iteration returns and "
              "when a munmap starts; 0 = do not record RSS.")
@click.option("--rss-per-fault", is_flag=True,
              help="Take RSS from kmem:rss_stat instead: a row the moment it moves, at the cost of "
                   "a BPF program on every page fault of every process (about 16% of fault-bound "
                   "code on some hosts; docs/performance.md).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout at the end.")
@click.option("--quiet", is_flag=True, help="No live status line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def command(pids, comm, output, label, duration, fault_sample, ringbuf_pages, max_threads, hint_after, rss_step,
            rss_per_fault, as_json, quiet, command):
    """Record checkpoint, iteration, fault, mmap and RSS events of one or more processes.

    Give one of -p/--pid PID (repeatable), --comm NAME or -- COMMAND [ARGS...]. Each process keeps
    its pid, label, executable and build-id (trace metadata `processes`); every row has its pid.
    A process that exits ends its part; recording stops when all have exited, on Ctrl-C,
    SIGTERM or --duration, and always writes a complete trace; events reach the file at least
    twice a second, so a killed recorder leaves a cut-short one. A launched COMMAND that ends by
    itself gives record its exit status (128+N when signal N ended it, as a shell says it). Needs
    root.
    """
    if sum(map(bool, (pids, comm, command))) != 1:
        raise click.UsageError("give exactly one of --pid PID, --comm NAME or -- COMMAND [ARGS...]")
    from ckptrace.core.errors import CkptraceError
    from ckptrace.probes.record_session import RecordOptions, record
    from ckptrace.probes.stop import Interrupted, interruption

    opts = RecordOptions(output=output, label=label, duration_s=duration,
                         fault_sample=int(fault_sample), ringbuf_pages=ringbuf_pages, max_threads=max_threads,
                         status=not quiet, no_checkpoint_hint_s=hint_after, rss_step_mib=rss_step,
                         rss_per_fault=rss_per_fault)
    try:
        result = record(opts, pid=_pid_list(pids) if pids else None, command=list(command) if command else None,
                        comm=comm)
    except (Interrupted, Exception) as e:  # stopped while starting: one line, a shell's status for the signal
        stop = interruption(e)
        if stop is None:
            raise
        err = CkptraceError(str(stop))
        err.exit_code = stop.exit_code
        raise err from None
    if as_json:
        from ckptrace.renderers.json import versioned

        _summary(versioned({
            "trace": str(result.path), "events": result.events, "checkpoints": result.checkpoints,
            "iterations": result.iterations, "lost_events": result.lost_events,
            "stop_reason": result.stop_reason, "exit_code": result.exit_code,
            "processes": [{"pid": p.pid, "label": p.label, "exited_ns": p.exited_ns} for p in result.meta.processes],
        }), result.path)
    # The command's own status when it ended by itself, as strace and time give it (one record
    # stopped at --duration or on a signal to it exits 0: the recording is what was asked for).
    if command and result.stop_reason == "target exited" and result.exit_code:
        code = result.exit_code if result.exit_code > 0 else 128 - result.exit_code
        raise click.exceptions.Exit(min(code, 255))


def _summary(doc: dict, trace: Path) -> None:
    """The --json summary on stdout; if stdout fails, its one line says the trace is written."""
    from ckptrace.core.stdio import StdoutFailed

    try:
        click.echo(json.dumps(doc))
    except StdoutFailed as e:
        e.note = f"the trace {trace} is written"
        raise


def _pid_list(values: tuple[str, ...]) -> list[tuple[int, str | None]]:
    """--pid values (each PID, PID=LABEL or a comma list of them) as (pid, label or None)."""
    out = []
    for value in values:
        for item in value.split(","):
            text, _, label = item.strip().partition("=")
            if not (text.isascii() and text.isdigit()) or int(text) < 1 or int(text) > (1 << 22):
                raise click.BadParameter(f"{printable(item)!r} is not a PID (or PID=LABEL)", param_hint="--pid")
            out.append((int(text), label if _ else None))
    return out
