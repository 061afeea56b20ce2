"""The sample workload, untraced: its ground truth is self-consistent and true to the mechanism."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import CkptraceError
from ckptrace.samples import workload_binary
from ckptrace.core.units import MIB
from helpers import go, truth_records, waiting_workload

PAGE = os.sysconf("SC_PAGESIZE")
DEFAULT_APPEND = "_ZNSt6vectorIhSaIhEE17_M_default_appendEm"
UPDATE_TGT = "_ZN24common_prompt_checkpoint10update_tgtEP13llama_contextij"
# Short decode spins: the tests check the checkpoint path, not the decode.
FAST = ["--decode-us", "100"]


def run(exe, tmp_path, *args, check=True):
    truth = tmp_path / "truth.jsonl"
    proc = subprocess.run(
        [str(exe), "--truth", str(truth), *FAST, *args], capture_output=True, text=True, timeout=60
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc, truth_records(truth)


def split(records):
    ckpts = [r for r in records if r["type"] == "checkpoint"]
    iters = [r for r in records if r["type"] == "iteration"]
    summaries = [r for r in records if r["type"] == "summary"]
    assert len(summaries) == 1 and records[-1] is summaries[0]
    return ckpts, iters, summaries[0]


def check_consistent(records, slots=2, iterations=24, dpp=2, prompt=64, draft=False):
    """What every run's truth must satisfy, whatever the options."""
    ckpts, iters, summary = split(records)
    kinds = ["prefill" if i % (dpp + 1) == 0 else "decode" for i in range(iterations)]
    assert [it["iter"] for it in iters] == list(range(1, iterations + 1))
    assert [it["kind"] for it in iters] == kinds
    main_tid = iters[0]["tid"]
    for it in iters:
        prefill = it["kind"] == "prefill"
        mine = [c for c in ckpts if c["iter"] == it["iter"]]
        assert it["checkpoints"] == (slots if prefill else 0)
        assert sum(not c["draft"] for c in mine) == it["checkpoints"]
        assert sum(c["draft"] for c in mine) == (it["checkpoints"] if draft else 0)
        assert sorted({c["slot"] for c in mine}) == (list(range(slots)) if prefill else [])
        assert it["tokens"] == (slots * prompt if prefill else slots)
        assert it["prompt_tokens"] == (slots * prompt if prefill else 0)
        assert it["tid"] == main_tid
        assert it["start_ns"] <= it["end_ns"]
        for c in mine:
            assert c["tid"] == main_tid
            fill_end = c["fill_start_ns"] + c["fill_ns"]
            copy_end = c["copy_start_ns"] + c["copy_ns"]
            assert it["start_ns"] <= c["start_ns"] <= c["fill_start_ns"] <= fill_end
            assert fill_end <= c["copy_start_ns"] <= copy_end <= c["end_ns"] <= it["end_ns"]
    for a, b in zip(iters, iters[1:]):
        assert a["end_ns"] <= b["start_ns"]
    assert summary["checkpoints"] == sum(not c["draft"] for c in ckpts)
    assert summary["iterations"] == iterations
    assert summary["prefill_iterations"] == kinds.count("prefill")
    assert summary["slots"] == slots
    assert summary["ckpt_bytes_first"] == ckpts[0]["bytes"]
    assert summary["wall_ns"] >= iters[-1]["end_ns"] - iters[0]["start_ns"]
    assert summary["minflt_total"] >= sum(c["fill_faults"] + c["copy_faults"] for c in ckpts)
    return ckpts, iters, summary


def pages(nbytes):
    return nbytes / PAGE


def test_pool_off_every_fill_faults_in_fresh_pages(workload, tmp_path):
    proc, records = run(workload, tmp_path, "--iterations", "6", "--ckpt-mib", "40")
    ckpts, _, summary = check_consistent(records, iterations=6)
    assert len(ckpts) == 4 and summary["pool"] is False
    for c in ckpts:
        assert c["bytes"] == 40 * MIB
        assert not c["pool_hit"]
        assert c["fill_faults"] >= pages(c["bytes"]) * 0.99
        # The fill made the destination resident and the source is pre-touched.
        assert c["copy_faults"] <= pages(c["bytes"]) * 0.01
    line = proc.stderr.strip().splitlines()
    assert len(line) == 1 and "4 checkpoints" in line[0] and "pool off" in line[0]


@pytest.mark.parametrize("keep", [1, 2])
def test_pool_on_hits_after_warmup(workload, tmp_path, keep):
    slots, iterations = 2, 15
    _, records = run(workload, tmp_path, "--pool", "on", "--keep", str(keep), "--iterations", str(iterations),
                     "--ckpt-mib", "40")
    ckpts, _, summary = check_consistent(records, slots=slots, iterations=iterations)
    warmup = slots * keep + slots
    assert len(ckpts) == 10 > warmup
    for c in ckpts[: slots * keep]:  # nothing pooled yet
        assert not c["pool_hit"] and c["fill_faults"] >= pages(c["bytes"]) * 0.99
    for c in ckpts[warmup:]:
        assert c["pool_hit"] and c["fill_faults"] == 0
    assert summary["pool"] is True
    assert summary["pool_hits"] == sum(c["pool_hit"] for c in ckpts)


def test_growing_checkpoints_never_hit_the_pool(workload, tmp_path):
    _, records = run(workload, tmp_path, "--pool", "on", "--grow-mib", "4", "--iterations", "9", "--ckpt-mib", "40")
    ckpts, _, summary = check_consistent(records, iterations=9)
    sizes = sorted({c["bytes"] for c in ckpts})
    assert sizes == [40 * MIB, 44 * MIB, 48 * MIB]
    for c in ckpts:
        assert not c["pool_hit"]
        assert c["fill_faults"] >= pages(c["bytes"]) * 0.99
    assert summary["pool_hits"] == 0 and summary["grow_bytes"] == 4 * MIB


def test_draft_updates_follow_each_checkpoint(workload, tmp_path):
    _, records = run(workload, tmp_path, "--draft", "--iterations", "4", "--ckpt-mib", "40")
    ckpts, _, _ = check_consistent(records, iterations=4, draft=True)
    assert [c["draft"] for c in ckpts] == [False, True] * 4
    for tgt, dft in zip(ckpts[::2], ckpts[1::2]):
        assert (tgt["iter"], tgt["slot"], tgt["bytes"]) == (dft["iter"], dft["slot"], dft["bytes"])
        assert tgt["end_ns"] <= dft["start_ns"]


def test_noise_threads_stay_outside_the_checkpoints(workload, tmp_path):
    _, records = run(workload, tmp_path, "--noise-threads", "2", "--iterations", "6", "--ckpt-mib", "40")
    ckpts, iters, summary = check_consistent(records, iterations=6)
    assert summary["noise_threads"] == 2 and summary["noise_calls"] >= 2
    assert {c["tid"] for c in ckpts} == {iters[0]["tid"]}


# Noise threads size and copy the state while the main thread grows it (--grow-mib) and shrinks
# it again on each new request (--request-prefills): a size read before the change used to make
# the copy fail and the workload abort. A prefill every iteration changes the size every time, so
# 12 iterations aborted 10 of 10 runs before the fix.
RESIZE_RACE = ["--iterations", "12", "--decode-per-prefill", "0", "--request-prefills", "2", "--noise-threads", "2"]


@pytest.mark.parametrize(
    "variant,args",
    [
        (None, ["--grow-mib", "8", "--thread-churn", "1", "--mremap"]),
        ("upstream", ["--grow-mib", "1", "--spec", "--prompt-save", "--thread-churn", "1", "--mremap"]),
    ],
    ids=["default", "upstream"],
)
def test_noise_threads_survive_the_state_resizing(variant, args, tmp_path):
    exe = workload_binary(variant=variant) if variant else workload_binary()
    _, records = run(exe, tmp_path, *RESIZE_RACE, "--ckpt-mib", "40", *args)
    grow = int(args[1]) * MIB
    ckpts = [r for r in records if r["type"] == "checkpoint" and not r.get("spec")]
    # Each slot's checkpoint follows the state: 40 MiB on a request's first prefill, grown on its second.
    assert [c["bytes"] for c in ckpts] == [40 * MIB + (i // 2 % 2) * grow for i in range(len(ckpts))]
    assert len(ckpts) == 2 * 12
    summary = records[-1]
    assert summary["type"] == "summary" and summary["noise_threads"] == 2 and summary["noise_calls"] >= 2
    assert {c["tid"] for c in ckpts} == {r["tid"] for r in records if r["type"] == "iteration"}


def test_static_binary_runs_and_keeps_its_symbols(static_workload, tmp_path):
    _, records = run(static_workload, tmp_path, "--iterations", "6", "--slots", "3", "--ckpt-mib", "40")
    ckpts, _, _ = check_consistent(records, slots=3, iterations=6)
    assert all(c["fill_faults"] >= pages(c["bytes"]) * 0.99 for c in ckpts)
    with open(static_workload, "rb") as f:
        elf = ELFFile(f)
        assert elf.header["e_type"] == "ET_EXEC"  # -no-pie
        names = {s.name for s in elf.get_section_by_name(".symtab").iter_symbols()}
    for sym in (UPDATE_TGT, DEFAULT_APPEND, "_ZN19server_context_impl12update_slotsEv", "llama_decode",
                "llama_state_seq_get_data_ext"):
        assert sym in names


def _dynamic(path):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dyn = next(s for s in elf.iter_sections() if isinstance(s, DynamicSection))
        tags = [(t.entry.d_tag, getattr(t, "needed", None) or getattr(t, "runpath", None)) for t in dyn.iter_tags()]
        syms = {s.name: s for s in elf.get_section_by_name(".dynsym").iter_symbols()}
        return elf.header["e_type"], tags, {n: (s["st_info"]["bind"], s["st_shndx"]) for n, s in syms.items()}


def test_libraries_mirror_the_real_servers_layout(workload):
    build = workload.parent
    for lib in ("libsample-common.so", "libsample-server.so"):
        _, _, syms = _dynamic(build / lib)
        bind, shndx = syms[DEFAULT_APPEND]
        assert bind == "STB_WEAK" and shndx != "SHN_UNDEF", lib
    _, _, common = _dynamic(build / "libsample-common.so")
    assert common[UPDATE_TGT][1] != "SHN_UNDEF"
    _, _, llama = _dynamic(build / "libsample-llama.so")
    for sym in ("llama_decode", "llama_state_seq_get_size_ext", "llama_state_seq_get_data_ext"):
        assert llama[sym][1] != "SHN_UNDEF"
    e_type, tags, _ = _dynamic(workload)
    assert e_type == "ET_DYN"
    needed = [v for t, v in tags if t == "DT_NEEDED"]
    assert needed.index("libsample-server.so") < needed.index("libsample-common.so")
    assert ("DT_RUNPATH", "$ORIGIN") in tags


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_update_tgt_calls_default_append_through_the_plt(workload):
    out = subprocess.run(
        ["objdump", "-d", f"--disassemble={UPDATE_TGT}", str(workload.parent / "libsample-common.so")],
        capture_output=True, text=True, check=True,
    ).stdout
    calls = [ln for ln in out.splitlines() if "call" in ln]
    assert any(f"<{DEFAULT_APPEND}@plt>" in ln for ln in calls), out
    assert any("<llama_state_seq_get_data_ext@plt>" in ln for ln in calls)


def test_update_tgt_binds_to_the_server_librarys_copy(workload):
    proc = subprocess.run(
        [str(workload), "--iterations", "1", "--ckpt-mib", "40", *FAST],
        capture_output=True, text=True, timeout=60, env={**os.environ, "LD_DEBUG": "bindings"},
    )
    assert proc.returncode == 0
    binds = re.findall(rf"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `{DEFAULT_APPEND}'", proc.stderr)
    assert binds, proc.stderr[-2000:]
    by_caller = {os.path.basename(a): os.path.basename(b) for a, b in binds}
    assert by_caller["libsample-common.so"] == "libsample-server.so"


def test_wait_signal_and_exit_code(workload, tmp_path):
    truth = tmp_path / "t.jsonl"
    # waiting_workload checks that the first line is exactly `ready pid=PID`
    with waiting_workload(workload, "--exit-code", "7", "--iterations", "3", "--ckpt-mib", "40", *FAST,
                          truth=truth) as proc:
        assert truth.read_text() == ""  # nothing ran before the signal
        go(proc)
        assert proc.wait(timeout=60) == 7
    check_consistent(truth_records(truth), iterations=3)


@pytest.mark.parametrize(
    "args",
    [
        ["--slots", "0"],
        ["--slots", "two"],
        ["--iterations", "5x"],
        ["--pool", "maybe"],
        ["--ckpt-mib", "-1"],
        ["--exit-code", "256"],
        ["--bogus"],
        ["--iterations"],
        ["stray"],
        ["--truth", "/nonexistent-dir/truth.jsonl"],
    ],
)
def test_bad_options_exit_2_with_one_line(workload, args):
    proc = subprocess.run([str(workload), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt-workload: error: "), proc.stderr
    assert proc.stdout == ""


def test_small_checkpoints_run_with_a_warning(workload, tmp_path):
    proc, records = run(workload, tmp_path, "--iterations", "1", "--ckpt-mib", "8")
    assert "warning" in proc.stderr and "32 MiB" in proc.stderr
    assert split(records)[0][0]["bytes"] == 8 * MIB


def test_build_failure_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTRACE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with pytest.raises(CkptraceError, match="building the sample workload failed"):
        workload_binary()
    assert not any(tmp_path.iterdir())  # no half-built folder left behind
    monkeypatch.setenv("CXX", "no-such-compiler-ckptrace")
    with pytest.raises(CkptraceError, match="needs no-such-compiler-ckptrace"):
        workload_binary()
