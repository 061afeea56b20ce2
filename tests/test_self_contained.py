"""The repository cites nothing outside itself: no machine's absolute paths, no missing docs."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Built from parts so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"/" + "work/", r"(?<![\w>])/" + "root/", "FIND" + "INGS", r"\.\./" + "shared"]))
DOC = re.compile(r"\bdocs/[\w.-]+\.md\b")


def tracked_text() -> dict[str, str]:
    ls = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True)
    if ls.returncode:
        pytest.skip("not a git checkout")
    out = {}
    for name in ls.stdout.splitlines():
        data = (REPO / name).read_bytes() if (REPO / name).is_file() else b""
        if b"\0" not in data:  # text only: recorded traces hold the paths of the run they recorded
            out[name] = data.decode("utf-8", "replace")
    return out


def test_no_file_cites_a_path_outside_the_repository():
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
            for name, text in tracked_text().items() for m in OUTSIDE.finditer(text)]
    assert hits == []


def test_every_cited_doc_exists():
    missing = {f"{name}: {m.group()}" for name, text in tracked_text().items()
               for m in DOC.finditer(text) if not (REPO / m.group()).is_file()}
    assert missing == set()
