"""Start a command held before its first instruction, so probes can be attached first."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time

from ckptrace.core.errors import TargetError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec: get `sig` when the process that forked us dies, even by SIGKILL.

    SIGKILL by default: a SIGTERM would be lost on a child that inherited SIGTERM as ignored
    (`nohup`, some service managers), and the command would outlive its recorder."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def stop(proc, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> int | None:
    """Stop a process we started (a subprocess.Popen or a HeldChild): `sig`, then SIGKILL if it
    still runs after `grace_s` seconds. Returns its exit code."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.poll()


class HeldChild:
    """fork() now, exec() on release(): the pid is known (and stays the same across exec) before
    the program runs, so the probes filter on it and miss nothing."""

    def __init__(self, argv: list[str]):
        if not argv:
            raise TargetError("no command given after --")
        path = shutil.which(argv[0])
        if path is None:
            raise TargetError(f"command not found: {argv[0]}")
        self.argv = argv
        self.path = os.path.realpath(path)
        self.exit_code: int | None = None
        r, w = os.pipe()
        recorder = os.getpid()
        pid = os.fork()
        if pid == 0:  # child: wait for the go byte, then become the command
            os.close(w)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            try:
                die_with_parent()  # if the recorder dies (even SIGKILL), its command goes with it
                go = os.read(r, 1)
                if go != b"g" or os.getppid() != recorder:
                    os._exit(125)  # the recorder gave up (or died) before starting us
                os.close(r)
                os.execv(path, argv)
            except BaseException:
                os._exit(127)
        os.close(r)
        self.pid = pid
        self._go = w

    def release(self) -> None:
        os.write(self._go, b"g")
        os.close(self._go)
        self._go = -1

    def abandon(self) -> None:
        """The recorder failed before release(): the child exits without running the command."""
        if self._go >= 0:
            os.close(self._go)
            self._go = -1
        self.wait()

    def poll(self) -> int | None:
        if self.exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    def wait(self, timeout_s: float | None = None) -> int:
        """As Popen.wait: the exit code, or subprocess.TimeoutExpired after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.argv, timeout_s)
            time.sleep(0.02)
        return self.exit_code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self, grace_s: float = 5.0) -> int | None:
        return stop(self, signal.SIGTERM, grace_s)
