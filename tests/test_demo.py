"""`ckptrace demo` end to end, as the README's first command runs it (smaller)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ebpf, pytest.mark.usefixtures("require_root_ebpf")]


def test_demo_records_checks_compares_and_writes_the_report(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ckptrace", "demo", "--out", str(tmp_path), "--iterations", "24",
                        "--json"], capture_output=True, text=True, timeout=300)
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
