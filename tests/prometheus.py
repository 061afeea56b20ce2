"""Run a real Prometheus server (Debian's `prometheus` binary) that scrapes given targets, and
query its HTTP API. Synchronise on what its API says (target health, sample values), not on time.

Each server gets a temporary config and TSDB folder (removed afterwards) and a free port on
127.0.0.1; nothing else on the machine is touched.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from helpers import wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def prometheus_available() -> bool:
    return Path(PROMETHEUS).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus scraping `targets` (host:port) every `interval_s`. Use as a context manager."""

    def __init__(self, targets: list[str], interval_s: float = 0.5):
        self.dir = Path(tempfile.mkdtemp(prefix="ckptrace-prometheus-"))
        iv = f"{int(interval_s * 1000)}ms"
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {iv}\n  scrape_timeout: {iv}\n"
            "scrape_configs:\n  - job_name: ckptrace\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n")
        self.proc = None
        self.url = ""

    def __enter__(self) -> Prometheus:
        for _ in range(3):  # the free port may be taken before Prometheus binds it: try another
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.log = open(self.dir / "prometheus.log", "w")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
            if wait_until(lambda: self.proc.poll() is not None or self._ready(), "Prometheus ready",
                          timeout_s=60, every_s=0.1) and self.proc.poll() is None:
                return self
            self.log.close()
        raise AssertionError(f"Prometheus did not start: {(self.dir / 'prometheus.log').read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def health(self, target: str) -> str | None:
        """The target's health as the targets API reports it ('up', 'down', 'unknown')."""
        for t in self.api("targets")["activeTargets"]:
            if t["labels"].get("instance") == target:
                return t["health"]
        return None

    def query(self, expr: str) -> dict[tuple, float]:
        """Instant query: {sorted label items: value} per series of the vector result."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
        """Range query over [start, end] (Unix seconds): the series of its matrix result."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s:g}")
        assert data["resultType"] == "matrix", data
        return data["result"]

    def value(self, expr: str) -> float | None:
        """The single value of a query (None when it has no series)."""
        got = self.query(expr)
        assert len(got) <= 1, got
        return next(iter(got.values()), None)
