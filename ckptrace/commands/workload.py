"""`ckptrace workload`: the sample workload's path, built first if needed, for `record -- ...`."""
from __future__ import annotations

import click

from ckptrace.core.terminal import printable


@click.command(epilog="""\b
Examples:
  ckptrace workload                            # its path (built on first use)
  W=$(ckptrace workload)
  ckptrace record -o off.parquet --label pool-off -- "$W" --pool off
  ckptrace record -o on.parquet --label pool-on -- "$W" --pool on
  "$(ckptrace workload)" --help                # the workload's own options
  ckptrace workload --variant upstream         # the upstream llama.cpp generation's copy
""")
@click.option("--variant", type=click.Choice(["upstream", "inlined", "inlined-memset", "libcxx", "static"]),
              default=None, help="Another build of it: the upstream llama.cpp generation (restores, prompt "
                                 "saves, speculative checkpoints), its growth inlined, built with libc++, "
                                 "or linked statically.")
def command(variant: str | None) -> None:
    """Print the path of the sample workload (ckpt-workload), building it first if needed.

    The sample workload is a small C++ copy of llama-server's checkpoint path (the same function
    names, a buffer pool behind --pool on|off) that writes its own ground truth (--truth FILE).
    It is not installed on PATH: give its path to `record -- ...`, as the examples do. The build
    goes to a cache folder keyed by the sources' hash (CKPTRACE_CACHE, else ~/.cache/ckptrace).
    """
    from ckptrace.samples import build_dir, workload_binary

    if not (build_dir() / "ckpt-workload").is_file():
        click.echo("ckptrace: building the sample workload (make, g++: about 20 s)", err=True)
    click.echo(printable(str(workload_binary(variant=variant))))
