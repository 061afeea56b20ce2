"""A container's first process, as a runtime starts one, with no container daemon (tests only).

    container_init.py docker ROOT WORK -- PROGRAM ARGS...   run by `unshare --mount --pid --net --fork`
    container_init.py chroot ROOT -- PROGRAM ARGS...        run as is: no namespace of its own

docker: as runc does, in the namespaces unshare made: ROOT as the lower layer of an overlay file
system (upper and work folders in WORK; Docker's overlay2 storage), /proc of the new PID namespace
in it, WORK/out bound at /out (the only folder the host reads back), the loopback interface up,
then pivot_root into it with the old root detached, and exec: PROGRAM is PID 1 of its namespace
and the host reaches its files only through /proc/PID/root. chroot: chroot(ROOT) and exec, a jail
with the host's mount namespace, so the host sees its files at their host paths. Either runs in
/app where ROOT has one (the official images' WORKDIR). Everything mounted here lives in the
namespace and goes with its last process.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import socket
import struct
import sys

MS_BIND, MS_REC = 0x1000, 0x4000
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

libc = ctypes.CDLL(None, use_errno=True)


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None), f"mount {target}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def docker(root: str, work: str) -> None:
    merged, upper, wdir, out = (os.path.join(work, d) for d in ("merged", "upper", "work", "out"))
    for d in (merged, upper, wdir):
        os.makedirs(d, exist_ok=True)
    mount("overlay", merged, "overlay", 0, f"lowerdir={root},upperdir={upper},workdir={wdir}")
    mount("proc", os.path.join(merged, "proc"), "proc")
    mount(out, os.path.join(merged, "out"), None, MS_BIND | MS_REC)
    loopback_up()
    os.chdir(merged)
    # pivot_root(".", "."): the old root is stacked on the new one, then detached (runc's way)
    check(libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount the old root")


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    mode, args, program = argv[1], argv[2:sep], argv[sep + 1:]
    if mode == "docker":
        docker(*args)
    elif mode == "chroot":
        os.chroot(args[0])
    else:
        raise SystemExit(f"container_init: unknown mode {mode}")
    # The official images' WORKDIR: where ggml looks for its backends after the executable's
    # folder, which a jail without /proc can't name (ggml reads it from /proc/self/exe)
    os.chdir("/app" if os.path.isdir("/app") else "/")
    sys.stderr.flush()
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
