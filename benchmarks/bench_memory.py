"""Peak memory of the commands that read a whole trace, against its length.

    .venv/bin/python benchmarks/bench_memory.py                     # 1M, 3M and 10M events
    .venv/bin/python benchmarks/bench_memory.py --events 1e6 3e6 1e7 --cap-mib 6144
    .venv/bin/python benchmarks/bench_memory.py --commands export-chrome --events 2e5
    .venv/bin/python benchmarks/bench_memory.py --trace sample --events 2e5   # the recorded sample repeated
    git archive main | tar -x -C /tmp/before && \
    .venv/bin/python benchmarks/bench_memory.py --before /tmp/before --commands export-perfetto export-chrome whatif

The trace (`--trace synthetic`, the default) is bench_analyzer's synthetic recording (one thread:
a prefill iteration with checkpoint, fill, copy, mmap, munmap and decode, then three decode
iterations; 1 in 10 checkpoints a pool hit without fill), given a pid and the addresses of its
checkpoint buffers (64 of them in turn, each munmapped whole: what whatif replays), written as
`record` writes a trace. Its jitter keeps it about 30x its file when decoded (157 bytes a row;
the reader's bound counts twice that, 59x at 10M events, against 256x), which the repeated sample
(`--trace sample`, bench_export.repeated_trace) passes above about 950,000 events.

Each command runs as the CLI, alone, in a fresh parent whose RUSAGE_CHILDREN peak RSS is that
command's: `analyze --json`, `export` (perfetto and chrome) and `whatif`. Its output goes to a
file (export) or /dev/null. A command whose resident memory passes `--cap-mib` is killed (the
machine is shared) and reported as over the cap. Reported per command and length: peak RSS in
MiB, bytes of peak per event, the CPU seconds it took (user + system) and the load average when
it ended; the figures to quote are the bytes per event and how they change from one length to the
next (flat: memory grows with the trace at that rate; falling: a fixed part dominates).

`--before DIR`: also run each command with the ckptrace of the source tree DIR (another commit's
files, e.g. `git archive main`; its modules come first on PYTHONPATH, this venv's packages
serve both) on the same trace, just before this tree's, and end with a table of both.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CKPTRACE = Path(sys.executable).with_name("ckptrace")
SAMPLE_EVENTS = 229  # rows of the sample trace (samples/traces/1-pool-off.parquet)
PID = 4242
BUFFERS = 64  # checkpoint buffer addresses the synthetic trace cycles through
COMMANDS = {
    "analyze": lambda t, out: ["analyze", t, "--json"],
    "export-perfetto": lambda t, out: ["export", t, "-o", out / "x.perfetto-trace"],
    "export-chrome": lambda t, out: ["export", t, "-o", out / "x.json"],
    "whatif": lambda t, out: ["whatif", t, "--cap-bytes", "4GiB"],  # the sample predates host_memory_bytes
}
# The command in a child; its resident memory polled, killed past the cap (KiB, 0: none).
_PEAK = """\
import os, resource, signal, subprocess, sys, time
cap = int(sys.argv[1])
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)
over = False
while p.poll() is None:
    try:
        with open(f"/proc/{p.pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    except (OSError, StopIteration):
        rss = 0
    if cap and rss > cap:
        over = True
        p.send_signal(signal.SIGKILL)
        p.wait()
        break
    time.sleep(0.05)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(u.ru_maxrss, u.ru_utime + u.ru_stime, int(over), file=sys.stderr)
sys.exit(p.returncode)
"""


def synthetic_trace(path: Path, n: int) -> int:
    """bench_analyzer's synthetic events with a pid and buffer addresses, written as record writes them."""
    import numpy as np

    from bench_analyzer import synthetic_events
    from ckptrace.core.meta import TraceMeta
    from ckptrace.core.trace import write_trace

    ev = synthetic_events(n)
    ev["pid"] = np.int32(PID)
    kind = ev["kind"].astype(str).to_numpy()
    buf = np.isin(kind, ["mmap", "munmap", "fill", "copy"])
    slot = ev["ckpt"].to_numpy("int64") % BUFFERS
    ev["addr"] = np.where(buf, (0x7f0000000000 + slot * (64 << 20)).astype("uint64"), 0).astype("uint64")
    meta = TraceMeta(label="bench", pid=PID, fault_sample_every=8, stop_ns=int(ev["end_ns"].max()))
    write_trace(path, ev, meta)
    return len(ev)


def make_trace(kind: str, path: Path, want: float) -> int:
    """The trace in a child process (building 10M events takes GBs this process should not keep)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import bench_memory as b, "
            "bench_export as e; p, k, n = Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]); "
            "print(b.synthetic_trace(p, round(n)) if k == 'synthetic' else e.repeated_trace(p, "
            "max(1, round(n / b.SAMPLE_EVENTS))))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(path), kind,
                          str(want)], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def peak(args: list, cap_kib: int, src: Path | None = None) -> tuple[int, float, int, bool, str]:
    """(peak RSS in KiB, CPU seconds, exit status, over the cap, the command's last stderr line) of
    `ckptrace ARGS` (`src`: the ckptrace of that source tree)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", _PEAK, str(cap_kib), str(CKPTRACE), *map(str, args)],
                       capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    kib, cpu, over = lines[-1].split()
    return int(kib), float(cpu), r.returncode, over == "1", (lines[-2] if len(lines) > 1 else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=float, nargs="+", default=[1e6, 3e6, 1e7],
                    help="trace lengths (default 1e6 3e6 1e7)")
    ap.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    ap.add_argument("--trace", choices=["synthetic", "sample"], default="synthetic",
                    help="synthetic: bench_analyzer's events (default); sample: the recorded sample repeated")
    ap.add_argument("--cap-mib", type=int, default=6144, help="kill a command past this RSS (default 6144; 0: none)")
    ap.add_argument("--dir", type=Path, default=None, help="where the traces go (default: a temp folder)")
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="also run the ckptrace of this source tree (e.g. `git archive main`), then print a table")
    a = ap.parse_args(argv)
    versions = [("before", a.before.resolve()), ("after", None)] if a.before else [("", None)]
    table: dict[tuple[str, int], dict[str, int | None]] = {}
    with tempfile.TemporaryDirectory(prefix="ckptrace-bench-memory-", dir=a.dir) as tmp:
        out = Path(tmp)
        for want in a.events:
            path = out / f"t{int(want)}.parquet"
            n = make_trace(a.trace, path, want)
            print(json.dumps({"trace": a.trace, "events": n, "file_mib": round(path.stat().st_size / (1 << 20), 1)}),
                  flush=True)
            for name in a.commands:
                for version, src in versions:
                    kib, cpu, rc, over, last = peak(COMMANDS[name](path, out), a.cap_mib << 10, src)
                    row = {"command": name, **({"version": version} if version else {}), "events": n,
                           "peak_mib": round(kib / 1024), "bytes_per_event": round((kib << 10) / n),
                           "cpu_s": round(cpu, 1), "exit": rc, "loadavg_1m": round(os.getloadavg()[0], 1)}
                    if over:
                        row["over_cap_mib"] = a.cap_mib
                    elif rc:
                        row["error"] = last
                    print(json.dumps(row), flush=True)
                    table.setdefault((name, n), {})[version] = None if over or rc else round(kib / 1024)
            for f in out.iterdir():
                f.unlink()
    print(json.dumps({"maxrss_of_this_process_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}))
    if a.before:
        print(_table(table, a.cap_mib))


def _table(table: dict, cap_mib: int) -> str:
    """Markdown: peak RSS in MiB (and bytes per event) before and after, per command and length."""
    cell = lambda mib, n: f"over {cap_mib}" if mib is None else f"{mib} ({(mib << 20) // n} B/event)"  # noqa: E731
    lines = ["| command | events | before: peak MiB | after: peak MiB |", "|---|---:|---:|---:|"]
    for (name, n), v in table.items():
        lines.append(f"| {name} | {n:,} | {cell(v.get('before'), n)} | {cell(v.get('after'), n)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
