"""Screenshot a dashboard with headless Chromium (for the README): `python -m ckptrace.dashboards.screenshot
REPORT.html OUT.png [--width 1400] [--height 2200]`."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ckptrace.core.errors import CkptraceError

# Root needs --no-sandbox; the rest keeps Chromium from reaching the network on its own.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio"]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise CkptraceError("no Chromium found: install it (Debian: apt-get install chromium) and retry")


def screenshot(report: Path, png: Path, width: int = 1400, height: int = 2200, timeout_s: float = 60) -> Path:
    """Render `report` in headless Chromium and write the top width x height pixels to `png`."""
    report, png = Path(report).resolve(), Path(png).resolve()
    if not report.is_file():
        raise CkptraceError(f"{report}: no such report; write one with `ckptrace dashboard ... -o {report.name}`")
    with tempfile.TemporaryDirectory(prefix="ckptrace-chromium-") as profile:
        # Virtual time lets plotly's scripts finish before the capture, without a fixed sleep.
        cmd = [find_chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               "--virtual-time-budget=10000", f"--screenshot={png}", report.as_uri()]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise CkptraceError(f"Chromium took over {timeout_s:.0f} s to render {report.name}") from None
    if p.returncode != 0 or not png.exists():
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise CkptraceError(f"Chromium could not screenshot {report.name} (exit {p.returncode}: {last})")
    return png


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ckptrace.dashboards.screenshot", description=__doc__)
    ap.add_argument("report", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=2200)
    a = ap.parse_args(argv)
    try:
        print(screenshot(a.report, a.png, a.width, a.height))
    except CkptraceError as e:
        print(f"ckptrace: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
