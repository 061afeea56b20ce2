"""Screenshot a `ckptrace export --format chrome` file in Chromium's own DevTools Performance panel
(for docs/perfetto.md): `.venv/bin/python scripts/export_screenshot.py TRACE.json OUT.png
--from-ns T0 --to-ns T1`.

Not the Perfetto UI: that is a web app served from ui.perfetto.dev, which the project's test machine
can't reach and no package registry ships. DevTools is built into Chromium, reads the same Trace Event JSON,
and draws the slices as its flame chart (it does not draw generic counters). The page is driven
over the DevTools protocol with the test suite's driver (tests/browser.py); every wait is on a
condition, and the script fails if the trace's process and thread tracks are not there.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from browser import Browser  # noqa: E402  (the suite's Chromium driver)

APP = "devtools://devtools/bundled/trace_app.html"
TIMELINE = "./panels/timeline/timeline.js"
# Elements matching a selector, inside shadow roots too (DevTools builds its UI from them).
DEEP = ("function deep(root, sel, out = []) { root.querySelectorAll(sel).forEach(e => out.push(e));"
        " root.querySelectorAll('*').forEach(e => e.shadowRoot && deep(e.shadowRoot, sel, out)); return out; }")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="a ckptrace export --format chrome file")
    ap.add_argument("png", type=Path)
    ap.add_argument("--from-ns", type=int, required=True, help="left edge, CLOCK_MONOTONIC ns")
    ap.add_argument("--to-ns", type=int, required=True, help="right edge, CLOCK_MONOTONIC ns")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=300)
    a = ap.parse_args(argv)
    with Browser.start(width=a.width, height=900, timeout_s=60) as b:
        b.call("Page.navigate", url=APP)
        b.wait_event("Page.loadEventFired")
        # Until DevTools has started (its locale data, its views), showing a panel throws.
        if not b.wait_until("(async () => { try { const UI = await import('./ui/legacy/legacy.js');"
                            " await UI.ViewManager.ViewManager.instance().showView('timeline'); return true; }"
                            " catch (e) { return false; } })()", timeout_s=60):
            raise SystemExit("DevTools did not start")
        b.call("Runtime.evaluate", expression=f"window.__trace = {json.dumps(a.trace.read_text())}")
        b.evaluate(f"(async () => {{ const T = await import('{TIMELINE}');"
                   " await T.TimelinePanel.TimelinePanel.instance().loadFromFile("
                   f"new File([window.__trace], {json.dumps(a.trace.name)})); }})()")
        loaded = (f"(async () => {{ const T = await import('{TIMELINE}');"
                  " const p = T.TimelinePanel.TimelinePanel.instance(); return p.hasActiveTrace() &&"
                  " (p.getFlameChart().getMainFlameChart().timelineData()?.groups?.length || 0) > 0; })()")
        if not b.wait_until(loaded, timeout_s=60):
            raise SystemExit("DevTools did not load the trace")
        groups = b.evaluate(f"(async () => {{ const T = await import('{TIMELINE}');"
                            " const m = T.TimelinePanel.TimelinePanel.instance().getFlameChart().getMainFlameChart();"
                            " const g = m.timelineData().groups; g.forEach((_, i) => m.expandGroup(i));"
                            " return g.map(x => x.name); })()")
        doc = json.loads(a.trace.read_text())
        names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"].endswith("_name")}
        missing = [n for n in names if not any(g.startswith(n) for g in groups)]
        if missing:
            raise SystemExit(f"DevTools shows no track for {missing} (tracks: {groups})")
        base = doc["otherData"]["ts_base_ns"]  # the file's ts count from it
        lo, hi = (a.from_ns - base) / 1e6, (a.to_ns - base) / 1e6  # DevTools' window is in milliseconds
        b.evaluate("(async () => { const TB = await import('./services/trace_bounds/trace_bounds.js');"
                   " TB.TraceBounds.BoundsManager.instance().setTimelineVisibleWindow("
                   f"{{min: {lo * 1000}, max: {hi * 1000}, range: {(hi - lo) * 1000}}}); }})()")
        # DevTools opened without a page to inspect says so in a dialog: not part of the trace.
        b.wait_until(f"{DEEP} deep(document, '.glass-pane').length > 0", timeout_s=10)
        b.evaluate(f"(async () => {{ {DEEP} deep(document, '.glass-pane').forEach(e => e.remove());"
                   " deep(document, 'dialog').forEach(d => d.open && d.close());"
                   " deep(document, '.dimmed-pane').forEach(e => e.classList.remove('dimmed-pane'));"
                   " for (let i = 0; i < 3; i++) await new Promise(r => requestAnimationFrame(r)); })()")
        box = b.evaluate(f"(async () => {{ const T = await import('{TIMELINE}'); const r = T.TimelinePanel"
                         ".TimelinePanel.instance().getFlameChart().getMainFlameChart().canvasBoundingClientRect();"
                         " return [r.x, r.y, r.width]; })()")
        x, y, w = box
        shot = b.call("Page.captureScreenshot", format="png",
                      clip={"x": x, "y": y - 48, "width": w, "height": a.height, "scale": 1})
        a.png.write_bytes(base64.b64decode(shot["data"]))
        print(a.png)


if __name__ == "__main__":
    main()
