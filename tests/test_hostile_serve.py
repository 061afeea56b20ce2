"""`serve` against a hostile local user (issue 22): a slowloris client, run as user nobody, holding
thousands of idle and trickling connections to /metrics, can't stop a real Prometheus scraping it
nor make serve's threads, open files or memory grow without bound (exporters/http.py)."""
from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from ckptrace.exporters.http import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from ckptrace.probes import bpf_runtime
from helpers import AS_NOBODY, CKPTRACE, go, load_truth, proc_status, started, wait_until, waiting_workload, \
    why_nobody_cannot_run_ckptrace
from prometheus import Prometheus, prometheus_available

# User nobody's slowloris: keeps N connections open to HOST:PORT, re-opening each one the server
# closes; every other one trickles a header line every second and never ends its request. Prints
# "holding N" once all are open, then how many it re-opened when stdin closes.
SLOWLORIS = r"""
import resource, selectors, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
sel = selectors.DefaultSelector()
socks, reopened = {}, 0
def conn(i):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, port))
    if i % 2:
        try: s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError: pass
    socks[i] = s
for i in range(n):
    conn(i)
print("holding", n, flush=True)
sel.register(sys.stdin, selectors.EVENT_READ)
last = 0.0
while True:
    if sel.select(timeout=0.2):
        break
    if time.monotonic() - last >= 1.0:
        last = time.monotonic()
        for i, s in list(socks.items()):
            try:
                if i % 2:
                    s.send(b"X-a: b\r\n")
                else:
                    s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    raise ConnectionError  # readable: the server closed it (EOF)
            except BlockingIOError:
                continue
            except OSError:
                s.close(); conn(i); reopened += 1
print("reopened", reopened, flush=True)
"""


def counts(pid: int) -> tuple[int, int, int]:
    """serve's threads, open descriptors and RSS (KiB), as /proc says."""
    st = proc_status(pid)
    return int(st["Threads"]), len(list(Path(f"/proc/{pid}/fd").iterdir())), int(st["VmRSS"].split()[0])


@pytest.mark.skipif(not prometheus_available(), reason="Debian package prometheus not installed")
@pytest.mark.ebpf
def test_a_slowloris_of_thousands_of_idle_sockets_does_not_stop_a_real_scraper(require_root_ebpf, workload,
                                                                              tmp_path):
    """3000 connections held past REQUEST_TIMEOUT_S (each one closed re-opened at once): every
    scrape, Prometheus' every 2 s and ours every 0.2 s, is answered throughout, and Prometheus
    ends holding the workload's every checkpoint; serve keeps
    its threads (but for the detach's bounded few), at most MAX_CONNECTIONS more descriptors and under 64 MiB more RSS. Before
    (prometheus_client's server, a thread per connection): 4 threads became 316 in those 13 s."""
    why = why_nobody_cannot_run_ckptrace()
    if why:
        pytest.skip(why)
    truth = tmp_path / "truth.jsonl"
    with waiting_workload(workload, "--iterations", "6", truth=truth) as w, \
            started([CKPTRACE, "serve", "--listen", "127.0.0.1:0", "--pid", w.pid],
                    ready="ckptrace: serving http://127.0.0.1:") as (srv, line):
        port = int(re.search(r"127\.0\.0\.1:(\d+)/metrics", line).group(1))
        target = f"127.0.0.1:{port}"
        # a 2 s scrape timeout: a busy machine's latency, not the attack, must not decide
        with Prometheus([target], interval_s=2.0) as prom:
            wait_until(lambda: prom.health(target) == "up", "the exporter's target up", timeout_s=60,
                       every_s=0.2, watch=[srv, prom.proc])
            threads0, fds0, rss0 = counts(srv.pid)
            attacker = subprocess.Popen([*AS_NOBODY, "/usr/bin/python3", "-c", SLOWLORIS, "127.0.0.1", str(port),
                                         "3000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
            try:
                assert attacker.stdout.readline() == "holding 3000\n"
                start, scrapes, peak = time.monotonic(), 0, (0, 0, 0)
                t_attack = time.time()
                while time.monotonic() - start < REQUEST_TIMEOUT_S + 3:
                    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as r:
                        assert "ckptrace_checkpoints_total" in r.read().decode()
                    scrapes += 1
                    peak = tuple(map(max, peak, counts(srv.pid)))
                    time.sleep(0.2)
                assert attacker.poll() is None
                # Prometheus' own scrapes during the attack: every one up
                up = prom.query_range(f'up{{instance="{target}"}}', t_attack, time.time(), step_s=0.5)
                assert up and all(v == "1" for _, v in up[0]["values"]), [x for x in up[0]["values"] if x[1] != "1"]
                go(w)
                assert w.wait(120) == 0
                n = len(load_truth(truth)["checkpoint"])
                wait_until(lambda: prom.value(f'ckptrace_checkpoints_total{{pid="{w.pid}"}}') == n,
                           f"Prometheus holding the {n} checkpoints, under attack", timeout_s=60, every_s=0.2,
                           watch=[srv, prom.proc])
                peak = tuple(map(max, peak, counts(srv.pid)))
            finally:
                attacker.stdin.close()
                reopened = attacker.stdout.read()
                attacker.wait(30)
                attacker.stdout.close()
            assert re.match(r"reopened [1-9]\d*\n", reopened), reopened  # the server closed idle ones
            threads, fds, rss = peak
            # Detaching the workload when it exits closes its probes from a few threads at once
            # (bpf_runtime.THREADS at most, gone after): bounded, unlike a thread per connection.
            assert threads <= threads0 + bpf_runtime.THREADS, (threads0, threads)
            assert fds <= fds0 + MAX_CONNECTIONS + 4, (fds0, fds)
            assert rss - rss0 < 64 << 10, (rss0, rss)
            assert scrapes >= 5


@pytest.mark.parametrize("path,status", [("/metrics", 200), ("/metrics?name[]=x", 200), ("/", 404),
                                         ("/favicon.ico", 404), ("/metrics/../etc/passwd", 404),
                                         ("/%6detrics", 200), ("/anything", 404)])
def test_only_metrics_is_answered(path, status):
    """serve's server answers /metrics (docs/commands.md) and 404 for any other path (issue 39:
    prometheus_client's app served the series at every path)."""
    import urllib.error

    from prometheus_client import CollectorRegistry, make_wsgi_app

    from ckptrace.exporters.http import MetricsServer

    server = MetricsServer("127.0.0.1", 0, make_wsgi_app(CollectorRegistry()))
    server.start()
    try:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=30) as r:
                got = r.status
        except urllib.error.HTTPError as e:
            got = e.code
    finally:
        server.close()
    assert got == status
