"""Writing an output file safely, as root, wherever the user points: the one helper every writer uses.

- A regular file (or a new name) is replaced atomically: the data goes to a new file with no
  name (O_TMPFILE in the folder's open descriptor), is fsync'ed, is linked to a random temp name
  created exclusively (linkat never follows or replaces a name), then renamed over the name. A
  reader never sees half a file, no existing inode is written into, so a hard link or a planted
  symlink at the name is never written through, and a writer killed while writing (SIGKILL, the
  OOM killer) leaves nothing: the file had no name, so the kernel frees it. Where the folder's
  filesystem has no O_TMPFILE, the temp file is named from the start (O_EXCL|O_NOFOLLOW) and a
  kill while writing leaves it.
- A FIFO, a terminal, /dev/null, /dev/zero, /dev/full and our own stdout/stderr (`-o /dev/stdout`,
  `/dev/fd/1`) are written into directly, never replaced: that is what a user pointing there means.
- Any other special file (a block device, /dev/mem, a socket) and a directory are refused.
- A symlink anywhere on the path is followed only when someone else can't have planted or swapped
  it: the link and its folder belong to us or root, and the folder is not writable by others
  unless sticky. Otherwise one line says so (Linux's fs.protected_symlinks only covers sticky
  world-writable folders).
- A trace a `ckptrace record` is streaming into is never replaced: the recorder holds an
  exclusive flock on it from before its name appears until it is replaced by the finished trace,
  and a second recorder given the same `-o` (by any path to the same file) refuses in one line,
  before it starts anything; so does any other output of ckptrace pointed at it. A trace no
  recorder holds (finished, or left by a killed one) is replaced like any other file. Only locks
  on files of ours or root's count: another user's lock on a file of theirs stops nothing.
- A new output's mode is 0666 less the umask, whatever file it replaces: a file planted at the
  name (setuid, group- or world-writable) lends it nothing.
Failures raise OutputError (one line, with errno), and nothing is left behind.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from ckptrace.core import stdio
from ckptrace.core.errors import CkptraceError
from ckptrace.core.terminal import printable

Writer = Callable[[BinaryIO], None]
MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup
# Character devices that discard or refuse data without side effects, and terminals.
_MEM_DEVICES = {(1, 3), (1, 5), (1, 7)}  # null, zero, full
_TTY_MAJORS = set(range(136, 144)) | {4}  # pts, tty
_OUR_FD = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)/fd|dev/fd)/(\d+)$")


class OutputError(CkptraceError):
    """An output file could not be written; `errno` says why (ENOSPC: look elsewhere)."""

    def __init__(self, message: str, err: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.errno = err
        self.reason = reason or message


def write_output(path: str | os.PathLike, write: Writer, *, what: str = "output",
                 own: tuple[int, int] | None = None) -> Path:
    """Write `path` with `write(fileobj)` following the rules above; returns the path written.
    `own`: (st_dev, st_ino) of the stream a recorder is replacing with its finished trace (its
    own lock on it is no reason to refuse)."""
    target, folder_id = _resolve(os.fspath(path), what)
    if isinstance(target, int):
        _write_direct(os.dup(target), path, write, what)
        return Path(path)
    st = _lstat(target, path, what)
    if st is not None and (st.st_dev, st.st_ino) != own:
        _not_recording(target, st, path, what, fcntl.LOCK_SH)
    if st is None or stat.S_ISREG(st.st_mode):
        _replace(target, folder_id, write, path, what)
    elif _writable_in_place(st):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as e:
            raise _error(path, what, e) from None
        _write_direct(fd, path, write, what)
    elif stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{printable(path)}: is a directory; give a file name for the {what}",
                          errno.EISDIR)
    else:
        raise _refused(path, st, what)
    return Path(path)


def _lstat(target: str, path, what: str) -> os.stat_result | None:
    """The name itself (a link not followed); None if nothing is there."""
    try:
        return os.stat(target, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _error(path, what, e) from None


def _refused(path, st: os.stat_result, what: str) -> OutputError:
    return OutputError(f"{printable(path)}: is a {_kind(st.st_mode)}; ckptrace replaces regular files and "
                       f"writes into FIFOs, terminals and /dev/null only: choose a file path for the {what}")


def check_output(path: str | os.PathLike, *, what: str = "output") -> None:
    """Say now, in one line, if write_output(path) would be refused (before hours of recording)."""
    target, _ = _resolve(os.fspath(path), what)
    if isinstance(target, int):
        return
    try:
        st = os.stat(target, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    _not_recording(target, st, path, what, fcntl.LOCK_SH)
    if st is None or stat.S_ISREG(st.st_mode):
        folder = os.path.dirname(target)
        if not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
            raise OutputError(f"cannot write the {what} into {printable(folder)}: permission denied; "
                              "choose another path", errno.EACCES)
    elif stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{printable(path)}: is a directory; give a file name for the {what}", errno.EISDIR)
    elif not _writable_in_place(st):
        raise _refused(path, st, what)


def not_an_input(path: str | os.PathLike, inputs, *, what: str = "output", option: str = "-o path") -> None:
    """Refuse to write over a file the command reads (a trace, a request file): that would lose it."""
    for source in inputs:
        try:
            same = os.path.samefile(path, source)
        except OSError:  # either does not exist (yet): not the same file
            continue
        if same:
            raise OutputError(f"{printable(path)}: is one of the files this command reads; "
                              f"choose another {option} for the {what}", errno.EEXIST)


def output_folder(path: str | os.PathLike, *, what: str = "output") -> Path:
    """A folder several files will be written into, also by other programs (a server's log, the
    workload's truth): created if missing, and refused unless it belongs to us or root and no one
    else can write in it, so nothing can be planted there between our writes. Missing parents are
    created the same way, each checked (as `mkdir -p`)."""
    shown = os.fspath(path)
    try:
        real, _ = _resolve(os.path.join(shown, "."), what)
    except OutputError as e:
        if e.errno != errno.ENOENT:
            raise
        parent = os.path.dirname(os.path.normpath(shown))
        if parent and parent != os.path.normpath(shown):
            output_folder(parent, what=what)
        real, _ = _resolve(os.path.normpath(shown), what)  # the folder itself, not there yet
    if isinstance(real, int):
        raise OutputError(f"{printable(path)}: not a folder", errno.ENOTDIR)
    try:
        os.makedirs(real, mode=0o755, exist_ok=True)
        st = os.stat(real, follow_symlinks=False)
    except OSError as e:
        raise _error(path, what, e) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{printable(path)}: not a folder", errno.ENOTDIR)
    whose = None if st.st_uid in (os.geteuid(), 0) else f"of uid {st.st_uid}"
    if whose or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OutputError(f"{printable(path)}: a folder {whose or 'others can write to'}; give a folder "
                          f"of your own for the {what}", errno.EPERM)
    return Path(real)


def write_new(folder: str | os.PathLike, prefix: str, suffix: str, write: Writer, *,
              what: str = "output") -> Path:
    """Write a new file with an unpredictable name in `folder` (a rescue copy); returns its path."""
    real, _ = _resolve(os.path.join(os.fspath(folder), "."), what)
    if isinstance(real, int):
        raise OutputError(f"{printable(folder)}: not a folder", errno.ENOTDIR)
    dfd = _open_folder(real, _identity(real), folder, what)
    try:
        name = _write_temp(dfd, write, folder, what, prefix, suffix, _default_mode())
    finally:
        os.close(dfd)
    return Path(real) / name


def _open_folder(folder: str, identity: tuple[int, int], shown, what: str) -> int:
    """The folder's descriptor, checked to be the very folder resolved (not swapped meanwhile)."""
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _error(shown, what, e) from None
    st = os.fstat(dfd)
    if (st.st_dev, st.st_ino) != identity:
        os.close(dfd)
        raise OutputError(f"{printable(shown)}: its folder changed while being checked; refusing to write "
                          f"the {what}", errno.EAGAIN)
    return dfd


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _replace(real: str, folder_id, write: Writer, shown, what: str) -> None:
    folder, name = os.path.split(real)
    dfd = _open_folder(folder, folder_id, shown, what)
    try:
        tmp = _write_temp(dfd, write, shown, what, _temp_prefix(name), ".tmp", _default_mode())
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # renameat never follows `name`
        except OSError as e:
            os.unlink(tmp, dir_fd=dfd)
            raise _error(shown, what, e) from None
    finally:
        os.close(dfd)


def create_in_place(path: str | os.PathLike, head: bytes, *, what: str = "output") -> int | None:
    """A new regular file starting with `head` put at `path` now, by the rules above (a regular file
    there is replaced by a rename, nothing is written through a link), and its descriptor for appending,
    which holds the file's exclusive flock from before its name appears: the mark of a recording in
    progress. None where `path` is written into directly (a FIFO, a terminal, /dev/null, our stdout):
    those can't hold a file that grows and is replaced at the end.

    Race-free between recorders: the file being replaced is held locked (exclusively) until the
    rename, and where nothing was there the name is made by link(), which fails if another
    recorder made it meanwhile. Either way the second one refuses."""
    target, folder_id = _resolve(os.fspath(path), what)
    if isinstance(target, int):
        return None
    st = _lstat(target, path, what)
    if st is not None and not stat.S_ISREG(st.st_mode):
        if _writable_in_place(st):
            return None
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{printable(path)}: is a directory; give a file name for the {what}",
                              errno.EISDIR)
        raise _refused(path, st, what)
    folder, name = os.path.split(target)
    held = _not_recording(target, st, path, what, fcntl.LOCK_EX, keep=True)
    dfd = _open_folder(folder, folder_id, path, what)
    try:
        fd, tmp = _new_file(dfd, path, what, _temp_prefix(name), ".tmp")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else can hold it
            view = memoryview(head)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, _default_mode())  # never the replaced file's mode: its owner chose it
            tmp = _named(fd, tmp, dfd, path, what, _temp_prefix(name), ".tmp")
            if st is None:  # link() never replaces: a file made there meanwhile is not lost
                try:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                except FileExistsError:
                    raise OutputError(f"{printable(path)}: a file appeared there while the {what} was being "
                                      "created (another `ckptrace record` given the same -o?); give another "
                                      "path", errno.EEXIST) from None
                os.unlink(tmp, dir_fd=dfd)
            else:
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            tmp = None
        except BaseException as e:
            os.close(fd)
            if tmp is not None:
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(e, OSError):
                raise _error(path, what, e) from None
            raise
    finally:
        os.close(dfd)
        if held is not None:
            os.close(held)
    return fd


def _not_recording(target: str, st: os.stat_result | None, shown, what: str, how: int,
                   keep: bool = False) -> int | None:
    """Refuse (OutputError, EBUSY) when the regular file at `target` (`st`, its lstat) is held by a
    `ckptrace record` streaming into it: a flock `how` can't be had. Files of other users don't
    count. keep: return the descriptor holding the lock (closing it releases it), else None."""
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
        return None
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None  # gone or replaced meanwhile: nothing held to keep
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = _lock_holder(now)
        raise OutputError(f"{printable(shown)}: another `ckptrace record`{f' (pid {pid})' if pid else ''} is "
                          f"writing its trace there now; give another path for the {what}", errno.EBUSY) from None
    except OSError:
        pass
    if keep:
        return fd
    os.close(fd)
    return None


def _lock_holder(st: os.stat_result) -> int | None:
    """The pid /proc/locks names for an exclusive flock on this file (None: not found)."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == dev:
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def _temp_prefix(name: str) -> str:
    """A temp name's start beside `name`: the name cut to 200 bytes, so the temp name (18 bytes
    more) stays a legal name even when `name` is NAME_MAX (255) bytes long."""
    return "." + os.fsdecode(os.fsencode(name)[:200]) + "."


def _new_file(dfd: int, shown, what: str, prefix: str, suffix: str) -> tuple[int, str | None]:
    """A new file in the folder, open for writing: (fd, None) with no name yet (O_TMPFILE), or,
    where the filesystem can't make one, (fd, its temp name)."""
    if os.path.isdir("/proc/self/fd"):  # naming it later takes /proc
        try:
            return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dfd), None
        except OSError:
            pass  # tmpfs, ext4, xfs and btrfs have O_TMPFILE; other filesystems may not
    return _create_temp(dfd, shown, what, prefix, suffix)


def _named(fd: int, name: str | None, dfd: int, shown, what: str, prefix: str, suffix: str) -> str:
    """The file's temp name in the folder: the one it has, or a new random one linked to the
    unnamed file (linkat through /proc/self/fd: O_TMPFILE's documented way to give it a name)."""
    if name is not None:
        return name
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
            return name
        except FileExistsError:
            continue
        except OSError as e:
            raise _error(shown, what, e) from None
    raise OutputError(f"{printable(shown)}: could not create a temp file beside it", errno.EEXIST)


def _create_temp(dfd: int, shown, what: str, prefix: str, suffix: str) -> tuple[int, str]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(name, flags, 0o600, dir_fd=dfd), name
        except FileExistsError:
            continue
        except OSError as e:
            raise _error(shown, what, e) from None
    raise OutputError(f"{printable(shown)}: could not create a temp file beside it", errno.EEXIST)


def _write_temp(dfd: int, write: Writer, shown, what: str, prefix: str, suffix: str, mode: int) -> str:
    """Write a new file in the folder and return its temp name (prefix, random, suffix); it has no
    name while it is written (see the module's note), so a kill meanwhile leaves nothing."""
    fd, name = _new_file(dfd, shown, what, prefix, suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # ENOSPC/EIO surface here, before the name points at it
            os.fchmod(f.fileno(), mode)
            name = _named(f.fileno(), name, dfd, shown, what, prefix, suffix)
    except BaseException as e:
        if name is not None:
            os.unlink(name, dir_fd=dfd)
        if isinstance(e, OSError):
            raise _error(shown, what, e) from None
        raise
    return name


def _write_direct(fd: int, shown, write: Writer, what: str) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
    except BrokenPipeError:
        raise stdio.PipeClosed(printable(shown)) from None  # the reader left (`| head`): exit 141, as a filter
    except OSError as e:
        raise _error(shown, what, e) from None


def _writable_in_place(st: os.stat_result) -> bool:
    if stat.S_ISFIFO(st.st_mode):
        return True
    if stat.S_ISCHR(st.st_mode):
        dev = (os.major(st.st_rdev), os.minor(st.st_rdev))
        return dev in _MEM_DEVICES or dev[0] in _TTY_MAJORS or dev in {(5, 0), (5, 1)}
    return False


def _resolve(path: str, what: str) -> tuple[str | int, tuple[int, int] | None]:
    """The real path of `path`, following only trustworthy symlinks (an int for our own fd),
    and the identity of the folder it is in."""
    if not path:
        raise OutputError(f"empty path for the {what}")
    if "\0" in path:
        raise OutputError(f"{printable(path)}: not a file name (it holds a NUL byte); choose a path for the {what}",
                          errno.EINVAL)
    todo = [p for p in path.split("/") if p][::-1]
    current = "/" if path.startswith("/") else os.getcwd()
    current_id = _identity(current)
    links = 0
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            current_id = _identity(current)
            continue
        candidate = os.path.join(current, part)
        m = _OUR_FD.match(candidate)
        if m and not todo and _is_ours(candidate):
            if stdio.closed(int(m.group(1))):  # it holds /dev/null now: the output would vanish
                raise OutputError(f"{printable(path)}: fd {m.group(1)} was closed when ckptrace started; "
                                  f"give a file path for the {what}", errno.EBADF)
            return int(m.group(1)), None
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if todo:
                raise OutputError(f"{printable(candidate)}: no such directory; create it or choose another "
                                  f"path for the {what}", errno.ENOENT) from None
            return candidate, current_id
        except OSError as e:
            raise _error(path, what, e) from None
        if not stat.S_ISLNK(st.st_mode):
            if not todo:
                return candidate, current_id
            if not stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{printable(candidate)}: not a directory", errno.ENOTDIR)
            current, current_id = candidate, (st.st_dev, st.st_ino)
            continue
        links += 1
        if links > MAX_LINKS:
            raise OutputError(f"{printable(path)}: too many symbolic links", errno.ELOOP)
        _check_link(candidate, st, current, what)
        target = os.readlink(candidate)
        if target.startswith("/"):
            current = "/"
        todo.extend([p for p in target.split("/") if p][::-1])
    return current, _identity(os.path.dirname(current))


def _is_ours(candidate: str) -> bool:
    """/proc/PID/fd/N names our fd only for our own PID (self and thread-self are ours)."""
    parts = candidate.split("/")
    return parts[1] == "dev" or parts[2] in ("self", "thread-self", str(os.getpid()))


def _check_link(link: str, st: os.stat_result, folder: str, what: str) -> None:
    me = os.geteuid()
    dst = os.stat(folder)
    safe_folder = dst.st_uid in (me, 0) and (not dst.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                                             or dst.st_mode & stat.S_ISVTX)
    if st.st_uid in (me, 0) and safe_folder:
        return
    if dst.st_uid not in (me, 0):
        where = f"in a folder of uid {dst.st_uid}"
    elif not safe_folder:
        where = "in a folder others can write to"
    else:
        where = f"owned by uid {st.st_uid}"
    raise OutputError(f"{printable(link)}: a symlink {where}, which someone else could have planted or "
                      f"swapped; refusing to write the {what} through it: give the real path", errno.EPERM)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISBLK, "block device"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _default_mode() -> int:
    """0666 less the umask, as open(..., 'w') would create (read without changing it)."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(ln.split()[1], 8) for ln in f if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = 0o022
    return 0o666 & ~umask


def _error(path, what: str, e: OSError) -> OutputError:
    reason = e.strerror or type(e).__name__
    hint = "; free some space or choose another path" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return OutputError(f"cannot write the {what} {printable(path)}: {reason}{hint}", e.errno, reason)
