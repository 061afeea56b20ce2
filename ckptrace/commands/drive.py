"""`ckptrace drive`: a bounded load of distinct streaming prompts to a local llama-server, with TTFT.

The load generator is core/loadgen.py; this command parses options and prints."""
from __future__ import annotations

import json

import click

from ckptrace.core.errors import TargetError
from ckptrace.options import seconds


class LocalURL(click.ParamType):
    """An http:// URL on 127.0.0.1 or localhost; any other host is refused."""

    name = "URL"

    def convert(self, value, param, ctx):
        from ckptrace.core.loadgen import local_url

        try:
            return local_url(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.command("drive", epilog="""\b
Examples:
  ckptrace drive http://127.0.0.1:8080 --clients 3 --requests 6
  ckptrace drive http://localhost:8080 --clients 4 --requests 40 \\
      --prompt-tokens 480 --n-predict 16
  ckptrace drive http://127.0.0.1:8080 --requests 6 --json > ttft.json
  ckptrace drive http://127.0.0.1:8080 --requests 30 -o off.requests.json
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
@click.option("--timeout", "timeout_s", type=seconds(), default=300.0,
              show_default=True, help="Hard wall-clock bound on the whole run, in seconds (waiting for "
                                      "/health included): every open request is cut off then.")
@click.option("--request-timeout", "request_timeout_s", type=seconds(),
              default=None, help="Hard wall-clock bound on each request, in seconds (default: --timeout).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompts' words.")
@click.option("--json", "as_json", is_flag=True, help="Print {schema_version, requests: [...]} as JSON for scripts (-o writes the list alone: the request file).")
@click.option("-o", "--output", metavar="FILE", default=None,
              help="Also write the per-request JSON list to FILE (the request file `analyze --requests` and "
                   "`compare` read; name it NAME.requests.json beside the trace NAME.parquet to pair them).")
def command(url, clients, n_requests, prompt_tokens, n_predict, timeout_s, request_timeout_s, seed, as_json,
            output):
    """Send distinct streaming prompts to URL/completion and report time to first token.

    URL must be on 127.0.0.1 or localhost; redirects are never followed. Clients take requests
    in turn until --requests are sent or --timeout passes. TTFT is the time from sending a
    request to its first streamed chunk with content. A request that fails, times out or gets
    anything but a well-formed stream ending with its stop chunk is counted with its reason, and
    the exit status is then 1. Times in --json: start_unix_ns (wall clock), start_ns
    (CLOCK_MONOTONIC, the clock of ckptrace traces), ttft_ns and total_ns (durations),
    predicted_tokens (tokens generated). -o FILE writes the list of requests (the request file) to FILE, failed requests
    included, before the exit status says they failed.
    """
    from ckptrace.core.loadgen import run_load, ttft_percentiles_ms
    from ckptrace.core.output import check_output
    from ckptrace.renderers.text import load_report
    from ckptrace.core.requests_file import requests_json, write_requests

    if output is not None:
        check_output(output, what="request file")  # before the load, not after it
    df = run_load(url, clients, n_requests, prompt_tokens, n_predict, timeout_s, seed, request_timeout_s)
    if output is not None:
        write_requests(output, df)
    if as_json:
        from ckptrace.renderers.json import versioned

        click.echo(json.dumps(versioned({"requests": json.loads(requests_json(df))}), indent=1))
    else:
        click.echo(load_report(df, n_requests, ttft_percentiles_ms(df)))
    failed = df[df["status"] != "ok"]
    if len(failed) or len(df) < n_requests:
        first = failed["status"].iat[0] if len(failed) else "not sent before --timeout"
        raise TargetError(f"{n_requests - int((df['status'] == 'ok').sum())} of {n_requests} requests to {url} "
                          f"did not complete (first: {first})")
