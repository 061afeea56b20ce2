"""Compiled BPF objects kept between runs, so a recorder or `serve` starts without compiling.

An entry is the compiled object of one source for one kernel, one bcc and one set of -D flags:
its name is the SHA-256 of all of those (`key`), so a changed source, option, kernel, BTF, kernel
headers or bcc is a new entry, never a stale one. What can't be cached is never in it: map file
descriptors (the instructions say which map each load refers to, and the loader puts its own
descriptors there), and nothing of a process.

The files are root's, read and written as root, so nobody else may be able to write, swap or
plant one (docs/security.md):
- the folder (`/var/cache/ckptrace/bpf`, or $CKPTRACE_BPF_CACHE; "off" for none) is made mode
  0700 and used only when it is ours, mode 0700, not a symlink, and every folder above it belongs
  to root (or us) and is not writable by others unless sticky; otherwise one note says why and
  each run compiles;
- every access is relative to that folder's open descriptor, with O_NOFOLLOW; a new entry is
  written to a random name created O_EXCL, fsync'ed, then renamed into place, so a reader sees
  a whole entry or none;
- an entry read back must be a regular file of ours, under MAX_BYTES, start with MAGIC, and
  carry the SHA-256 of its content and its own key: anything else is ignored and replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import stat
from pathlib import Path

DEFAULT_DIR = "/var/cache/ckptrace/bpf"
ENV = "CKPTRACE_BPF_CACHE"
MAGIC = b"ckptrace-bpf-object 1\n"
SUFFIX = ".bpfobj"
MAX_BYTES = 32 << 20
MAX_ENTRIES = 32  # oldest removed past this (one per kernel x option set in use)
BTF = Path("/sys/kernel/btf/vmlinux")
FIELDS_CODE = Path(__file__).with_name("kernel.py")  # which BTF fields become -D flags (key)
BCC_ENV = ("BCC_KERNEL_SOURCE", "BCC_KERNEL_MODULES_SUFFIX", "BCC_LINUX_VERSION_CODE")


class Unusable(Exception):
    """The cache folder can't be trusted or made; str() says why."""


def folder() -> str | None:
    """The cache folder to use, None when turned off."""
    value = os.environ.get(ENV, DEFAULT_DIR)
    return None if value in ("", "off", "0", "none") else value


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def key(source: Path, cflags: list[str], headers: Path, bcc_version: str) -> str:
    """What the compiled object depends on, hashed: the source and every header beside it, the
    -D flags, the running kernel (release, build, BTF), its headers folder, bcc's version and
    the environment bcc reads. The kernel-derived offsets are not inputs: the BTF they come from
    is, and so is the code that chooses which fields to take from it (kernel.py: a field added
    there, with no change of the C source, must not find an object compiled without it)."""
    local = sorted(p for p in source.parent.iterdir() if p.suffix == ".h")
    try:
        fields = _digest(FIELDS_CODE)
    except OSError:  # an install without .py sources: keyed on the rest, as before kernel.py was
        fields = "none"
    try:
        btf = _digest(BTF)
    except OSError:
        btf = "none"
    real = Path(os.path.realpath(headers))
    try:
        headers_id = f"{real}:{(real / 'include').stat().st_mtime_ns}"
    except OSError:
        headers_id = str(real)
    doc = {"format": MAGIC.decode().strip(), "source": _digest(source, *local), "fields": fields, "cflags": list(cflags),
           "kernel": [platform.release(), platform.version(), platform.machine()], "btf": btf,
           "headers": headers_id, "bcc": bcc_version, "env": {k: os.environ.get(k) for k in BCC_ENV}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _trusted_ancestors(path: str) -> None:
    """Every folder above `path` (links resolved) belongs to root or us and is not writable by
    others unless sticky: no one else can rename or swap what lies below it."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    parts = Path(parent).parts
    for i in range(1, len(parts) + 1):
        d = os.path.join(*parts[:i])
        try:
            st = os.stat(d)
        except FileNotFoundError:
            return  # made below, by us
        if st.st_uid not in (0, os.geteuid()):
            raise Unusable(f"{d} belongs to uid {st.st_uid}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise Unusable(f"{d} is writable by others")


def open_folder(path: str) -> int:
    """An O_DIRECTORY descriptor of the cache folder, made (mode 0700) if missing; Unusable if it
    can't be trusted."""
    path = os.path.abspath(path)
    _trusted_ancestors(path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, mode=0o755, exist_ok=True)
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise Unusable(f"{parent}: {e.strerror}") from None
    name = os.path.basename(path)
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
        except FileExistsError:
            pass
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    except OSError as e:
        raise Unusable(f"{path}: {e.strerror}") from None
    finally:
        os.close(pfd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise Unusable(f"{path} is not a folder of uid {os.geteuid()} with mode 0700 "
                       f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return fd


def read(dfd: int, entry: str) -> bytes | None:
    """The payload of entry `entry` (its key), or None when there is none or it fails a check."""
    try:
        fd = os.open(entry + SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head = len(MAGIC)
    if not data.startswith(MAGIC) or data[head + 64:head + 65] != b"\n":
        return None
    digest, payload = data[head:head + 64].decode("ascii", "replace"), data[head + 65:]
    if hashlib.sha256(payload).hexdigest() != digest:
        return None
    first = payload[:100].split(b"\n", 1)[0]
    if first != entry.encode():  # the payload names its key: a renamed entry is not taken
        return None
    return payload[len(first) + 1:]


def write(dfd: int, entry: str, payload: bytes) -> None:
    """Store `payload` as entry `entry`, atomically; then drop the oldest entries past MAX_ENTRIES.
    OSError on failure (the caller goes on without the cache)."""
    body = entry.encode() + b"\n" + payload
    data = MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    tmp = f".{entry[:16]}-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, entry + SUFFIX, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    _prune(dfd)


def _prune(dfd: int) -> None:
    entries = []
    for name in os.listdir(dfd):
        if name.endswith(SUFFIX):
            try:
                entries.append((os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime_ns, name))
            except OSError:
                pass
    for _, name in sorted(entries)[:-MAX_ENTRIES]:
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass
