"""`ckptrace drive`: a bounded load of distinct streaming prompts to a local llama-server, with TTFT."""
from __future__ import annotations

import ipaddress
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import click
import pandas as pd

from ckptrace.errors import TargetError

# The network policy allows no other target: the server must be on this machine.
LOCAL_HOSTS = ("127.0.0.1", "localhost")
# No proxies: urllib would honour http_proxy and send "local" requests to another host.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

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
}


class LocalURL(click.ParamType):
    """An http:// URL on 127.0.0.1 or localhost; any other host is refused."""

    name = "URL"

    def convert(self, value, param, ctx):
        parts = urllib.parse.urlsplit(value)
        if parts.scheme != "http":
            self.fail(f"{value!r}: give an http:// URL, e.g. http://127.0.0.1:8080", param, ctx)
        host = parts.hostname or ""
        if host not in LOCAL_HOSTS:
            self.fail(f"{value!r}: only 127.0.0.1 or localhost may be driven (this machine's "
                      f"network policy forbids any other target)", param, ctx)
        if host == "localhost" and not _resolves_to_loopback(host):
            self.fail("'localhost' does not resolve to a loopback address here: use 127.0.0.1",
                      param, ctx)
        try:
            parts.port
        except ValueError:
            self.fail(f"{value!r}: the port is not a number", param, ctx)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _resolves_to_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def make_prompt(request: int, n_words: int, seed: int) -> str:
    """Prompt `request` of a run: distinct from its first word, the same for the same seed."""
    rng = random.Random(seed * 1_000_003 + request)
    return f"Request {request}: " + " ".join(rng.choice(WORDS) for _ in range(max(1, n_words - 3)))


def _one_request(base: str, body: dict, deadline: float) -> dict:
    """POST one streaming completion; time its first content chunk and its end."""
    out = {"ttft_ns": None, "total_ns": None, "status": "ok", "prompt_tokens": -1}
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        out["status"] = "timeout"
        return out
    req = urllib.request.Request(base + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.monotonic_ns()
    out["start_ns"], out["start_unix_ns"] = t0, time.time_ns()
    first_chunk_ns = None
    try:
        with _OPENER.open(req, timeout=remaining) as resp:
            for raw in resp:
                if time.monotonic() > deadline:
                    out["status"] = "timeout"
                    break
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.monotonic_ns()
                chunk = json.loads(payload)
                first_chunk_ns = first_chunk_ns or now
                if out["ttft_ns"] is None and chunk.get("content"):
                    out["ttft_ns"] = now - t0
                if "tokens_evaluated" in chunk:
                    out["prompt_tokens"] = int(chunk["tokens_evaluated"])
                if chunk.get("stop"):
                    break
    except urllib.error.HTTPError as e:
        out["status"] = f"http {e.code}"
    except (TimeoutError, socket.timeout):
        out["status"] = "timeout"
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        out["status"] = f"error: {reason}"[:60]
    except ValueError:
        out["status"] = "error: bad stream"
    end = time.monotonic_ns()
    if out["status"] == "ok":
        out["total_ns"] = end - t0
        # a stream of empty pieces (rare with a random model): time the first chunk instead
        if out["ttft_ns"] is None and first_chunk_ns is not None:
            out["ttft_ns"] = first_chunk_ns - t0
    return out


def wait_ready(base: str, deadline: float) -> None:
    """Wait for GET /health to answer 200 (503 while the model loads)."""
    last = "no answer"
    refused_until = min(deadline, time.monotonic() + 10.0)  # a server just started may not listen yet
    while time.monotonic() < deadline:
        try:
            with _OPENER.open(base + "/health", timeout=max(0.1, min(5.0, deadline - time.monotonic()))) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
            refused = isinstance(getattr(e, "reason", e), ConnectionRefusedError)
            if refused and time.monotonic() >= refused_until:
                break
        time.sleep(0.2)
    if last.endswith("Connection refused"):
        raise TargetError(f"nothing listens at {base}: start llama-server with "
                          f"--host 127.0.0.1 --port PORT, or fix the URL")
    raise TargetError(f"{base}/health did not answer 200 in time ({last}): is the model still "
                      f"loading? raise --timeout")


def run_load(url: str, clients: int, requests: int, prompt_tokens: int = 256,
             n_predict: int = 8, timeout_s: float = 300.0, seed: int = 0) -> pd.DataFrame:
    """Drive `requests` distinct streaming prompts through `clients` concurrent clients.

    Stops starting requests at the time bound and cuts open streams there. Returns one row per
    request sent, in RESULT_COLUMNS (start_ns is CLOCK_MONOTONIC, the trace clock).
    """
    base = LocalURL().convert(url, None, None)
    deadline = time.monotonic() + timeout_s
    wait_ready(base, deadline)
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
            r = _one_request(base, body, deadline)
            r.update(request=i, client=c)
            with lock:
                rows.append(r)

    threads = [threading.Thread(target=client, args=(c,), daemon=True, name=f"drive-{c}")
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    df = pd.DataFrame([r for r in rows if "start_ns" in r], columns=list(RESULT_COLUMNS))
    return df.astype(RESULT_COLUMNS).sort_values("request", ignore_index=True)


def ttft_percentiles_ms(df: pd.DataFrame) -> dict[str, float]:
    """p50/p90/p99 of TTFT in ms over the requests that completed (NaN when none)."""
    ok = df.loc[df["status"] == "ok", "ttft_ns"].dropna().astype("float64") / 1e6
    return {f"p{q}": float(ok.quantile(q / 100)) if len(ok) else float("nan") for q in (50, 90, 99)}


def format_table(df: pd.DataFrame) -> str:
    t0 = int(df["start_ns"].min()) if len(df) else 0
    lines = [f"{'req':>4} {'client':>6} {'prompt_tok':>10} {'start_ms':>9} {'ttft_ms':>9} "
             f"{'total_ms':>9}  status"]
    ms = lambda v: "-" if pd.isna(v) else f"{v / 1e6:.1f}"  # noqa: E731
    for r in df.itertuples(index=False):
        lines.append(f"{r.request:>4} {r.client:>6} {r.prompt_tokens:>10} "
                     f"{(r.start_ns - t0) / 1e6:>9.1f} {ms(r.ttft_ns):>9} {ms(r.total_ns):>9}  {r.status}")
    return "\n".join(lines)


@click.command("drive", epilog="""\b
Examples:
  ckptrace drive http://127.0.0.1:8080 --clients 3 --requests 6
  ckptrace drive http://localhost:8080 --clients 4 --requests 40 \\
      --prompt-tokens 480 --n-predict 16
  ckptrace drive http://127.0.0.1:8080 --requests 6 --json > ttft.json
""")
@click.argument("url", type=LocalURL())
@click.option("--clients", type=click.IntRange(1, 256), default=3, show_default=True,
              help="Concurrent clients (one request in flight each).")
@click.option("--requests", "n_requests", type=click.IntRange(1, 100000), default=6, show_default=True,
              help="Requests in all; each has its own prompt.")
@click.option("--prompt-tokens", type=click.IntRange(4, 1_000_000), default=256, show_default=True,
              help="Prompt length, in words of about one token each.")
@click.option("--n-predict", type=click.IntRange(1, 100000), default=8, show_default=True,
              help="Tokens to generate per request.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Bound on the whole run, in seconds (waiting for /health included).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompts' words.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-request list as JSON for scripts.")
def command(url, clients, n_requests, prompt_tokens, n_predict, timeout_s, seed, as_json):
    """Send distinct streaming prompts to URL/completion and report time to first token.

    URL must be on 127.0.0.1 or localhost. Clients take requests in turn until --requests
    are sent or --timeout passes. TTFT is the time from sending a request to its first
    streamed chunk with content. Times in --json: start_unix_ns (wall clock), start_ns
    (CLOCK_MONOTONIC, the clock of ckptrace traces), ttft_ns and total_ns (durations).
    """
    df = run_load(url, clients, n_requests, prompt_tokens, n_predict, timeout_s, seed)
    if as_json:
        records = json.loads(df.to_json(orient="records"))
        click.echo(json.dumps(records, indent=1))
        return
    click.echo(format_table(df))
    p = ttft_percentiles_ms(df)
    n_ok = int((df["status"] == "ok").sum())
    click.echo(f"{n_ok} of {n_requests} requests ok, {len(df)} sent; TTFT ms: "
               f"p50 {p['p50']:.1f}  p90 {p['p90']:.1f}  p99 {p['p99']:.1f}")
    if n_ok == 0:
        raise TargetError(f"no request to {url} completed: see the status column")
