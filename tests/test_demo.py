"""`ckptrace demo` end to end, as the README's first command runs it (smaller)."""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import ckptrace

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]


def test_demo_records_checks_compares_and_writes_the_report(tmp_path):
    p = ckptrace("demo", "--out", tmp_path, "--iterations", "24", "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    metrics = {m["metric"]: m for m in out["comparison"]["metrics"]}
    assert metrics["checkpoint_fill_ns"]["verdict"] == "faster"
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert len(out["traces"]) == 3 and all((tmp_path / f).exists() for f in
                                           ("1-pool-off.parquet", "2-pool-on.parquet", "3-pool-off.parquet"))
    # The demo's own cross-check: recorded fill faults equal the workload's getrusage counts.
    for check in out["checks"]:
        faults = check.split("fill faults ")[1]
        recorded, truth = faults.split(" (getrusage: ")
        assert recorded == truth.split(")")[0]


@pytest.mark.llama
def test_demo_llama_server_records_checks_compares_and_writes_the_report(tmp_path):
    """`demo --llama-server` as a user runs it: cached builds, the default model, three legs."""
    p = ckptrace("demo", "--llama-server", "--out", tmp_path, "--json", timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    metrics = {m["metric"]: m for m in out["comparison"]["metrics"]}
    assert metrics["checkpoint_fill_ns"]["verdict"] == "faster", metrics["checkpoint_fill_ns"]
    assert (tmp_path / "report.html").stat().st_size > 100_000
    names = ("1-pool-off", "2-pool-on", "3-pool-off")
    assert all((tmp_path / f"{n}.parquet").exists() and (tmp_path / f"{n}.log").exists() for n in names)
    # The demo's own cross-check: every checkpoint the server logged was recorded, with its size.
    for check in out["checks"]:
        recorded = int(check.split("checkpoints ")[1].split(" ")[0])
        logged = int(check.split("(server log: ")[1].split(")")[0])
        same_size = int(check.split("), ")[1].split(" with the logged size")[0])
        assert recorded == logged == same_size >= 6, check
    # nothing it started is left running
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout
