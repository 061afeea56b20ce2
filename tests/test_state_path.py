"""The state path around checkpoints (trace format 3) recorded from the sample workload: each
create_checkpoint span, the old checkpoint it evicts first, and the analysis built on them."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from ckptrace.analyzers import analyze_trace
from helpers import ckptrace, clock_tolerance, record_with_truth

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]
# Every state kind of the upstream generation: restores from the 2nd prefill, a speculative
# checkpoint per slot on decode iterations, 512 KiB of speculative state per create, a prompt save.
UPSTREAM_ARGS = ["--iterations", "9", "--slots", "2", "--restore-every", "1", "--spec", "--spec-state-kib", "512",
                 "--prompt-save"]


def variant(name: str):
    from ckptrace.samples import workload_binary

    return str(workload_binary(variant=name))


def within_cpu(ours, truth) -> bool:
    """docs/tests.md's promise against the workload's thread CPU clock: 5% + 0.5 ms."""
    ours, truth = np.asarray(ours, dtype="float64"), np.asarray(truth, dtype="float64")
    return bool(np.all(np.abs(ours - truth) <= clock_tolerance(truth)))


def by_start(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("start_ns").reset_index(drop=True)


def assert_checkpoints_match(a, truth, derived: bool = False) -> None:
    ck, t = by_start(a.checkpoints), by_start(truth["checkpoint"])
    assert len(ck) == len(t) and (ck["bytes"] == t["bytes"]).all()
    assert (ck["spec"] == t["spec"].astype(bool)).all()
    assert (ck["fill_source"] == ("derived" if derived else "measured")).all()
    hit = t["pool_hit"].astype(bool)
    assert (ck["pool_hit"] == hit).all()
    # fill and copy on the thread's CPU clock; a derived fill also holds the size query (microseconds)
    assert within_cpu(ck["fill_cpu_ns"], t["fill_cpu_ns"].where(~hit, 0)), ck[["fill_cpu_ns"]].join(t["fill_cpu_ns"])
    assert within_cpu(ck["copy_cpu_ns"], t["copy_cpu_ns"])
    assert (abs(ck["fill_faults"] - t["fill_faults"]) <= 0.01 * t["fill_faults"] + 2).all()


def test_create_spans_hold_their_checkpoints_and_evictions(tmp_path, workload):
    # 3 prefill iterations, 2 slots, one checkpoint kept per slot: from the second prefill on each
    # create_checkpoint first erases the slot's old checkpoint (a 48 MiB buffer: one munmap).
    r = record_with_truth(tmp_path, [workload, "--iterations", "7", "--slots", "2", "--keep", "1"])
    ev, truth = r.trace.events, r.truth["checkpoint"]
    creates = ev[ev["kind"] == "create"].reset_index(drop=True)
    ck = ev[ev["kind"] == "checkpoint"].reset_index(drop=True)
    assert len(creates) == len(ck) == len(truth) == 6
    assert r.trace.meta.profile.name == "llama_decode"
    # each checkpoint lies inside one create span, on its thread; bytes are what it copied
    for c, k in zip(creates.itertuples(), ck.itertuples()):
        assert c.tid == k.tid and c.start_ns <= k.start_ns and k.end_ns <= c.end_ns
        assert c.bytes == k.bytes and c.phase == "create"
    assert not ck["spec"].any()  # every update_tgt came from create_checkpoint
    a = analyze_trace(r.trace)
    ev_rows = a.evictions
    assert len(ev_rows) == 4, ev_rows  # slots x (prefills - 1)
    # each eviction unmaps the buffer its slot's previous checkpoint mapped (same address)
    mapped = ev[(ev["kind"] == "mmap") & (ev["phase"] == "fill")]
    assert set(ev_rows["addr"]) <= set(mapped["addr"])
    assert (ev_rows["bytes"] >= truth["bytes"].iloc[0]).all()
    assert (a.checkpoints["fill_source"] == "measured").all()
    out = ckptrace("analyze", "--json", r.path)
    doc = json.loads(out.stdout)
    assert len(doc["evictions"]) == 4 and doc["restores"] == []
    assert doc["trace"]["profile"]["name"] == "llama_decode"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    return record_with_truth(tmp, [variant("upstream"), *UPSTREAM_ARGS, "--slot-file", tmp / "slot.bin"], "--label", "up")


@pytest.fixture(scope="module")
def inlined(tmp_path_factory):
    return record_with_truth(tmp_path_factory.mktemp("inl"), [variant("inlined"), *UPSTREAM_ARGS], "--label", "inl")


def test_upstream_generation_every_state_kind_matches_the_workload(upstream):
    r = upstream
    prof = r.trace.meta.profile
    assert prof.name == "11434" and prof.missing == [] and prof.source["llama_decode"] == "llama_decode"
    a, t, ev = analyze_trace(r.trace), r.truth, r.trace.events
    assert_checkpoints_match(a, t)
    assert a.checkpoints["spec"].sum() == 12 and not a.checkpoints.loc[a.checkpoints["spec"], "draft"].any()

    # each copy's flags as the workload passed them (trace format 5): its checkpoints PARTIAL_ONLY,
    # its prompt saves none; a checkpoint's size as the server logs it counts the speculative state
    copies = ev[ev["kind"] == "copy"]
    assert (copies.loc[copies["ckpt"] > 0, "state_flags"] == 1).all()
    assert (copies.loc[copies["ckpt"] == 0, "state_flags"] == 0).all() and (copies["ckpt"] == 0).any()
    assert not a.checkpoints["on_device"].any()
    own = a.checkpoints[~a.checkpoints["spec"]]  # made inside create_checkpoint: its whole size
    assert sorted(own["create_bytes"]) == sorted(by_start(t["create"])["bytes"])
    assert (own["create_bytes"] == own["bytes"] + 512 * 1024).all()
    assert a.checkpoints.loc[a.checkpoints["spec"], "create_bytes"].isna().all()

    # restores: load_tgt spans, their llama_state_seq_set_data_ext copy inside, the bytes put back;
    # restored: the copies read all they were given (this generation's load_tgt returns nothing)
    rs, tr = a.restores, by_start(t["restore"])
    assert len(rs) == len(tr) == 4 and (rs["source"] == "checkpoint").all()
    assert rs["restored"].eq(True).all()
    rc = ev[ev["kind"] == "restore_copy"]
    assert (rc["state_flags"] == 1).all() and (rc["outcome"] == 1).all()
    assert (rs["bytes"] == tr["bytes"]).all() and (rs["tid"] == tr["tid"]).all()
    assert (rs["start_ns"] <= tr["start_ns"]).all() and (tr["end_ns"] <= rs["end_ns"]).all()
    assert within_cpu(rs["copy_cpu_ns"], tr["copy_cpu_ns"])
    assert (rs["iter"] > 0).all()

    # the speculative state, the prompt saves and the create_checkpoint calls: prompt_save and create
    # take their clocks inside the call (the row encloses them), spec_state around it (they enclose the row)
    for kind in ("spec_state", "prompt_save", "create"):
        rows, want = by_start(ev[ev["kind"] == kind]), by_start(t[kind])
        assert len(rows) == len(want) > 0, kind
        assert (rows["bytes"] == want["bytes"]).all(), kind
        outer, inner = (want, rows) if kind == "spec_state" else (rows, want)
        assert (outer["start_ns"] <= inner["start_ns"]).all() and (inner["end_ns"] <= outer["end_ns"]).all(), kind
    # an evicted checkpoint frees its 48 MiB state buffer (and its speculative state when glibc had
    # mmap()ed that): one munmap each, inside the creates that evicted, before their checkpoint
    big = a.evictions[a.evictions["bytes"] >= t["checkpoint"]["bytes"].min()]
    assert len(big) == t["create"]["evictions"].sum() == 4
    evicting = by_start(ev[ev["kind"] == "create"])["start_ns"][(by_start(t["create"])["evictions"] > 0).to_numpy()]
    assert set(a.evictions["create_start_ns"]) == set(evicting)

    # batches through llama_process: tokens from llama_batch_ext, prompt tokens = those without output
    it, ti = by_start(a.iterations), by_start(t["iteration"])
    assert (it["tokens"] == ti["tokens"]).all()
    assert (it["kind"].astype(str) == ti["kind"]).all()  # spec checkpoints do not make a prefill
    prefill = ti["kind"] == "prefill"
    assert (it.loc[prefill, "prompt_tokens"] == ti.loc[prefill, "tokens"] - 2).all()  # one output per slot
    assert (it.loc[~prefill, "prompt_tokens"] == 0).all()
    assert r.trace.meta.lost_events == 0 and r.trace.meta.partial_spans == 0

    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert len(doc["restores"]) == 4
    text = ckptrace("analyze", "--all", r.path).stdout
    assert "restores: 4 (4 of a checkpoint, 0 other" in text and "evictions: " in text
    assert sum(1 for ln in text.splitlines() if re.match(r"\s*\d+s ", ln)) == 12  # spec checkpoints marked
    assert {"start_ns", "end_ns", "tid", "bytes", "copy_ns", "copy_faults", "cpu_ns", "wait_ns"} <= set(doc["restores"][0])


def test_prompt_saves_have_their_copies(upstream):
    # each prompt save's llama_state_seq_get_data_ext is a copy row (ckpt 0, phase prompt_save) inside
    # the workload's own clocks around that copy, analyzed as a checkpoint's copy is
    r = upstream
    ev, want = r.trace.events, by_start(r.truth["prompt_save"])
    rows = by_start(ev[(ev["kind"] == "copy") & (ev["ckpt"] == 0)])
    assert len(rows) == len(want) > 0 and (rows["phase"] == "prompt_save").all()
    assert (rows["bytes"] == want["bytes"]).all() and (rows["tid"] == want["tid"]).all()
    assert (want["copy_start_ns"] <= rows["start_ns"]).all()
    assert (rows["end_ns"] <= want["copy_start_ns"] + want["copy_ns"]).all()
    ps = analyze_trace(r.trace).prompt_saves
    assert len(ps) == len(want) and (ps["bytes"] == want["bytes"]).all()
    assert (ps["copy_ns"] == (rows["end_ns"] - rows["start_ns"]).to_numpy()).all()
    assert within_cpu(ps["copy_cpu_ns"], want["copy_cpu_ns"])
    assert (ps["iter"] > 0).all() and ps["copy_fault_ns"].notna().all()
    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert len(doc["prompt_saves"]) == len(want)
    assert f"prompt saves: {len(want)}, " in ckptrace("analyze", r.path).stdout


def test_slot_files_are_spans_with_their_bytes(upstream):
    """Each save to a slot file and each load from it (the token count first, then the rest) is a
    span of its own (trace format 5) inside the workload's clocks around the call, with the bytes
    the call returned."""
    r = upstream
    t = r.truth
    want = by_start(pd.concat([t["slot_save"].assign(action="save"), t["slot_restore"].assign(action="restore")]))
    sf = analyze_trace(r.trace).slot_files
    assert len(sf) == len(want) > 0
    assert (sf["action"].astype(str) == want["action"]).all()
    assert (sf["bytes"] == want["bytes"]).all() and sf["ok"].all() and (sf["tid"] == want["tid"]).all()
    assert (want["start_ns"] <= sf["start_ns"]).all() and (sf["end_ns"] <= want["end_ns"]).all()
    assert (sf["iter"] > 0).all()
    restores = sf[sf["action"] == "restore"]
    assert (restores["bytes"].iloc[0::2] == 4).all()  # the first load reads the token count only
    ev = r.trace.events
    assert (ev.loc[ev["kind"].isin(["slot_save", "slot_restore"]), "outcome"] == 1).all()
    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert len(doc["slot_files"]) == len(want)
    text = ckptrace("analyze", r.path).stdout
    saves = t["slot_save"]
    assert f"slot files: {len(saves)} save calls, {saves['bytes'].sum() / 2**20:.1f} MiB written" in text


def test_libcxx_build_measures_fill(tmp_path):
    r = record_with_truth(tmp_path, [variant("libcxx"), *UPSTREAM_ARGS])
    assert r.trace.meta.profile.name == "11434"
    assert {p.point for p in r.trace.meta.probes} >= {"resize_libcxx", "resize_grow_libcxx"}
    a = analyze_trace(r.trace)
    assert_checkpoints_match(a, r.truth)
    # the token vector read with libc++'s token size (80 bytes)
    assert (by_start(a.iterations)["tokens"] == by_start(r.truth["iteration"])["tokens"]).all()


def test_inlined_growth_fill_is_measured_at_its_memset_calls(tmp_path):
    # resize()'s growth inlined into update_tgt/update_dft (no growth symbol anywhere), its zero fill
    # a call to memset: each call site is probed, and the fill is measured, not derived
    binary = variant("inlined-memset")
    out = ckptrace("symbols", "--json", binary)
    plan = json.loads(out.stdout)
    assert plan["fill"] == "memset call sites in update_tgt and update_dft (inlined growth)"
    assert not {p["point"] for p in plan["points"]} & {"resize_grow", "resize_grow_libcxx", "resize_libcxx"}
    r = record_with_truth(tmp_path, [binary, *UPSTREAM_ARGS])
    calls = [p for p in r.trace.meta.probes if p.point == "fill_call"]
    assert calls and all("(call memset@plt)" in p.symbol for p in calls)
    assert "no fill probe" not in r.proc.stderr and "fill" not in r.trace.meta.profile.missing
    a = analyze_trace(r.trace)
    # the memset inside the workload's clocks around the resize; its faults are the resize's but the
    # page operator new's malloc header touches (at most 2 apart: assert_checkpoints_match's margin)
    assert_checkpoints_match(a, r.truth)
    ck, t = by_start(a.checkpoints), by_start(r.truth["checkpoint"])
    fills = r.trace.events[r.trace.events["kind"] == "fill"]
    assert len(fills) == (~t["pool_hit"].astype(bool)).sum() and (fills["bytes"] > 0).all()
    starts = ck["ckpt"].map(fills.groupby("ckpt")["start_ns"].min())
    ends = ck["ckpt"].map(fills.groupby("ckpt")["end_ns"].max())
    grown = ~t["pool_hit"].astype(bool)
    assert (t.loc[grown, "fill_start_ns"] <= starts[grown]).all()
    assert (ends[grown] <= t.loc[grown, "fill_start_ns"] + t.loc[grown, "fill_ns"]).all()
    assert (ck.loc[grown, "fill_faults"] > 0).all()
    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert {c["fill_source"] for c in doc["checkpoints"]} == {"measured"}


def test_inlined_fill_is_derived_and_flagged(inlined):
    r = inlined
    assert "no fill probe" in r.proc.stderr and "derived" in r.proc.stderr
    assert "fill" in r.trace.meta.profile.missing
    assert not (r.trace.events["kind"] == "fill").any()
    a = analyze_trace(r.trace)
    assert_checkpoints_match(a, r.truth, derived=True)
    assert a.checkpoints["fill_fault_ns"].isna().all()  # not measured, never 0
    doc = json.loads(ckptrace("analyze", "--json", r.path).stdout)
    assert {c["fill_source"] for c in doc["checkpoints"]} == {"derived"}
    text = ckptrace("analyze", r.path).stdout
    assert "fill ~ derived" in text


def test_compare_judges_restores_and_says_a_fill_is_derived(upstream, inlined):
    doc = json.loads(ckptrace("compare", "--json", upstream.path, inlined.path).stdout)
    rows = {m["metric"]: m for m in doc["metrics"]}
    assert {"restore_total_ns", "restore_copy_ns", "prompt_save_total_ns", "prompt_save_copy_ns"} <= set(rows)
    assert rows["prompt_save_copy_ns"]["samples_baseline"] == len(upstream.truth["prompt_save"])
    assert rows["restore_total_ns"]["baseline_mean"] > 0 and rows["restore_total_ns"]["candidate_mean"] > 0
    assert any("leg 2: fill derived, not measured" in w for w in doc["warnings"])


def union_ns(spans, lo: int, hi: int) -> int:
    """Independent truth: time in [lo, hi] covered by any of the (start, end) spans, by a plain sweep."""
    total, reach = 0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def test_requests_count_whole_create_spans_once(upstream, tmp_path):
    """analyze --requests on the upstream generation: a create_checkpoint span (the eviction of the
    slot's old checkpoint, update_tgt, the speculative state) is checkpoint time as a whole, its
    nested checkpoint counted once; speculative checkpoints (outside any create) count themselves."""
    from test_requests import request, write_requests_file

    r = upstream
    ev, a = r.trace.events, analyze_trace(r.trace)
    creates = by_start(ev[ev["kind"] == "create"])
    ck = by_start(ev[ev["kind"] == "checkpoint"])
    t_create = by_start(r.truth["create"])
    evicting = (t_create["evictions"] > 0).to_numpy()
    assert evicting.sum() == 4 and len(creates) == len(t_create)
    c = creates[evicting].iloc[0]  # a create that evicted: its munmaps lie before its checkpoint
    inner = ck[(ck["start_ns"] >= c.start_ns) & (ck["end_ns"] <= c.end_ns)].iloc[0]
    lo, hi = int(ev["start_ns"].min()), int(ev["end_ns"].max())
    reqs = [request(0, c.start_ns, c.end_ns - c.start_ns),  # exactly the create span
            request(1, c.start_ns, inner.start_ns - c.start_ns),  # its part before the checkpoint
            request(2, lo, hi - lo)]  # the whole recording
    p = ckptrace("analyze", r.path, "--requests", write_requests_file(tmp_path / "r.json", reqs), "--json")
    assert p.returncode == 0, p.stderr
    rows = {q["request"]: q for q in json.loads(p.stdout)["requests"]}
    for q in rows.values():  # the split adds up to the ns
        assert q["ckpt_fill_ns"] + q["ckpt_copy_ns"] + q["ckpt_other_ns"] == q["ckpt_ns"], q
        assert q["ckpt_ns"] + q["restore_ns"] == q["stall_ns"] and q["stall_ns"] + q["rest_ns"] == q["ttft_ns"], q
    # the whole create, not create + checkpoint: all of the window, once; it holds the workload's own create clock
    q = rows[0]
    assert q["ckpt_ns"] == q["ttft_ns"] == c.end_ns - c.start_ns and q["rest_ns"] == 0 and q["cut_spans"] == 0
    assert q["ckpt_ns"] >= t_create[evicting].iloc[0]["end_ns"] - t_create[evicting].iloc[0]["start_ns"]
    assert q["checkpoints"] == 1 and q["ckpt_create_ns"] == q["ckpt_ns"] - (inner.end_ns - inner.start_ns) > 0
    # before the checkpoint: the eviction's munmaps, all create time
    q = rows[1]
    evictions = a.evictions[a.evictions["create_start_ns"] == c.start_ns]
    assert len(evictions) and ((evictions["start_ns"] > c.start_ns) & (evictions["start_ns"] < inner.start_ns)).all()
    assert q["ckpt_ns"] == q["ckpt_create_ns"] == q["ckpt_other_ns"] == q["ttft_ns"] and q["checkpoints"] == 0
    # every create and every checkpoint outside one, against a plain sweep over the rows
    q = rows[2]
    spans = list(zip(creates["start_ns"], creates["end_ns"])) + list(zip(ck["start_ns"], ck["end_ns"]))
    assert q["ckpt_ns"] == union_ns(spans, lo, hi)
    assert q["checkpoints"] == len(r.truth["checkpoint"]) == 18
    restores = ev[ev["kind"] == "restore"]
    assert q["restore_ns"] == int((restores["end_ns"] - restores["start_ns"]).sum()) > 0
    spec = ck[ck["spec"]]
    assert q["ckpt_create_ns"] == q["ckpt_ns"] - int((ck["end_ns"] - ck["start_ns"]).sum())
    assert len(spec) == 12 and q["ckpt_ns"] == int((creates["end_ns"] - creates["start_ns"]).sum()
                                                  + (spec["end_ns"] - spec["start_ns"]).sum())


def test_dashboard_draws_restores_and_state_saves_like_checkpoints(upstream):
    # the timeline's iteration is the median (the lower middle one) of those after the warm-up that made a
    # checkpoint and restored; each restore, speculative state and prompt save in it is a row with its span
    # and, inside, its copies, at the analysis's own times
    from ckptrace.dashboards.report import build_panels

    a = analyze_trace(upstream.trace)
    panels = dict(build_panels([a]))
    bars = {t.name: t for t in panels["timeline"].figure.data}
    it = a.iterations[a.iterations["kind"] == "prefill"].sort_values("start_ns", kind="stable")
    first = it[it["checkpoints"] > 0].groupby("tid")["start_ns"].min()  # each thread's warm-up ends there
    warm = it[it["start_ns"] > it["tid"].map(first).fillna(np.inf)]
    held = warm[(warm["checkpoints"] > 0) & warm["iter"].isin(set(a.restores["iter"]))]
    held = held.sort_values(["span_ns", "start_ns"], kind="stable")
    assert len(held) >= 2  # so the lower middle one is not the longest
    it = held.iloc[(len(held) - 1) // 2]
    t0, t1 = int(it["start_ns"]), int(it["end_ns"])
    assert np.isclose(bars["iteration"].x[0] * 1e6, t1 - t0, rtol=1e-6)
    ev = upstream.trace.events
    inside = ev[(ev["start_ns"] >= t0) & (ev["end_ns"] <= t1)]
    for name, kind, extra in (("restore", "restore", None), ("speculative state", "spec_state", None),
                              ("prompt save", "prompt_save", None), ("restore copy", "restore_copy", None),
                              ("copy", "copy", "prompt save")):
        want = by_start(inside[inside["kind"] == kind])
        if extra:  # the prompt save's copy, drawn on its row (the checkpoints' copies are another trace)
            want = by_start(want[want["ckpt"] == 0])
            drawn = [(b, x) for y, b, x in zip(bars[name].y, bars[name].base, bars[name].x) if y.startswith(extra)]
        else:
            drawn = list(zip(bars[name].base, bars[name].x))
        assert len(want) == len(drawn) > 0, name
        assert np.allclose([b for b, _ in drawn], (want["start_ns"] - t0) / 1e6, atol=1e-3), name
        assert np.allclose([x for _, x in drawn], (want["end_ns"] - want["start_ns"]) / 1e6, atol=1e-3), name
    titles = [x.text for x in panels["distributions"].figure.layout.annotations]
    assert {"restore (ms)", "restore copy (ms)", "prompt save (ms)"} <= set(titles)


def test_a_prompt_save_inlined_into_its_caller_is_its_state_copy(tmp_path):
    # as upstream's GCC build inlines server_slot::prompt_save into get_available_slot: no span to
    # probe, so the call to llama_state_seq_get_data_ext there is (symbols finds it as objdump does)
    from test_symbols import objdump_calls

    binary = variant("upstream")
    want_sites = objdump_calls(binary, "_ZN19server_context_impl18get_available_slotER11server_slotR20common_restore_truth",
                               "llama_state_seq_get_data_ext")
    plan = json.loads(ckptrace("symbols", "--json", binary).stdout)
    sites = sorted((p["vaddr"], p["point"]) for p in plan["points"] if p["point"].startswith("save_call"))
    assert len(want_sites) == 1 and sites == sorted([(want_sites[0][0], "save_call"), (want_sites[0][1], "save_call_end")])
    r = record_with_truth(tmp_path, [binary, "--iterations", "6", "--slots", "2", "--prompt-save-inlined"])
    want = by_start(r.truth["prompt_save_inlined"])
    ev = r.trace.events
    rows = by_start(ev[(ev["kind"] == "copy") & (ev["ckpt"] == 0)])
    assert len(rows) == len(want) == 2 and not (ev["kind"] == "prompt_save").any()
    assert (rows["bytes"] == want["bytes"]).all() and (rows["tid"] == want["tid"]).all()
    assert (want["copy_start_ns"] <= rows["start_ns"]).all()
    assert (rows["end_ns"] <= want["copy_start_ns"] + want["copy_ns"]).all()
    ps = analyze_trace(r.trace).prompt_saves
    assert (ps["source"] == "inlined").all() and len(ps) == 2 and (ps["iter"] > 0).all()
    assert within_cpu(ps["copy_cpu_ns"], want["copy_cpu_ns"])
