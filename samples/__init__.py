"""The sample workload: builds and finds ckpt-workload, a small copy of llama-server's checkpoint path.

Tests, benchmarks and demos trace it because it writes its own ground truth (clock and fault counts
around the resize and the copy of every checkpoint). The C++ sources ship as package data beside
this module; the build goes to a cache folder keyed by their hash, never into the package.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from ckptrace.core.errors import CkptraceError

SAMPLE_DIR = pathlib.Path(__file__).resolve().parent
WORKLOAD_DIR = SAMPLE_DIR / "workload"

_SOURCE_SUFFIXES = {".cpp", ".h", ".c", ".cu"}
CUDA_STUB_DIR = WORKLOAD_DIR / "cuda"  # the stub CUDA libraries' sources (the CUDA build)


def _sources() -> list[pathlib.Path]:
    files = [p for d in (WORKLOAD_DIR, CUDA_STUB_DIR) if d.is_dir() for p in d.iterdir()
             if p.suffix in _SOURCE_SUFFIXES or p.name == "Makefile"]
    if not any(p.name == "Makefile" for p in files):
        raise CkptraceError(f"the sample workload's sources are missing from {WORKLOAD_DIR}: reinstall ckptrace")
    return sorted(files)


def _cache_root() -> pathlib.Path:
    if os.environ.get("CKPTRACE_CACHE"):
        return pathlib.Path(os.environ["CKPTRACE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "ckptrace"


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in _sources():
        h.update(str(p.relative_to(WORKLOAD_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build_dir() -> pathlib.Path:
    """The folder the current sources build into (it may not exist yet)."""
    return _cache_root() / f"workload-{_source_hash()}"


VARIANTS = ("static", "upstream", "inlined", "inlined-memset", "libcxx", "cuda", "cuda-dl")  # see the Makefile
# A variant in a folder of its own: cuda-dl's backend library lies beside it, as in llama.cpp's images
SUBDIRS = {"cuda-dl": "backend-dl"}


def workload_binary(static: bool = False, variant: str | None = None) -> pathlib.Path:
    """Path of ckpt-workload (or ckpt-workload-static, or ckpt-workload-VARIANT), built first if needed."""
    variant = "static" if static else variant
    name = f"ckpt-workload-{variant}" if variant else "ckpt-workload"
    out = build_dir()
    if not (out / "ckpt-workload").is_file():
        _build(out)
    if variant == "libcxx" and not (out / name).is_file():
        _build_one(out, name)  # clang++ and libc++ installed after the rest was built
    if variant in SUBDIRS:
        out = out / SUBDIRS[variant]
    if not (out / name).is_file():
        why = " (it needs clang++ and libc++: apt-get install clang libc++-dev libc++abi-dev)" \
            if variant == "libcxx" else ""
        raise CkptraceError(f"the sample build has no {name}{why}")
    return out / name


def gpucopy_binary() -> pathlib.Path:
    """Path of gpucopy (the GPU check's program) built against the stub CUDA libraries."""
    workload_binary()
    return build_dir() / "gpucopy"


def _build_one(out: pathlib.Path, name: str) -> None:
    """Build one more executable aside and move it into an existing build folder (no error: the
    caller says what is missing)."""
    with tempfile.TemporaryDirectory(prefix=name + ".tmp-", dir=out.parent) as tmp:
        proc = subprocess.run(["make", "-C", str(WORKLOAD_DIR), f"BUILD={tmp}", f"{tmp}/{name}"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(pathlib.Path(tmp) / name, out / name)


def _build(out: pathlib.Path) -> None:
    cxx = os.environ.get("CXX", "g++")
    missing = [tool for tool in ("make", cxx) if shutil.which(tool) is None]
    if missing:
        raise CkptraceError(
            f"building the sample workload needs {' and '.join(missing)}: apt-get install g++ make"
        )
    # Build aside and rename into place, so a concurrent build or an interrupted one never
    # leaves a half-built folder under the final name.
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    except OSError as e:
        raise CkptraceError(
            f"cannot write the sample build under {out.parent} ({e.strerror}): set CKPTRACE_CACHE to a writable folder"
        ) from None
    try:
        proc = subprocess.run(
            ["make", "-C", str(WORKLOAD_DIR), f"BUILD={tmp}", "all"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else f"make exited with {proc.returncode}"
            raise CkptraceError(
                f"building the sample workload failed ({last}); run make -C {WORKLOAD_DIR} to see the whole log"
            )
        if out.is_dir() and not (out / "ckpt-workload").is_file():
            shutil.rmtree(out, ignore_errors=True)  # a damaged earlier build
        try:
            tmp.rename(out)
        except OSError as e:
            if not (out / "ckpt-workload").is_file():  # not another build winning the race
                raise CkptraceError(
                    f"cannot move the sample build to {out} ({e.strerror}): set CKPTRACE_CACHE to a writable folder"
                ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
