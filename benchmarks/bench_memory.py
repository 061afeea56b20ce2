"""Peak memory of the commands that read a whole trace, against its length.

    .venv/bin/python benchmarks/bench_memory.py                     # 1M and 3M events
    .venv/bin/python benchmarks/bench_memory.py --events 1e6 3e6 1e7
    .venv/bin/python benchmarks/bench_memory.py --commands export-chrome --events 2e5

Each trace is the committed sample `1-pool-off` repeated end to end by the trace writer
(bench_export.repeated_trace: ids renumbered, so the mix of kinds and arguments is a real
recording's). Each command runs as the CLI, alone, in a fresh parent whose RUSAGE_CHILDREN
peak RSS is that command's: `analyze --json`, `export` (perfetto and chrome) and `whatif`. Its
output goes to a file (export) or /dev/null. Reported per command and length: peak RSS in MiB,
bytes of peak per event, and the CPU seconds it took (user + system); the figures to quote are
the bytes per event and how they change from one length to the next (flat: memory grows with
the trace at that rate; falling: a fixed part dominates).

The repeated sample is very regular: from about 950,000 events it would expand past 256x its
file and every command refuses it (the reader's memory bound, docs/trace-format.md), so lengths
above that need a less regular synthetic trace.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_export import repeated_trace  # noqa: E402

CKPTRACE = Path(sys.executable).with_name("ckptrace")
SAMPLE_EVENTS = 202  # rows of the sample trace
COMMANDS = {
    "analyze": lambda t, out: ["analyze", t, "--json"],
    "export-perfetto": lambda t, out: ["export", t, "-o", out / "x.perfetto-trace"],
    "export-chrome": lambda t, out: ["export", t, "-o", out / "x.json"],
    "whatif": lambda t, out: ["whatif", t, "--cap-bytes", "4GiB"],  # the sample predates host_memory_bytes
}
_PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
         "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
         "print(u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(p.returncode)")


def peak(args: list) -> tuple[int, float, int, str]:
    """(peak RSS in KiB, CPU seconds, exit status, the command's last stderr line) of `ckptrace ARGS`."""
    r = subprocess.run([sys.executable, "-c", _PEAK, str(CKPTRACE), *map(str, args)], capture_output=True,
                       text=True)
    lines = r.stderr.strip().splitlines()
    kib, cpu = lines[-1].split()
    return int(kib), float(cpu), r.returncode, (lines[-2] if len(lines) > 1 else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=float, nargs="+", default=[1e6, 3e6], help="trace lengths (default 1e6 3e6)")
    ap.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    ap.add_argument("--dir", type=Path, default=None, help="where the traces go (default: a temp folder)")
    a = ap.parse_args(argv)
    report = []
    with tempfile.TemporaryDirectory(prefix="ckptrace-bench-memory-", dir=a.dir) as tmp:
        out = Path(tmp)
        for want in a.events:
            path = out / f"t{int(want)}.parquet"
            n = repeated_trace(path, max(1, round(want / SAMPLE_EVENTS)))
            for name in a.commands:
                kib, cpu, rc, last = peak(COMMANDS[name](path, out))
                row = {"command": name, "events": n, "peak_mib": round(kib / 1024), "bytes_per_event":
                       round((kib << 10) / n), "cpu_s": round(cpu, 1), "exit": rc}
                if rc:
                    row["error"] = last
                report.append(row)
                print(json.dumps(row), flush=True)
            path.unlink()
            for f in out.iterdir():
                f.unlink()
    print(json.dumps({"maxrss_of_this_process_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}))


if __name__ == "__main__":
    main()
