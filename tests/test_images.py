"""Every image in docs/ shows what the current code draws: scripts/make_images.py made it from
committed inputs and stamped it (docs/images.json); here each intermediate (the dashboard's
page, an export) is rendered again and must be the one the stamp names. No browser needed: the
browser only draws the intermediate."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_images():
    spec = importlib.util.spec_from_file_location("make_images", ROOT / "scripts" / "make_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_image_in_docs_is_stamped_and_matches_the_code_that_made_it():
    mi = make_images()
    stamps = json.loads(mi.STAMPS.read_text())
    images = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.png")}
    assert images == set(mi.IMAGES) == set(stamps), "an image without a recipe or a stamp: scripts/make_images.py"
    for image, s in stamps.items():
        assert set(s) >= {"inputs", "rendered", "ckptrace", "viewer", "made"}, image
        assert set(s["inputs"]) == set(mi.IMAGES[image]["inputs"]), image
    assert mi.stale(stamps) == [], "regenerate with: .venv/bin/python scripts/make_images.py"


def test_a_change_to_what_the_dashboard_draws_makes_its_stamp_stale(monkeypatch):
    """The check fails on code that draws another picture (here, another plotly template)."""
    from ckptrace.dashboards import figure

    mi = make_images()
    stamps = json.loads(mi.STAMPS.read_text())
    monkeypatch.setattr(figure, "TEMPLATE", "plotly_dark")
    assert mi.stale(stamps, ["docs/dashboard.png"]) == [
        "docs/dashboard.png: the code now renders a different dashboard file"]
    stamps["docs/export-devtools.png"]["inputs"]["samples/traces/1-pool-off.parquet"] = "0" * 64
    assert mi.stale(stamps, ["docs/export-devtools.png"]) == [
        "docs/export-devtools.png: its input changed (samples/traces/1-pool-off.parquet)"]
