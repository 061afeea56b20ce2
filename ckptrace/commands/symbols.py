"""`ckptrace symbols`: show where each probe point lives in a binary or a live process."""
from __future__ import annotations

import json

import click

from ckptrace.core.terminal import echo, printable


@click.command("symbols", epilog="""\b
Examples:
  ckptrace symbols ./build/bin/llama-server
  ckptrace symbols --pid $(pidof llama-server)
  ckptrace symbols --json "$(ckptrace workload)" | jq '.points[].object'
""")
@click.argument("binary", required=False)
@click.option("-p", "--pid", type=click.IntRange(min=1), help="Resolve in a running process (its /proc/PID/maps).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON for scripts.")
def command(binary, pid, as_json):
    """Resolve every probe point in BINARY (and the libraries it needs) or in process PID.

    Prints, per probe point, the object defining it, the file offset and virtual address a
    uprobe attaches at, and the object's build-id. A weak function defined in several objects
    (the vector growth behind resize()) is listed once per copy: the recorder probes them all.
    """
    if (binary is None) == (pid is None):
        raise click.UsageError("give exactly one of BINARY or --pid PID")
    from ckptrace.probes.symbols import resolve_binary, resolve_pid
    from ckptrace.probes.symbols_text import format_plan
    from ckptrace.probes.target import process_of

    if pid is not None:
        pid, note = process_of(pid)
        if note:
            click.echo(f"ckptrace: note: {note}", err=True)
    def note(text: str) -> None:  # an object left out (unreadable), as it is found
        click.echo(f"ckptrace: note: {printable(text)}", err=True)

    plan = resolve_pid(pid, note) if pid is not None else resolve_binary(binary, note)
    if as_json:
        from ckptrace.renderers.json import versioned

        click.echo(json.dumps(versioned(plan.to_dict()), indent=2))
    else:
        echo(format_plan(plan))  # object paths come from the target: made printable
