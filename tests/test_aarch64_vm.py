"""`ckptrace record` in a real arm64 kernel: a Debian 12 arm64 virtual machine (tests/aarch64_vm.py,
qemu-system-aarch64 under TCG) boots once, builds the sample workload with its own g++ and records
it from this working tree in its fresh, pooled and growing modes; here, on the host, each recording
is held to the workload's own account exactly as tests/test_record.py holds the x86 ones.

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
import pandas as pd

from ckptrace.core.trace import read_trace
from helpers import clock_tolerance, load_truth
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
"""


@dataclass
class GuestRun:
    out: Path
    console: str
    image: Path
    build_s: float
    boot_s: float

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
    with aarch64_vm.image_lock():
        t = time.monotonic()
        image = aarch64_vm.ensure_image()
        build_s = time.monotonic() - t
        t = time.monotonic()
        run = aarch64_vm.boot(image, REPO, out, JOB, timeout=BOOT_TIMEOUT_S)
        boot_s = time.monotonic() - t
    return GuestRun(out, run.stdout + run.stderr, image, build_s, boot_s), run


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
              f"one boot, the workload built and recorded three times: {guest.boot_s:.0f} s; "
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
