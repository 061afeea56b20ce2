"""The GPU check (issue 27): ckptrace's pageable fresh / resident copy-time ratio against a CUDA
program's own timers, on a machine with an NVIDIA GPU.

    python -m ckptrace.samples.gpu_check [--out DIR] [--mib 149] [--rounds 5]

1. builds samples/workload/gpucopy.cu (149 MiB device-to-host into fresh pageable, resident
   pageable and pinned memory, each copy timed by the program) with nvcc from PyPI's NVIDIA wheels,
   installed into DIR/cuda: nvidia-cuda-nvcc and nvidia-cuda-runtime (CUDA 13, which needs a driver of
   the 580 series or later) or, with --cuda 12, nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12,
   built with g++ (those nvcc wheels hold no nvcc binary, only the crt/ headers; the program is host
   code only, so g++ builds it the same). --wheels DIR installs from downloaded wheels (no network); --cuda-root DIR uses
   an installed toolkit's nvcc instead;
2. records it: `ckptrace record -o DIR/gpucopy.parquet -- gpucopy ...` (root);
3. prints each destination's copy time by both clocks and ckptrace's phases and destination class,
   and the fresh / resident ratio by both: PASS when ckptrace's is within 10% of the program's and
   each destination's class is the expected one, else FAIL (exit 1).

--stub runs the same steps against the stub CUDA libraries (samples/workload/cuda), on the CPU: the
check of this script itself, not of a GPU. Nothing here has run on a GPU yet (docs/limits.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

WORKLOAD = Path(__file__).resolve().parent / "workload"
SOURCE = WORKLOAD / "gpucopy.cu"
EXPECTED = {"fresh": "pageable_fresh", "resident": "pageable_resident", "pinned": "pinned"}
TOLERANCE = 0.10  # the issue's: ckptrace's ratio within 10% of the program's
# CUDA 12's nvcc wheel holds no nvcc binary, but the crt/ headers cuda_runtime.h includes.
WHEELS = {"13": ["nvidia-cuda-nvcc", "nvidia-cuda-runtime"], "12": ["nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12"]}


class CheckError(Exception):
    """A step that could not run: one line, exit 2."""


def _run(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        raise CheckError(f"{what} failed: {tail[0]}")
    return p


def driver_cuda() -> int | None:
    """The CUDA version the installed driver supports (cuDriverGetVersion: 12080 is 12.8), None
    without a driver."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None


def install_wheels(prefix: Path, cuda: str, wheels: Path | None) -> Path:
    """PyPI's NVIDIA wheels installed into `prefix`; the folder holding bin/, include/ and lib/."""
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", prefix, *source, *WHEELS[cuda]],
         f"pip install {' '.join(WHEELS[cuda])}")
    root = prefix / "nvidia" / ("cu13" if cuda == "13" else "cuda_runtime")
    if not (root / "include" / "cuda_runtime.h").is_file():
        raise CheckError(f"the wheels installed no CUDA headers under {root}")
    return root


def build(out: Path, cuda: str, wheels: Path | None, cuda_root: Path | None) -> Path:
    """gpucopy built against a real CUDA runtime (a shared libcudart, so its calls can be probed)."""
    exe = out / "gpucopy"
    if cuda_root:
        root, nvcc = cuda_root, cuda_root / "bin" / "nvcc"
    else:
        root = install_wheels(out / "cuda", cuda, wheels)
        nvcc = root / "bin" / "nvcc"
    lib = root / ("lib64" if (root / "lib64").is_dir() else "lib")
    runtime = sorted(lib.glob("libcudart.so*"))
    if not runtime:
        raise CheckError(f"no libcudart.so in {lib}")
    links = out / "link"  # the wheels have libcudart.so.N only; the linker wants libcudart.so
    links.mkdir(exist_ok=True)
    if not (links / "libcudart.so").exists():
        os.symlink(runtime[-1], links / "libcudart.so")
    rpath = ["-Xlinker", "-rpath", "-Xlinker", str(lib)]
    if nvcc.is_file():
        _run([nvcc, "-O2", "-cudart", "shared", "-o", exe, SOURCE, f"-L{links}", *rpath], "nvcc")
    else:  # CUDA 12 from PyPI: no nvcc; the program is host code, g++ builds it the same
        includes = [f"-I{d}" for d in (root / "include", root.parent / "cuda_nvcc" / "include") if d.is_dir()]
        _run(["g++", "-O2", "-x", "c++", SOURCE, "-x", "none", *includes, f"-L{links}", "-lcudart",
              f"-Wl,-rpath,{lib}", "-o", exe], "g++")
    return exe


def record(out: Path, exe: Path, mib: int, rounds: int, tensors: int, env: dict) -> tuple[Path, Path]:
    trace, timers = out / "gpucopy.parquet", out / "gpucopy.jsonl"
    _run([sys.executable, "-m", "ckptrace", "record", "--quiet", "-o", trace, "--", exe, "--mib", mib,
          "--rounds", rounds, "--tensors", tensors, "--json", timers], "ckptrace record",
         env={**os.environ, **env}, timeout=1800)
    return trace, timers


def compare(trace: Path, timers: Path) -> dict:
    """Each timed copy beside the copy span ckptrace recorded inside it; per destination, medians by
    both clocks; the fresh / resident ratios; the verdict."""
    from ckptrace.analyzers import analyze_file

    lines = [json.loads(line) for line in timers.read_text().splitlines() if line.strip()]
    device = next(x for x in lines if x["type"] == "device")
    prog = pd.DataFrame([x for x in lines if x["type"] == "copy"])
    spans = analyze_file(trace).gpu
    if spans is None or len(spans) != len(prog):
        raise CheckError(f"ckptrace recorded {0 if spans is None else len(spans)} CUDA copy spans, "
                         f"the program made {len(prog)} copies")
    prog = prog.sort_values("start_ns").reset_index(drop=True)
    spans = spans.sort_values("start_ns").reset_index(drop=True)
    inside = ((spans["tid"] == prog["tid"]) & (spans["start_ns"] >= prog["start_ns"])
              & (spans["end_ns"] <= prog["end_ns"]))
    if not inside.all():
        raise CheckError("a recorded copy span does not lie inside the program's timed copy")
    both = pd.concat([prog[["mode", "round", "warmup", "copy_ns"]].rename(columns={"copy_ns": "program_ns"}),
                      spans[["copy_ns", "enqueue_ns", "sync_ns", "host_ns", "dst", "dst_faults", "driver_faults"]]],
                     axis=1)
    both["dst"] = both["dst"].astype(str)
    kept = both[~both["warmup"]]
    modes = {}
    for mode in EXPECTED:
        m = kept[kept["mode"] == mode]
        modes[mode] = {"copies": len(m), "program_ms": m["program_ns"].median() / 1e6,
                       "ckptrace_ms": m["copy_ns"].median() / 1e6, "enqueue_ms": m["enqueue_ns"].median() / 1e6,
                       "wait_ms": m["sync_ns"].median() / 1e6, "host_ms": m["host_ns"].median() / 1e6,
                       "dst": sorted(set(m["dst"])), "dst_faults": int(m["dst_faults"].sum()),
                       "driver_faults": int(m["driver_faults"].sum())}
    ratio = {k: modes["fresh"][f"{k}_ms"] / modes["resident"][f"{k}_ms"] for k in ("program", "ckptrace")}
    off = ratio["ckptrace"] / ratio["program"] - 1
    classes = all(modes[m]["dst"] == [EXPECTED[m]] for m in EXPECTED)
    return {"device": device["name"], "mib": device["mib"], "rounds": device["rounds"], "modes": modes,
            "ratio": ratio, "off": off, "classes_ok": classes, "pass": classes and abs(off) <= TOLERANCE,
            "copies": both.to_dict("records")}


def report(r: dict) -> str:
    lines = [f"device: {r['device']}; {r['mib']} MiB device-to-host, {r['rounds']} rounds (after one warm-up)",
             f"{'destination':12} {'program ms':>10} {'ckptrace ms':>11} {'enqueue':>8} {'wait':>7} {'host':>6}  "
             f"{'class (ckptrace)':18} {'faults':>7} {'driver':>7}"]
    for mode, m in r["modes"].items():
        lines.append(f"{mode:12} {m['program_ms']:>10.2f} {m['ckptrace_ms']:>11.2f} {m['enqueue_ms']:>8.2f} "
                     f"{m['wait_ms']:>7.2f} {m['host_ms']:>6.2f}  {','.join(m['dst']):18} {m['dst_faults']:>7} "
                     f"{m['driver_faults']:>7}")
    lines.append(f"fresh / resident: program {r['ratio']['program']:.2f}x, ckptrace {r['ratio']['ckptrace']:.2f}x "
                 f"({r['off']:+.1%}; within {TOLERANCE:.0%} passes); classes "
                 + ("as expected" if r["classes_ok"] else "NOT as expected"))
    lines.append("PASS" if r["pass"] else "FAIL")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ckptrace.samples.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the build, trace and timers")
    ap.add_argument("--mib", type=int, default=149)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=1, help="copies (each then synchronized) per state copy")
    ap.add_argument("--cuda", choices=["auto", *sorted(WHEELS)], default="auto",
                    help="which PyPI CUDA wheels: auto takes 13 where the driver supports CUDA 13, else 12")
    ap.add_argument("--wheels", type=Path, help="install the wheels from this folder (no network)")
    ap.add_argument("--cuda-root", type=Path, help="an installed CUDA toolkit (its bin/nvcc) instead of wheels")
    ap.add_argument("--stub", action="store_true", help="against the stub CUDA libraries, on the CPU")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    a = ap.parse_args(argv)
    try:
        a.out.mkdir(parents=True, exist_ok=True)
        env = {}
        if a.stub:
            from ckptrace.samples import gpucopy_binary

            exe = gpucopy_binary()
        else:
            supported = driver_cuda()
            if supported is None:
                raise CheckError("no NVIDIA driver here (libcuda.so.1 cannot be loaded): --stub checks the "
                                 "script on the CPU")
            cuda = a.cuda if a.cuda != "auto" else "13" if supported >= 13000 else "12"
            exe = build(a.out, cuda, a.wheels, a.cuda_root)
        r = compare(*record(a.out, exe, a.mib, a.rounds, a.tensors, env))
    except (CheckError, OSError, subprocess.TimeoutExpired) as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r, default=str) if a.json else report(r))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
