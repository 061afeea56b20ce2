"""`ckptrace serve`: keep the probes on running processes and serve their series at /metrics.

The listening socket is bound first (a bad --listen fails before anything attaches), then each
process is attached; every POLL_S the events are drained and folded into the series
(exporters/prometheus.py). A process that exits is served once more, then its series end;
`--comm` keeps looking for new processes with that name.
"""
from __future__ import annotations

import errno
import ipaddress
import signal
import sys
import time
from dataclasses import dataclass

from ckptrace.core.errors import CkptraceError, TargetError
from ckptrace.probes.target import process_of, processes_named, start_time
from ckptrace.core.terminal import printable

DEFAULT_LISTEN = "127.0.0.1:9464"  # 9464: the port OpenTelemetry's Prometheus exporters use
POLL_S = 0.5
RESCAN_S = 1.0  # --comm: how often new processes are looked for
LINGER_S = 60.0  # an exited process's series wait this long for a last scrape
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ListenError(CkptraceError):
    """--listen names no address this machine can serve on."""


@dataclass
class ServeOptions:
    pids: tuple[int, ...] = ()
    comm: str | None = None
    listen: str = DEFAULT_LISTEN
    label: str = ""
    ringbuf_pages: int = 512
    hint_after_s: float = 30.0
    duration_s: float | None = None


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (address, port); ListenError for anything else."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ListenError(f"--listen {printable(text)!r}: give ADDRESS:PORT, e.g. {DEFAULT_LISTEN} or [::1]:9464")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ListenError(f"--listen {printable(text)!r}: {printable(host)!r} is not an IP address "
                          f"(give one of this machine's, e.g. 127.0.0.1 or ::1)") from None
    port = int(port_text)
    if port > 65535:
        raise ListenError(f"--listen {printable(text)!r}: port {port} is out of range (1024-65535)")
    if 0 < port < 1024:
        raise ListenError(f"--listen {printable(text)!r}: port {port} is a privileged port (below 1024); "
                          f"choose one from 1024 to 65535 (exporters use 9100-9999; the default is 9464)")
    return host, port


def bind(host: str, port: int, registry) -> tuple[object, int]:
    """Start the /metrics HTTP server (exporters/http.py: one thread, bounded connections) for a
    CollectorRegistry; (server, the port it got). One line on failure."""
    from prometheus_client import make_wsgi_app

    from ckptrace.exporters.http import MetricsServer

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server = MetricsServer(host, port, make_wsgi_app(registry))
    except OSError as e:
        why = {errno.EADDRINUSE: "the port is in use (another exporter or server listens there); "
                                 "choose another with --listen",
               errno.EADDRNOTAVAIL: "the address is not one of this machine's",
               errno.EACCES: "not permitted to listen there"}.get(e.errno, e.strerror or str(e))
        raise ListenError(f"cannot listen on {where}: {why}") from None
    server.start()
    return server, server.port


def serve(opts: ServeOptions) -> None:
    """Run until a stop signal, --duration, or (with --pid) every process has exited."""
    host, port = parse_listen(opts.listen)
    if bool(opts.pids) == bool(opts.comm):
        raise TargetError("give --pid PID (one or more) or --comm NAME")
    if opts.comm and ("/" in opts.comm or len(opts.comm.encode()) > 255):
        raise TargetError(f"--comm takes a process name (as in /proc/PID/comm), got {printable(opts.comm)!r}")
    from ckptrace.probes.loader import MAX_TARGETS

    if len(opts.pids) > MAX_TARGETS:
        raise TargetError(f"{len(opts.pids)} processes: serve follows at most {MAX_TARGETS} at once")
    for pid in opts.pids:
        process_of(pid)  # a missing pid, a kernel thread, a zombie: said now, not after the BPF compile
    # Imported here: a bad --listen is said without loading pandas, bcc or the client library.
    from prometheus_client import CollectorRegistry, ProcessCollector

    from ckptrace.exporters.prometheus import CheckpointMetrics

    metrics = CheckpointMetrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    ProcessCollector(registry=registry)  # the exporter's own process_cpu_seconds_total, memory, fds
    server, port = bind(host, port, registry)  # a port in use is said before the machine checks
    stop: list[str] = []
    old = {s: signal.signal(s, lambda signum, frame: stop.append(signal.Signals(signum).name))
           for s in STOP_SIGNALS}
    probes = None
    try:
        from ckptrace.live.session import LiveProbes, attach_given

        probes = LiveProbes(opts.ringbuf_pages, preload=opts.comm is not None)  # --pid: verified as attached
        session = _Serving(opts, probes, metrics)
        attach_given(opts.pids, session.attach, lambda text: _say(f"ckptrace: note: {text}"), "serving", "serve")
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
        what = (", ".join(f"PID {t.pid} ({t.comm}, {t.probes} uprobes)" for t in session.targets.values())
                if opts.pids else f"every process named {printable(opts.comm)!r} (looked for every {RESCAN_S:g} s)")
        _say(f"ckptrace: serving {url} for {what}. Ctrl-C to stop.")
        session.run(stop)
    finally:
        server.close()
        if probes is not None:
            probes.close()
        for s, h in old.items():
            signal.signal(s, h)


class _Serving:
    """The attached processes and the drain loop."""

    def __init__(self, opts: ServeOptions, probes, metrics):
        self.opts, self.probes, self.metrics = opts, probes, metrics
        self.targets: dict[int, object] = {}  # pid -> LiveTarget (one process per pid at a time)
        self.refused: set[tuple[int, int | None]] = set()  # --comm: (pid, start time) that could not be attached, said once

    def attach(self, pid: int) -> None:
        t = self.probes.attach(pid)
        self.targets[t.pid] = t
        self.metrics.add(t.pid, printable(self.opts.label) or t.comm, t.build_id, t.plan.fill_probed, start=t.start)

    def run(self, stop: list[str]) -> None:
        t0 = time.monotonic()
        next_scan = 0.0
        hinted = False
        while not stop:
            time.sleep(POLL_S)
            gone = [pid for pid, t in self.targets.items() if not t.alive()]  # before the drain: it holds their last events
            batch = self.probes.batch()
            if batch is not None:
                for pid, part in batch.by_pid().items():
                    self.metrics.fold(pid, part)
            self.metrics.set_lost(self.probes.lost())
            for pid in gone:
                self.metrics.end(pid)
                self.probes.detach(self.targets.pop(pid))
                _say(f"ckptrace: PID {pid} exited; its series end after the next scrape")
            self.metrics.expire(int(LINGER_S * 1e9))
            now = time.monotonic()
            if self.opts.duration_s and now - t0 >= self.opts.duration_s:
                break
            if self.opts.comm and now >= next_scan:
                next_scan = now + RESCAN_S
                for pid in processes_named(self.opts.comm):
                    # a pid reused by a new process of the name is a new process (key: its start time)
                    if pid not in self.targets and (pid, start_time(pid)) not in self.refused:
                        self._attach_found(pid)
                if not hinted and not self.targets and not self.metrics.pids() and now - t0 >= self.opts.hint_after_s:
                    hinted = True
                    _say(f"ckptrace: no process named {printable(self.opts.comm)!r} in {self.opts.hint_after_s:g} s "
                         "(names are the kernel's comm, at most 15 characters: see `ps -o comm`); still waiting, "
                         "Ctrl-C to stop")
            if not self.opts.comm and not self.targets and not self.metrics.pids():
                _say("ckptrace: every process exited and its last values were served; stopping")
                return
        _say(f"ckptrace: stopped ({stop[0] if stop else 'duration'})")

    def _attach_found(self, pid: int) -> None:
        """A process of the --comm name appeared: attach it; one that can't be is said once, and
        the others go on."""
        start = start_time(pid)
        try:
            self.attach(pid)
        except (CkptraceError, OSError) as e:  # e.g. it exited while being attached: the others go on
            self.refused.add((pid, start))
            why = str(e) if isinstance(e, CkptraceError) else f"{e.strerror or e}"
            _say(f"ckptrace: note: not serving PID {pid}: {why}")
            return
        t = self.targets[pid]
        _say(f"ckptrace: serving PID {pid} ({t.comm}, {t.probes} uprobes)")


def _say(text: str) -> None:
    print(printable(text, lines=True), file=sys.stderr, flush=True)
