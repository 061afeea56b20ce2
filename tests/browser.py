"""Drive a real headless Chromium over the DevTools protocol (a pipe): load a page, collect its
JavaScript errors and network requests, evaluate expressions, take a screenshot; decode PNGs.

No driver library: Chromium's `--remote-debugging-pipe` reads JSON commands from fd 3 and
writes replies and events to fd 4, each message ending in a NUL byte.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from ckptrace.dashboards.screenshot import FLAGS  # the README screenshot's flags: one list

CHROMIUM = os.environ.get("CKPTRACE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def chromium_available() -> bool:
    return Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is not None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process with one page. Use as a context manager."""

    def __init__(self, width: int = 1400, height: int = 3000, timeout_s: float = 30):
        self.timeout_s = timeout_s
        self._to_child = self._from_child = -1
        self.proc = None
        self.profile = tempfile.mkdtemp(prefix="ckptrace-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire():  # runs in the child: the protocol's fixed descriptors 3 and 4
            # Move both ends above 4 first: a pipe may already sit on 3 or 4.
            a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session = None
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
        except BaseException:
            self.close()
            raise

    @classmethod
    def start(cls, attempts: int = 3, **kw) -> "Browser":
        """A started Browser. Starting is what times out on a loaded machine (a cold Chromium on
        two busy cores), so a start that fails is retried; what the page does is never retried."""
        for attempt in range(1, attempts + 1):
            try:
                return cls(**kw)
            except (BrowserError, OSError):
                if attempt == attempts:
                    raise

    # -- protocol ---------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (rc {self.proc.poll()})")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, **params) -> dict:
        self._next_id += 1
        mid = self._next_id
        msg = {"id": mid, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == mid:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout_s: float | None = None) -> dict:
        for ev in self.events:
            if ev["method"] == method:
                return ev
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            ev = self._read_message(deadline)
            if "method" in ev:
                self.events.append(ev)
                if ev["method"] == method:
                    return ev

    # -- page -------------------------------------------------------------------------------
    def open(self, path: Path) -> None:
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"evaluate failed: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def wait_until(self, expression: str, timeout_s: float = 20) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return True
            time.sleep(0.1)
        return False

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries, so far."""
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        return [ev["params"]["request"]["url"] for ev in self.events if ev["method"] == "Network.requestWillBeSent"]

    def screenshot(self, png: Path, full_page: bool = False) -> Path:
        import base64
        r = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        Path(png).write_bytes(base64.b64decode(r["data"]))
        return Path(png)

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- PNG ------------------------------------------------------------------------------------------

def read_png(path: Path) -> np.ndarray:
    """Pixels (height, width, channels) of an 8-bit, non-interlaced greyscale/RGB/RGBA PNG."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace:
        raise ValueError(f"{path}: unsupported PNG (depth {depth}, colour type {colour}, interlace {interlace})")
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: a running sum per channel, mod 256
            cur = np.cumsum(line.reshape(width, channels), axis=0, dtype=np.uint8).reshape(stride)
        elif f == 2:  # Up
            cur = line + prev
        else:  # Average or Paeth depend on the decoded left byte: byte by byte
            cur = _unfilter_slow(f, line, prev, channels)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)


def _unfilter_slow(f: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    cur = bytearray(len(line))
    ln, up = line.tobytes(), prev.tobytes()
    for i in range(len(ln)):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3:
            cur[i] = (ln[i] + ((a + b) >> 1)) & 0xFF
        else:
            c = up[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (ln[i] + pred) & 0xFF
    return np.frombuffer(bytes(cur), dtype=np.uint8)


def distinct_colours(pixels: np.ndarray) -> int:
    flat = pixels.reshape(-1, pixels.shape[-1]).astype(np.uint32)
    key = np.zeros(len(flat), dtype=np.uint32)
    for c in range(min(flat.shape[1], 3)):
        key = (key << 8) | flat[:, c]
    return len(np.unique(key))
