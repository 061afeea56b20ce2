"""Static tools see what runs: from a checkout, pyright resolves every import, `ckptrace.*` included.

The top-level folders (probes/, analyzers/, ...) are the project's layout and, installed, the
subpackages ckptrace.probes, ckptrace.analyzers, ...; in a checkout ckptrace/probes and the others
are links to them (setup.py does not walk the links), so pyright, pylance and jedi resolve
`ckptrace.probes` from the source as Python does. pyproject.toml's [tool.pyright] checks imports
only (the project is not type-checked). Without the links, every `ckptrace.<folder>` import of
the tree was unresolved (docs/architecture.md, "Packaging").
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = sorted(p.parent.name for p in REPO.glob("*/__init__.py") if p.parent.name != "ckptrace")


def test_each_package_folder_has_its_link_under_ckptrace():
    for name in FOLDERS:
        link = REPO / "ckptrace" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve(), name


def test_pyright_resolves_every_import():
    pyright = pytest.importorskip("pyright")  # a test dependency, with node from PyPI ([nodejs])
    p = subprocess.run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.stdout, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["summary"]["filesAnalyzed"] > 100, (pyright, doc["summary"])
    unresolved = [f"{Path(d['file']).relative_to(REPO)}:{d['range']['start']['line'] + 1}: {d['message']}"
                  for d in doc["generalDiagnostics"]
                  if d.get("rule") in ("reportMissingImports", "reportMissingModuleSource")
                  or "is unknown import symbol" in d["message"]]
    assert unresolved == []


PACKAGE_FOLDERS = ["ckptrace", *FOLDERS]


def private_imports() -> list[str]:
    """Every `from M import _name` in the package code naming a private (underscore) name of
    another ckptrace module: its owner may change it without looking further."""
    import ast

    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if (REPO / folder).is_symlink() or any(p.is_symlink() for p in path.relative_to(REPO).parents
                                                    if p != Path(".")):
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ckptrace")):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name} from "
                                         f"{'.' * node.level}{node.module or ''}")
    return found


def test_no_private_name_crosses_a_module():
    assert private_imports() == []
