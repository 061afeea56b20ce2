"""`ckptrace record` in a real arm64 kernel: a Debian 12 arm64 virtual machine (tests/aarch64_vm.py,
qemu-system-aarch64 under TCG) boots once, builds the sample workload with its own g++ and records
it from this working tree in its fresh, pooled and growing modes; here, on the host, each recording
is held to the workload's own account exactly as tests/test_record.py holds the x86 ones. The same
boot then serves a tiny hybrid model with PyPI's xllamacpp aarch64 wheel (tests/aarch64_vm_llama.py)
and records it by --pid, held to the server's log as tests/test_llama_python.py holds the x86 wheel.

The image is built once (a few minutes: unpacked from Debian's packages, see docs/tests.md) and
cached outside the checkout; a warm run is one boot. It is an `ebpf` test: in CI
(CKPTRACE_REQUIRE_EBPF=1) a skip, such as for a missing qemu, fails the run.
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

import aarch64_vm
import aarch64_vm_llama
import pandas as pd

from ckptrace.core.trace import read_trace
from ckptrace.samples.llama_server import cached_model, logged_checkpoints, server_argv
from helpers import clock_tolerance, load_truth
from llama_checks import checkpoint_rows
from test_record import spans

pytestmark = [pytest.mark.ebpf, pytest.mark.aarch64_vm]

REPO = Path(__file__).resolve().parent.parent
# 36 MiB: above glibc's largest mmap threshold (32 MiB), so every fresh buffer is fresh pages, as
# llama-server's are; smaller than the x86 tests' 48 MiB because every page costs more emulated.
CKPT_MIB = 36
MODES = {
    "fresh": ["--iterations", "9", "--pool", "off"],
    "pooled": ["--iterations", "15", "--pool", "on"],
    "growing": ["--iterations", "12", "--pool", "on", "--grow-mib", "4"],
}
# The llama leg: PyPI's xllamacpp aarch64 wheel (build 11549) serving a make_model.py qwen35 hybrid
# in the guest's python, pool off (no patched aarch64 build exists). 3 delta-net layers of 16
# heads of 64: 0.820 MiB checkpoints. A delta-net's per-token cost grows with its state: x86's
# test_llama_python.py shape (39.26 MiB) took 66 to 340 ms a token on x86, this one 0.2 to 3 ms,
# which emulation can afford. 1 client, 3 prompts of 48 words: 2 checkpoints each.
LLAMA_MODEL = {"arch": "qwen35", "d_model": 64, "layers": 4, "d_state": 64, "heads": 16}
LLAMA_REQUESTS = 3
BOOT_TIMEOUT_S = 3600  # a bound for a hung guest; a cold guest run (one BPF compile) takes ~10 minutes

# Runs in the guest as root. The workload's build and the BPF cache stay on the image's disk, so
# the next boot compiles neither again (make and ckptrace's BPF cache check their sources).
JOB = f"""
export PYTHONPATH={aarch64_vm.DEPS_DIR}:/src PYTHONDONTWRITEBYTECODE=1 HOME=/root LC_ALL=C.UTF-8
up() {{ cut -d' ' -f1 /proc/uptime; }}
uname -r >/out/kernel; uname -m >/out/machine; getconf PAGESIZE >/out/pagesize
cat /sys/kernel/mm/transparent_hugepage/enabled >/out/thp; cat /sys/kernel/mm/transparent_hugepage/hpage_pmd_size >/out/hpage
W=/var/lib/ckptrace-vm/workload
mkdir -p $W
t=$(up); make -s -C /src/samples/workload BUILD=$W $W/ckpt-workload || exit 10
echo "workload: built (make) in $(awk "BEGIN {{ print $(up) - $t }}") s"
for mode in {' '.join(MODES)}; do
    case $mode in
{''.join(f'        {m}) args="{" ".join(a)}" ;;{chr(10)}' for m, a in MODES.items())}    esac
    t=$(up)
    # The trace on the guest's disk, then copied: on the 9p share record could not write the
    # finished trace (reopening its stream file through /proc/self/fd failed with ENOENT).
    rm -f /var/lib/ckptrace-vm/$mode.parquet
    timeout 1500 python3 -m ckptrace record --quiet --json -o /var/lib/ckptrace-vm/$mode.parquet -- \\
        $W/ckpt-workload --ckpt-mib {CKPT_MIB} $args --truth /out/$mode.truth.jsonl \\
        >/out/$mode.json 2>/out/$mode.err
    echo $? >/out/$mode.rc
    cp /var/lib/ckptrace-vm/$mode.parquet /out/ 2>/dev/null
    echo "$mode: ckptrace record exit $(cat /out/$mode.rc) after $(awk "BEGIN {{ print $(up) - $t }}") s"
done
# The llama leg; its failure is llama.rc's, not the job's (the workload's tests stand alone). The
# wheel's module and the model are copied from their read-only shares onto the guest's disk once
# (again when the share's size differs), then loaded from there on every boot.
L=/var/lib/ckptrace-vm/llama
same() {{ [ -f "$2" ] && [ "$(stat -c %s "$1")" = "$(stat -c %s "$2")" ]; }}
llama() {{
    [ -s /out/llama-model ] || return 13  # the host could not provide the model or the wheel
    M=$(cat /out/llama-model)
    mkdir -p $L /mnt/xllamacpp /mnt/models || return 11
    mount -t 9p -o trans=virtio,version=9p2000.L,ro xllamacpp /mnt/xllamacpp || return 11
    mount -t 9p -o trans=virtio,version=9p2000.L,ro models /mnt/models || return 11
    busybox ifconfig lo 127.0.0.1 up || return 11  # the server and its clients talk over loopback
    c=$(up)
    same /mnt/xllamacpp/xllamacpp/xllamacpp.abi3.so $L/xllamacpp/xllamacpp.abi3.so || {{
        rm -rf $L/xllamacpp $L/x.tmp && cp -r /mnt/xllamacpp/xllamacpp $L/x.tmp && mv $L/x.tmp $L/xllamacpp; }} || return 12
    same /mnt/models/$M $L/$M || {{ rm -f $L/*.gguf $L/m.tmp && cp /mnt/models/$M $L/m.tmp && mv $L/m.tmp $L/$M; }} || return 12
    echo "llama: wheel and model on the disk in $(awk "BEGIN {{ print $(up) - $c }}") s"
    rm -rf $L/leg && mkdir -p $L/leg || return 12
    echo "llama: driver started at uptime $(up)"
    PYTHONPATH=$L:$PYTHONPATH timeout 1500 python3 /src/tests/aarch64_vm_llama.py $L/$M $L/leg/1-pool-off.parquet \\
        --requests {LLAMA_REQUESTS} >/out/llama.json 2>/out/llama.err
}}
t=$(up)
llama
echo $? >/out/llama.rc
echo "llama: driver ended at uptime $(up)"
cp $L/leg/1-pool-off.parquet $L/leg/1-pool-off.log $L/leg/1-pool-off.record.err /out/ 2>/dev/null
echo "llama: xllamacpp served and recorded: exit $(cat /out/llama.rc) after $(awk "BEGIN {{ print $(up) - $t }}") s"
"""


@dataclass
class GuestRun:
    out: Path
    console: str
    image: Path
    build_s: float
    boot_s: float
    llama_error: str | None  # why the host could not give the guest the wheel or the model

    def text(self, name: str) -> str:
        p = self.out / name
        return p.read_text(errors="replace").strip() if p.exists() else f"({name} missing)"

    def explain(self) -> str:
        return (f"job log:\n{self.text('job.log')}\nserial console (last 4000 chars):\n{self.console[-4000:]}")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the arm64 VM test needs root (the image's files are unpacked owned by root)"
    missing = aarch64_vm.missing_host_tools()
    return f"the arm64 VM test needs: apt-get install {' '.join(missing)}" if missing else None


def _run_guest() -> tuple[GuestRun, subprocess.CompletedProcess]:
    # Not under pytest's basetemp: another pytest run on the machine may prune it while the guest runs.
    out = Path(tempfile.mkdtemp(prefix="ckptrace-aarch64-vm-"))
    # The llama leg's inputs, shared read-only: failing here fails its test only.
    shares, llama_error = {}, None
    try:
        model = cached_model(**LLAMA_MODEL)
        shares = {"xllamacpp": aarch64_vm.xllamacpp_wheel(), "models": model.parent}
        (out / "llama-model").write_text(model.name)
    except Exception as e:  # noqa: BLE001 (reported by the llama test)
        llama_error = f"{type(e).__name__}: {e}"
    with aarch64_vm.image_lock():
        t = time.monotonic()
        image = aarch64_vm.ensure_image()
        build_s = time.monotonic() - t
        t = time.monotonic()
        run = aarch64_vm.boot(image, REPO, out, JOB, timeout=BOOT_TIMEOUT_S, shares=shares)
        boot_s = time.monotonic() - t
    return GuestRun(out, run.stdout + run.stderr, image, build_s, boot_s, llama_error), run


# The guest's run (minutes of emulation: the image when it is not cached, then one boot) starts
# when the session's tests are collected (conftest calls prestart), in a thread beside the other
# tests, and the fixture takes its result; conftest kills a guest still running when the session
# ends. Without prestart (the file imported some other way) the fixture runs it.
_background: concurrent.futures.Future | None = None


def prestart() -> None:
    global _background
    if _background is None and _skip_reason() is None:
        _background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aarch64-vm").submit(_run_guest)


def prestop() -> None:
    aarch64_vm.stop_guests()


@pytest.fixture(scope="module")
def guest() -> Iterator[GuestRun]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    g, run = _background.result() if _background is not None else _run_guest()
    try:
        assert g.text("job.rc") == "0", f"the guest's job failed (QEMU exit {run.returncode})\n{g.explain()}"
        yield g
    finally:
        shutil.rmtree(g.out, ignore_errors=True)


def test_the_guest_is_an_arm64_kernel(guest, capsys):
    assert guest.text("machine") == "aarch64", guest.explain()
    with capsys.disabled():
        print(f"\naarch64 VM: image {guest.image.name} ready in {guest.build_s:.0f} s (0 when cached); "
              f"one boot, the workload built and recorded three times, the llama leg: {guest.boot_s:.0f} s; "
              f"kernel {guest.text('kernel')}, page size {guest.text('pagesize')}, transparent huge pages "
              f"{guest.text('thp')}\n{guest.text('job.log')}")


def vs_truth(trace, truth) -> pd.DataFrame:
    """One row per checkpoint: ours beside the workload's own, as test_record.checkpoints_vs_truth,
    with an unknown on-CPU figure kept unknown (<NA>) and, per span, `*_edge_ns`: the wall time
    between our span's edges and the workload's (both the guest's CLOCK_MONOTONIC)."""
    ev = trace.events
    ck = ev[(ev["kind"] == "checkpoint") & ~ev["draft"]].reset_index(drop=True)
    t = truth["checkpoint"]
    t = t[~t["draft"].astype(bool)].sort_values("start_ns").reset_index(drop=True)
    assert len(ck) == len(t), f"recorded {len(ck)} checkpoints, workload made {len(t)}"
    m = pd.DataFrame({"tid": ck["tid"], "truth_tid": t["tid"], "bytes": ck["bytes"], "truth_bytes": t["bytes"],
                      "truth_pool_hit": t["pool_hit"].astype(bool)})
    m["has_fill"] = ck["ckpt"].isin(spans(ev, "fill").index)
    edges = {"": (ck, t["start_ns"], t["end_ns"] - t["start_ns"])}
    for name in ("fill", "copy"):
        s = spans(ev, name)
        edges[f"{name}_"] = (s.reindex(ck["ckpt"]).reset_index(drop=True), t[f"{name}_start_ns"], t[f"{name}_ns"])
    for p, (s, t0, dur) in edges.items():
        m[f"{p}cpu_ns"] = s["cpu_ns"].astype("Int64")
        m[f"truth_{p}cpu_ns"] = t[f"{p}cpu_ns"]
        m[f"{p}edge_ns"] = (s["start_ns"] - t0).abs() + (s["end_ns"] - (t0 + dur)).abs()
        if p:
            m[f"{p}faults"] = s["faults"].fillna(0)
            m[f"truth_{p}faults"] = t[f"{p}faults"]
    hit = m["truth_pool_hit"]  # a pool hit has no fill: nothing to compare
    m.loc[hit, ["fill_cpu_ns", "fill_edge_ns"]] = pd.NA
    m.loc[hit, "fill_faults"] = 0
    return m


def assert_matches_truth_in_tcg(m: pd.DataFrame) -> None:
    """test_record.assert_matches_truth, with the on-CPU tolerance widened by the span's edges.

    Under TCG the guest has no steal time (no pvtime; Debian's arm64 kernel has no
    CONFIG_PARAVIRT_TIME_ACCOUNTING): a host preemption of the vCPU is on-CPU time, in the guest,
    of whatever ran then. Where it falls between the workload's clock read and our probe's (the
    uprobe's trap and return, ~0.2 ms emulated) one figure has tens of ms the other has not, and
    the guest's wall clock shows the same gap (measured: docs/tests.md). An unknown (<NA>: a
    reading the probe found wrong) is no miss, but at most one span in a mode."""
    assert (m["tid"] == m["truth_tid"]).all()
    assert (m["bytes"] == m["truth_bytes"]).all()
    assert (m["has_fill"] == ~m["truth_pool_hit"]).all()
    unknown = 0
    for p in ("", "fill_", "copy_"):
        ours, truth = m[f"{p}cpu_ns"], m[f"truth_{p}cpu_ns"]
        rows = ~(m["truth_pool_hit"] & (p == "fill_"))
        unknown += int((ours.isna() & rows).sum())
        known = rows & ours.notna()
        err = (ours[known].astype("int64") - truth[known]).abs()
        bad = err > clock_tolerance(truth[known]) + m.loc[known, f"{p}edge_ns"]
        assert not bad.any(), f"{p}cpu_ns off the workload's clock:\n{m.loc[bad[bad].index].to_string()}"
    assert unknown <= 1, f"{unknown} on-CPU figures unknown:\n{m.to_string()}"
    for p in ("fill_", "copy_"):
        err = (m[f"{p}faults"] - m[f"truth_{p}faults"]).abs()
        assert (err <= 0.01 * m[f"truth_{p}faults"]).all(), m[[f"{p}faults", f"truth_{p}faults"]]


def recorded(guest: GuestRun, mode: str, capsys):
    err = guest.text(f"{mode}.err")
    assert guest.text(f"{mode}.rc") == "0", f"ckptrace record ({mode}) failed in the guest:\n{err}\n{guest.explain()}"
    assert "Traceback" not in err, err
    trace = read_trace(guest.out / f"{mode}.parquet")
    truth = load_truth(guest.out / f"{mode}.truth.jsonl")
    assert trace.meta.kernel == guest.text("kernel")
    m = vs_truth(trace, truth)
    with capsys.disabled():  # the figures against the workload's own, in the CI log
        cols = ["bytes", "cpu_ns", "truth_cpu_ns", "edge_ns", "fill_cpu_ns", "truth_fill_cpu_ns", "fill_edge_ns",
                "copy_cpu_ns", "truth_copy_cpu_ns", "copy_edge_ns", "fill_faults", "truth_fill_faults",
                "copy_faults", "truth_copy_faults", "truth_pool_hit"]
        print(f"\naarch64 VM, {mode} ({guest.text('kernel')}): ckptrace against the workload's own account\n"
              f"{m[cols].to_string()}")
    assert_matches_truth_in_tcg(m)
    return trace, truth, m


def test_fresh_buffers_match_the_workload(guest, capsys):
    trace, truth, m = recorded(guest, "fresh", capsys)
    assert len(m) == 6
    # Every page of a fresh buffer faults in the fill, none in the copy; with transparent huge
    # pages always on (Debian's arm64 kernel), every huge page (and a small one at either end).
    thp = "[always]" in guest.text("thp")
    page = int(guest.text("hpage")) if thp else int(guest.text("pagesize"))
    assert (m["fill_faults"] >= m["bytes"] // page).all(), (guest.text("thp"), page)
    assert (m["copy_faults"] == 0).all()
    mm = trace.events[(trace.events["kind"] == "mmap") & (trace.events["phase"] == "fill")]
    assert len(mm) == len(m) and (mm["bytes"] >= m["bytes"].min()).all()
    assert trace.meta.lost_events == 0
    # llama_decode's batch (a 56-byte struct: by reference in x1 on arm64, in memory on x86-64)
    # read right: each iteration's tokens are the workload's.
    it = trace.events[trace.events["kind"] == "iteration"].reset_index(drop=True)
    t = truth["iteration"].sort_values("start_ns").reset_index(drop=True)
    assert len(it) == len(t) and (it["tokens"].to_numpy() == t["tokens"].to_numpy()).all(), \
        (it["tokens"].tolist(), t["tokens"].tolist())


def test_pooled_buffers_have_no_fill_faults_or_mmaps_after_warmup(guest, capsys):
    trace, _, m = recorded(guest, "pooled", capsys)
    warm = m.iloc[4:]
    assert len(warm) >= 4 and warm["truth_pool_hit"].all()
    assert (~warm["has_fill"]).all() and (warm["fill_faults"] == 0).all()
    ev = trace.events
    ck_ids = ev[ev["kind"] == "checkpoint"]["ckpt"].iloc[4:]
    churn = ev[ev["kind"].isin(["mmap", "munmap"]) & ev["ckpt"].isin(ck_ids)]
    assert churn.empty, churn


def test_growing_buffers_never_hit(guest, capsys):
    _, _, m = recorded(guest, "growing", capsys)
    assert m["has_fill"].all() and m["bytes"].is_monotonic_increasing


def test_the_guest_starts_the_server_as_run_legs_does():
    """The guest's driver (no pandas: see its docstring) writes the server's command line itself."""
    model = Path("/m/model.gguf")
    assert aarch64_vm_llama.server_command("/usr/bin/python3", model, 8080, 1) == \
        server_argv(Path("/usr/bin/python3"), model, 8080, slots=1, version="11549")


def test_xllamacpp_wheel_every_logged_checkpoint_is_recorded_with_its_size_fill_and_copy(guest, capsys):
    """PyPI's aarch64 build 11549 in the guest's python: each `created context checkpoint` line
    of its log (-lv 4) is a recorded checkpoint of the size it prints, in its order, with a
    measured fill (the growth behind resize(), _M_default_append) and copy, as on x86
    (test_llama_python.py)."""
    assert guest.llama_error is None, f"no model or wheel for the guest: {guest.llama_error}"
    err = f"{guest.text('llama.err')}\nckptrace record's stderr:\n{guest.text('1-pool-off.record.err')}"
    assert guest.text("llama.rc") == "0", f"the llama leg failed in the guest:\n{err}\n{guest.explain()}"
    trace = read_trace(guest.out / "1-pool-off.parquet")
    logged = logged_checkpoints(guest.out / "1-pool-off.log")
    ck = checkpoint_rows({"trace": trace})
    meta = trace.meta
    side = pd.concat([
        logged[["n", "pos_max", "n_tokens", "size_text"]].rename(columns=lambda c: f"log_{c}"),
        pd.DataFrame({"ckpt": ck["ckpt"], "iter": ck["iter"], "MiB": [f"{b / 2**20:.3f}" for b in ck["bytes"]],
                      "bytes": ck["bytes"], "create_bytes": ck["create_bytes"], "fill_source": ck["fill_source"],
                      "fill_ms": ck["fill_ns"] / 1e6, "fill_faults": ck["fill_faults"], "copy_ms": ck["copy_ns"] / 1e6,
                      "copy_faults": ck["copy_faults"], "total_ms": ck["total_ns"] / 1e6})], axis=1)
    with capsys.disabled():  # ckptrace's figures beside the server's own log lines, in the CI log
        print(f"\naarch64 VM, xllamacpp {meta.profile.name} ({meta.kernel}, {meta.arch}, page {meta.page_size}): "
              f"ckptrace against the server's log; the guest's phases: {guest.text('llama.json')}\n"
              f"{side.to_string()}")
    assert meta.profile.name == "11549", meta.profile
    assert meta.kernel == guest.text("kernel") and meta.arch == "aarch64"
    assert meta.executable and "python" in meta.executable.rsplit("/", 1)[-1]
    where = {p.object.rsplit("/", 1)[-1] for p in meta.probes if p.point in ("update_tgt", "state_copy")}
    assert where == {"xllamacpp.abi3.so"}, where
    assert meta.lost_events == 0
    assert len(logged) >= 2 * LLAMA_REQUESTS, f"the server made only {len(logged)} checkpoints:\n{err}"
    assert len(ck) == len(logged), f"{len(ck)} recorded, {len(logged)} logged"
    assert (side["MiB"] == side["log_size_text"]).all()
    assert (ck["create_bytes"] == ck["bytes"]).all()  # no draft model, no speculative state
    assert (ck["fill_source"] == "measured").all() and (ck["fill_ns"] > 0).all()
    # Below glibc's mmap threshold once it has risen (a freed checkpoint raises it to its size), a
    # buffer can be heap memory an erased checkpoint left resident: no fault (seen: 2 of 6). The
    # fault counter still works in this process (some fill faults) and never counts past the pages.
    pages = -(-ck["bytes"] // meta.page_size) + 1
    assert (ck["fill_faults"] > 0).any() and (ck["fill_faults"] <= pages).all()
    assert (ck["copy_ns"] > 0).all() and (ck["iter"] > 0).all() and not ck["on_device"].any()
    copies = trace.events.query("kind == 'copy' and ckpt > 0")
    assert (copies["state_flags"] == 1).all()  # PARTIAL_ONLY: the server's checkpoints go to host memory
