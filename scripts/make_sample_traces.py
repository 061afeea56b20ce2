"""Record the shipped sample traces (samples/traces/) again, in the current trace format.

    .venv/bin/python scripts/make_sample_traces.py              # all six, into samples/traces/
    .venv/bin/python scripts/make_sample_traces.py 5-upstream   # one
    .venv/bin/python scripts/make_sample_traces.py --out /tmp/s # elsewhere

Needs root (record loads BPF). Traces 1 to 5 record the sample workload (`ckptrace workload`),
each beside the workload's own truth file; 6 records one pool-off leg of a real llama-server
(llama-cpp-python 0.3.36's llama.cpp, built or reused from samples/llama-server/build.sh's cache)
driven by 12 requests from 3 clients, beside its request file. Afterwards regenerate the images
drawn from them: `.venv/bin/python scripts/make_images.py`.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CKPTRACE = Path(sys.executable).parent / "ckptrace"

# name -> (workload variant, label, the workload's arguments). 1-3: an A/B/A; 4: a third pool-off
# run for an A/A/A of separate recordings; 5: the upstream generation (restores, speculative
# state, prompt saves), the input of docs/perfetto-ui-upstream.png.
WORKLOAD = {
    "1-pool-off": (None, "pool-off", ["--pool", "off", "--iterations", "30"]),
    "2-pool-on": (None, "pool-on", ["--pool", "on", "--iterations", "30"]),
    "3-pool-off": (None, "pool-off", ["--pool", "off", "--iterations", "30"]),
    "4-pool-off": (None, "pool-off", ["--pool", "off", "--iterations", "30"]),
    "5-upstream": ("upstream", "up", ["--iterations", "9", "--slots", "2", "--restore-every", "1", "--spec",
                                      "--spec-state-kib", "512", "--prompt-save"]),
}
LLAMA = "6-llama-pool-off"
NAMES = [*WORKLOAD, LLAMA]


def workload(name: str, out: Path) -> None:
    variant, label, args = WORKLOAD[name]
    which = ["workload"] + (["--variant", variant] if variant else [])
    binary = subprocess.run([str(CKPTRACE), *which], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([str(CKPTRACE), "record", "--quiet", "-o", str(out / f"{name}.parquet"), "--label", label,
                    "--", binary, *args, "--truth", str(out / f"{name}.truth.jsonl")], check=True)


def llama(out: Path) -> None:
    from ckptrace.core.requests_file import requests_path
    from ckptrace.samples.llama_server import run_legs

    with tempfile.TemporaryDirectory(prefix="ckptrace-sample-") as tmp:
        (trace,) = run_legs(Path(tmp), legs=[("llama-pool-off", False)], clients=3, requests=12, timeout_s=2400,
                            say=lambda s: print(f"make_sample_traces: {s}", file=sys.stderr))
        shutil.copyfile(trace, out / f"{LLAMA}.parquet")
        shutil.copyfile(requests_path(trace), out / f"{LLAMA}.requests.json")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"which (default: all of {', '.join(NAMES)})")
    ap.add_argument("--out", type=Path, default=ROOT / "samples" / "traces")
    a = ap.parse_args(argv)
    unknown = [n for n in a.names if n not in NAMES]
    if unknown:
        ap.error(f"unknown trace {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.names or NAMES:
        print(f"make_sample_traces: {name}", file=sys.stderr)
        llama(a.out) if name == LLAMA else workload(name, a.out)


if __name__ == "__main__":
    main()
