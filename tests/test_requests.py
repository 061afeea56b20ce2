"""Per-request attribution (analyze --requests), request files, compare's request pairing, the CI gate
(--fail-on) and --format markdown, on the committed sample recordings.

The arithmetic is checked against the trace's own spans, computed here independently (a plain
loop over the event rows). The request windows below are placed by this test on the recording's
clock, at and across checkpoint edges, so every case (whole span, span cut by the window's edge,
no span, outside the recording) happens by construction; the figures on a real llama-server with
drive's own requests are in test_llama_server.py. The gate's verdicts are on real recordings, far
from any threshold: the pool's fill on CPU (-90%), the default metrics of the sample A/B/A, and an
A/A/A of three pool-off recordings whose metric is the fault count (exact: about 12,289 faults per
48 MiB checkpoint in every run, checked against the workload's own getrusage).
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from ckptrace.analyzers.requests import request_process, request_summary, request_table
from ckptrace.analyzers.warmup import split
from ckptrace.core.requests_file import read_requests, requests_path
from ckptrace.core.trace import read_trace, write_trace
from helpers import assert_one_line_error, ckptrace, load_truth, within_clock

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"
OFF1, ON, OFF2, OFF4 = (SAMPLES / f"{n}.parquet" for n in ("1-pool-off", "2-pool-on", "3-pool-off", "4-pool-off"))


def request(i: int, start: int, ttft: int | None, status: str = "ok") -> dict:
    return {"request": i, "client": i % 3, "prompt_tokens": 64, "start_unix_ns": 1, "start_ns": int(start),
            "ttft_ns": None if ttft is None else int(ttft), "total_ns": None if ttft is None else int(ttft) + 5_000_000,
            "status": status, "predicted_tokens": 4}


def write_requests_file(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows))
    return path


def windows_around(a) -> list[dict]:
    """Windows at and across the checkpoints of a recording: each case by construction."""
    ck = a.checkpoints.sort_values("start_ns", ignore_index=True)
    s, e = ck["start_ns"].to_numpy(), ck["end_ns"].to_numpy()
    mid = (s + e) // 2
    return [
        request(0, s[0] - 1_000_000, e[0] - s[0] + 1_000_000),  # wholly holds the first checkpoint
        request(1, mid[1], e[3] - mid[1]),  # from inside checkpoint 2 to the end of checkpoint 4
        request(2, s[5] - 10, (mid[5] - s[5]) + 10),  # ends inside checkpoint 6 (cut)
        request(3, e[6] + 1, max(1, s[7] - e[6] - 2)),  # between two checkpoints: none
        request(4, s[0], e[-1] - s[0]),  # all of them
        request(5, s[2], None, status="error: ConnectionResetError"),  # failed: no first token
    ]


def overlap(rows: pd.DataFrame, lo: int, hi: int) -> int:
    """Independent truth: summed intersection of the rows' spans with [lo, hi], by a plain loop."""
    return sum(max(0, min(int(r.end_ns), hi) - max(int(r.start_ns), lo)) for r in rows.itertuples())


def checkpoints_only(path: Path):
    """The trace as a build whose create_checkpoint was not probed records it: its checkpoints are
    the spans a request's checkpoint time is made of (the create spans' case: test_llama_server)."""
    t = read_trace(path)
    t.events = t.events[t.events["kind"] != "create"].reset_index(drop=True)
    return t


def test_each_request_is_split_by_the_spans_inside_its_window(tmp_path):
    a = analyze_trace(checkpoints_only(OFF1))
    f = write_requests_file(tmp_path / "r.json", windows_around(a))
    table = request_table(read_requests(f), a)
    ev = a.trace.events
    ck_rows, fills, copies = (ev[ev["kind"] == k] for k in ("checkpoint", "fill", "copy"))
    ck_rows = ck_rows[ck_rows["ckpt"].isin(a.checkpoints["ckpt"])]
    for r in table[table["in_recording"]].itertuples():
        lo, hi = r.start_ns, r.start_ns + r.ttft_ns
        assert r.ckpt_ns == overlap(ck_rows, lo, hi), r
        assert r.ckpt_fill_ns == overlap(fills, lo, hi) and r.ckpt_copy_ns == overlap(copies, lo, hi), r
        assert r.ckpt_other_ns == r.ckpt_ns - r.ckpt_fill_ns - r.ckpt_copy_ns
        assert r.stall_ns == r.ckpt_ns  # restores not recorded in this trace (format 2): NA, not counted
        assert pd.isna(r.restore_ns)
        assert r.rest_ns == r.ttft_ns - r.stall_ns and r.est_ttft_without_fill_ns == r.ttft_ns - r.ckpt_fill_ns
        whole = a.checkpoints[(a.checkpoints["start_ns"] >= lo) & (a.checkpoints["end_ns"] <= hi)]
        met = ((ck_rows["end_ns"] > lo) & (ck_rows["start_ns"] < hi)).sum()
        assert r.checkpoints == met and r.cut_spans == met - len(whole)
        if r.cut_spans == 0:  # every span wholly inside: the checkpoints' own figures, to the ns
            for col, src in (("ckpt_fault_ns", "fault_ns"), ("ckpt_cpu_ns", "cpu_ns"), ("ckpt_wait_ns", "wait_ns")):
                assert getattr(r, col) == int(whole[src].sum()), (col, r)
    by = table.set_index("request")
    assert by.loc[0, "checkpoints"] == 1 and by.loc[0, "cut_spans"] == 0
    assert by.loc[1, "cut_spans"] == 1 and by.loc[2, "cut_spans"] == 1  # cut by the window's edge
    assert by.loc[3, "checkpoints"] == 0 and by.loc[3, "ckpt_ns"] == 0
    assert by.loc[4, "checkpoints"] == len(a.checkpoints)
    assert by.loc[4, "ckpt_ns"] == int(a.checkpoints["total_ns"].sum())
    assert by.loc[4, "ckpt_fault_ns"] == int(a.checkpoints["fault_ns"].sum())
    assert not by.loc[5, "in_recording"] and pd.isna(by.loc[5, "ckpt_ns"])  # failed: no breakdown
    # a cut span's fault, on-CPU and wait time are prorated by its share inside the window
    r = by.loc[2]
    c = a.checkpoints.sort_values("start_ns", ignore_index=True).iloc[5]
    share = (r["start_ns"] + r["ttft_ns"] - c["start_ns"]) / c["total_ns"]
    assert abs(r["ckpt_cpu_ns"] - share * c["cpu_ns"]) <= 1


def test_summary_percentiles_are_those_of_the_rows(tmp_path):
    a = analyze_trace(read_trace(OFF1))
    table = request_table(read_requests(write_requests_file(tmp_path / "r.json", windows_around(a))), a)
    s = request_summary(table, a.trace)
    assert (s["requests"], s["completed"], s["with_breakdown"]) == (6, 5, 5)
    rows = table[table["in_recording"]]
    for key in ("ttft_ns", "stall_ns", "ckpt_fill_ns", "est_ttft_without_fill_ns"):
        v = rows[key].to_numpy("float64")
        assert s["stats"][key]["count"] == 5
        assert s["stats"][key]["p90"] == pytest.approx(np.percentile(v, 90))
        assert s["stats"][key]["median"] == pytest.approx(np.median(v))
    assert s["stats"]["restore_ns"]["not_recorded"] == 5
    assert any("did not complete" in n for n in s["notes"]) and any("restores not recorded" in n for n in s["notes"])
    assert any("prorated" in n for n in s["notes"])
    assert "estimate" in s["estimate"]


def test_analyze_requests_cli_json_text_and_csv(tmp_path):
    a = analyze_trace(read_trace(OFF1))
    f = write_requests_file(tmp_path / "r.json", windows_around(a))
    p = ckptrace("analyze", OFF1, "--requests", f, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["requests"]) == 6 and doc["summary"]["requests"]["with_breakdown"] == 5
    assert doc["requests"][5]["ckpt_ns"] is None  # not recorded is null, never 0
    # the window from the first checkpoint's start to the last one's end: every create_checkpoint
    # span (each holds one checkpoint), the first and last cut at the window's edges
    ev, r = a.trace.events, doc["requests"][4]
    creates = ev[ev["kind"] == "create"]
    assert len(creates) == len(a.checkpoints)
    assert r["ckpt_ns"] == overlap(creates, r["start_ns"], r["start_ns"] + r["ttft_ns"])
    p = ckptrace("analyze", OFF1, "--requests", f, "--csv", tmp_path / "csv")
    assert p.returncode == 0, p.stderr
    assert "Requests (ms)" in p.stdout and "ESTIMATE" in p.stdout
    assert len(pd.read_csv(tmp_path / "csv" / "requests.csv")) == 6


def test_a_request_file_from_another_run_is_one_line(tmp_path):
    a = analyze_trace(read_trace(OFF1))
    rows = windows_around(a)
    for r in rows:
        r["start_ns"] += 3600 * 10**9  # an hour later: nothing overlaps
    f = write_requests_file(tmp_path / "later.json", rows)
    line = assert_one_line_error(ckptrace("analyze", OFF1, "--requests", f), code=1)
    assert "none of its 6 requests ran while" in line and "another run" in line
    # some outside: kept, without a breakdown, and said
    rows = windows_around(a) + [request(9, int(a.checkpoints["end_ns"].max()) + 3600 * 10**9, 1000)]
    table = request_table(read_requests(write_requests_file(tmp_path / "some.json", rows)), a)
    assert not table.set_index("request").loc[9, "in_recording"]
    assert any("outside the recording" in n for n in request_summary(table, a.trace)["notes"])


@pytest.mark.parametrize("content, needle", [
    ("{", "not valid JSON"),
    ('{"request": 1}', "want a JSON list"),
    ("[]", "holds no requests"),
    ('[{"request": 0, "start_ns": 5, "ttft_ns": 1, "total_ns": 2}]', "has no 'status'"),
    ('[{"request": 0, "start_ns": true, "ttft_ns": 1, "total_ns": 2, "status": "ok"}]', "'start_ns' is not a whole"),
    ('[{"request": 0, "start_ns": -5, "ttft_ns": 1, "total_ns": 2, "status": "ok"}]', "out of range"),
    ('[{"request": 0, "start_ns": 5, "ttft_ns": 1.5, "total_ns": 2, "status": "ok"}]', "'ttft_ns' is not a whole"),
    ('[{"request": 0, "start_ns": 5, "ttft_ns": NaN, "total_ns": 2, "status": "ok"}]', "not valid JSON"),
    ('[{"request": 0, "start_ns": 5, "ttft_ns": 1, "total_ns": 2, "status": "ok"},'
     ' {"request": 0, "start_ns": 6, "ttft_ns": 1, "total_ns": 2, "status": "ok"}]', "appears twice"),
    ('[{"request": 0, "start_ns": 5, "ttft_ns": 1, "total_ns": 2, "status": "ok"},'
     ' {"request": 1, "start_ns": 5, "ttft_ns": 9, "total_ns": 2, "status": "ok"}]',
     "request 2: 'total_ns' = 2 is less than its 'ttft_ns' = 9"),
    (f'[{{"request": 0, "start_ns": {1 << 62}, "ttft_ns": 1, "total_ns": {1 << 62}, "status": "ok"}}]',
     "request 1: 'start_ns' + total_ns is past 4611686018427387904 ns"),
    (f'[{{"request": 0, "start_ns": {1 << 62}, "ttft_ns": {1 << 62}, "total_ns": null, "status": "error: x"}}]',
     "request 1: 'start_ns' + ttft_ns is past"),
])
def test_bad_request_files_are_one_line(tmp_path, content, needle):
    f = tmp_path / "bad.json"
    f.write_text(content)
    assert_one_line_error(ckptrace("analyze", OFF1, "--requests", f), needle, code=1)


def test_a_fifo_or_folder_is_not_read_as_a_request_file(tmp_path):
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_one_line_error(ckptrace("analyze", OFF1, "--requests", fifo, timeout=30), "not a regular file", code=1)
    assert_one_line_error(ckptrace("analyze", OFF1, "--requests", tmp_path), "not a request file", code=1)


def legs_with_requests(tmp_path, traces, labels=None) -> list[Path]:
    """Copies of the sample traces (relabelled when `labels`), each with a request file beside it
    whose windows sit on that recording's checkpoints."""
    out = []
    for i, src in enumerate(traces):
        t = read_trace(src)
        if labels:
            t.meta = replace(t.meta, label=labels[i])
        dst = tmp_path / f"{i + 1}-{Path(src).stem.split('-', 1)[1]}.parquet"
        write_trace(dst, t.events, t.meta)
        write_requests_file(requests_path(dst), windows_around(analyze_trace(read_trace(dst)))[:5])
        out.append(dst)
    return out


def test_compare_pairs_request_files_and_says_which_legs_lack_them(tmp_path):
    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2])
    p = ckptrace("compare", *legs, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = {m["metric"]: m for m in doc["metrics"]}
    for name in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_tok_s"):
        assert rows[name]["ci_low_pct"] is not None and rows[name]["ci_high_pct"] is not None, rows[name]
        assert rows[name]["samples_baseline"] == 10 and rows[name]["samples_candidate"] == 5
    b = [read_requests(requests_path(p)) for p in (legs[0], legs[2])]
    assert rows["ttft_p90_ms"]["baseline_value"] == pytest.approx(
        np.percentile(np.concatenate([r["ttft_ns"].to_numpy("float64") for r in b]) / 1e6, 90))
    assert [leg["requests"] for leg in doc["legs"]] == [5, 5, 5]
    moved = requests_path(legs[1]).rename(tmp_path / "on.json")
    doc = json.loads(ckptrace("compare", *legs, "--json").stdout)
    assert any("leg 2 has no request file" in w for w in doc["warnings"]), doc["warnings"]
    rows = {m["metric"]: m for m in doc["metrics"]}
    assert rows["ttft_p90_ms"]["verdict"] == "not recorded" and doc["legs"][1]["requests"] is None
    # explicit files, one per trace; a wrong count is a usage error
    explicit = [requests_path(legs[0]), moved, requests_path(legs[2])]
    p = ckptrace("compare", *legs, *(x for f in explicit for x in ("--requests", f)), "--json")
    assert p.returncode == 0, p.stderr
    assert_one_line_error(ckptrace("compare", *legs, "--requests", explicit[0]), "one request file per trace", code=2)


def test_compare_leaves_out_requests_outside_the_recording(tmp_path):
    """Requests whose window starts before a leg's recording (the trace did not see them) count in
    no request metric, throughput included, as in analyze; a warning per leg gives the count."""
    from ckptrace.analyzers.requests import recording_range

    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2])
    for n, leg in ((2, legs[0]), (1, legs[1])):
        lo, _ = recording_range(read_trace(leg))
        rows = json.loads(requests_path(leg).read_text())
        rows += [request(10 + k, lo - 50_000_000 - k, 60_000_000) for k in range(n)]  # starts before, ends inside
        write_requests_file(requests_path(leg), rows)
    doc = json.loads(ckptrace("compare", *legs, "--json").stdout)
    rows = {m["metric"]: m for m in doc["metrics"]}
    for name in ("ttft_p50_ms", "ttft_p90_ms", "throughput_tok_s"):
        assert (rows[name]["samples_baseline"], rows[name]["samples_candidate"]) == (10, 5), rows[name]
    said = [w for w in doc["warnings"] if "outside its recording" in w]
    assert said == ["leg 1 (pool-off): 2 completed requests ran (partly) outside its recording: left out of the "
                    "request metrics", "leg 2 (pool-on): 1 completed requests ran (partly) outside its recording: "
                    "left out of the request metrics"], doc["warnings"]


def test_compare_refuses_a_request_file_from_another_run(tmp_path):
    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2])
    shutil.copy(requests_path(legs[0]), requests_path(legs[1]))  # leg 1's requests beside leg 2's trace
    line = assert_one_line_error(ckptrace("compare", *legs), code=1)
    assert "2-pool-on.parquet" in line and "another run" in line


def test_fail_on_slower_trips_when_the_candidate_is_slower_by_construction():
    """pool-on as the baseline, pool-off as the candidate: after the warm-up (pool-on's 2 misses) the
    baseline's fill on CPU is 0, the candidate's what the workload's own thread clock says. A change
    from 0 trips the gate whatever the machine's state between legs (the samples' states differ)."""
    p = ckptrace("compare", ON, OFF1, OFF2, "--fail-on", "slower", "--metrics", "checkpoint_fill_cpu_ns")
    assert p.returncode == 3, p.stderr
    m = re.fullmatch(r"ckptrace: compare: --fail-on slower tripped: checkpoint_fill_cpu_ns slower \(([\d.]+) ms more "
                     r"than a baseline of 0\)", p.stderr.strip().splitlines()[-1])
    assert m, p.stderr
    warm = [t[t["iter"] != t["iter"].min()] for t in
            (load_truth(x.with_name(x.stem + ".truth.jsonl"))["checkpoint"] for x in (OFF1, OFF2))]
    assert within_clock(float(m.group(1)) * 1e6, pd.concat(warm)["fill_cpu_ns"].mean())
    assert "ckpt fill ms" in p.stdout  # the table comes first
    # the same comparison passes a gate on the other direction
    p = ckptrace("compare", ON, OFF1, OFF2, "--fail-on", "faster", "--metrics", "checkpoint_fill_cpu_ns")
    assert p.returncode == 0, p.stderr


def truth_faults(trace: Path, warm: bool = True) -> np.ndarray:
    """Each checkpoint's faults by the workload's own getrusage (its truth file), not by ckptrace;
    `warm`: after the warm-up (compare's default, auto: the workload's first iteration, which
    makes every slot's first checkpoint)."""
    t = load_truth(trace.with_name(trace.stem + ".truth.jsonl"))["checkpoint"]
    if warm:
        t = t[t["iter"] != t["iter"].min()]
    return (t["fill_faults"] + t["copy_faults"]).to_numpy("float64")


def test_fail_on_any_change_passes_an_aaa_of_three_recordings(tmp_path):
    """Three recordings of three pool-off runs, labelled A, B, A, each with its own request file:
    the fault count of each checkpoint is exact (the thread's own counter) and the same about
    12,289 in every run, so each arm's value is the truth's mean over that arm's legs, the change
    is 0 and the verdict 'no change'. A leg in the wrong arm, counted twice or paired with another
    leg's request file would change the samples or be refused; any other verdict fails."""
    srcs = [OFF1, OFF4, OFF2]
    legs = legs_with_requests(tmp_path, srcs, labels=["A", "B", "A"])
    p = ckptrace("compare", *legs, "--fail-on", "any-change", "--metrics", "checkpoint_faults")
    assert p.returncode == 0 and "tripped" not in p.stderr and "did not judge" not in p.stderr, (p.stdout, p.stderr)
    doc = json.loads(ckptrace("compare", *legs, "--json").stdout)
    assert [(x["label"], x["checkpoints"], x["requests"]) for x in doc["legs"]] == [("A", 20, 5), ("B", 20, 5), ("A", 20, 5)]
    row = {m["metric"]: m for m in doc["metrics"]}["checkpoint_faults"]
    truth = [truth_faults(x) for x in srcs]
    base, cand = np.concatenate([truth[0], truth[2]]), truth[1]
    assert (row["samples_baseline"], row["samples_candidate"]) == (len(base), len(cand)) == (36, 18)
    assert row["baseline_value"] == pytest.approx(base.mean(), abs=1e-9) and base.mean() > 12_000
    assert row["candidate_value"] == pytest.approx(cand.mean(), abs=1e-9)
    assert row["change_pct"] == pytest.approx(100 * (cand.mean() / base.mean() - 1), abs=1e-9)
    assert row["verdict"] == "no change", row


def test_gate_with_every_metric_on_the_sample_aba():
    """The committed A/B/A with the default metrics: after the warm-up the pool cut faults per
    checkpoint by 100% (the truth: every pool-on checkpoint after the first iteration hit, 0
    faults, against 12,289 each), so --fail-on faster trips on it; nothing is
    slower, and the copy, which the pool does not change, is not judged (the legs ran in different
    states of the machine, and its change is within what that explains), which the gate says and
    --require-judged turns into exit 4. The recordings are fixed, the seed too."""
    change = 100 * (truth_faults(ON).mean() / np.concatenate([truth_faults(OFF1), truth_faults(OFF2)]).mean() - 1)
    assert change == -100
    p = ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "faster")
    assert p.returncode == 3, p.stderr
    assert f"checkpoint_faults faster ({change:+.1f}%" in p.stderr.splitlines()[-1], p.stderr
    p = ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "slower", "--format", "markdown")
    assert p.returncode == 0, p.stderr
    assert "Gate `--fail-on slower` passed on `checkpoint_fill_ns`, `checkpoint_fault_ns`," in p.stdout
    assert "It did not judge `checkpoint_copy_ns` (not judged: " in p.stdout
    assert ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "slower", "--require-judged").returncode == 4


def test_a_gate_that_judged_nothing_does_not_say_passed():
    """The sample legs ran in different states of the machine (the copy's change is within what that
    explains: 'not judged'): a gate on the copy judged nothing and says so, in Markdown and on
    stderr; --require-judged makes that exit 4."""
    p = ckptrace("compare", OFF1, ON, OFF2, "--format", "markdown", "--fail-on", "slower",
                 "--metrics", "checkpoint_copy_ns")
    assert p.returncode == 0, p.stderr
    assert "Gate `--fail-on slower` passed" not in p.stdout and "**Gate `--fail-on slower` judged nothing**: not passed." in p.stdout
    assert "It did not judge `checkpoint_copy_ns` (not judged: the legs did not run in one state" in p.stdout
    assert "did not judge checkpoint_copy_ns (not judged: " in p.stderr and "(it judged nothing)" in p.stderr
    p = ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "slower", "--metrics", "checkpoint_copy_ns,checkpoint_faults",
                 "--require-judged")
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("--require-judged: 1 of 2 metric(s) not judged")
    p = ckptrace("compare", OFF1, ON, OFF2, "--format", "markdown", "--fail-on", "slower",
                 "--metrics", "checkpoint_copy_ns,checkpoint_faults")
    assert p.returncode == 0 and "Gate `--fail-on slower` passed on `checkpoint_faults` only." in p.stdout
    # a trip is a trip (exit 3) whatever else was not judged
    p = ckptrace("compare", ON, OFF1, OFF2, "--fail-on", "slower", "--require-judged",
                 "--metrics", "checkpoint_copy_ns,checkpoint_faults")
    assert p.returncode == 3, p.stderr
    assert_one_line_error(ckptrace("compare", OFF1, ON, OFF2, "--require-judged"), "give --fail-on too", code=2)


def test_fail_on_bad_use(tmp_path):
    assert_one_line_error(ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "slower", "--metrics", "nope"),
                          "unknown metric nope", code=2)
    assert_one_line_error(ckptrace("compare", OFF1, ON, OFF2, "--metrics", "checkpoint_faults"),
                          "give --fail-on too", code=2)
    assert_one_line_error(ckptrace("compare", OFF1, ON, OFF2, "--fail-on", "slower", "--metrics", "ttft_p90_ms"),
                          "request metrics need a request file", code=1)
    assert_one_line_error(ckptrace("compare", OFF1, ON, OFF2, "--json", "--format", "markdown"), "disagree", code=2)


def test_markdown_shows_hostile_labels_as_code_only(tmp_path):
    hostile = ["A|b `x` <img src=y> @someone **z** [l](http://e.x)\n# h", "B``"]
    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2], labels=[hostile[0], hostile[1], hostile[0]])
    p = ckptrace("compare", *legs, "--format", "markdown", "--fail-on", "faster",
                 "--metrics", "checkpoint_fill_cpu_ns")
    assert p.returncode == 3, p.stderr
    md = p.stdout
    assert "| ttft p90 ms |" in md and "**Gate `--fail-on faster` tripped**" in md
    tables = [[]]
    for ln in md.splitlines():  # consecutive lines starting with '|' make one table
        if ln.startswith("|"):
            tables[-1].append(ln)
        elif tables[-1]:
            tables.append([])
    tables = [t for t in tables if t]
    assert len(tables) >= 2 and all(len({ln.count("|") for ln in t}) == 1 for t in tables), tables  # no row split
    # the label, printable (its newline as \n) and cut to LABEL_MAX, only inside a code span of a longer fence
    from ckptrace.core.terminal import shown_label
    assert shown_label(hostile[0]).startswith("A|b `x` <img src=y> @someone **z** [l](ht~")
    assert f"``{shown_label(hostile[0])}``" in md
    assert "``` B`` ```" in md
    outside = re.sub(r"(`+).+?\1", "", md, flags=re.S)  # every code span and block removed
    assert "@someone" not in outside and "<img" not in outside
    assert "\n# h" not in md


def test_dashboard_requests_panel_draws_the_tables_values(tmp_path):
    from ckptrace.dashboards.report import build_panels

    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2])
    requests_path(legs[1]).unlink()
    p = ckptrace("dashboard", *legs, "-o", tmp_path / "r.html")
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "r.html").read_text()
    assert "ckptrace-requests" in html and "TTFT without fill (est.)" in html
    analyses = [analyze_trace(read_trace(x)) for x in legs]
    tables = [request_table(read_requests(requests_path(x)), a) if requests_path(x).exists() else None
              for x, a in zip(legs, analyses)]
    panels = dict(build_panels(analyses, None, requests=tables))
    fig = panels["requests"].figure
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 2 * 4  # two legs with a file, four parts each
    for leg_bars, table in zip((bars[:4], bars[4:]), (tables[0], tables[2])):
        rows = table[table["in_recording"]]
        fill = next(b for b in leg_bars if b.name == "checkpoint fill")
        assert np.allclose(np.asarray(fill.y, "float64"), rows["ckpt_fill_ns"].to_numpy("float64") / 1e6, rtol=1e-6)
        total = sum(np.asarray(b.y, "float64") for b in leg_bars)
        assert np.allclose(total, rows["stall_ns"].to_numpy("float64") / 1e6, rtol=1e-6)
    assert any("no request file for 2" in n for n in panels["requests"].notes)


def test_restores_count_as_stall_nested_copies_once():
    """A trace with restores (trace format 3 kinds): a restore span and its nested copy count
    once; a copy outside any restore span (load_tgt not probed) counts as restore time itself."""
    from ckptrace.core.meta import TraceMeta
    from ckptrace.core.trace import Trace
    from test_analyzers import make_events

    ms = 1_000_000
    ev = make_events([
        dict(kind="checkpoint", tid=1, start_ns=10 * ms, end_ns=20 * ms, ckpt=1, bytes=4096),
        dict(kind="copy", tid=1, start_ns=12 * ms, end_ns=20 * ms, ckpt=1, bytes=4096, phase="checkpoint"),
        dict(kind="restore", tid=1, start_ns=30 * ms, end_ns=40 * ms),
        dict(kind="restore_copy", tid=1, start_ns=31 * ms, end_ns=39 * ms, phase="restore"),
        dict(kind="restore_copy", tid=1, start_ns=50 * ms, end_ns=54 * ms, phase="none"),
    ])
    a = analyze_trace(Trace(ev, TraceMeta(label="r", attach_ns=1, stop_ns=100 * ms), "r.parquet"))
    reqs = pd.DataFrame([request(0, 5 * ms, 60 * ms), request(1, 35 * ms, 17 * ms)])
    from ckptrace.core.requests_file import COLUMNS
    t = request_table(reqs.astype({k: v for k, v in COLUMNS.items() if k in reqs}), a).set_index("request")
    assert (t.loc[0, "ckpt_ns"], t.loc[0, "restore_ns"], t.loc[0, "restore_copy_ns"]) == (10 * ms, 14 * ms, 12 * ms)
    assert t.loc[0, "stall_ns"] == 24 * ms and t.loc[0, "rest_ns"] == 36 * ms
    # from inside the restore (35 ms) to 52 ms: 5 ms of it, 4 of its copy, 2 of the lone copy
    assert (t.loc[1, "restore_ns"], t.loc[1, "restore_copy_ns"], t.loc[1, "cut_spans"]) == (7 * ms, 6 * ms, 2)


def test_drive_writes_the_request_file_it_prints(tmp_path):
    """`drive -o FILE` writes what `--json` prints, and read_requests takes it back as it is."""
    import http.server
    import threading

    from test_llama_server import FakeCompletion

    handler = type("Handler", (FakeCompletion,), {"prompts": [], "lock": threading.Lock()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "run.requests.json"
        p = ckptrace("drive", f"http://127.0.0.1:{srv.server_address[1]}", "--clients", "2", "--requests", "3",
                     "--n-predict", "2", "--json", "-o", out)
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text()) == json.loads(p.stdout)["requests"]
    r = read_requests(out)
    assert list(r["request"]) == [0, 1, 2] and (r["predicted_tokens"] == 2).all() and (r["status"] == "ok").all()
    assert_one_line_error(ckptrace("drive", "http://127.0.0.1:1", "-o", tmp_path), "is a directory", code=1)


def two_servers(tmp_path: Path, east: Path, west: Path, label: str, name: str) -> Path:
    """One trace of two processes, as `record --pid A=east --pid B=west` writes it: two sample
    recordings, the west one moved in time so that its checkpoints interleave with the east one's.
    Beside it, a request file whose windows sit on the east process's checkpoints."""
    from ckptrace.core.meta import ProcessInfo

    e, w = read_trace(east), read_trace(west)
    first = lambda t: int(t.events.loc[t.events["kind"] == "checkpoint", "start_ns"].min())  # noqa: E731
    shift = first(e) + 7_000_000 - first(w)
    ids = {c: w.events[c].where(w.events[c] == 0, w.events[c] + int(e.events[c].max())) for c in ("ckpt", "iter")}
    wev = w.events.assign(start_ns=w.events["start_ns"] + shift, end_ns=w.events["end_ns"] + shift, **ids)
    ev = pd.concat([e.events, wev], ignore_index=True).sort_values("start_ns", kind="stable", ignore_index=True)
    meta = replace(e.meta, label=label, processes=[
        ProcessInfo(pid=e.meta.pid, label="east", comm="ckpt-workload", executable=e.meta.executable),
        ProcessInfo(pid=w.meta.pid, label="west", comm="ckpt-workload", executable=w.meta.executable)],
        attach_ns=min(e.meta.attach_ns, w.meta.attach_ns + shift), stop_ns=max(e.meta.stop_ns, w.meta.stop_ns + shift),
        first_event_ns=int(ev["start_ns"].min()))
    dst = tmp_path / f"{name}.parquet"
    write_trace(dst, ev, meta)
    write_requests_file(requests_path(dst), windows_around(analyze_trace(read_trace(east)))[:5])
    return dst


def test_requests_in_a_trace_of_two_processes_name_the_process(tmp_path):
    """A request file carries no pid: in a trace of two processes analyze, dashboard and export
    refuse it in one line until --requests-pid names one, and then count that process's spans only."""
    both = two_servers(tmp_path, OFF1, ON, "off", "both")
    f = requests_path(both)
    east_pid, west_pid = read_trace(OFF1).meta.pid, read_trace(ON).meta.pid
    for cmd in (["analyze", both], ["dashboard", both, "-o", tmp_path / "r.html"],
                ["export", both, "-o", tmp_path / "x.json"]):
        line = assert_one_line_error(ckptrace(*cmd, "--requests", f), code=1)
        assert "holds 2 processes" in line and f"{east_pid} (east)" in line and "--requests-pid" in line, line
    assert_one_line_error(ckptrace("analyze", both, "--requests", f, "--requests-pid", "north"),
                          "--requests-pid north names no process of", code=1)
    assert_one_line_error(ckptrace("analyze", both, "--requests-pid", "east"), "give --requests too", code=2)
    # east by label or pid: the same split as the east recording alone, to the ns
    alone = request_table(read_requests(f), analyze_trace(read_trace(OFF1))).set_index("request")
    whole = request_table(read_requests(f), analyze_trace(read_trace(both))).set_index("request")
    cols = ["checkpoints", "cut_spans", "ckpt_ns", "ckpt_fill_ns", "ckpt_copy_ns", "ckpt_cpu_ns", "ckpt_wait_ns",
            "stall_ns", "rest_ns"]
    assert (whole["ckpt_ns"] > alone["ckpt_ns"]).any()  # the premise: west's checkpoints fall in the windows
    assert request_process(read_trace(both), str(east_pid)) == request_process(read_trace(both), "east") == east_pid
    p = ckptrace("analyze", both, "--requests", f, "--requests-pid", "east", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    got = pd.DataFrame(doc["requests"]).set_index("request")
    for c in cols:
        assert got[c].tolist() == [None if pd.isna(v) else int(v) for v in alone[c]], c
    assert doc["summary"]["requests"]["pid"] == east_pid
    p = ckptrace("dashboard", both, "-o", tmp_path / "r.html", "--requests", f, "--requests-pid", "east")
    assert p.returncode == 0, p.stderr
    # export: the lanes go under the process named, whose spans the breakdown counts
    p = ckptrace("export", both, "-o", tmp_path / "x.json", "--requests", f, "--requests-pid", "west")
    assert p.returncode == 0, p.stderr
    ev = json.loads((tmp_path / "x.json").read_text())["traceEvents"]
    lanes = {e["pid"] for e in ev if e["name"] == "thread_name" and e["args"]["name"].startswith("requests: time to")}
    assert lanes == {west_pid}
    west = request_table(read_requests(f), analyze_trace(read_trace(both)), pid=west_pid).set_index("request")
    slices = {e["args"]["request"]: e["args"] for e in ev if e["ph"] == "X" and e["cat"] == "ckptrace.request"}
    assert {r: a["ckpt_ns"] for r, a in slices.items()} == {r: int(v) for r, v in west["ckpt_ns"].dropna().items()}


def test_compare_of_legs_of_two_processes_compares_the_one_named(tmp_path):
    legs = [two_servers(tmp_path, e, w, label, f"{i + 1}-{label}")
            for i, (e, w, label) in enumerate([(OFF1, ON, "off"), (ON, OFF2, "on"), (OFF2, OFF1, "off")])]
    line = assert_one_line_error(ckptrace("compare", *legs), code=1)
    assert "leg 1 (" in line and "holds 2 processes" in line
    assert_one_line_error(ckptrace("compare", *legs, "--requests-pid", "east", "--requests-pid", "west"),
                          "given 2 times for 3 traces", code=2)
    p = ckptrace("compare", *legs, "--requests-pid", "east", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = {m["metric"]: m for m in doc["metrics"]}
    # east alone: pool-off in legs 1 and 3, pool-on in leg 2 (west holds the opposite)
    n = [int(split(analyze_trace(read_trace(x))).warm.sum()) for x in (OFF1, ON, OFF2)]  # after the warm-up
    assert (rows["checkpoint_total_ns"]["samples_baseline"], rows["checkpoint_total_ns"]["samples_candidate"]) == \
        (n[0] + n[2], n[1])
    assert rows["checkpoint_fill_cpu_ns"]["verdict"] == "faster", rows["checkpoint_fill_cpu_ns"]
    assert rows["ttft_p90_ms"]["samples_baseline"] == 10
    assert sum("only pid" in w for w in doc["warnings"]) == 3, doc["warnings"]


def test_requests_pid_that_is_one_process_pid_and_another_label_is_ambiguous(tmp_path):
    """--requests-pid N where N is the east process's pid and the west one's label: refused in one
    line naming both, until written pid:N or label:N."""
    both = two_servers(tmp_path, OFF1, ON, "off", "both")
    t = read_trace(both)
    east, west = t.meta.processes
    t.meta = replace(t.meta, processes=[east, replace(west, label=str(east.pid))])
    write_trace(both, t.events, t.meta)
    line = assert_one_line_error(ckptrace("analyze", both, "--requests", requests_path(both), "--requests-pid",
                                          str(east.pid)), "is ambiguous")
    assert f"the pid of {east.pid} (east) and the label of {west.pid}" in line
    assert f"pid:{east.pid} or label:{east.pid}" in line
    t = read_trace(both)
    assert request_process(t, f"pid:{east.pid}") == east.pid and request_process(t, f"label:{east.pid}") == west.pid
    assert request_process(t, "label:east") == east.pid and request_process(t, f"pid:{west.pid}") == west.pid
    p = ckptrace("analyze", both, "--requests", requests_path(both), "--requests-pid", f"pid:{east.pid}", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["summary"]["requests"]["pid"] == east.pid, p.stderr


def test_export_and_dashboard_say_which_legs_have_no_request_file(tmp_path):
    """A leg without a request file (none beside it, or `--requests -`) is one warning line each in
    export and dashboard; the other legs' requests are still drawn."""
    legs = legs_with_requests(tmp_path, [OFF1, ON, OFF2])
    files = [requests_path(x) for x in legs]
    moved = files[1].rename(tmp_path / "on.json")
    p = ckptrace("export", *legs, "-o", tmp_path / "beside.json")
    assert p.returncode == 0, p.stderr
    warned = [x for x in p.stderr.splitlines() if "has no request file" in x]
    assert warned == [f"ckptrace: warning: leg 2 ({legs[1]}) has no request file (--requests, or NAME.requests.json "
                      "beside NAME.parquet): no requests drawn for it"], p.stderr
    p = ckptrace("export", *legs, "--requests", files[0], "--requests", "-", "--requests", "-",
                 "-o", tmp_path / "skipped.json")
    assert p.returncode == 0, p.stderr
    assert [x.split(" (")[0] for x in p.stderr.splitlines() if "has no request file" in x] == \
        ["ckptrace: warning: leg 2", "ckptrace: warning: leg 3"], p.stderr
    names = lambda f: {e["args"]["name"] for e in json.loads(f.read_text())["traceEvents"]  # noqa: E731
                       if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert sum(n.startswith("requests: time to first token") for n in names(tmp_path / "skipped.json")) >= 1
    # "wrote ... N slices" counts every slice written: the recording's and the requests' too
    written = sum(e.get("ph") == "X" for e in json.loads((tmp_path / "skipped.json").read_text())["traceEvents"])
    assert re.search(r"3 process track\(s\), (\d+) slices$", p.stderr.strip().splitlines()[-1]).group(1) == str(written)
    p = ckptrace("dashboard", *legs, "--requests", files[0], "--requests", moved, "--requests", "-",
                 "-o", tmp_path / "r.html")
    assert p.returncode == 0, p.stderr
    assert [x.split(" (")[0] for x in p.stderr.splitlines() if "has no request file" in x] == \
        ["ckptrace: warning: leg 3"], p.stderr
    p = ckptrace("export", *legs, "--requests", "-", "--requests", "-", "--requests", "-", "-o", tmp_path / "none.json")
    assert p.returncode == 0 and "request file" not in p.stderr, p.stderr


# A TTFT change split by the traced path (analyzers/ttft.py): enough requests per percentile, and
# a verdict only where the checkpoint path explains the change.

def ttft_windows(trace: Path, n: int, rest_ms: float) -> list[dict]:
    """n requests, the k-th from 1 ms before the recording's k-th checkpoint to `rest_ms` after its
    end: its TTFT is its stalls plus a rest set here."""
    from ckptrace.analyzers.requests import recording_range

    a = analyze_trace(read_trace(trace))
    lo, hi = recording_range(a.trace)
    ck = a.checkpoints.sort_values("start_ns", ignore_index=True)
    out = []
    for k in range(n):
        start = int(ck["start_ns"][k]) - 1_000_000
        ttft = int(ck["end_ns"][k]) + int(rest_ms * 1e6) - start
        assert lo <= start and start + ttft <= hi  # inside the recording: every request counts
        out.append(request(k, start, ttft))
    return out


def stalls_ms(trace: Path, rows: list[dict]) -> np.ndarray:
    """Each request's checkpoint time inside its window, by a plain loop over the trace's spans:
    each create_checkpoint span whole, and each checkpoint outside one (these recordings have no
    restore spans)."""
    ev = read_trace(trace).events
    assert not ev["kind"].isin(["restore", "restore_copy"]).any()
    creates, ck = ev[ev["kind"] == "create"], ev[ev["kind"] == "checkpoint"]
    inside = [((creates["tid"] == c.tid) & (creates["start_ns"] <= c.start_ns) & (creates["end_ns"] >= c.end_ns)).any()
              for c in ck.itertuples()]
    spans = pd.concat([creates, ck[~np.array(inside, dtype=bool)]])
    return np.array([overlap(spans, r["start_ns"], r["start_ns"] + r["ttft_ns"]) for r in rows]) / 1e6


def test_a_ttft_change_is_split_by_the_traced_path_and_judged_only_with_enough_requests(tmp_path):
    """Pool-off, pool-on, pool-off with 12 requests per leg, each holding a checkpoint; the
    candidate's requests wait 320 ms more outside any checkpoint, the baseline's 20 ms. TTFT rises
    though the pool's checkpoints are shorter: the split says the rest lies outside the traced path,
    p50 is not judged for it, p90 and p99 have too few requests (12 of 50 and 500), and the
    headline states no verdict on TTFT."""
    from ckptrace.analyzers.ttft import min_requests

    assert (min_requests(50), min_requests(90), min_requests(99)) == (10, 50, 500)  # docs/commands.md
    rest = {OFF1: 20, ON: 320, OFF2: 20}  # 300 ms more: beyond what the pool's shorter checkpoints take off
    legs, truth = [], {}
    for i, src in enumerate((OFF1, ON, OFF2)):
        rows = ttft_windows(src, 12, rest[src])
        dst = tmp_path / f"{i + 1}-{src.name}"
        shutil.copy(src, dst)
        write_requests_file(requests_path(dst), rows)
        legs.append(dst)
        truth[src] = (np.array([r["ttft_ns"] for r in rows]) / 1e6, stalls_ms(src, rows))
    p = ckptrace("compare", *legs, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    split = {r["metric"]: r for r in doc["ttft"]}
    rows = {m["metric"]: m for m in doc["metrics"]}
    base = tuple(np.concatenate([truth[OFF1][k], truth[OFF2][k]]) for k in (0, 1))
    cand = truth[ON]
    for q in (50, 90, 99):
        s = split[f"ttft_p{q}_ms"]
        assert (s["requests_baseline"], s["requests_candidate"]) == (24, 12)
        change = np.percentile(cand[0], q) - np.percentile(base[0], q)
        outside = np.percentile(cand[0] - cand[1], q) - np.percentile(base[0] - base[1], q)
        assert s["change_ms"] == pytest.approx(change, abs=1e-6)
        assert s["outside_ms"] == pytest.approx(outside, abs=1e-6)
        assert s["explained_ms"] == pytest.approx(change - outside, abs=1e-6)
        # no request's rest is further from its TTFT than its largest stall
        assert abs(s["explained_ms"]) <= base[1].max() + cand[1].max()
        # the 300 ms put outside by construction (less the candidate's checkpoints it came to hold)
        assert s["change_ms"] > 50 and s["outside_ms"] > 50 and s["outside_ms"] > 2 * abs(s["explained_ms"])
    p50 = rows["ttft_p50_ms"]
    assert p50["verdict"] == "not judged" and p50["why"].startswith("TTFT p50 +"), p50
    assert "lies outside the traced path (queueing, decode, the machine)" in p50["why"]
    for q, need in ((90, 50), (99, 500)):
        assert rows[f"ttft_p{q}_ms"]["verdict"] == "too few samples"
        assert rows[f"ttft_p{q}_ms"]["why"] == (f"a p{q} is judged on at least {need} requests per arm (5 beyond "
                                                "it); the candidate has 12")
    said = doc["headline"]["sentence"]
    t = doc["headline"]["ttft_p90"]
    assert t["explained_ms"] == pytest.approx(split["ttft_p90_ms"]["explained_ms"])
    assert "time to first token p90 +" in said and "too few samples: a p90 is judged on at least 50" in said
    assert "of which the checkpoint path explains" in said and "lies outside the traced path" in said
    assert "slower" not in said.split("time to first token")[1].split("hit the pool")[0]
    text = ckptrace("compare", *legs).stdout
    assert "ttft p50 ms: not judged: TTFT p50 +" in text
    assert max(len(x) for x in text.splitlines() if "ttft" in x.lower()) <= 80


def test_a_ttft_verdict_stands_where_the_traced_path_explains_it(tmp_path):
    """Crafted legs on a quiet machine (compare's test legs: 40 checkpoints of ~31 ms; the pool's
    ~7 ms), 40 requests each holding one checkpoint. Same rest everywhere: the TTFT change is the
    checkpoints' own, explained, and p50 reads faster. 100 ms more rest in the candidate: slower by
    the interval, but the path explains none of it, so not judged."""
    from ckptrace.core.meta import ObjectInfo, TraceMeta
    from ckptrace.core.trace import Trace
    from test_compare import leg_events

    def legs(cand_rest_ms):
        out = []
        for i, (label, fill) in enumerate((("off", 24.0), ("on", 0.0), ("off", 24.0))):
            ev = leg_events(seed=i + 1, fill_ms=fill, pool_hit=fill == 0, wait_share=0.0)
            trace = Trace(ev, TraceMeta(label=label, objects=[ObjectInfo("/lib/x.so", "aa")]), f"{label}{i}.parquet")
            ck = ev[ev["kind"] == "checkpoint"].reset_index(drop=True)
            rest = cand_rest_ms if label == "on" else 2.0
            rows = [request(k, int(ck["start_ns"][k]) - 1_000_000,
                            int(ck["end_ns"][k] - ck["start_ns"][k]) + 1_000_000 + int(rest * 1e6)) for k in range(40)]
            out.append((trace, read_requests(write_requests_file(tmp_path / f"{i}.json", rows))))
        return out

    from ckptrace.analyzers.compare import compare

    for cand_rest, verdict in ((2.0, "faster"), (102.0, "not judged")):
        pairs = legs(cand_rest)
        c = compare([t for t, _ in pairs], requests=[r for _, r in pairs])
        row = c.metrics.set_index("metric").loc["ttft_p50_ms"]
        s = c.ttft.set_index("metric").loc["ttft_p50_ms"]
        assert row["verdict"] == verdict, (row.to_dict(), s.to_dict())
        if verdict == "faster":
            assert s["change_ms"] < -20 and s["explained_ms"] == pytest.approx(s["change_ms"], abs=1.0)
            assert row["why"] == ""
        else:
            assert s["change_ms"] > 50 and abs(s["explained_ms"]) < s["change_ms"] / 2
            assert row["why"].startswith("TTFT p50 +") and "lies outside the traced path" in row["why"]
        assert c.metrics.set_index("metric").loc["ttft_p90_ms", "verdict"] == "too few samples"  # 40 < 50


def test_the_split_on_the_shipped_llama_server_requests(tmp_path):
    """The real llama-server leg's 12 requests and the stalls ckptrace measured inside each TTFT: a
    candidate whose every request took 3 s longer outside the traced path is +3000 ms at every
    percentile, of which the checkpoint path explains 0, and a p90 of 12 requests is too few."""
    from ckptrace.analyzers import ttft

    llama = SAMPLES / "6-llama-pool-off.parquet"
    t = request_table(read_requests(requests_path(llama)), analyze_trace(read_trace(llama)))
    t = t[t["in_recording"]]
    assert len(t) == 12 and (t["stall_ns"] > 0).all()
    base = (t["ttft_ns"].to_numpy("float64") / 1e6, t["stall_ns"].to_numpy("float64") / 1e6)
    s = ttft.split("ttft_p90_ms", 90, base, (base[0] + 3000, base[1]))
    assert s["change_ms"] == pytest.approx(3000) and s["explained_ms"] == pytest.approx(0, abs=1e-6)
    assert ttft.unsupported(s) == ("TTFT p90 +3000 ms, of which the checkpoint path explains +0.0 ms; the rest "
                                   "(+3000 ms) lies outside the traced path (queueing, decode, the machine)")
    assert ttft.too_few(s) == "a p90 is judged on at least 50 requests per arm (5 beyond it); the baseline has 12"
