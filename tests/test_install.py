"""ckptrace installed as a user would install it: from a built wheel, and with `pip install .`.

Each install goes into a fresh virtual environment (Debian's python with its site-packages, so
bcc is visible); the dependencies come from this test's own environment through a .pth line, so
nothing is downloaded. Every command then runs from another folder, so what runs is the installed
package, never the checkout. The source is copied first: building never writes into the checkout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ckptrace.cli import COMMANDS
from helpers import assert_one_line_error, ckptrace

REPO = Path(__file__).resolve().parent.parent
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", "ckptrace-demo", "out")
LEGS = ["1-pool-off", "2-pool-on", "3-pool-off"]


def run(argv, cwd, check=True, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    p = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=600, **kw)
    if check:
        assert p.returncode == 0, f"{argv}: {p.stderr[-2000:]}"
    return p


def pip(*args, cwd):
    return run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """(sdist, wheel) built from a copy of the source tree."""
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    out = tmp / "out"
    run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(out)!r})"], cwd=src)
    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, src, cwd=tmp)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


def fresh_venv(where: Path) -> Path:
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip", where], cwd=where.parent)
    py = where / "bin" / "python"
    purelib = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=where).stdout.strip()
    # The dependencies already installed for this test run, without re-downloading them.
    Path(purelib, "ckptrace-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return where


@pytest.fixture(scope="module", params=["wheel", "pip install ."])
def installed(request, dists, tmp_path_factory):
    """A venv with ckptrace installed the given way; returns (venv, cwd outside any checkout)."""
    tmp = tmp_path_factory.mktemp("venv")
    venv = fresh_venv(tmp / "v")
    target = ["--python", venv / "bin" / "python"]
    if request.param == "wheel":
        pip(*target, "install", "--no-deps", "--no-index", dists[1], cwd=tmp)
    else:
        src = tmp / "src"
        shutil.copytree(REPO, src, ignore=NOT_SOURCE)
        pip(*target, "install", "--no-deps", "--no-index", "--no-build-isolation", ".", cwd=src)
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, work


def installed_file(venv: Path, cwd: Path, module: str) -> Path:
    return Path(run([venv / "bin" / "python", "-c", f"import {module}; print({module}.__file__)"], cwd=cwd).stdout.strip())


def test_wheel_and_sdist_hold_every_package_and_data_file(dists):
    sdist, wheel = dists
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    ls = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True)
    if ls.returncode:
        pytest.skip("not a git checkout: no list of the source files to hold the dists against")
    # ckptrace/probes and the others are links to the package folders, for static tools in a
    # checkout (tests/test_static.py): the dists hold the folders, not the links.
    tracked = {f for f in ls.stdout.splitlines() if not (REPO / f).is_symlink()}
    # Every file of a package folder (probes/ -> ckptrace/probes/...) is in the wheel.
    top = {p.parent.name for p in REPO.glob("*/__init__.py")}
    want = {(f if f.startswith("ckptrace/") else f"ckptrace/{f}") for f in tracked if f.split("/")[0] in top}
    assert want - in_wheel == set()
    assert {"ckptrace/commands/analyze.py", "ckptrace/probes/checkpoint.bpf.c",
            "ckptrace/probes/tstate.bpf.h", "ckptrace/probes/memory.bpf.h", "ckptrace/probes/cuda.bpf.h",
            "ckptrace/probes/emit.bpf.h",
            "ckptrace/samples/workload/Makefile", "ckptrace/samples/traces/1-pool-off.parquet"} <= in_wheel
    # The sdist is the whole source: the wheel's files plus tests, docs and the set-up script.
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert tracked - in_sdist == set()


def test_wheel_built_from_the_sdist_is_the_same(dists, tmp_path):
    sdist, wheel = dists
    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path, sdist, cwd=tmp_path)
    (again,) = tmp_path.glob("*.whl")
    names = lambda w: {n for n in zipfile.ZipFile(w).namelist() if ".dist-info/" not in n}  # noqa: E731
    assert names(again) == names(wheel)


def test_installed_package_runs_not_the_checkout(installed):
    venv, cwd = installed
    where = installed_file(venv, cwd, "ckptrace")
    assert venv in where.parents and REPO not in where.parents
    for sub in ("probes", "analyzers", "dashboards", "samples", "commands"):
        assert venv in installed_file(venv, cwd, f"ckptrace.{sub}").parents


def test_every_command_has_help(installed):
    venv, cwd = installed
    exe = venv / "bin" / "ckptrace"
    top = run([exe, "--help"], cwd=cwd).stdout
    for name in COMMANDS:
        assert name in top
        p = run([exe, name, "--help"], cwd=cwd)
        assert "Examples:" in p.stdout and p.stderr == "", name


def test_analyze_compare_dashboard_on_the_installed_samples(installed, tmp_path):
    venv, cwd = installed
    exe = venv / "bin" / "ckptrace"
    traces = installed_file(venv, cwd, "ckptrace.samples").parent / "traces"
    legs = [traces / f"{leg}.parquet" for leg in LEGS]
    # Same answers as the checkout's own package on the checkout's copy of the traces.
    from ckptrace.analyzers import analyze_trace
    from ckptrace.core.trace import read_trace
    for leg in legs:
        got = json.loads(run([exe, "analyze", leg, "--json"], cwd=cwd).stdout)
        want = analyze_trace(read_trace(REPO / "samples" / "traces" / leg.name))
        assert len(got["checkpoints"]) == len(want.checkpoints) > 0
        assert got["summary"]["pool_hits"] == want.summary["pool_hits"]
        truth = [json.loads(ln) for ln in (traces / f"{leg.stem}.truth.jsonl").read_text().splitlines()]
        assert len(got["checkpoints"]) == sum(t["type"] == "checkpoint" for t in truth)
    text = run([exe, "analyze", legs[0]], cwd=cwd).stdout
    assert "checkpoints" in text
    cmp = json.loads(run([exe, "compare", *legs, "--json"], cwd=cwd).stdout)
    cpu_fill = next(m for m in cmp["metrics"] if m["metric"] == "checkpoint_fill_cpu_ns")
    assert cmp["baseline"] == "pool-off" and cmp["candidate"] == "pool-on" and cpu_fill["verdict"] == "faster"
    # every verdict as the checkout's own compare gives it on the checkout's copy of the samples
    mine = json.loads(ckptrace("compare", *(REPO / "samples" / "traces" / leg.name for leg in legs), "--json").stdout)
    verdicts = lambda doc: {m["metric"]: m["verdict"] for m in doc["metrics"]}  # noqa: E731
    assert verdicts(cmp) == verdicts(mine) and len(verdicts(mine)) > 5
    report = tmp_path / "report.html"
    run([exe, "dashboard", *legs, "-o", report], cwd=cwd)
    html = report.read_text()
    assert "pool-on" in html and "ckptrace-comparison" in html
    assert len(re.findall(r"<script\b[^>]*\bsrc=", html)) == 0  # plotly.js embedded from the install


def test_imports_go_one_way(installed):
    """pyproject.toml's import-linter layers, on the installed layout (in the checkout the
    folders are not under ckptrace/, where import-linter looks)."""
    venv, cwd = installed
    p = run([venv / "bin" / "python", "-c", "import sys; from importlinter.cli import lint_imports_command; "
             "sys.exit(lint_imports_command())", "--config", REPO / "pyproject.toml", "--no-cache"],
            cwd=cwd, check=False)
    assert p.returncode == 0 and "3 kept, 0 broken" in p.stdout, p.stdout[-3000:]


def package_modules(folder: Path, name: str = "ckptrace") -> list[str]:
    """Every module of the package at `folder`: its .py files, through the folders that are
    packages (a script in a data folder, samples/llama-server/, is not a module)."""
    found = [name]
    for path in sorted(folder.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            found += package_modules(path, f"{name}.{path.name}")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.append(f"{name}.{path.stem}")
    return found


def unplaced(modules: list[str]) -> list[str]:
    """The modules no layer of pyproject.toml's data-flow contract covers (a layer entry covers
    a module and everything under it). The root package itself holds none: import-linter's
    layers are inside it, and its __init__ only names the version and, lazily, the API."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    flow = next(c for c in contracts if c["type"] == "layers" and "containers" not in c)
    entries = [e.strip() for layer in flow["layers"] for e in re.split(r"[|:]", layer)]
    return [m for m in modules if m != "ckptrace" and not any(m == e or m.startswith(e + ".") for e in entries)]


def test_every_module_is_in_a_layer(installed):
    """A new module must be placed: one the contract does not name breaks this, by name."""
    venv, cwd = installed
    modules = package_modules(installed_file(venv, cwd, "ckptrace").parent)
    assert "ckptrace.core.trace" in modules and "ckptrace.live.top" in modules  # the walk sees the package
    assert unplaced(modules) == []


def test_a_command_that_cannot_load_says_which_module_in_one_line(installed):
    venv, cwd = installed
    broken = installed_file(venv, cwd, "ckptrace.commands").parent / "drive.py"
    saved = broken.read_bytes()
    broken.unlink()
    try:
        p = run([venv / "bin" / "ckptrace", "drive", "http://127.0.0.1:1"], cwd=cwd, check=False)
    finally:
        broken.write_bytes(saved)
    assert_one_line_error(p, "the drive command could not be loaded: module 'ckptrace.commands.drive' "
                          "is missing; reinstall ckptrace", code=1)


PANDAS_FLOOR = "pandas==2.2.3"  # pyproject.toml's floor (pandas>=2.2): the oldest pandas ckptrace supports


@pytest.fixture(scope="module")
def pandas_floor(dists, tmp_path_factory):
    """A venv with the wheel and pandas 2.2 (fetched once by pip, then from its cache) in front of
    this test run's own packages."""
    tmp = tmp_path_factory.mktemp("pandas22")
    venv = fresh_venv(tmp / "v")
    target = ["--python", venv / "bin" / "python"]
    pip(*target, "install", "--no-deps", "--no-index", dists[1], cwd=tmp)
    pip(*target, "install", PANDAS_FLOOR, cwd=tmp)  # and what it lacks here (pytz), nothing else
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, work


def test_pandas_2_2_gives_the_same_output_as_pandas_3(pandas_floor, tmp_path):
    """Every figure of analyze --json, compare --json and whatif --json, and the documented API's notebook, under
    pandas 2.2 (copy-on-write turned on by ckptrace) equal this run's under pandas 3."""
    venv, cwd = pandas_floor
    py, exe = venv / "bin" / "python", venv / "bin" / "ckptrace"
    assert run([py, "-c", "import pandas; print(pandas.__version__)"], cwd=cwd).stdout.startswith("2.2.")
    import pandas

    assert int(pandas.__version__.split(".")[0]) >= 3  # this run's own: the other side of the comparison
    legs = [REPO / "samples" / "traces" / f"{leg}.parquet" for leg in LEGS]
    here = [sys.executable, "-m", "ckptrace"]
    for argv in [["analyze", leg, "--json"] for leg in legs] + [["compare", *legs, "--json"],
                                                                ["whatif", *legs[::2], "--cap-bytes", "1GiB", "--json"]]:
        old, new = run([exe, *argv], cwd=cwd).stdout, run([*here, *argv], cwd=cwd).stdout
        assert old == new, argv
    notebook = [REPO / "docs" / "examples" / "reproduce_json.py", *legs]
    assert json.loads(run([py, *notebook], cwd=cwd).stdout) == json.loads(run([sys.executable, *notebook], cwd=cwd).stdout)
    for out, argv in ((tmp_path / "report.html", ["dashboard"]), (tmp_path / "timeline.json", ["export"])):
        run([exe, *argv, *legs, "-o", out], cwd=cwd)
        run([*here, *argv, *legs, "-o", tmp_path / f"3-{out.name}"], cwd=cwd)
        assert out.read_bytes() == (tmp_path / f"3-{out.name}").read_bytes(), argv
