"""Serve upstream llama.cpp's server from inside this Python process, through xllamacpp's extension module.

build.sh --version 11549 installs xllamacpp 2026.10.11549 (upstream llama.cpp build 11549 compiled into
the module; PyPI's prebuilt wheel, or with --from-source its sdist) into a venv and prints that venv's
python; run this script with it. The server's C++
(its HTTP threads, its task loop, the checkpoints) lives in the module's shared object inside this
process: `ckptrace record --pid` on this process traces it like a llama-server.

Takes the llama-server options ckptrace.samples.llama_server passes (same spelling): -m, --host,
--port, -np, -c, -b, -ub, -t, -lv, --cache-ram, --no-webui (no UI is compiled in), and
--slot-save-path. -lv 4 turns on the trace-level lines (`created context checkpoint ...`, which
moved to trace level in 11549): xllamacpp's CommonParams.verbosity is llama-server's -lv.
Serves until SIGINT or SIGTERM, then stops the server's loop and returns 0.

    VENV_PY=$(samples/llama-server/build.sh --version 11549)
    $VENV_PY samples/llama-server/python_server.py -m model.gguf --port 8080 -lv 4 2> server.log &
    ckptrace record --pid $! -o py.parquet
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="llama.cpp's server inside Python (xllamacpp), with "
                                             "llama-server's option names")
    ap.add_argument("-m", "--model", required=True, help="GGUF model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("-np", "--parallel", type=int, default=1, help="slots")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=-1)
    ap.add_argument("-lv", "--verbosity", type=int, default=3, help="4: trace (checkpoint lines)")
    ap.add_argument("--cache-ram", type=int, default=None, help="prompt cache MiB (0: off)")
    ap.add_argument("--slot-save-path", default=None, help="folder for /slots/ID?action=save|restore")
    ap.add_argument("--no-webui", action="store_true", help="accepted; no UI is compiled in")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import xllamacpp as xlc  # pyright: ignore[reportMissingImports] (only in build.sh's venv)
    except ImportError as e:
        sys.exit(f"python_server.py: {e}: run it with the python build.sh --version 11549 prints")
    p = xlc.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx_size
    p.n_batch = args.batch_size
    p.n_ubatch = args.ubatch_size
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.verbosity = args.verbosity
    if args.cache_ram is not None:
        p.cache_ram_mib = args.cache_ram
    if args.slot_save_path:
        p.slot_save_path = args.slot_save_path.rstrip("/") + "/"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = xlc.Server(p)  # returns once the model is loaded and the HTTP server listens
    print(f"python_server.py: serving {args.model} at {server.listening_address}", file=sys.stderr, flush=True)
    while not stop.wait(1.0):  # a timed wait: the handlers run between waits
        pass
    del server  # terminates the task loop and joins it
    return 0


if __name__ == "__main__":
    sys.exit(main())
