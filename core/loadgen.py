"""The load generator: distinct streaming prompts to a llama-server on this machine, with TTFT.

Used by `ckptrace drive` and by the llama-server sample. It talks only to the server it was
given: plain http.client, which never follows a redirect and never reads http_proxy. Every
request, and the whole run, ends by a wall-clock deadline however the server behaves: a watchdog
shuts the socket down at the deadline, so a server trickling bytes can't hold a client. Anything
but a well-formed stream that ends with `stop` is a failure with its reason.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import random
import socket
import threading
import time
import urllib.parse
from typing import Callable

import pandas as pd

from ckptrace.core.errors import TargetError
from ckptrace.core.terminal import printable

# The network policy allows no other target: the server must be on this machine.
LOCAL_HOSTS = ("127.0.0.1", "localhost")
REASON_CHARS = 80  # a failure's reason, as shown in the status column
# One line of the event stream, at most: llama-server's longest, the last chunk with its timings
# and settings, is a few KiB. A server sending a line without end once took drive to 3.1 GB.
LINE_MAX = 1 << 20
COUNT_MAX = (1 << 31) - 1  # a token count, as a trace holds one (core/validate.py)
# Refused connections to a server we did not start: nothing listens, said after this long (a
# server restarting has that long to listen again), not after --timeout.
REFUSED_S = 1.0

# Short common English words: about one GPT-2 style token each, so a prompt of T words is
# close to T tokens. The server's own count is what the results report.
WORDS = (
    "the of and to in is it that for on was with he as at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take"
).split()

RESULT_COLUMNS = {
    "request": "int64", "client": "int64", "prompt_tokens": "int64", "start_unix_ns": "int64",
    "start_ns": "int64", "ttft_ns": "Int64", "total_ns": "Int64", "status": "string",
    "predicted_tokens": "int64",
}


def local_url(value: str) -> str:
    """`value` as a base URL on 127.0.0.1 or localhost; ValueError saying why not."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme != "http":
        raise ValueError(f"{printable(value)!r}: give an http:// URL, e.g. http://127.0.0.1:8080")
    host = parts.hostname or ""
    if host not in LOCAL_HOSTS:
        raise ValueError(f"{printable(value)!r}: only 127.0.0.1 or localhost may be driven (this machine's "
                         "network policy forbids any other target)")
    if host == "localhost" and not _resolves_to_loopback(host):
        raise ValueError("'localhost' does not resolve to a loopback address here: use 127.0.0.1")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"{printable(value)!r}: the port is not a number") from None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _resolves_to_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


class Exchange:
    """One HTTP request to the local server, cut off at `deadline` (time.monotonic()) whatever
    the server does. `response` is the http.client response, read by the caller."""

    def __init__(self, base: str, method: str, path: str, deadline: float, body: dict | None = None):
        parts = urllib.parse.urlsplit(base)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=remaining)
        self.cut = False
        self.sock = None
        self._watchdog = threading.Timer(remaining, self._cut_off)
        self._watchdog.daemon = True
        self._watchdog.start()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data else {}
        try:
            self.conn.connect()
            # Ours to shut down: http.client hands the socket to the response and forgets it.
            self.sock = self.conn.sock
            if self.cut:  # the deadline passed while connecting
                raise TimeoutError("deadline passed")
            self.conn.request(method, parts.path + path, body=data, headers=headers)
            self.response = self.conn.getresponse()
        except BaseException:
            self.close()
            raise

    def _cut_off(self) -> None:
        self.cut = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv at once
            except OSError:
                pass

    def close(self) -> None:
        self._watchdog.cancel()
        if getattr(self, "response", None) is not None:
            self.response.close()
        self.conn.close()

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_healthy(base: str, deadline: float, exited: Callable[[], int | None] | None = None) -> None:
    """Return once GET /health answers 200 (503 while the model loads), by `deadline`.

    `exited`: for a server we started, its poll(); refused connections are then waited out,
    else (someone's server) REFUSED_S of refusals mean nothing listens."""
    last = "no answer"
    refused_until = deadline if exited else min(deadline, time.monotonic() + REFUSED_S)
    while time.monotonic() < deadline:
        if exited is not None and exited() is not None:
            raise TargetError(f"the server exited ({exited()}) before {base}/health answered 200")
        try:
            with Exchange(base, "GET", "/health", min(deadline, time.monotonic() + 5.0)) as ex:
                if ex.response.status == 200:
                    return
                last = f"HTTP {ex.response.status}"
        except ConnectionRefusedError:
            last = "connection refused"
            if time.monotonic() >= refused_until:
                break
        except (OSError, http.client.HTTPException) as e:
            last = printable(str(e) or type(e).__name__)
        time.sleep(0.2)
    if last == "connection refused" and exited is None:
        raise TargetError(f"nothing listens at {base}: start llama-server with "
                          "--host 127.0.0.1 --port PORT, or fix the URL")
    raise TargetError(f"{base}/health did not answer 200 in time ({last}): is the model still "
                      "loading? raise --timeout")


def make_prompt(request: int, n_words: int, seed: int) -> str:
    """Prompt `request` of a run: distinct from its first word, the same for the same seed."""
    rng = random.Random(seed * 1_000_003 + request)
    return f"Request {request}: " + " ".join(rng.choice(WORDS) for _ in range(max(1, n_words - 3)))


class BadStream(Exception):
    """The response is not the stream /completion promises; str() is the reason."""


def one_request(base: str, body: dict, deadline: float) -> dict:
    """POST one streaming completion; time its first content chunk and its end. Never raises:
    a failure is a status other than "ok", with its reason."""
    t0 = time.monotonic_ns()
    out = {"ttft_ns": None, "total_ns": None, "status": "ok", "prompt_tokens": -1, "predicted_tokens": 0,
           "start_ns": t0, "start_unix_ns": time.time_ns()}
    ex = None
    try:
        ex = Exchange(base, "POST", "/completion", deadline, body)
        _read_stream(ex.response, out, t0)
        out["total_ns"] = time.monotonic_ns() - t0
    except (BadStream, OSError, http.client.HTTPException) as e:
        if (ex is not None and ex.cut) or isinstance(e, TimeoutError) or time.monotonic() >= deadline:
            out["status"] = "timeout"  # cut at the deadline: whatever broke after that is its doing
        elif isinstance(e, BadStream):
            out["status"] = f"bad response: {e}"
        else:
            out["status"] = f"error: {type(e).__name__} {e}".strip()
    finally:
        if ex is not None:
            ex.close()
    out["status"] = printable(out["status"])[:REASON_CHARS]
    return out


def _read_stream(resp: http.client.HTTPResponse, out: dict, t0: int) -> None:
    if 300 <= resp.status < 400:
        raise BadStream(f"HTTP {resp.status} redirect to {resp.getheader('Location', '?')} (not followed)")
    if resp.status != 200:
        raise BadStream(f"HTTP {resp.status}")
    first_chunk_ns = None
    while raw := resp.readline(LINE_MAX + 1):
        if len(raw) > LINE_MAX:
            raise BadStream(f"a line longer than {LINE_MAX >> 20} MiB")
        line = raw.strip()
        if not line or line.startswith(b":"):
            continue  # SSE blank separator or comment
        if not line.startswith(b"data:"):
            raise BadStream(f"not an event stream (a line starts {line[:20]!r})")
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        now = time.monotonic_ns()
        try:
            chunk = json.loads(payload)
        except ValueError:  # also an integer of over 4,300 digits
            raise BadStream("a data line is not JSON") from None
        except RecursionError:
            raise BadStream("a data line is nested too deep") from None
        if not isinstance(chunk, dict):
            raise BadStream("a data line is not a JSON object")
        if "error" in chunk:
            raise BadStream(f"server error {json.dumps(chunk['error'])[:60]}")
        content = chunk.get("content", "")
        if not isinstance(content, str):
            raise BadStream("content is not text")
        first_chunk_ns = first_chunk_ns or now
        if content:
            out["predicted_tokens"] += 1  # one streamed piece per token, unless the server says
            if out["ttft_ns"] is None:
                out["ttft_ns"] = now - t0
        for key, field in (("tokens_evaluated", "prompt_tokens"), ("tokens_predicted", "predicted_tokens")):
            count = chunk.get(key)
            if count is not None:
                if type(count) is not int or not 0 <= count <= COUNT_MAX:
                    raise BadStream(f"{key} is not a count (0..{COUNT_MAX})")
                out[field] = count
        if chunk.get("stop") is True:
            if out["ttft_ns"] is None and first_chunk_ns is not None:
                out["ttft_ns"] = first_chunk_ns - t0  # a stream of empty pieces: its first chunk
            return
    raise BadStream("the stream ended before its stop chunk" if first_chunk_ns else "an empty response")


def run_load(url: str, clients: int, requests: int, prompt_tokens: int = 256, n_predict: int = 8,
             timeout_s: float = 300.0, seed: int = 0, request_timeout_s: float | None = None) -> pd.DataFrame:
    """Drive `requests` distinct streaming prompts through `clients` concurrent clients.

    Nothing starts after `timeout_s` and nothing runs past it (waiting for /health included);
    each request also ends by `request_timeout_s`. One row per request started, in
    RESULT_COLUMNS (start_ns is CLOCK_MONOTONIC, the trace clock).
    """
    base = local_url(url)
    deadline = time.monotonic() + timeout_s
    wait_healthy(base, deadline)
    lock = threading.Lock()
    next_request = [0]
    rows: list[dict] = []

    def client(c: int) -> None:
        while True:
            with lock:
                i = next_request[0]
                if i >= requests or time.monotonic() >= deadline:
                    return
                next_request[0] += 1
            body = {"prompt": make_prompt(i, prompt_tokens, seed), "n_predict": n_predict,
                    "stream": True, "temperature": 0.0, "seed": seed}
            ends = deadline if request_timeout_s is None else min(deadline, time.monotonic() + request_timeout_s)
            r = one_request(base, body, ends)
            r.update(request=i, client=c)
            with lock:
                rows.append(r)

    threads = [threading.Thread(target=client, args=(c,), daemon=True, name=f"drive-{c}")
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5.0)  # the watchdogs end every request by then
    with lock:
        df = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    return df.astype(RESULT_COLUMNS).sort_values("request", ignore_index=True)


def ttft_percentiles_ms(df: pd.DataFrame) -> dict[str, float]:
    """p50/p90/p99 of TTFT in ms over the requests that completed (NaN when none)."""
    ok = df.loc[df["status"] == "ok", "ttft_ns"].dropna().astype("float64") / 1e6
    return {f"p{q}": float(ok.quantile(q / 100)) if len(ok) else float("nan") for q in (50, 90, 99)}
