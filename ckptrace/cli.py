"""The `ckptrace` command: one group, a subcommand per job, errors printed once as one line."""
from __future__ import annotations

import errno
import importlib
import sys

import click

from ckptrace import __version__
from ckptrace.core import stdio, stopping
from ckptrace.core.errors import CkptraceError
from ckptrace.core.heap import keep_freed_memory
from ckptrace.core.terminal import printable

# name -> module under ckptrace.commands defining a click command called `command`.
# Imported lazily so `analyze` works on a machine without bcc.
COMMANDS = {
    "doctor": "Check that this machine can record: privileges, bpf(), tracefs, uprobes, bcc.",
    "symbols": "Resolve every probe point in a binary or a live process.",
    "record": "Record checkpoint, iteration, fault and mmap events into a trace file.",
    "analyze": "Per-checkpoint and per-iteration breakdown of one trace.",
    "compare": "Compare baseline and candidate legs (A/B/A) with drift-aware verdicts.",
    "dashboard": "Write a self-contained HTML report of one or more traces.",
    "demo": "Record the sample pool-off and pool-on in turn (A/B/A/B/A); analyze, compare, write a dashboard.",
    "drive": "Send a bounded load of distinct prompts to a llama-server and report TTFT.",
    "export": "Write traces as a timeline for Perfetto (protobuf) or Chrome (Trace Event JSON).",
    "serve": "Serve Prometheus metrics of running servers' checkpoints at /metrics.",
    "whatif": "Predict what a checkpoint-buffer pool would do from a pool-off recording.",
    "workload": "Print the sample workload's path (built first if needed), for record -- PATH.",
    "top": "Show running servers' checkpoints live: rate, fill/copy/fault p50/p99, held memory.",
}


# Commands that read traces and exit: glibc keeps their freed memory for reuse (core/heap.py).
READERS = {"analyze", "compare", "dashboard", "export", "whatif"}
# Commands that take the held stop signals over (core/stopping.py); the others get Python's
# defaults back before they run.
STOPPABLE = {"record"}


class Stopped(CkptraceError):
    """A stop signal came before the command ran: exit as a shell would say it (130, 143...)."""

    def __init__(self, signum: int):
        super().__init__(f"{stopping.STOPS.get(signum, 'stopped')} before the command started: nothing was done")
        self.exit_code = stopping.exit_code(signum)


def settle_signals(name: str | None) -> None:
    """A stop signal held while starting ends the command now; else the command gets the
    signals: record keeps them held (it takes them over), the others their defaults."""
    if stopping.pending() is not None:
        raise Stopped(stopping.pending())
    if name not in STOPPABLE:
        stopping.release()


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"ckptrace.commands.{name}")
        except ImportError as e:  # a broken install or a missing dependency: say which module
            missing = f"module {e.name!r} is missing" if e.name else str(e).splitlines()[0]
            raise CkptraceError(f"the {name} command could not be loaded: {missing}; "
                                "reinstall ckptrace with its dependencies") from None
        if name in READERS:
            keep_freed_memory()
        settle_signals(name)
        return module.command

    def format_commands(self, ctx, formatter):
        # Short help from the table above, without importing every command module.
        rows = [(n, COMMANDS[n]) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="""\b
Examples:
  ckptrace doctor
  ckptrace record -o off.parquet --label pool-off -- "$(ckptrace workload)" --pool off
  ckptrace record --pid $(pidof llama-server) -o live.parquet --duration 60
  ckptrace analyze off.parquet
  ckptrace compare off1.parquet on.parquet off2.parquet
  ckptrace dashboard off1.parquet on.parquet off2.parquet -o report.html
  ckptrace demo
""")
@click.version_option(__version__, prog_name="ckptrace")
def cli():
    """Trace where llama-server's prefill time goes when it saves context checkpoints.

    Data flows probes -> trace -> analyzers -> dashboards. Only `doctor`, `record`,
    `symbols --pid`, `serve`, `top` and `demo` need root and eBPF; the rest work on any machine
    with the trace files.
    """


def usage_line(e: click.ClickException) -> str:
    """Click's message as one printable line, naming the --help to read for a usage error."""
    line = printable(e.format_message())
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click.UsageError) and ctx is not None:
        line = f"{line.rstrip('.')}; see '{printable(ctx.command_path)} --help'"
    return line


def main(argv=None):
    stopping.hold()  # first: a Ctrl-C or SIGTERM from here on is never lost, nor a traceback
    stdio.guard()
    try:
        try:
            rc = cli.main(args=argv, prog_name="ckptrace", standalone_mode=False)
            stdio.finish()
        except CkptraceError as e:
            click.echo(f"ckptrace: error: {printable(e)}", err=True)
            rc = e.exit_code
        except click.exceptions.Abort:
            click.echo("ckptrace: interrupted", err=True)
            rc = 130
        except click.ClickException as e:
            click.echo(f"ckptrace: error: {usage_line(e)}", err=True)
            rc = e.exit_code
        except click.exceptions.Exit as e:
            stdio.finish()
            rc = e.exit_code
        except stdio.PipeClosed:  # an -o /dev/stdout or FIFO whose reader left
            rc = stdio.EXIT_PIPE
    except stdio.StdoutFailed as e:  # the command's result could not be written (stdio.py)
        if e.errno == errno.EPIPE:
            rc = stdio.EXIT_PIPE
        else:
            click.echo(f"ckptrace: error: cannot write to stdout ({printable(e)})"
                       + (f"; {printable(e.note)}" if e.note else ""), err=True)
            rc = 1
    stopping.release()
    if isinstance(rc, int) and rc:  # a command's ctx.exit(N) / click Exit(N) comes back as a return
        sys.exit(rc)
