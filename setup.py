"""Which packages and data files install, found rather than listed (everything else: pyproject.toml).

The repository's top-level package folders show the data flow (probes/, analyzers/, ...);
installed, each is a subpackage of ckptrace (probes/ -> ckptrace.probes). In a checkout,
ckptrace/probes and the others are links to those folders, so that static tools (pyright,
pylance, jedi) resolve `ckptrace.probes` from the source: they are not walked here. A folder with an
__init__.py is a package; every other file under it (C sources, traces, a script in a folder
that is not a package) is its data. A new folder or file needs no change here.
"""
from __future__ import annotations

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SKIP = {"__pycache__"}


def _is_package(folder: Path) -> bool:
    return (folder / "__init__.py").is_file()


def _walk(folder: Path, name: str, package_dir: dict, package_data: dict) -> None:
    package_dir[name] = folder.relative_to(ROOT).as_posix()
    data = []
    for path in sorted(folder.iterdir()):
        if path.name in SKIP or path.name.startswith(".") or path.is_symlink():
            continue
        if path.is_dir() and _is_package(path):
            _walk(path, f"{name}.{path.name}", package_dir, package_data)
        elif path.is_dir():
            data += [f.relative_to(folder).as_posix() for f in sorted(path.rglob("*"))
                     if f.is_file() and not SKIP & set(f.parts) and f.suffix != ".pyc"]
        elif path.suffix not in (".py", ".pyc"):
            data.append(path.name)
    if data:
        package_data[name] = data


def _layout() -> tuple[dict, dict]:
    package_dir: dict[str, str] = {}
    package_data: dict[str, list[str]] = {}
    _walk(ROOT / "ckptrace", "ckptrace", package_dir, package_data)
    for folder in sorted(ROOT.iterdir()):
        if folder.is_dir() and folder.name != "ckptrace" and _is_package(folder):
            _walk(folder, f"ckptrace.{folder.name}", package_dir, package_data)
    return package_dir, package_data


PACKAGE_DIR, PACKAGE_DATA = _layout()
setup(packages=list(PACKAGE_DIR), package_dir=PACKAGE_DIR, package_data=PACKAGE_DATA)
