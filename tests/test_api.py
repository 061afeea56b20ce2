"""ckptrace as a library (docs/api.md): the documented API gives exactly what the commands print,
the DuckDB recipe over `analyze --parquet` and over the raw trace gives analyze's figures, and a
trace is opened once.

Everything runs on the recorded sample traces (samples/traces): their figures are held to the
workload's own clocks by tests/test_record.py; here they are held to `analyze` and `compare`.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ckptrace
from ckptrace.analyzers.checkpoints import CHECKPOINT_COLUMNS
from ckptrace.analyzers.iterations import ITERATION_COLUMNS
from ckptrace.core.errors import AnalysisError
from helpers import assert_one_line_error, ckptrace as run_ckptrace, validate_json

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples" / "traces"
LEGS = [SAMPLES / f"{n}.parquet" for n in ("1-pool-off", "2-pool-on", "3-pool-off", "4-pool-off")]
duckdb = pytest.importorskip("duckdb")  # a test dependency (pyproject.toml's test extra)


def cli_json(*args) -> dict:
    p = run_ckptrace(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_every_example_in_docs_api_md_runs(monkeypatch):
    monkeypatch.chdir(REPO)
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S)
    assert len(blocks) >= 5
    ns: dict = {}
    for block in blocks:  # in order, in one namespace: as a reader would paste them
        exec(compile(block, "docs/api.md", "exec"), ns)
    assert ns["fill"][:2] == (20, 18) and ns["prefill"][0] == 10  # the pool-on sample: 18 of 20 hit


def test_a_notebook_on_the_documented_api_reproduces_analyze_and_compare_json():
    p = subprocess.run([sys.executable, str(REPO / "docs" / "examples" / "reproduce_json.py"), *map(str, LEGS)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for leg in LEGS:
        want = cli_json("analyze", leg)
        mine = got["analyze"][str(leg)]
        assert mine.keys() == want.keys() and [k for k in want if mine[k] != want[k]] == [], leg
        assert len(want["checkpoints"]) > 0 and want["memory"]["releases"]
    want = cli_json("compare", *LEGS)
    assert [k for k in want if got["compare"][k] != want[k]] == [] and got["compare"] == want
    assert {m["verdict"] for m in want["metrics"]} - {"not judged"}  # something was judged


@pytest.mark.ebpf
def test_a_cuda_trace_through_the_notebook_and_the_schema(require_root_ebpf, tmp_path):
    """A trace of a CUDA target (the stub driver, trace format 4) has analyze --json's `gpu` block:
    the notebook rebuilds it from gpu_copies() and gpu_summary(), and it fits the schema."""
    from ckptrace.samples import workload_binary

    trace = tmp_path / "cuda.parquet"
    p = run_ckptrace("record", "--quiet", "-o", trace, "--", workload_binary(variant="cuda"), "--iterations", "3",
                     "--cuda-dst", "cycle", timeout=300)
    assert p.returncode == 0, p.stderr
    want = cli_json("analyze", trace)
    assert len(want["gpu"]["copies"]) == len(want["checkpoints"]) > 0
    validate_json("analyze", want)
    p = subprocess.run([sys.executable, str(REPO / "docs" / "examples" / "reproduce_json.py"), str(trace)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["analyze"][str(trace)] == want
    with ckptrace.open(trace) as t:
        assert len(t.tables()["gpu_copies"]) == len(want["gpu"]["copies"])


def test_the_api_gives_typed_frames_with_units_in_their_names():
    with ckptrace.open(LEGS[1]) as t:
        ck, it = t.checkpoints(), t.iterations()
        assert dict(ck.dtypes) == {c: pd.api.types.pandas_dtype(d) for c, d in CHECKPOINT_COLUMNS.items()}
        assert dict(it.dtypes) == {c: pd.api.types.pandas_dtype(d) for c, d in ITERATION_COLUMNS.items()}
        s = t.summary()
        assert s.loc["checkpoint_fill_ns", "unit"] == "ns" and s.loc["checkpoint_fill_ns", "count"] == len(ck) == 20
        assert s.loc["checkpoint_fill_ns", "mean"] == pytest.approx(ck["fill_ns"].mean(), rel=1e-12)
        assert t.figures()["pool_hits"] == int(ck["pool_hit"].sum()) == 18
        assert t.memory().dtypes.eq("Int64").all() and t.memory()["buffers_mapped"].iat[0] == 2
        assert list(t.processes["pid"]) == [t.meta.pid]
        assert t.summary(t.meta.pid).equals(s)  # one process: its own summary is the trace's
        assert len(t.events()) == t.meta.events
        assert t.gpu_summary() is None and t.gpu_copies().empty  # no CUDA target
        with pytest.raises(AnalysisError, match="not one of its processes"):
            t.summary(12345678)
    c = ckptrace.compare(LEGS[:3])
    assert c.baseline == "pool-off" and c.candidate == "pool-on"
    assert c.verdict("checkpoint_fill_cpu_ns") == "faster"  # -90% on CPU, far from any threshold
    with pytest.raises(AnalysisError, match="no metric 'ttft_p50_ms'"):
        c.verdict("ttft_p50_ms")
    head = c.headline  # the answer's sentence, as compare prints it first
    assert head == c.headline_figures["sentence"] and head.startswith("pool-on removes ")
    assert head.rstrip(".").endswith("against pool-off")


def test_a_trace_is_opened_and_checked_once(monkeypatch):
    """Every table, the events and the metadata from one open of the file (today's code opened a
    trace five times for one analysis and read its metadata three times)."""
    import ckptrace.core.trace as trace_module
    import ckptrace.core.stream as stream_module

    opens, metas = [], []
    real_open, real_meta = trace_module.open_regular, trace_module._checked_meta
    monkeypatch.setattr(trace_module, "open_regular", lambda *a, **k: opens.append(a) or real_open(*a, **k))
    monkeypatch.setattr(trace_module, "_checked_meta", lambda *a, **k: metas.append(a) or real_meta(*a, **k))
    monkeypatch.setattr(stream_module, "is_stream", lambda *a: pytest.fail("sniffed again"))
    with ckptrace.open(LEGS[1]) as t:
        t.checkpoints(), t.summary(), t.memory(), t.tables(), t.events(), t.meta
    assert len(opens) == 1 and len(metas) == 1


def test_analyze_parquet_writes_every_table_as_the_api_types_it(tmp_path):
    out = tmp_path / "tables"
    p = run_ckptrace("analyze", LEGS[1], "--parquet", out)
    assert p.returncode == 0, p.stderr
    with ckptrace.open(LEGS[1]) as t:
        tables = t.tables()
    assert sorted(f.stem for f in out.iterdir()) == sorted(tables)
    for name, frame in tables.items():
        back, frame = pd.read_parquet(out / f"{name}.parquet"), frame.reset_index(drop=True)
        pd.testing.assert_frame_equal(back, frame, check_dtype=False, check_categorical=False, obj=name)
        typed = [c for c in frame if not pd.api.types.is_object_dtype(frame[c]) and not pd.api.types.is_string_dtype(frame[c])]
        assert dict(back[typed].dtypes) == dict(frame[typed].dtypes), name  # numbers, NA-able, bool, categories
    assert_one_line_error(run_ckptrace("analyze", LEGS[1], "--parquet", tmp_path / "tables" / "checkpoints.parquet"),
                          "--parquet", code=1)


def _figures(values: np.ndarray) -> list[float]:
    return [float(values.mean()), *np.percentile(values, [50, 90, 99]).tolist()]


QUANTILES = "avg({c}), quantile_cont({c}, 0.5), quantile_cont({c}, 0.9), quantile_cont({c}, 0.99)"


@pytest.mark.parametrize("leg", LEGS, ids=lambda p: p.stem)
def test_the_duckdb_recipes_give_analyze_figures(leg, tmp_path):
    """docs/api.md's SQL, on `analyze --parquet`'s tables and on the raw trace, against analyze --json."""
    doc = cli_json("analyze", leg)
    stats, summary = doc["summary"]["stats"], doc["summary"]
    run_ckptrace("analyze", leg, "--parquet", tmp_path)
    ck = f"'{tmp_path}/checkpoints.parquet'"
    for metric, col in (("checkpoint_fill_ns", "fill_ns"), ("checkpoint_copy_ns", "copy_ns"),
                        ("checkpoint_total_ns", "total_ns"), ("checkpoint_fill_cpu_ns", "fill_cpu_ns")):
        row = duckdb.sql(f"SELECT {QUANTILES.format(c=col)} FROM {ck}").fetchall()[0]
        want = [stats[metric][k] for k in ("mean", "median", "p90", "p99")]
        assert row == pytest.approx(want, rel=1e-12), metric
    n, hits = duckdb.sql(f"SELECT count(*), sum(pool_hit::INT) FROM {ck}").fetchall()[0]
    assert (n, hits) == (summary["checkpoints"], summary["pool_hits"])
    prefill = duckdb.sql(f"SELECT count(*), {QUANTILES.format(c='span_ns')} FROM '{tmp_path}/iterations.parquet' "
                         "WHERE kind = 'prefill'").fetchall()[0]
    assert prefill[0] == summary["prefill_iterations"]
    assert prefill[1:] == pytest.approx([stats["prefill_iteration_ns"][k] for k in ("mean", "median", "p90", "p99")],
                                        rel=1e-12)

    recipe = re.search(r'recipe = """(.*?)"""', (REPO / "docs" / "api.md").read_text(), re.S).group(1)
    raw = duckdb.sql(recipe.replace("samples/traces/2-pool-on.parquet", str(leg))).fetchall()[0]
    checkpoints = doc["checkpoints"]
    assert raw[:2] == (summary["checkpoints"], summary["pool_hits"])
    assert raw[2:] == pytest.approx([np.mean([c[k] for c in checkpoints]) / 1e6
                                     for k in ("fill_ns", "copy_ns", "total_ns")], rel=1e-12)
    if summary["pool_hits"]:  # the trap the recipe avoids: fill rows alone leave the hits out
        naive = duckdb.sql(f"SELECT avg(end_ns - start_ns) / 1e6 FROM '{leg}' WHERE kind = 'fill'").fetchall()[0][0]
        assert naive > 5 * raw[2]
