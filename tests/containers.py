"""Container roots and containers for the tests, with no container daemon: a root laid out as
llama.cpp's official images lay theirs out (the program at /app/NAME, its own libraries beside it in
/app, the system's at their own paths; WORKDIR /app), built from a program and what `ldd` says it
loads, plus the ggml backends a GGML_BACKEND_DL build dlopens from its folder (libggml-*.so: not in
ldd's list) and what they load, and started by tests/container_init.py as a Docker-style container
(unshare + overlay + pivot_root) or a chroot jail."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from helpers import wait_until

INIT = Path(__file__).with_name("container_init.py")
SHAPES = ("docker", "chroot")
_LDD = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")


def _put(src: Path, dst: Path) -> None:
    """A hard link where the file system allows (a model file is large), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    src = src.resolve()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def backends(program: Path) -> list[Path]:
    """The ggml backends beside `program` that a GGML_BACKEND_DL build dlopens at start."""
    return sorted(Path(program).resolve().parent.glob("libggml-*.so"))


def app_root(root: Path, program: Path, name: str | None = None, files: dict[str, Path] | None = None) -> Path:
    """`root` made a container root: /app/NAME (`program`), the libraries beside it in /app, every
    other library and the loader at its own path, empty /proc, /out, /tmp; `files`: more files,
    by their path inside. Returns root."""
    program = Path(program).resolve()
    for d in ("app", "proc", "out", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    _put(program, root / "app" / (name or program.name))
    for obj in (program, *backends(program)):
        if obj != program:  # the images copy every built .so into /app
            shutil.copy2(obj, root / "app" / obj.name)
        listed = subprocess.run(["ldd", str(obj)], capture_output=True, text=True, check=True).stdout
        for line in listed.splitlines():
            m = _LDD.match(line)
            if not m:
                continue
            lib = Path(m.group(1))
            inside = Path("app", lib.name) if lib.resolve().parent == program.parent else lib.relative_to("/")
            (root / inside).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), root / inside)  # a copy: the name ldd gives may be a link
    for inside, src in (files or {}).items():
        _put(src, root / inside.lstrip("/"))
    return root


@dataclass
class Container:
    shape: str
    proc: subprocess.Popen  # unshare (docker) or the program itself (chroot)
    pid: int  # the program's PID as the host sees it
    out: Path  # the host's side of the container's /out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@contextlib.contextmanager
def container(shape: str, root: Path, work: Path, argv: list, ready: str | None = None,
              **popen) -> Iterator[Container]:
    """`argv` run in a container of `shape` on `root` (work: the docker shape's overlay folders
    and /out); with `ready`, its first stderr line must start with it (`popen`: Popen's keywords,
    stderr a pipe unless given). On the way out the program
    is killed if it still runs (which ends its PID namespace and, with its last process, its mount
    namespace and every mount made in it) and reaped."""
    argv = [str(a) for a in argv]
    if shape == "docker":
        out = work / "out"
        out.mkdir(parents=True, exist_ok=True)
        cmd = ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child", "--propagation", "private",
               sys.executable, str(INIT), "docker", str(root), str(work), "--", *argv]
    elif shape == "chroot":
        out = root / "out"
        cmd = [sys.executable, str(INIT), "chroot", str(root), "--", *argv]
        # a jail has no /proc, where ld.so reads the program's folder to expand RUNPATH's $ORIGIN
        popen["env"] = {**popen.get("env", os.environ), "LD_LIBRARY_PATH": "/app"}
    else:
        raise ValueError(shape)
    proc = subprocess.Popen(cmd, text=True, **{"stderr": subprocess.PIPE, **popen})
    pid = proc.pid
    try:
        if shape == "docker":
            pid = wait_until(lambda: (_children(proc.pid) or [None])[0], "the container's first process",
                             watch=[proc])
        if ready is not None:
            line = proc.stderr.readline()
            assert line.startswith(ready), f"{line!r} (expected {ready!r}...): {proc.stderr.read()}"
        yield Container(shape, proc, pid, out)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        if proc.stderr is not None:
            proc.stderr.close()
