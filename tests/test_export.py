"""`ckptrace export`: the Perfetto file decoded back with the perfetto package's own protos, and the
Chrome JSON parsed, each checked slice by slice against `analyze --json` of the same trace (and, for
a fresh recording, against the workload's own clock)."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ckptrace.analyzers import analyze_trace
from ckptrace.renderers.json import analysis_json
from ckptrace.core.trace import read_trace, write_trace
from helpers import (CKPTRACE, assert_one_line_error, ckptrace, go, launched_pid, load_truth, proc_status, recorder,
                     wait_for_truth, wait_until, waiting_workload)

TRACES = Path(__file__).resolve().parent.parent / "samples" / "traces"
LEGS = [TRACES / f"{leg}.parquet" for leg in ("1-pool-off", "2-pool-on", "3-pool-off")]
MONOTONIC = 3  # BUILTIN_CLOCK_MONOTONIC
RAW_KINDS = {"fill": "fill", "copy": "copy", "mmap": "mmap", "munmap": "munmap", "decode": "llama_decode"}


@dataclass
class Decoded:
    """A Perfetto trace as tracks: descriptors, slices rebuilt from begin/end pairs, counters."""
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: dict[int, list[dict]] = field(default_factory=lambda: defaultdict(list))
    counters: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    clocks: set = field(default_factory=set)
    snapshot_clocks: set = field(default_factory=set)

    def processes(self) -> dict[int, pb.TrackDescriptor]:
        return {u: d for u, d in self.tracks.items() if d.HasField("process")}

    def threads_of(self, pid: int) -> dict[int, int]:
        """tid -> track uuid of the process's thread tracks."""
        return {d.thread.tid: u for u, d in self.tracks.items() if d.HasField("thread") and d.thread.pid == pid}

    def children(self, parent: int, name: str) -> list[int]:
        return [u for u, d in self.tracks.items() if d.parent_uuid == parent and d.name.startswith(name)]


def decode(data: bytes) -> Decoded:
    trace = pb.Trace()
    trace.ParseFromString(data)
    out, stacks = Decoded(), defaultdict(list)
    interned = defaultdict(dict)  # table -> iid -> string (the file has one packet sequence)
    last_ts: dict[int, int] = {}
    # The sequence starts clean, so trace processor keeps the interned names that follow.
    assert trace.packet[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert len({p.trusted_packet_sequence_id for p in trace.packet}) == 1
    for p in trace.packet:
        for table in ("event_names", "event_categories", "debug_annotation_names"):
            for entry in getattr(p.interned_data, table):
                interned[table][entry.iid] = entry.name
        if p.HasField("clock_snapshot"):
            out.snapshot_clocks |= {c.clock_id for c in p.clock_snapshot.clocks}
        if p.HasField("track_descriptor"):
            assert p.track_descriptor.uuid not in out.tracks, "uuid used twice"
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        out.clocks.add(p.timestamp_clock_id)
        e, stack = p.track_event, stacks[p.track_event.track_uuid]
        # In file order, each track's events never go back in time: nesting needs no re-sorting.
        assert p.timestamp >= last_ts.get(e.track_uuid, 0), "a track's events out of order"
        last_ts[e.track_uuid] = p.timestamp
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {}
            for a in e.debug_annotations:
                args[a.name or interned["debug_annotation_names"][a.name_iid]] = getattr(a, a.WhichOneof("value"))
            name = e.name or interned["event_names"][e.name_iid]
            cats = list(e.categories) or [interned["event_categories"][i] for i in e.category_iids]
            stack.append({"name": name, "ts": p.timestamp, "args": args, "cat": cats,
                          "parent": stack[-1] if stack else None, "depth": len(stack)})
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            s = stack.pop()
            s["dur"] = p.timestamp - s["ts"]
            out.slices[e.track_uuid].append(s)
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            out.counters[e.track_uuid].append((p.timestamp, e.counter_value))
    assert not any(stacks.values()), "a slice never ended"
    return out


def export(tmp_path: Path, *traces, fmt: str = "perfetto", name: str = "out") -> tuple[bytes, str]:
    """Chrome's format is asked for by the .json name alone (the default for such an -o)."""
    out = tmp_path / (f"{name}.json" if fmt == "chrome" else f"{name}.perfetto-trace")
    p = ckptrace("export", *traces, *(["--format", fmt] if fmt != "chrome" else []), "-o", out)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return out.read_bytes(), p.stderr


def check_leg(d: Decoded, doc: dict, events) -> None:
    """One leg of a decoded export against `analyze --json` of its trace and its event rows."""
    meta = doc["trace"]
    (puuid,) = [u for u, t in d.processes().items() if t.process.pid == meta["pid"]]
    assert meta["label"] in d.tracks[puuid].process.process_name
    assert list(d.tracks[puuid].process.cmdline) == (meta["command"] or [meta["executable"]])
    threads = d.threads_of(meta["pid"])
    assert set(threads) == set(int(t) for t in events.loc[events["kind"] != "rss", "tid"].unique())
    check_slices(d, threads, doc["checkpoints"], doc["iterations"], events, doc["restores"], doc["prompt_saves"])
    (held,) = d.children(puuid, "held checkpoint memory")
    assert d.tracks[held].counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    assert max(v for _, v in d.counters[held]) >= max(c["bytes"] for c in doc["checkpoints"])
    # The metadata track: one slice over the recording.
    (meta_track,) = d.children(puuid, "ckptrace recording")
    (rec,) = d.slices[meta_track]
    assert rec["args"]["label"] == meta["label"] and rec["args"]["lost_events"] == meta["lost_events"]
    assert rec["args"]["complete"] is True
    exe = [o["build_id"] for o in meta["objects"] if o["path"] == meta["executable"]]
    assert rec["args"]["build_id"] == exe[0]


def check_slices(d: Decoded, threads: dict[int, int], checkpoints: list, iterations: list, events,
                 restores: list = (), prompt_saves: list = (), cut_short: bool = False) -> None:
    """The slices on these thread tracks against analyze's checkpoints and iterations (those of
    other threads must not be here) and the event rows of these threads. In a cut-short stream the
    checkpoint being made at the cut may have its fill, copy or mmap rows and not its own row yet:
    those slices have no checkpoint around them and start after the thread's last recorded one."""
    by_kind = defaultdict(list)
    for tid, uuid in threads.items():
        for s in d.slices[uuid]:
            by_kind[s["cat"][0]].append({**s, "tid": tid})
    last_end = {tid: max((c["end_ns"] for c in checkpoints if c["tid"] == tid), default=0) for tid in threads}
    recorded = {c["ckpt"] for c in checkpoints}

    def unfinished(s: dict) -> bool:
        """A slice of the checkpoint the cut interrupted (only in a cut-short stream)."""
        return cut_short and s["ts"] >= last_end[s["tid"]] and s["args"].get("ckpt") not in recorded \
            and (s["parent"] is None or s["parent"]["cat"] != ["ckptrace.checkpoint"])
    # Every checkpoint is one slice of its exact span on its thread, with analyze's figures.
    want = sorted((c["tid"], c["start_ns"], c["end_ns"] - c["start_ns"], c["bytes"], c["fill_ns"])
                  for c in checkpoints if c["tid"] in threads)
    got = sorted((s["tid"], s["ts"], s["dur"], s["args"]["bytes"], s["args"]["fill_ns"])
                 for s in by_kind["ckptrace.checkpoint"])
    assert got == want and len(got) > 0
    # Iterations likewise, each checkpoint nested in the iteration it belongs to.
    its = sorted((i["tid"], i["start_ns"], i["end_ns"] - i["start_ns"], i["kind"]) for i in iterations
                 if i["tid"] in threads)
    assert sorted((s["tid"], s["ts"], s["dur"], s["args"]["kind"]) for s in by_kind["ckptrace.iteration"]) == its
    for s in by_kind["ckptrace.checkpoint"]:
        if s["args"]["iter"]:
            # Inside its iteration; directly, or in the create_checkpoint span that makes it (format 3).
            parent = s["parent"]
            if parent["cat"] == ["ckptrace.create"]:
                parent = parent["parent"]
            assert parent["cat"] == ["ckptrace.iteration"] and parent["args"]["iter"] == s["args"]["iter"]
    # Raw spans: one slice per row, fill and copy inside their checkpoint, a fill's mmap inside it.
    for kind, name in RAW_KINDS.items():
        rows = events[(events["kind"] == kind) & events["tid"].isin(list(threads))]
        got = sorted((s["tid"], s["ts"], s["dur"]) for s in by_kind[f"ckptrace.{kind}"])
        assert got == sorted(zip(rows["tid"], rows["start_ns"], rows["end_ns"] - rows["start_ns"])), kind
        assert all(s["name"] == name for s in by_kind[f"ckptrace.{kind}"])
    cut_faults = 0
    for s in by_kind["ckptrace.fill"] + by_kind["ckptrace.copy"]:
        if s["args"]["ckpt"] == 0:  # a prompt save's state copy (format 3), inside its save
            assert s["cat"] == ["ckptrace.copy"] and s["parent"]["cat"] == ["ckptrace.prompt_save"]
            continue
        if unfinished(s):
            cut_faults += s["args"]["faults"]
            continue
        assert s["parent"]["cat"] == ["ckptrace.checkpoint"] and s["parent"]["args"]["ckpt"] == s["args"]["ckpt"]
    for s in by_kind["ckptrace.mmap"]:
        if s["args"]["phase"] == "fill" and not (cut_short and s["ts"] >= last_end[s["tid"]]):
            assert s["parent"]["cat"] == ["ckptrace.fill"]
    # The fault counters add up to the checkpoints' fill + copy faults and the restores' and prompt
    # saves' copy faults (and, cut short, those of the interrupted checkpoint's fill or copy).
    fault_tracks = [u for t in threads.values() for u in d.children(t, "page faults")]
    faults = sum(v for u in fault_tracks for _, v in d.counters[u])
    assert faults == sum(c["fill_faults"] + c["copy_faults"] for c in checkpoints if c["tid"] in threads) \
        + sum(r["copy_faults"] for r in restores if r["tid"] in threads) \
        + sum(p["copy_faults"] for p in prompt_saves if p["tid"] in threads) + cut_faults > 0


def test_perfetto_export_of_an_aba_matches_analyze(tmp_path):
    data, err = export(tmp_path, *LEGS)
    assert "wrote" in err and "3 process track(s)" in err
    d = decode(data)
    assert d.clocks == {MONOTONIC} and MONOTONIC in d.snapshot_clocks
    assert len(d.processes()) == 3 and len({t.process.pid for t in d.processes().values()}) == 3
    for leg in LEGS:
        trace = read_trace(leg)
        check_leg(d, analysis_json(analyze_trace(trace)), trace.events)
    # Held checkpoint memory rises once per buffer the workload had to allocate (a checkpoint that
    # missed its pool, by the workload's own account): 2 in the pool-on leg against 20 without.
    for uuid, proc in d.processes().items():
        leg = TRACES / f"{proc.process.process_name.split('(')[1].split('.')[0]}.truth.jsonl"
        misses = (~load_truth(leg)["checkpoint"]["pool_hit"].astype(bool)).sum()
        values = [v for _, v in d.counters[d.children(uuid, "held checkpoint memory")[0]]]
        rises = sum(b > a for a, b in zip([0, *values], values))
        assert rises == misses and values[-1] == 0  # the workload frees every buffer before it exits

def test_packets_written_in_chunks_make_the_same_file(monkeypatch):
    """Serialized traces concatenate into one: the file written 100 packets at a time is the
    same bytes as the one written at once."""
    from ckptrace.renderers import perfetto
    from ckptrace.renderers.timeline import build_timeline

    timeline = build_timeline([analyze_trace(read_trace(p)) for p in LEGS], LEGS)
    whole, chunked = io.BytesIO(), io.BytesIO()
    perfetto.perfetto_writer(timeline)(whole)
    monkeypatch.setattr(perfetto, "CHUNK", 100)
    perfetto.perfetto_writer(timeline)(chunked)
    assert len(decode(whole.getvalue()).tracks) > 10
    assert chunked.getvalue() == whole.getvalue()


def test_chrome_export_matches_analyze(tmp_path):
    data, _ = export(tmp_path, LEGS[0], LEGS[1], fmt="chrome")
    doc = json.loads(data)
    ev = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["clock"] == "CLOCK_MONOTONIC"
    base = doc["otherData"]["ts_base_ns"]
    assert base == min(read_trace(leg).meta.attach_ns for leg in LEGS[:2])  # the first timestamp: ts 0
    assert min(e["ts"] for e in ev if "ts" in e) == 0
    for leg in LEGS[:2]:
        a = analysis_json(analyze_trace(read_trace(leg)))
        pid = a["trace"]["pid"]
        names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == pid]
        assert len(names) == 1 and a["trace"]["label"] in names[0]
        ck = [e for e in ev if e["ph"] == "X" and e["pid"] == pid and e["cat"] == "ckptrace.checkpoint"]
        # Microseconds since ts_base_ns: the nanoseconds survive.
        got = sorted((e["tid"], base + round(e["ts"] * 1000), round(e["dur"] * 1000), e["args"]["fill_ns"]) for e in ck)
        want = sorted((c["tid"], c["start_ns"], c["end_ns"] - c["start_ns"], c["fill_ns"]) for c in a["checkpoints"])
        assert got == want
        faults = sum(e["args"]["faults"] for e in ev if e["ph"] == "C" and e["pid"] == pid
                     and e["name"].startswith("page faults"))
        assert faults == sum(c["fill_faults"] + c["copy_faults"] for c in a["checkpoints"])
        held = [e for e in ev if e["ph"] == "C" and e["pid"] == pid and e["name"] == "held checkpoint memory"]
        assert held and all("bytes" in e["args"] for e in held)
        rec = [e for e in ev if e["ph"] == "X" and e["pid"] == pid and e["cat"] == "ckptrace.recording"]
        assert len(rec) == 1 and rec[0]["args"]["complete"] is True


def test_chrome_timestamps_keep_every_ns_after_200_days_of_uptime(tmp_path):
    """CLOCK_MONOTONIC counts from boot: at 200 days (1.7e16 ns, past 2^53) an absolute microsecond
    double can't hold every ns. The sample trace moved there (an odd ns offset) exports with ts
    relative to ts_base_ns, and every slice comes back to the exact ns of its row."""
    t = read_trace(LEGS[0])
    shift = 200 * 86_400 * 10**9 + 123_456_789 - int(t.meta.attach_ns)
    ev = t.events.assign(start_ns=t.events["start_ns"] + shift, end_ns=t.events["end_ns"] + shift)
    meta = replace(t.meta, attach_ns=t.meta.attach_ns + shift, stop_ns=t.meta.stop_ns + shift,
                   first_event_ns=t.meta.first_event_ns + shift)
    moved = tmp_path / "uptime-200d.parquet"
    write_trace(moved, ev, meta)
    starts = ev["start_ns"].to_numpy().tolist()
    # the premise: as absolute microseconds (the old format) some of these ns are lost
    assert any(round(round(s / 1000, 3) * 1000) != s for s in starts)
    doc = json.loads(export(tmp_path, moved, fmt="chrome")[0])
    base = doc["otherData"]["ts_base_ns"]
    assert base == meta.attach_ns and isinstance(base, int)
    got = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            got[e["cat"].split(".", 1)[1]].append((base + round(e["ts"] * 1000), round(e["dur"] * 1000)))
    a = analyze_trace(read_trace(moved))
    want = {"checkpoint": a.checkpoints, "iteration": a.iterations,
            **{k: ev[ev["kind"] == k] for k in RAW_KINDS}}
    for kind, rows in want.items():
        exact = sorted(zip(rows["start_ns"].tolist(), (rows["end_ns"] - rows["start_ns"]).tolist()))
        assert sorted(got[kind]) == exact and exact, kind
    assert got["recording"] == [(meta.attach_ns, meta.stop_ns - meta.attach_ns)]
    counters = [base + round(e["ts"] * 1000) for e in doc["traceEvents"] if e["ph"] == "C"]
    fills = ev[ev["kind"] == "fill"]
    assert set(fills["start_ns"]) | set(fills["end_ns"]) <= set(counters)  # the fault counter's steps


def test_the_same_trace_twice_is_two_processes(tmp_path):
    d = decode(export(tmp_path, LEGS[0], LEGS[0])[0])
    procs = list(d.processes().values())
    pid = read_trace(LEGS[0]).meta.pid
    assert len(procs) == 2 and {p.process.pid for p in procs} == {pid, pid + (1 << 23)}
    moved = [p for p in procs if p.process.pid != pid][0]
    assert f"pid {pid}" in moved.process.process_name  # the real pid stays visible
    assert set(d.threads_of(pid)).isdisjoint(d.threads_of(moved.process.pid))


def test_lost_events_and_a_cut_short_recording_are_marked(tmp_path):
    trace = read_trace(LEGS[0])
    trace.meta.lost_events = 7
    trace.meta.complete, trace.meta.cut_short = False, "the recorder was killed"
    damaged = tmp_path / "damaged.parquet"
    write_trace(damaged, trace.events, trace.meta)
    data, err = export(tmp_path, damaged)
    assert "ckptrace: warning: damaged.parquet: cut short (the recorder was killed) and 7 lost events" in err
    d = decode(data)
    (puuid,) = d.processes()
    (rec,) = d.slices[d.children(puuid, "ckptrace recording")[0]]
    assert rec["name"] == "recording: pool-off (cut short, 7 lost events)"
    assert rec["args"]["complete"] is False and rec["args"]["lost_events"] == 7
    assert rec["args"]["cut_short"] == "the recorder was killed"
    # What is there is exported all the same.
    ck = [s for u in d.threads_of(trace.meta.pid).values() for s in d.slices[u] if s["cat"] == ["ckptrace.checkpoint"]]
    assert len(ck) == (trace.events["kind"] == "checkpoint").sum()


def test_requests_are_slices_with_analyzes_breakdown(tmp_path):
    """A request file beside the trace (as `drive -o` writes it): each answered request's time to
    first token is a slice with analyze --requests' figures; concurrent ones on lanes of their own."""
    trace = tmp_path / "run.parquet"
    shutil.copy(LEGS[0], trace)
    ck = analyze_trace(read_trace(trace)).checkpoints.sort_values("start_ns", ignore_index=True)
    s, e = ck["start_ns"].tolist(), ck["end_ns"].tolist()
    windows = [(s[0] - 1_000_000, e[0]), ((s[0] + e[0]) // 2, e[2]), (e[3] + 1, e[5]), (s[6], None)]
    rows = [{"request": i, "client": i % 2, "prompt_tokens": 64, "start_unix_ns": 1, "start_ns": a,
             "ttft_ns": None if b is None else b - a, "total_ns": None if b is None else b - a + 5_000_000,
             "status": "ok" if b else "error: ConnectionResetError", "predicted_tokens": 4}
            for i, (a, b) in enumerate(windows)]
    (tmp_path / "run.requests.json").write_text(json.dumps(rows))
    p = ckptrace("analyze", trace, "--requests", tmp_path / "run.requests.json", "--json")
    assert p.returncode == 0, p.stderr
    want = sorted((r["request"], r["start_ns"], r["ttft_ns"], r["stall_ns"], r["ckpt_fill_ns"], r["ckpt_ns"])
                  for r in json.loads(p.stdout)["requests"] if r["ttft_ns"] is not None)
    d = decode(export(tmp_path, trace)[0])
    (puuid,) = d.processes()
    lanes = d.children(puuid, "requests: time to first token")
    assert len(lanes) == 2  # requests 0 and 1 overlap
    got = sorted((x["args"]["request"], x["ts"], x["dur"], x["args"]["stall_ns"], x["args"]["ckpt_fill_ns"],
                  x["args"]["ckpt_ns"]) for u in lanes for x in d.slices[u])
    assert got == want and len(got) == 3  # the failed request has no window to draw
    assert all(x["cat"] == ["ckptrace.request"] for u in lanes for x in d.slices[u])


def test_stdout_and_bad_input(tmp_path):
    p = subprocess.run([CKPTRACE, "export", LEGS[0], "-o", "/dev/stdout"], capture_output=True, timeout=120)
    assert p.returncode == 0 and len(decode(p.stdout).processes()) == 1
    copy = tmp_path / "t.parquet"
    shutil.copy(LEGS[0], copy)
    before = copy.read_bytes()
    assert_one_line_error(ckptrace("export", copy, "-o", copy), "is one of the files this command reads")
    assert copy.read_bytes() == before
    (tmp_path / "junk.parquet").write_text("not a trace")
    assert_one_line_error(ckptrace("export", tmp_path / "junk.parquet", "-o", tmp_path / "x"), "not a ckptrace trace")
    assert_one_line_error(ckptrace("export", copy, "-o", tmp_path), "is a directory")
    later = [{"request": 0, "client": 0, "prompt_tokens": 8, "start_unix_ns": 1, "start_ns": 1 << 62,
              "ttft_ns": 1000, "total_ns": 2000, "status": "ok", "predicted_tokens": 1}]
    (tmp_path / "later.json").write_text(json.dumps(later))
    assert_one_line_error(ckptrace("export", copy, "--requests", tmp_path / "later.json", "-o", tmp_path / "x"),
                          "later.json")
    assert_one_line_error(ckptrace("export", copy, copy, "--requests", tmp_path / "later.json", "-o", tmp_path / "x"),
                          "--requests given 1 times for 2 traces", code=2)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["junk.parquet", "later.json", "t.parquet"]  # nothing written


def test_no_output_replaces_a_file_read_beside_or_through_a_link(tmp_path):
    """The request file found beside the trace (not named on the command line), a link to it, and
    analyze --csv's files that are the trace or the request file: refused, nothing written."""
    trace = tmp_path / "run.parquet"
    shutil.copy(LEGS[0], trace)
    a = analyze_trace(read_trace(trace))
    s = int(a.checkpoints["start_ns"].min())
    rows = [{"request": 0, "client": 0, "prompt_tokens": 8, "start_unix_ns": 1, "start_ns": s, "ttft_ns": 1000,
             "total_ns": 2000, "status": "ok", "predicted_tokens": 1}]
    beside = tmp_path / "run.requests.json"
    beside.write_text(json.dumps(rows))
    (tmp_path / "link.json").symlink_to(beside)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for out in (beside, tmp_path / "link.json"):
        assert_one_line_error(ckptrace("export", trace, "-o", out), "is one of the files this command reads")
    (tmp_path / "link.html").symlink_to(beside)
    assert_one_line_error(ckptrace("dashboard", trace, "-o", tmp_path / "link.html"),
                          "is one of the files this command reads")
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(beside, d / "requests.csv")
    shutil.copy(trace, d / "checkpoints.csv")
    assert_one_line_error(ckptrace("analyze", trace, "--requests", d / "requests.csv", "--csv", d),
                          "choose another --csv folder")
    assert_one_line_error(ckptrace("analyze", d / "checkpoints.csv", "--csv", d), "checkpoints.csv: is one of")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == {**before, "link.html": beside.read_bytes()}
    assert (d / "requests.csv").read_bytes() == beside.read_bytes() and sorted(os.listdir(d)) == ["checkpoints.csv", "requests.csv"]
    assert (d / "checkpoints.csv").read_bytes() == trace.read_bytes()


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_export_of_a_fresh_recording_of_two_processes(tmp_path, workload):
    """Two workloads recorded at once (pool off and on): each is a process track of its own, and
    every checkpoint is a slice on its thread holding the workload's own clock interval."""
    truth = {label: tmp_path / f"{label}.truth.jsonl" for label in ("pool-off", "pool-on")}
    trace_path = tmp_path / "two.parquet"
    with waiting_workload(workload, "--iterations", "6", "--pool", "off", truth=truth["pool-off"]) as off, \
            waiting_workload(workload, "--iterations", "6", "--pool", "on", truth=truth["pool-on"]) as on, \
            recorder(trace_path, "--pid", f"{off.pid}=pool-off", "--pid", f"{on.pid}=pool-on") as rec:
        go(off)
        go(on)
        assert off.wait(60) == 0 and on.wait(60) == 0
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        pids = {"pool-off": off.pid, "pool-on": on.pid}
    p = ckptrace("analyze", trace_path, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    trace = read_trace(trace_path)
    d = decode(export(tmp_path, trace_path)[0])
    assert {t.process.pid for t in d.processes().values()} == set(pids.values())
    for label, pid in pids.items():
        (puuid,) = [u for u, t in d.processes().items() if t.process.pid == pid]
        assert d.tracks[puuid].process.process_name == f"{label} (two.parquet)"
        threads = d.threads_of(pid)
        mine = trace.events[trace.events["pid"] == pid]
        assert set(threads) == set(mine.loc[mine["kind"] != "rss", "tid"].unique())  # RSS rows: a counter
        check_slices(d, threads, [c for c in doc["checkpoints"] if c["tid"] in threads], doc["iterations"], mine)
        assert d.children(puuid, "resident memory (RSS)")  # record's RSS rows, per process
        t = load_truth(truth[label])["checkpoint"].sort_values("start_ns").reset_index(drop=True)
        ck = sorted((s for u in threads.values() for s in d.slices[u] if s["cat"] == ["ckptrace.checkpoint"]),
                    key=lambda s: s["ts"])
        assert len(ck) == len(t) > 0
        for s, (_, row) in zip(ck, t.iterrows()):
            # The workload reads its clock inside update_tgt, the probes fire at its entry and
            # return: the slice holds the workload's own interval, on the thread it names.
            assert any(x is s for x in d.slices[threads[row["tid"]]])
            assert s["ts"] <= row["start_ns"] and row["end_ns"] <= s["ts"] + s["dur"]
            fill = [c for c in d.slices[threads[row["tid"]]] if c["parent"] is s and c["cat"] == ["ckptrace.fill"]]
            assert len(fill) == (0 if row["pool_hit"] else 1)
            # The fill slice (the resize call) lies inside the workload's clock reads around it.
            for f in fill:
                assert row["fill_start_ns"] <= f["ts"] and f["ts"] + f["dur"] <= row["fill_start_ns"] + row["fill_ns"]


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_export_of_a_recording_cut_short_by_sigkill(tmp_path, workload):
    """The file a SIGKILLed recorder leaves (a stream readable up to its last flush) exports as it
    is: every checkpoint read from it is a slice, and the metadata track says it was cut short."""
    out, truth = tmp_path / "killed.parquet", tmp_path / "t.jsonl"
    with recorder(out, "--", workload, "--iterations", "1000000", "--ckpt-mib", "8", "--truth", truth) as rec:
        child = launched_pid(rec.start_line)
        wait_for_truth(truth, 4, watch=rec)
        # Killed once the stream holds checkpoints (it is flushed every half second).
        wait_until(lambda: out.exists() and (read_trace(out).events["kind"] == "checkpoint").sum() >= 2,
                   "2 checkpoints flushed to the stream", watch=rec)
        rec.kill()
        rec.wait(30)
    wait_until(lambda: not proc_status(child), "the launched command to die with its recorder")
    p = ckptrace("analyze", out, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["trace"]["complete"] is False
    data, err = export(tmp_path, out)
    assert f"ckptrace: warning: killed.parquet: cut short ({doc['trace']['cut_short']})" in err
    d = decode(data)
    (puuid,) = d.processes()
    (rec_slice,) = d.slices[d.children(puuid, "ckptrace recording")[0]]
    assert "(cut short" in rec_slice["name"] and rec_slice["args"]["complete"] is False
    threads = d.threads_of(doc["trace"]["pid"])
    check_slices(d, threads, doc["checkpoints"], doc["iterations"], read_trace(out).events, cut_short=True)


@pytest.mark.ebpf
@pytest.mark.usefixtures("require_root_ebpf")
def test_export_of_the_whole_state_path(tmp_path):
    """The upstream-generation workload with every state kind (create_checkpoint with its
    evictions, speculative state, restores, prompt saves): each is a slice nested where the
    server makes it, restores as analyze --json reads them."""
    from ckptrace.samples import workload_binary

    trace_path = tmp_path / "state.parquet"
    p = ckptrace("record", "--quiet", "--label", "upstream", "-o", trace_path, "--", workload_binary(variant="upstream"),
                 "--iterations", "9", "--slots", "2", "--restore-every", "1", "--spec", "--spec-state-kib", "512",
                 "--prompt-save", timeout=180)
    assert p.returncode == 0, p.stderr
    p = ckptrace("analyze", trace_path, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    events = read_trace(trace_path).events
    d = decode(export(tmp_path, trace_path)[0])
    check_leg(d, doc, events)
    slices = [s for u in d.threads_of(doc["trace"]["pid"]).values() for s in d.slices[u]]
    kinds = {s["cat"][0].split(".")[1] for s in slices}
    assert {"create", "spec_state", "restore", "restore_copy", "prompt_save"} <= kinds
    for kind in kinds - {"checkpoint", "iteration"}:  # one slice per row
        assert sum(s["cat"] == [f"ckptrace.{kind}"] for s in slices) == (events["kind"] == kind).sum(), kind
    parent = {"create": "iteration", "spec_state": "create", "restore": "iteration", "restore_copy": "restore",
              "prompt_save": "iteration"}
    for s in slices:
        kind = s["cat"][0].split(".")[1]
        if kind in parent:
            assert s["parent"]["cat"] == [f"ckptrace.{parent[kind]}"], (kind, s["parent"]["cat"])
        if kind == "munmap" and s["args"]["phase"] == "create":  # an eviction, before its checkpoint
            assert s["parent"]["cat"] == ["ckptrace.create"]
    assert not [t for t in d.tracks.values() if "overlapping" in t.name]
    # Each restore analyze reads is a slice of its span, its copies inside it adding up to copy_ns.
    restores = {(s["ts"], s["dur"]): s for s in slices if s["cat"] == ["ckptrace.restore"]}
    assert len(doc["restores"]) >= 1
    for r in doc["restores"]:
        if r["source"] == "checkpoint":
            s = restores[(r["start_ns"], r["end_ns"] - r["start_ns"])]
            copies = [c for c in slices if c["parent"] is s and c["cat"] == ["ckptrace.restore_copy"]]
            assert sum(c["dur"] for c in copies) == r["copy_ns"] and s["args"]["bytes"] == r["bytes"]


def _crafted_trace(path: Path) -> None:
    """Two processes (one with rows of pid 0, the trace's), threads in both, an overlapping span,
    spans that start and end together (nested by kind, then in build_timeline's order), RSS rows."""
    import pandas as pd

    from ckptrace.core.meta import TraceMeta
    ms = 1_000_000
    rows = []
    for pid, tid, base in ((0, 11, 0), (700, 21, 5 * ms), (700, 22, 6 * ms), (0, 12, ms)):
        for i in range(6):
            t = base + i * 100 * ms
            ck, it = 1 + i + 10 * tid, 1 + i + 10 * tid
            rows += [("iteration", pid, tid, t, t + 50 * ms, 0, it, 0, 0, "none"),
                     ("checkpoint", pid, tid, t + ms, t + 20 * ms, ck, it, 1 << 20, 0, "iteration"),
                     ("fill", pid, tid, t + ms, t + 12 * ms, ck, it, 1 << 20, 0, "checkpoint"),
                     ("copy", pid, tid, t + 12 * ms, t + 20 * ms, ck, it, 1 << 20, 0, "checkpoint"),
                     ("mmap", pid, tid, t + 2 * ms, t + 2 * ms + 10, ck, it, 1 << 21, 0x7000_0000 + i * (4 << 20),
                      "fill"),
                     ("munmap", pid, tid, t + 2 * ms, t + 2 * ms + 10, ck, it, 1 << 21, 0x7100_0000, "fill"),
                     ("decode", pid, tid, t + 25 * ms, t + 55 * ms, 0, it, 0, 0, "iteration"),  # crosses the iteration's end
                     ("rss", pid, tid, t + 30 * ms, t + 30 * ms, 0, 0, 64 << 20, 0, "none")]
    ev = pd.DataFrame(rows, columns=["kind", "pid", "tid", "start_ns", "end_ns", "ckpt", "iter", "bytes", "addr",
                                     "phase"])
    ev["faults"] = ev.index.to_numpy() % 7
    ev = ev.sort_values("end_ns", kind="stable").reset_index(drop=True)
    write_trace(path, ev, TraceMeta(label="crafted", pid=500, stop_ns=int(ev["end_ns"].max())))


@pytest.mark.parametrize("legs", [["crafted"], ["1-pool-off"], ["5-upstream"], ["6-llama-pool-off"],
                                  ["1-pool-off", "2-pool-on", "1-pool-off"], ["crafted", "crafted"]])
def test_the_streamed_timeline_writes_the_same_bytes(tmp_path, legs):
    """export makes its timeline while writing it (renderers/timeline_stream.py: sorted runs on
    disk, merged per thread): the same bytes in both formats as the timeline built whole, with
    runs of a few rows (many runs to merge, a process's rows across several)."""
    from ckptrace.analyzers import analyze_file
    from ckptrace.renderers.chrome import chrome_writer
    from ckptrace.renderers.perfetto import perfetto_writer
    from ckptrace.renderers.timeline import build_timeline, process_count, recording_notes, slice_count
    from ckptrace.renderers.timeline_stream import stream_timeline

    _crafted_trace(tmp_path / "crafted.parquet")
    paths = [tmp_path / "crafted.parquet" if leg == "crafted" else TRACES / f"{leg}.parquet" for leg in legs]
    whole = build_timeline([analyze_trace(read_trace(p)) for p in paths], paths)
    for writer in (perfetto_writer, chrome_writer):
        want = io.BytesIO()
        writer(whole)(want)
        for rows in (5, 64, 1 << 18):
            streamed = stream_timeline(paths, [analyze_file(p) for p in paths], batch_rows=rows)
            spills = [f for leg in streamed.legs for f in (leg.spans, leg.faults)]
            # The spill files have no name while in use: a killed export leaves nothing behind.
            assert all(os.readlink(f"/proc/self/fd/{f.fileno()}").endswith(" (deleted)") for f in spills)
            got = io.BytesIO()
            try:
                writer(streamed)(got)
            finally:
                streamed.close()
            assert got.getvalue() == want.getvalue(), (writer.__name__, rows)
            assert (slice_count(streamed), process_count(streamed), recording_notes(streamed)) == \
                (slice_count(whole), process_count(whole), recording_notes(whole))
            assert all(f.closed for f in spills)
    if legs == ["crafted"]:
        assert any(th.overlapping for p in whole.processes for th in p.threads)
        assert len(whole.processes) == 2


def test_export_killed_while_spilling_leaves_nothing_in_tmpdir(tmp_path):
    """Issue 39: export's sorted runs (about 78 bytes per event) went to a named folder in TMPDIR,
    left there when export was killed. Now they are unlinked files: SIGKILL while they are open
    leaves TMPDIR empty."""
    import signal
    import time

    import numpy as np
    import pandas as pd

    from ckptrace.core.meta import TraceMeta
    n = 400_000
    t = np.arange(n, dtype="int64") * 1000
    ev = pd.DataFrame({"kind": np.where(np.arange(n) % 2, "fill", "copy"), "pid": np.int32(900), "tid": np.int32(900),
                       "start_ns": t, "end_ns": t + 500, "ckpt": np.arange(n) // 2, "faults": np.arange(n) % 5})
    path = tmp_path / "big.parquet"
    write_trace(path, ev, TraceMeta(label="big", pid=900, stop_ns=int(t[-1] + 500)))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    p = subprocess.Popen([str(CKPTRACE), "export", str(path), "-o", str(tmp_path / "out.json")],
                         env={**os.environ, "TMPDIR": str(tmpdir)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    caught = False
    try:
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline and not caught:
            try:
                links = [os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")]
            except OSError:
                links = []
            caught = any(link.startswith(str(tmpdir)) for link in links)
            time.sleep(0.01)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert caught, "export ended before its spill files were seen"
    assert list(tmpdir.iterdir()) == []


EXPORT_PEAK = """\
import os
from ckptrace.renderers.chrome import chrome_writer
from ckptrace.renderers.perfetto import perfetto_writer
from ckptrace.renderers.timeline_stream import stream_analysis, stream_timeline
a = stream_analysis(sys.argv[1])
timeline = stream_timeline([sys.argv[1]], [a])
assert a.rows.frames == {} and "fill_fault_ns" not in a.iterations
with open(os.devnull, "wb") as f:
    (perfetto_writer if sys.argv[2] == "perfetto" else chrome_writer)(timeline)(f)
timeline.close()
"""


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_export_memory_against_trace_length(tmp_path, fmt):
    """Issue 39: the streamed export (renderers/timeline_stream.py) makes of the analysis only what
    its slices and counters show (stream_analysis, as the CLI): the memory rows go once the
    counters' series are made, the iteration table is made with its shown columns only. Its traced
    peak (tracemalloc: Python and numpy, deterministic) at 50,000 and 200,000 events of
    bench_memory's trace grows by about 87 bytes an event in both formats (the kept rows and the
    tables while they are made), against 90 with analyze_file's analysis and 135 before that: held
    under 105. Not flat (docs/performance.md, "Memory against trace length")."""
    from helpers import bench_trace, traced_peak

    small, large = 50_000, 200_000
    peaks = [traced_peak(EXPORT_PEAK, bench_trace(tmp_path / f"{n}.parquet", n), fmt) for n in (small, large)]
    per_event = (peaks[1] - peaks[0]) / (large - small)
    assert per_event < 105, (peaks, per_event)


@pytest.mark.parametrize("name", ["1-pool-off", "2-pool-on", "5-upstream", "6-llama-pool-off"])
def test_stream_analysis_makes_the_tables_of_the_whole_analysis(name):
    """Issue 39: export's stream_analysis makes the checkpoint table, the iteration table's shown
    columns and the counters' series without the rest of analyze's analysis: the same values as
    analyze_file's tables and the series made from its memory rows."""
    import pandas as pd
    from ckptrace.analyzers import analyze_file
    from ckptrace.analyzers.memory import held_series, rss_series
    from ckptrace.renderers.timeline import ITERATION_ARGS
    from ckptrace.renderers.timeline_stream import _with_pids, stream_analysis

    path = TRACES / f"{name}.parquet"
    whole, part = analyze_file(path), stream_analysis(path)
    pd.testing.assert_frame_equal(part.checkpoints, whole.checkpoints)
    shown = [c for c in whole.iterations.columns if c in {*ITERATION_ARGS, "kind", "tid", "start_ns", "end_ns",
                                                           "span_faults", "boundary"}]
    assert list(part.iterations.columns) == shown
    pd.testing.assert_frame_equal(part.iterations, whole.iterations[shown])
    memory = _with_pids(whole.rows.of_group("memory"), whole.trace.meta)
    for made, want in zip(part.series, (held_series(memory), rss_series(memory))):
        pd.testing.assert_frame_equal(made, want)
    assert part.rows.frames == {}
