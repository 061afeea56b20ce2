"""One metric table (analyzers/metrics.py) read by compare, the summary, every renderer, the
Prometheus exporter and the benchmarks: each shows exactly the table's metrics, with its labels.

On the recorded sample A/B/A (pool-off, pool-on, pool-off), whose compare verdicts on CPU are far
from any threshold (fill on CPU -90%).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptrace.analyzers.checkpoints import CHECKPOINT_COLUMNS
from ckptrace.analyzers.iterations import ITERATION_COLUMNS
from ckptrace.analyzers.metrics import METRICS, POOL, compared
from ckptrace.analyzers.requests import REQUEST_COLUMNS
from ckptrace.analyzers.state_path import PROMPT_SAVE_COLUMNS, RESTORE_COLUMNS
from ckptrace.core.requests_file import COLUMNS as REQUEST_FILE_COLUMNS
from helpers import ckptrace

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"
LEGS = [SAMPLES / f"{n}.parquet" for n in ("1-pool-off", "2-pool-on", "3-pool-off")]
TABLES = {"checkpoint": CHECKPOINT_COLUMNS, "prefill iteration": ITERATION_COLUMNS, "restore": RESTORE_COLUMNS,
          "prompt save": PROMPT_SAVE_COLUMNS, "request": {**REQUEST_COLUMNS, **REQUEST_FILE_COLUMNS}}


def test_each_metric_names_columns_of_its_table_and_has_one_label():
    for m in METRICS.values():
        assert set(m.columns) <= set(TABLES[m.sample]), m.name
        assert m.name.endswith({"ns": "_ns", "faults": "faults", "bytes": "_bytes", "ms": "_ms", "tok/s": "_tok_s"}[m.unit])
    labels = [m.label for m in METRICS.values()]
    assert len(labels) == len(set(labels))
    assert set(POOL) <= {m.name for m in compared()}


@pytest.fixture(scope="module")
def outputs():
    def out(*args):
        p = ckptrace(*args)
        assert p.returncode == 0, p.stderr
        return p.stdout
    return {"compare": json.loads(out("compare", *LEGS, "--json")), "text": out("compare", *LEGS),
            "markdown": out("compare", *LEGS, "--format", "markdown"),
            "analyze": json.loads(out("analyze", LEGS[1], "--json")), "analyze_text": out("analyze", LEGS[1])}


def test_compare_judges_the_table_s_metrics_and_every_renderer_labels_them_so(outputs):
    # restores, prompt saves and requests only where recorded: the samples have none
    checkpoint_ones = [m for m in compared() if m.sample in ("checkpoint", "prefill iteration")]
    rows = outputs["compare"]["metrics"]
    assert [r["metric"] for r in rows] == [m.name for m in checkpoint_ones]
    assert {r["metric"]: r["unit"] for r in rows} == {m.name: m.unit for m in checkpoint_ones}
    for m in checkpoint_ones:
        assert f"\n{m.heading} " in outputs["text"] and f"| {m.heading} |" in outputs["markdown"], m.name
    pool = [(r["class"], r["metric"]) for r in outputs["compare"]["pool"]]
    # the samples' pool-on leg misses only in its warm-up (compare's --warmup auto): cold misses
    assert pool == [(c, n) for c in ("hits", "cold misses") for n in POOL]
    for n in POOL:
        assert (f"\ncold miss {METRICS[n].label} " in outputs["text"]
                and f"| cold misses {METRICS[n].label} |" in outputs["markdown"])
    fill_cpu = next(r for r in rows if r["metric"] == "checkpoint_fill_cpu_ns")
    assert fill_cpu["verdict"] == "faster"


def test_the_summary_and_its_text_hold_the_table_s_distributions(outputs):
    summary_ones = [m for m in METRICS.values() if m.summary]
    assert list(outputs["analyze"]["summary"]["stats"]) == [m.name for m in summary_ones]
    text = outputs["analyze_text"]
    for m in summary_ones:
        assert f"\n{m.label:18} " in text, m.name


def test_the_exporter_serves_the_table_s_series():
    from ckptrace.exporters.prometheus import HISTOGRAMS, series_names

    served = {m.series: m for m in METRICS.values() if m.series}
    assert set(HISTOGRAMS) == set(served)
    for name, (col, scale, _, doc) in HISTOGRAMS.items():
        assert col == served[name].columns[0] and doc == served[name].help
        assert f"ckptrace_{name}_bucket" in series_names()
        assert scale == (1e-9 if served[name].unit == "ns" else 1.0)


def test_fail_on_metrics_takes_every_compared_metric_and_refuses_others():
    p = ckptrace("compare", *LEGS, "--fail-on", "slower", "--metrics", "nonsense")
    assert p.returncode == 2 and all(m.name in p.stderr for m in compared())


def test_a_metric_added_to_the_table_is_compared_and_shown(outputs):
    """checkpoint_other_ns, added by one entry in analyzers/metrics.py: judged by compare, shown by
    the text and Markdown renderers, accepted by --fail-on --metrics. The pool changes the fill,
    not the rest of a checkpoint: other_ns is under a millisecond in every arm."""
    other = next(r for r in outputs["compare"]["metrics"] if r["metric"] == "checkpoint_other_ns")
    assert other["unit"] == "ns" and other["sample"] == "checkpoint" and other["samples_candidate"] == 18  # 20 less the warm-up's 2
    assert 0 < other["baseline_value"] < 1e6 and 0 < other["candidate_value"] < 1e6
    assert "\nckpt other ms " in outputs["text"] and "| ckpt other ms |" in outputs["markdown"]
    p = ckptrace("compare", *LEGS, "--fail-on", "any-change", "--metrics", "checkpoint_other_ns")
    assert p.returncode in (0, 3) and "--metrics" not in p.stderr, p.stderr
