"""Dashboards: self-contained HTML, panels drawn from the analyzers' frames, labels kept as text,
large traces bounded; `ckptrace dashboard`; and the report rendered in a real headless Chromium."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from browser import Browser, chromium_available, distinct_colours, read_png
from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.compare import compare
from ckptrace.dashboards.legs import MAX_POINTS, PHASE_COLOURS, bin_rows, order_statistics, plain
from ckptrace.dashboards.report import build_panels, write_dashboard
from ckptrace.dashboards.synthetic import synthetic_aba, synthetic_trace
from ckptrace.core.meta import TraceMeta
from ckptrace.core.trace import write_trace
from helpers import assert_one_line_error, ckptrace, record_with_truth, within_clock

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
HOSTILE_TITLE = "</script><script>document.title='pwned-title'</script>"
# Tags plotly.js itself would honour in figure text: a label must show them, not become them.
MARKUP = "<b>pool-on</b> <a href='https://example.com/x'>link</a>"
ALL_PANELS = {"answer", "breakdown", "header", "comparison", "iterations", "timeline", "distributions", "churn",
              "memory", "whatif", "summary", "metadata"}  # "processes" only for legs of several processes (test_memory.py)


@pytest.fixture(scope="module")
def aba():
    traces = synthetic_aba(checkpoints=40)
    analyses = [analyze_trace(t) for t in traces]
    return analyses, compare(analyses)


def figures(parts):
    return {pid: p.figure for pid, p in parts if p.figure is not None}


def test_every_panel_drawn_for_an_aba(aba):
    analyses, comparison = aba
    figs = figures(build_panels(analyses, comparison, "t"))
    assert set(figs) == ALL_PANELS


def test_one_label_has_no_comparison_and_says_so(aba):
    analyses, _ = aba
    parts = build_panels([analyses[0]], None, "t")
    figs = figures(parts)
    assert set(figs) == ALL_PANELS - {"comparison", "answer"}
    header_text = json.dumps(figs["header"].to_plotly_json()["data"])
    assert "Panel 'comparison' omitted: one label only" in header_text


def test_stacked_parts_add_up_to_each_prefill_iteration(aba):
    analyses, comparison = aba
    fig = figures(build_panels(analyses, comparison, "t"))["iterations"]
    per_leg = {}
    for tr in fig.data:  # one subplot per leg: y axis y, y2, y3
        per_leg.setdefault(tr.yaxis, []).append(np.asarray(tr.y, dtype="float64"))
    assert len(per_leg) == len(analyses)
    for axis, a in zip(sorted(per_leg, key=lambda s: int(s[1:] or 1)), analyses):
        stacked = np.sum(per_leg[axis], axis=0)
        span_ms = a.iterations.loc[a.iterations["kind"] == "prefill", "span_ns"].to_numpy() / 1e6
        np.testing.assert_allclose(stacked, span_ms, rtol=1e-5)


def test_every_leg_is_drawn_the_same_way_with_waiting_its_own_colour(aba):
    # Issue 8: the same workload must look the same in every leg (no leg all "faults" and another
    # all "fill" from a clamped estimate), and waiting for a CPU is a part of its own.
    analyses, comparison = aba
    fig = figures(build_panels(analyses, comparison, "t"))["iterations"]
    per_leg = {}
    for tr in fig.data:
        per_leg.setdefault(tr.yaxis, []).append((tr.name, tr.marker.color, float(np.sum(tr.y))))
    names = {tuple((n, c) for n, c, _ in parts) for parts in per_leg.values()}
    assert len(names) == 1  # the same parts, in the same order and colours, in every leg
    (parts,) = names
    assert ("waiting for a CPU", PHASE_COLOURS["wait"]) in parts
    assert len({c for _, c in parts}) == len(parts)  # each part its own colour
    baseline_legs = [per_leg[ax] for ax, a in zip(sorted(per_leg, key=lambda s: int(s[1:] or 1)), analyses)
                     if a.trace.label == comparison.baseline]
    for leg in baseline_legs:  # the two pool-off legs: faults drawn in both, and of like size
        totals = {n: t for n, _, t in leg}
        assert totals["page faults"] > 0 and totals["waiting for a CPU"] > 0
    f1, f2 = ({n: t for n, _, t in leg}["page faults"] for leg in baseline_legs)
    assert 0.5 < f1 / f2 < 2


def test_comparison_panel_draws_the_given_frame(aba):
    # A renderer: whatever change and interval compare() says is what is drawn.
    from ckptrace.analyzers.metrics import label

    analyses, comparison = aba
    m = comparison.metrics.copy()
    m.loc[0, ["change_pct", "ci_low_pct", "ci_high_pct", "verdict"]] = [-37.25, -40.5, -33.0, "within drift"]
    fake = type(comparison)(**{**comparison.__dict__, "metrics": m})
    fig = figures(build_panels(analyses, fake, "t"))["comparison"]
    points = next(tr for tr in fig.data if tr.type == "scatter")
    i = list(points.y).index(label(m.loc[0, "metric"]))  # shown by its one label (metrics.py)
    assert points.x[i] == -37.25 and points.text[i] == "within drift"
    assert points.error_x.arrayminus[i] == pytest.approx(3.25) and points.error_x.array[i] == pytest.approx(4.25)


def test_labels_are_escaped_for_plotly_markup():
    assert plain("<b>x</b> & y") == "&lt;b&gt;x&lt;/b&gt; &amp; y"


def test_html_is_self_contained_and_labels_never_markup(tmp_path):
    traces = [synthetic_trace(HOSTILE, checkpoints=8, seed=1), synthetic_trace("pool-on", checkpoints=8, pool=True, seed=2)]
    analyses = [analyze_trace(t) for t in traces]
    out = write_dashboard(analyses, compare(analyses), tmp_path / "r.html", HOSTILE_TITLE)
    html = out.read_text()
    assert HOSTILE not in html and "<img" not in html and HOSTILE_TITLE not in html
    assert not re.search(r"""src\s*=\s*["']?(https?:)?//""", html)  # no external script or image
    assert len(re.findall(r"<script\b[^>]*\bsrc=", html)) == 0
    assert html.count("Plotly.newPlot(") == len(ALL_PANELS)
    assert "MathJax.js" not in html


def test_large_trace_is_sampled_and_stays_under_10_mb(tmp_path):
    traces = synthetic_aba(checkpoints=34_000)  # 102,000 checkpoints over three legs
    analyses = [analyze_trace(t) for t in traces]
    out = write_dashboard(analyses, None, tmp_path / "big.html", "big")
    assert out.stat().st_size <= 10_000_000
    header = json.dumps(figures(build_panels(analyses, None, "big"))["header"].to_plotly_json()["data"])
    assert "evenly spaced order statistics" in header and "Prefill iterations binned" in header


def test_order_statistics_keep_the_distribution():
    v = np.random.default_rng(3).lognormal(size=100_001)
    s, sampled = order_statistics(v, 1001)
    assert sampled and len(s) == 1001 and s[0] == v.min() and s[-1] == v.max()
    for q in (0.1, 0.5, 0.9, 0.99):
        assert abs(np.mean(v <= np.quantile(s, q)) - q) < 2 / 1001
    small, sampled = order_statistics(v[:10], MAX_POINTS)
    assert not sampled and len(small) == 10


def test_bin_rows_means_of_consecutive_rows():
    import pandas as pd
    f = pd.DataFrame({"start_ns": np.arange(10) * 10, "a": np.arange(10.0)})
    out, k = bin_rows(f, ["a"], limit=4)
    assert k == 3 and list(out["a"]) == [1.0, 4.0, 7.0, 9.0] and list(out["start_ns"]) == [0, 30, 60, 90]


# -- the command -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    paths = []
    for i, t in enumerate(synthetic_aba(checkpoints=20), start=1):
        p = d / f"leg{i}.parquet"
        write_trace(p, t.events, t.meta)
        paths.append(p)
    return paths


def test_command_writes_the_report_and_prints_its_path(trace_files, tmp_path):
    out = tmp_path / "report.html"
    r = ckptrace("dashboard", *trace_files, "-o", out, "--title", "A/B/A")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    html = out.read_text()
    assert html.count("Plotly.newPlot(") == len(ALL_PANELS)  # the comparison panel is there


def test_command_three_labels_still_draws_and_warns(trace_files, tmp_path):
    third = tmp_path / "third.parquet"
    t = synthetic_trace("other", checkpoints=10, seed=9)
    write_trace(third, t.events, t.meta)
    out = tmp_path / "r.html"
    r = ckptrace("dashboard", *trace_files, third, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "no comparison" in r.stderr and out.exists()


def test_help_has_examples():
    r = ckptrace("dashboard", "--help")
    assert r.returncode == 0 and "Examples:" in r.stdout and "ckptrace dashboard" in r.stdout


@pytest.mark.parametrize("case", ["missing", "garbage", "no_dir", "not_html"])
def test_bad_input_is_one_line(case, trace_files, tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    args = {
        "missing": [str(tmp_path / "nope.parquet"), "-o", str(tmp_path / "r.html")],
        "garbage": [str(garbage), "-o", str(tmp_path / "r.html")],
        "no_dir": [str(trace_files[0]), "-o", str(tmp_path / "no" / "such" / "r.html")],
        "not_html": [str(trace_files[0]), "-o", str(tmp_path / "r.png")],
    }[case]
    assert_one_line_error(ckptrace("dashboard", *args))
    assert not (tmp_path / "r.html").exists()


# -- in a real browser ---------------------------------------------------------------------------

ALL_DRAWN = ("[...document.querySelectorAll('.plotly-graph-div')]"
             ".every(d => d._fullLayout && d.querySelector('.main-svg'))")
needs_chromium = pytest.mark.skipif(not chromium_available(), reason="chromium not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """A dashboard of two traces, one with a hostile label, loaded in headless Chromium."""
    d = tmp_path_factory.mktemp("browser")
    traces = [synthetic_trace(HOSTILE, checkpoints=12, seed=1),
              synthetic_trace(MARKUP, checkpoints=12, pool=True, seed=2)]
    analyses = [analyze_trace(t) for t in traces]
    html = write_dashboard(analyses, compare(analyses), d / "report.html", HOSTILE_TITLE)
    with Browser.start(width=1400, height=1600) as b:
        b.open(html)
        ready = b.wait_until(ALL_DRAWN, timeout_s=60)
        plots = b.evaluate("""[...document.querySelectorAll('.plotly-graph-div')].map(d => ({
            id: d.id, svgs: d.querySelectorAll('.main-svg').length, data: d.data.length,
            traces: d.querySelectorAll('g.trace').length, tables: d.querySelectorAll('g.table').length}))""")
        texts = b.evaluate("[...document.querySelectorAll('svg text')].map(t => t.textContent)")
        panel_texts = b.evaluate("Object.fromEntries([...document.querySelectorAll('.plotly-graph-div')].map(d => "
                                 "[d.id, [...d.querySelectorAll('svg text')].map(t => t.textContent)]))")
        result = {
            "ready": ready, "plots": plots, "texts": texts, "panel_texts": panel_texts,
            "title": b.evaluate("document.title"),
            "imgs": b.evaluate("document.querySelectorAll('img').length"),
            "svg_links": b.evaluate("document.querySelectorAll('svg a').length"),
            "bold": b.evaluate("[...document.querySelectorAll('svg tspan')].filter(t => "
                               "(t.getAttribute('style') || '').includes('bold')).length"),
            "dom": b.evaluate("document.documentElement.outerHTML"),
            "errors": b.errors(), "requests": b.requests(), "html": html.read_text(),
            "png": b.screenshot(d / "shot.png"),
        }
    return result


@pytest.mark.browser
@needs_chromium
def test_browser_loads_without_javascript_errors(rendered):
    assert rendered["ready"]
    assert rendered["errors"] == []


@pytest.mark.browser
@needs_chromium
def test_browser_renders_every_plot(rendered):
    plots = {p["id"]: p for p in rendered["plots"]}
    assert set(plots) == {f"ckptrace-{p}" for p in ALL_PANELS}
    for pid, p in plots.items():
        assert p["svgs"] >= 1, pid
        if pid.removeprefix("ckptrace-") in {"header", "summary", "metadata"}:
            assert p["tables"] == 1, pid
        else:  # every data trace of a chart became an SVG trace group
            assert p["traces"] == p["data"] - p["tables"] > 0, pid


@pytest.mark.browser
@needs_chromium
def test_browser_hostile_label_stays_text(rendered):
    assert rendered["title"] == "ckptrace report"  # neither onerror nor the title's script ran
    assert rendered["imgs"] == 0
    assert any(HOSTILE in t for t in rendered["texts"])
    assert any(HOSTILE_TITLE in t for t in rendered["texts"])
    assert any(MARKUP in t for t in rendered["texts"])
    assert rendered["svg_links"] == 0 and rendered["bold"] == 0
    assert "<img" not in rendered["dom"] and "&lt;img src=x onerror" in rendered["dom"]


@pytest.mark.browser
@needs_chromium
def test_browser_loads_nothing_from_the_network(rendered):
    assert rendered["requests"] and all(u.startswith("file://") for u in rendered["requests"]), rendered["requests"]
    assert 'src="http' not in rendered["html"]


@pytest.mark.browser
@needs_chromium
def test_browser_screenshot_is_not_blank(rendered):
    px = read_png(rendered["png"])
    assert px.shape[:2] == (1600, 1400)
    assert distinct_colours(px) > 200
    flat = px.reshape(-1, px.shape[-1])[:, :3]
    white = np.all(flat >= 250, axis=1).mean()
    assert white < 0.9  # plots, not an empty page


def test_empty_trace_still_gives_a_page_that_says_what_is_missing(tmp_path):
    from ckptrace.core.trace import Trace, empty_events
    a = analyze_trace(Trace(events=empty_events(), meta=TraceMeta(label="empty"), path="empty.parquet"))
    parts = build_panels([a], None, "t")
    assert set(figures(parts)) == {"header", "summary", "metadata"}
    header = json.dumps(figures(parts)["header"].to_plotly_json()["data"])
    for pid in ("iterations", "timeline", "distributions", "churn"):
        assert f"Panel '{pid}' omitted" in header
    assert write_dashboard([a], None, tmp_path / "e.html", "empty").stat().st_size > 0


# -- a real recording, in a real browser ---------------------------------------------------------

@pytest.mark.ebpf
@pytest.mark.browser
@needs_chromium
def test_a_real_recording_renders_its_own_numbers(require_root_ebpf, workload, tmp_path):
    """The sample workload recorded pool-off and pool-on, `ckptrace dashboard` on the two traces,
    loaded in Chromium: each prefill iteration's stacked bar, as the page holds it, is that
    iteration's span by the workload's own clock (docs/tests.md's 5% + 0.5 ms)."""
    legs = [record_with_truth(tmp_path, [workload, "--iterations", "9", "--pool", pool], "--label",
                              f"pool-{pool}", name=pool) for pool in ("off", "on")]
    out = tmp_path / "real.html"
    r = ckptrace("dashboard", *(leg.path for leg in legs), "-o", out)
    assert r.returncode == 0, r.stderr
    with Browser.start(width=1400, height=1600) as b:
        b.open(out)
        assert b.wait_until(ALL_DRAWN, timeout_s=60)
        bars = b.evaluate("""document.getElementById('ckptrace-iterations')._fullData.map(
            t => ({axis: t.yaxis, y: Array.from(t.y)}))""")
        drawn = b.evaluate("[...document.querySelectorAll('.plotly-graph-div')].map(d => d.id)")
        errors = b.errors()
    assert errors == []
    assert set(drawn) == {f"ckptrace-{p}" for p in ALL_PANELS}
    per_leg = {}
    for t in bars:
        per_leg.setdefault(t["axis"], []).append(np.asarray(t["y"], dtype="float64"))
    assert len(per_leg) == len(legs)
    for axis, leg in zip(sorted(per_leg, key=lambda a: int(a[1:] or 1)), legs):
        stacked_ns = np.sum(per_leg[axis], axis=0) * 1e6
        it = leg.truth["iteration"]
        prefill = it[it["kind"] == "prefill"].sort_values("start_ns")
        truth_ns = (prefill["end_ns"] - prefill["start_ns"]).to_numpy()
        assert len(stacked_ns) == len(truth_ns)
        assert within_clock(stacked_ns, truth_ns), (stacked_ns, truth_ns)


# -- the answer first (issue 21) ------------------------------------------------------------------

def test_the_answer_card_comes_first_and_shows_the_headline(aba):
    analyses, comparison = aba
    parts = build_panels(analyses, comparison, "t")
    assert [pid for pid, _ in parts][:3] == ["answer", "breakdown", "header"]
    fig = parts[0][1].figure
    h = comparison.headline
    values = [tr.value for tr in fig.data]
    assert values[0] == pytest.approx(h["checkpoint"]["removed_ms"]) and values[1] == pytest.approx(h["prefill"]["removed_ms"])
    assert values[2] == pytest.approx(100 * h["hit_rate"]["rate"])
    title = fig.layout.title.text
    assert "removes" in title and "per checkpoint" in title and "hit the pool" in title


def test_one_stacked_bar_per_arm_adds_up_to_its_mean_warm_checkpoint(aba):
    from ckptrace.analyzers.warmup import split

    analyses, comparison = aba
    fig = figures(build_panels(analyses, comparison, "t"))["breakdown"]
    bars = [tr for tr in fig.data if tr.type == "bar" and tr.xaxis == "x"]  # the checkpoint chart
    assert {tr.name for tr in bars} <= {"fill (on CPU, excl. faults)", "copy (on CPU, excl. faults)", "page faults",
                                         "waiting for a CPU", "other (incl. blocked)"}
    for i, label in enumerate(dict.fromkeys(a.trace.label for a in analyses)):
        legs = [a for a in analyses if a.trace.label == label]
        totals = np.concatenate([a.checkpoints["total_ns"].to_numpy()[split(a).warm] for a in legs])
        assert sum(tr.x[i] for tr in bars) == pytest.approx(totals.mean() / 1e6, rel=1e-6)
    assert len({tr.xaxis for tr in fig.data}) == 2  # per checkpoint, per prefill iteration: one axis each


def test_every_leg_shares_one_scale_and_the_timeline_is_the_median_iteration(aba):
    from ckptrace.analyzers.warmup import split

    analyses, comparison = aba
    figs = figures(build_panels(analyses, comparison, "t"))
    axes = [k for k in figs["iterations"].layout if k.startswith("yaxis")]
    assert len(axes) == len(analyses) and all(figs["iterations"].layout[k].matches == "y" for k in axes)
    title = figs["timeline"].layout.annotations[0].text  # the first arm's subplot title
    a = analyses[0]
    pre = a.iterations[a.iterations["kind"] == "prefill"].loc[split(a).warm_iterations]
    spans = np.sort(pre.loc[pre["checkpoints"] > 0, "span_ns"].to_numpy())
    assert f"({spans[(len(spans) - 1) // 2] / 1e6:.1f} ms," in title and spans[-1] > spans[(len(spans) - 1) // 2]


def test_tables_have_units_and_legends_show_only_what_is_drawn():
    from ckptrace.core.trace import Trace

    traces = synthetic_aba(checkpoints=20)
    for t in traces:  # as a format 1 trace: no on-CPU time, no wait
        ev = t.events.copy()
        ev[["cpu_ns", "wait_ns"]] = None
        t.events = ev
    analyses = [analyze_trace(t) for t in traces]
    figs = figures(build_panels(analyses, compare(analyses), "t"))
    cells = json.dumps(figs["summary"].to_plotly_json()["data"][0]["cells"]["values"])
    assert not re.search(r"\de[+-]\d", cells) and "True" not in cells and "False" not in cells and "None" not in cells
    assert "MiB" in cells and "%" in cells and "not recorded" in cells
    names = {tr.name for tr in figs["iterations"].data} | {tr.name for tr in figs["breakdown"].data if tr.name}
    assert "waiting for a CPU" not in names  # none recorded: no legend for it


# -- one name, one unit and one rate per metric (issue 36) ----------------------------------------

def test_one_name_one_unit_and_one_rate_per_metric(aba):
    """The comparison and summary tables name each metric by its one label from the metric table
    (never its dotted or _ns key), each value in its shown unit; the per-leg hit rate is the
    answer card's (after the warm-up), and analyze's rate over every checkpoint is named apart."""
    from ckptrace.analyzers.metrics import METRICS, label
    from ckptrace.analyzers.warmup import split

    analyses, comparison = aba
    figs = figures(build_panels(analyses, comparison, "t"))
    table = next(tr for tr in figs["comparison"].data if tr.type == "table")
    names, base = list(table.cells.values[0]), list(table.cells.values[1])
    m = comparison.metrics
    assert names[:len(m)] == [label(x) for x in m["metric"]]
    pool = comparison.pool
    assert names[len(m):] == [f"{c}: {label(x)}" for c, x in zip(pool["class"], pool["metric"])]
    assert not any("_" in n for n in names)
    for name, unit, cell in zip(m["metric"], m["unit"], base):
        assert cell == "-" or cell.endswith({"ns": " ms", "faults": " faults"}.get(unit, f" {unit}")), (name, cell)
    summary = next(tr for tr in figs["summary"].data if tr.type == "table")
    rows = dict(zip(summary.cells.values[0], summary.cells.values[1]))
    assert not any("stats." in k or "_ns" in k for k in rows), [k for k in rows if "_" in k]
    a = analyses[0]
    assert rows[f"{label('checkpoint_fill_ns')}, p90"] == f"{a.summary['stats']['checkpoint_fill_ns']['p90'] / 1e6:,.3f} ms"
    assert rows["pool hit rate, warm-up included"] == f"{100 * a.summary['pool_hit_rate']:.1f}%"
    # the hit rate per leg is the headline's: hits over the checkpoints after each thread's warm-up
    bars = [tr for tr in figs["churn"].data if tr.xaxis == "x3"][0]
    h = comparison.headline["hit_rate"]
    cand = [i for i, x in enumerate(a.trace.label == comparison.candidate for a in analyses) if x]
    warm = [split(analyses[i]) for i in cand]
    hits = sum(int(analyses[i].checkpoints["pool_hit"].to_numpy()[w.warm].sum()) for i, w in zip(cand, warm))
    n = sum(int(w.warm.sum()) for w in warm)
    assert (hits, n) == (h["warm_hits"], h["warm_checkpoints"]) and len(cand) == 1
    assert bars.y[cand[0]] == pytest.approx(100 * h["rate"])
    assert "after warm-up" in figs["churn"].layout.annotations[2].text
    assert all(x in METRICS for x in m["metric"])


@pytest.mark.browser
@needs_chromium
def test_browser_shows_labels_not_keys(rendered):
    """In the rendered page, the comparison and summary panels show no metric's key, only labels."""
    from ckptrace.analyzers.metrics import METRICS, label

    for pid in ("ckptrace-comparison", "ckptrace-summary"):
        texts = rendered["panel_texts"][pid]
        assert not [t for t in texts if any(k in t for k in METRICS) or "stats." in t], pid
    assert label("checkpoint_fill_ns") in rendered["panel_texts"]["ckptrace-comparison"]
