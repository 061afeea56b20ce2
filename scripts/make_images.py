"""Regenerate every image in docs/ from the current code, and stamp each with what made it.

    .venv/bin/python scripts/make_images.py                   # every image
    .venv/bin/python scripts/make_images.py docs/dashboard.png
    .venv/bin/python scripts/make_images.py --check           # which stamps no longer match (no browser)

Each image is drawn from committed inputs (the sample traces under samples/traces/) in two
steps: ckptrace renders an intermediate file (the dashboard's HTML, or an export for Perfetto or
DevTools), then a browser draws it (headless Chromium; the Perfetto UI through
scripts/export_screenshot.py). docs/images.json records, per image, the inputs' SHA-256, the
intermediate's SHA-256, the ckptrace version and the viewer. tests/test_images.py renders every
intermediate again with the code as it is and fails when one differs from its stamp: the
picture no longer shows what the code would draw, so it is regenerated with this script.
Needs Chromium; the Perfetto UI images also npm (scripts/export_screenshot.py fetches the UI).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMPS = ROOT / "docs" / "images.json"
TRACES = "samples/traces"
ABA = [f"{TRACES}/1-pool-off.parquet", f"{TRACES}/2-pool-on.parquet", f"{TRACES}/3-pool-off.parquet"]
UPSTREAM = [f"{TRACES}/5-upstream.parquet"]
LLAMA = [f"{TRACES}/6-llama-pool-off.parquet", f"{TRACES}/6-llama-pool-off.requests.json"]

# image -> how it is made: the inputs (paths from the repository root), the intermediate ckptrace
# renders ("dashboard", "perfetto" or "chrome" export) and how the viewer frames it.
IMAGES: dict[str, dict] = {
    "docs/dashboard.png": {"inputs": ABA, "render": "dashboard", "height": 2200,
                           "title": "sample workload, pool off / on / off (samples/traces)"},
    "docs/perfetto-ui.png": {"inputs": ABA, "render": "perfetto", "window": "two prefills"},
    "docs/perfetto-ui-upstream.png": {"inputs": UPSTREAM, "render": "perfetto", "window": "restore"},
    "docs/export-devtools.png": {"inputs": ABA[:1], "render": "chrome", "height": 230, "window": "two prefills"},
    "docs/export-devtools-llama.png": {"inputs": LLAMA, "render": "chrome", "height": 330, "window": "checkpoints"},
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def render(image: str) -> bytes:
    """The intermediate file of `image`, as the current code renders it from its inputs."""
    from ckptrace.analyzers import analyze_file, analyze_trace
    from ckptrace.core.trace import read_trace

    spec = IMAGES[image]
    traces = [p for p in spec["inputs"] if p.endswith(".parquet")]
    requests = [p for p in spec["inputs"] if p.endswith(".requests.json")]
    with tempfile.TemporaryDirectory(prefix="ckptrace-images-") as tmp:
        out = Path(tmp) / "out"
        if spec["render"] == "dashboard":
            from ckptrace.analyzers.compare import compare
            from ckptrace.dashboards.report import write_dashboard

            analyses = [analyze_file(ROOT / p) for p in traces]
            for a, p in zip(analyses, traces):
                a.trace.path = p  # shown as given: the repository's relative path
            write_dashboard(analyses, compare(analyses), out, spec["title"])
        else:
            from ckptrace.core.requests_file import read_requests
            from ckptrace.analyzers.requests import request_table
            from ckptrace.core.output import write_output
            from ckptrace.renderers.timeline import build_timeline

            analyses = [analyze_trace(read_trace(ROOT / p)) for p in traces]
            tables = None
            if requests:
                tables = [request_table(read_requests(ROOT / r), a) for a, r in zip(analyses, requests)]
            timeline = build_timeline(analyses, [Path(p).name for p in traces], tables)
            if spec["render"] == "perfetto":
                from ckptrace.renderers.perfetto import perfetto_writer
                write_output(out, perfetto_writer(timeline), what="timeline")
            else:
                from ckptrace.renderers.chrome import chrome_writer
                write_output(out, chrome_writer(timeline), what="timeline")
        return out.read_bytes()


def window(image: str) -> tuple[int, int]:
    """The span of CLOCK_MONOTONIC ns the viewer shows."""
    from ckptrace.analyzers import analyze_file
    from ckptrace.analyzers.warmup import prefill_rows, split

    spec = IMAGES[image]
    if isinstance(spec["window"], tuple):
        return spec["window"]
    a = analyze_file(ROOT / spec["inputs"][0])
    if spec["window"] == "two prefills":  # the first leg's first two prefill iterations, a 2% margin
        pre = prefill_rows(a.iterations).sort_values("start_ns")
        lo, hi = int(pre["start_ns"].iloc[0]), int(pre["end_ns"].iloc[1])
        pad = (hi - lo) // 50
        return lo - pad, hi + pad
    if spec["window"] == "restore":  # the second prefill's first restore: 6 ms before it, 135 ms on
        start = int(a.restores["start_ns"].iloc[0]) - 6_000_000
        return start, start + 135_000_000
    # "checkpoints": the median prefill iteration making two checkpoints after the warm-up, its checkpoints framed
    pre = prefill_rows(a.iterations).loc[split(a).warm_iterations]
    two = pre.loc[(pre["checkpoints"] >= 2).to_numpy()].sort_values("span_ns")
    it = two.iloc[(len(two) - 1) // 2]
    ck = a.checkpoints.loc[(a.checkpoints["iter"] == it["iter"]).to_numpy()]
    lo, hi = int(ck["start_ns"].min()), int(ck["end_ns"].max())
    pad = (hi - lo) // 5
    return lo - pad, hi + pad


def viewer(image: str) -> str:
    kind = IMAGES[image]["render"]
    if kind == "perfetto":
        from export_screenshot import PERFETTO_UI
        return f"Perfetto UI {PERFETTO_UI} in {chromium_version()}"
    return f"{chromium_version()}{' DevTools' if kind == 'chrome' else ''}"


def chromium_version() -> str:
    from ckptrace.dashboards.screenshot import find_chromium

    return subprocess.run([find_chromium(), "--version"], capture_output=True, text=True).stdout.strip()


def make(image: str, perfetto_cache: Path) -> dict:
    spec = IMAGES[image]
    data = render(image)
    png = ROOT / image
    with tempfile.TemporaryDirectory(prefix="ckptrace-images-") as tmp:
        src = Path(tmp) / {"dashboard": "report.html", "perfetto": "t.perfetto-trace", "chrome": "t.json"}[spec["render"]]
        src.write_bytes(data)
        if spec["render"] == "dashboard":
            from ckptrace.dashboards.screenshot import screenshot
            screenshot(src, png, height=spec["height"])
        else:
            import export_screenshot
            lo, hi = window(image)
            args = [str(src), str(png), "--from-ns", str(lo), "--to-ns", str(hi)]
            if spec["render"] == "perfetto":
                args += ["--perfetto-ui", str(perfetto_cache)]
            else:
                args += ["--height", str(spec["height"])]
            export_screenshot.main(args)
    from ckptrace import __version__
    return {"inputs": {p: sha256((ROOT / p).read_bytes()) for p in spec["inputs"]},
            "rendered": sha256(data), "ckptrace": __version__, "viewer": viewer(image),
            "made": dt.date.today().isoformat()}


def stale(stamps: dict, images=None) -> list[str]:
    """Images (default: all) whose stamp no longer matches: an input changed, or the code renders
    another file."""
    out = []
    for image in images or IMAGES:
        s = stamps.get(image)
        if s is None:
            out.append(f"{image}: no stamp")
            continue
        changed = [p for p in IMAGES[image]["inputs"] if s["inputs"].get(p) != sha256((ROOT / p).read_bytes())]
        if changed:
            out.append(f"{image}: its input changed ({', '.join(changed)})")
        elif s["rendered"] != sha256(render(image)):
            out.append(f"{image}: the code now renders a different {IMAGES[image]['render']} file")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", nargs="*", help=f"which (default: all of {', '.join(IMAGES)})")
    ap.add_argument("--check", action="store_true", help="only say which stamps no longer match (exit 1 if any)")
    ap.add_argument("--perfetto-cache", type=Path, default=Path.home() / ".cache" / "perfetto-ui",
                    help="where the Perfetto UI package is kept (outside the repository)")
    a = ap.parse_args(argv)
    stamps = json.loads(STAMPS.read_text()) if STAMPS.exists() else {}
    if a.check:
        bad = stale(stamps)
        print("\n".join(bad) or "every image matches the code that made it")
        sys.exit(1 if bad else 0)
    unknown = [x for x in a.images if x not in IMAGES]
    if unknown:
        ap.error(f"unknown image {', '.join(unknown)}; choose from {', '.join(IMAGES)}")
    for image in a.images or IMAGES:
        print(f"make_images: {image}", file=sys.stderr)
        stamps[image] = make(image, a.perfetto_cache)
        STAMPS.write_text(json.dumps(dict(sorted(stamps.items())), indent=1) + "\n")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # export_screenshot, beside this script

if __name__ == "__main__":
    main()
