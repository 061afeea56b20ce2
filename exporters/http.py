"""The /metrics HTTP server of `serve`: one thread, bounded connections, every client on a clock.

prometheus_client's own server starts a thread per connection and waits on each without a time
limit, so a client that opens sockets and sends nothing (slowloris) made serve hold a thread and
its stack per socket, without bound. Here one thread serves every connection from a selector:
- the kernel hands over a connection only once its first bytes arrived (TCP_DEFER_ACCEPT), so a
  scraper's request is there when it is accepted, however late after its connect it was sent;
  connections that send nothing come after the deferral (about a second);
- at most MAX_CONNECTIONS are open; a new one past that closes the connection idle longest that
  has not yet sent a whole request, so a scraper always gets in and is answered at once;
- a request must arrive whole (at most MAX_REQUEST_BYTES of request line and headers) within
  REQUEST_TIMEOUT_S of the connection, and the answer must be taken within RESPONSE_TIMEOUT_S;
- only /metrics is answered (any other path 404, so no scraper mistakes a typo for the series);
- one answer per connection (`Connection: close`, as HTTP/1.0), built by prometheus_client's own
  WSGI app (the same text, OpenMetrics negotiation, gzip and `name[]` filters as its server).
So memory and threads stay bounded whatever clients do: at most MAX_CONNECTIONS sockets with a
request buffer and one answer each, and one thread.
"""
from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from urllib.parse import unquote, urlsplit

MAX_CONNECTIONS = 64
ACCEPT_BURST = 256  # connections accepted before the others' events are looked at
BACKLOG = 4096  # connections the kernel queues (a burst is queued, not dropped; under TCP_DEFER_ACCEPT, also those yet to send: past it the kernel falls back to SYN cookies, which skip the deferral)
MAX_REQUEST_BYTES = 8192
DEFER_ACCEPT_S = 1  # a connection that sends nothing is accepted after about this (then on a clock)
REQUEST_TIMEOUT_S = 10.0
RESPONSE_TIMEOUT_S = 30.0
GRACE_S = 0.05
TICK_S = 0.5  # how often deadlines are looked at while nothing happens
PATHS = ("/metrics",)  # what serve answers (docs/commands.md); any other path is 404


class _Client:
    __slots__ = ("sock", "born", "since", "deadline", "inbox", "outbox")

    def __init__(self, sock: socket.socket, now: float):
        self.sock = sock
        self.born = time.monotonic()  # accepted at
        self.since = now  # last activity: the longest idle goes first when the table is full
        self.deadline = now + REQUEST_TIMEOUT_S
        self.inbox = bytearray()
        self.outbox: memoryview | None = None  # the answer, once the request is whole


class MetricsServer:
    """Serves `app` (a WSGI app: prometheus_client.make_wsgi_app(registry)) on (host, port).
    bind() raises OSError as socket.bind does; start() serves in a daemon thread; close() stops."""

    def __init__(self, host: str, port: int, app):
        self.app = app
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((host, port))
            # Before it, a scraper accepted before its request arrived (descheduled between connect
            # and send) could be closed to make room for an attacker's next connections.
            self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_S)
            self.listener.listen(BACKLOG)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.clients: dict[int, _Client] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="ckptrace-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self.thread.is_alive():
            self.thread.join(5)
        for c in list(self.clients.values()):
            self._drop(c)
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()
        self.selector.close()

    def _run(self) -> None:
        while not self._stop:
            now = time.monotonic()
            for key, events in self.selector.select(timeout=TICK_S):
                if key.fileobj is self.listener:
                    self._accept(now)
                elif key.fileobj is self._wake_r:
                    return
                else:
                    c = self.clients.get(key.fd)
                    if c is not None:
                        self._step(c, events, now)
            now = time.monotonic()
            for c in [c for c in self.clients.values() if now > c.deadline]:
                self._drop(c)

    def _accept(self, now: float) -> None:
        # Each connection's request is read as it is accepted: a scraper's has arrived by then
        # and is answered at once, so the table holds only clients that have not sent one.
        for _ in range(ACCEPT_BURST):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: the ones waiting stay queued
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._make_room()
                return
            if len(self.clients) >= MAX_CONNECTIONS:
                self._make_room()
            sock.setblocking(False)
            c = _Client(sock, now)
            self.clients[sock.fileno()] = c
            self.selector.register(sock, selectors.EVENT_READ)
            self._step(c, selectors.EVENT_READ, now)

    def _make_room(self) -> None:
        """Close the connection idle longest that is still sending its request (an answer being
        taken is left to finish); where every one is being answered, the oldest."""
        waiting = [c for c in self.clients.values() if c.outbox is None] or list(self.clients.values())
        # one accepted in the last GRACE_S is closed only where all are that young: a scraper whose
        # connection skipped the deferral (SYN cookies) still gets a moment to send its request
        now = time.monotonic()
        waiting = [c for c in waiting if now - c.born >= GRACE_S] or waiting
        if waiting:
            self._drop(min(waiting, key=lambda c: c.since))

    def _step(self, c: _Client, events: int, now: float) -> None:
        try:
            if c.outbox is None and events & selectors.EVENT_READ:
                data = c.sock.recv(4096)
                if not data:
                    self._drop(c)
                    return
                c.inbox += data
                c.since = now
                end = c.inbox.find(b"\r\n\r\n")
                if end < 0 and len(c.inbox) > MAX_REQUEST_BYTES:
                    self._answer(c, "431 Request Header Fields Too Large", [], b"request too large\n", now)
                elif end >= 0:
                    self._answer(c, *self._respond(bytes(c.inbox[:end])), now)
                else:
                    return
            if c.outbox is not None:  # just answered, or writable: send what the socket takes
                sent = c.sock.send(c.outbox)
                c.outbox = c.outbox[sent:]
                c.since = now
                if not c.outbox:
                    self._drop(c)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(c)

    def _respond(self, head: bytes) -> tuple[str, list, bytes]:
        """(status, headers, body) for a request's line and headers, from the WSGI app."""
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ")
        except ValueError:
            return "400 Bad Request", [], b"bad request\n"
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        url = urlsplit(target)
        if unquote(url.path) not in PATHS:  # prometheus_client's app answers any path with the series
            return "404 Not Found", [], b"not found: the series are at /metrics\n"
        environ = {"REQUEST_METHOD": method, "PATH_INFO": unquote(url.path or "/"),
                   "QUERY_STRING": url.query, "SERVER_PROTOCOL": "HTTP/1.0"}
        for name in ("accept", "accept-encoding"):
            if name in headers:
                environ[f"HTTP_{name.upper().replace('-', '_')}"] = headers[name]
        got: list = []
        try:
            body = b"".join(self.app(environ, lambda status, hdrs, exc_info=None: got.extend((status, hdrs))))
        except Exception as e:  # a collector that fails: the scraper sees why; serve goes on
            return "500 Internal Server Error", [], f"collecting the metrics failed: {type(e).__name__}\n".encode()
        return got[0], list(got[1]), body

    def _answer(self, c: _Client, status: str, headers: list, body: bytes, now: float) -> None:
        names = {k.lower() for k, _ in headers}
        head = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
        if "content-type" not in names:
            head.append("Content-Type: text/plain; charset=utf-8")
        head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        c.outbox = memoryview("\r\n".join(head).encode("latin-1") + body)
        c.inbox = bytearray()
        c.deadline = now + RESPONSE_TIMEOUT_S
        self.selector.modify(c.sock, selectors.EVENT_WRITE)

    def _drop(self, c: _Client) -> None:
        self.clients.pop(c.sock.fileno(), None)
        try:
            self.selector.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
