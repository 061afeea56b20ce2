"""The request file `ckptrace drive --json` writes: one JSON object per request, read back checked.

What `analyze --requests`, `compare` and `dashboard --requests` join with a trace. A request file
may come from anyone, so reading it checks, before anything is computed: a regular file of at
most MAX_BYTES holding at most MAX_REQUESTS objects and MAX_VALUES values (counted before it is
parsed, so the memory it takes is bounded: a 256 MiB file of `{},` once took 6 GB), a JSON list
of objects with no key twice in one (which value would count is anyone's guess), each with the
fields below of the right JSON type (a `true` is not a count) and in range, each request ending
after its first token and its window inside the 64-bit clock. The first problem is one line
naming the file, the request and the field. Fields a newer drive adds are ignored; `predicted_tokens` (added later) reads as NA
when absent: throughput is then not recorded, never 0.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from ckptrace.core.errors import TraceFormatError, UsageError
from ckptrace.core.loadgen import RESULT_COLUMNS
from ckptrace.core.output import write_output
from ckptrace.core.terminal import printable
from ckptrace.core.validate import NS_MAX, KeyTwice, no_key_twice, open_regular

MAX_BYTES = 32 << 20  # drive's most, 100,000 requests, take about 23 MiB
MAX_REQUESTS = 100_000  # objects and lists in a file: drive --requests' most
MAX_VALUES = 16 * MAX_REQUESTS  # list items and object entries (drive writes 9 a request)
# field -> (JSON type, may be null). start_ns is CLOCK_MONOTONIC, the clock of a trace.
FIELDS = {
    "request": (int, False), "client": (int, False), "prompt_tokens": (int, False),
    "start_unix_ns": (int, False), "start_ns": (int, False), "ttft_ns": (int, True),
    "total_ns": (int, True), "status": (str, False), "predicted_tokens": (int, False),
}
OPTIONAL = {"predicted_tokens", "client", "prompt_tokens", "start_unix_ns"}
COLUMNS = {**RESULT_COLUMNS, "predicted_tokens": "Int64", "client": "Int64", "prompt_tokens": "Int64",
           "start_unix_ns": "Int64"}
RANGE = {"prompt_tokens": (-1, NS_MAX), "request": (0, NS_MAX)}  # -1: the server did not say


def requests_path(trace: str | os.PathLike) -> Path:
    """The request file that goes with a trace: NAME.requests.json beside NAME.parquet."""
    p = Path(trace)
    return p.with_name((p.stem if p.suffix == ".parquet" else p.name) + ".requests.json")


def requests_json(df: pd.DataFrame) -> str:
    """The request file's text for drive's results (loadgen.run_load): a JSON list, one object per request."""
    return json.dumps(json.loads(df.to_json(orient="records")), indent=1)


def write_requests(path: str | os.PathLike, df: pd.DataFrame) -> Path:
    """Write the request file (atomically, through ckptrace.core.output)."""
    text = requests_json(df).encode() + b"\n"
    return write_output(path, lambda f: f.write(text), what="request file")


def read_requests(path: str | os.PathLike) -> pd.DataFrame:
    """The file's requests as a frame of COLUMNS, in file order; TraceFormatError on any problem."""
    shown = printable(path)
    source = open_regular(path, what="request")
    try:
        if source.size() > MAX_BYTES:
            raise TraceFormatError(f"{shown}: {source.size() >> 20} MiB is too large for a request file "
                                   f"(at most {MAX_BYTES >> 20} MiB)")
        raw = source.read()
    except OSError as e:
        raise TraceFormatError(f"{shown}: cannot read it ({e})") from None
    finally:
        source.close()
    _check_counts(shown, raw)
    try:
        doc = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=no_key_twice)
    except KeyTwice as e:
        raise TraceFormatError(f"{shown}: an object holds the key {printable(e.key)[:80]!r} twice (which one "
                               "counts is anyone's guess): not a request file `ckptrace drive` wrote") from None
    except (ValueError, RecursionError):
        raise TraceFormatError(f"{shown}: not a request file (not valid JSON; write one with "
                               "`ckptrace drive URL --json -o FILE`)") from None
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        raise TraceFormatError(f"{shown}: not a request file (want a JSON list of request objects, as "
                               "`ckptrace drive --json` prints)")
    if not doc:
        raise TraceFormatError(f"{shown}: holds no requests")
    cols: dict[str, list] = {f: [] for f in FIELDS}
    for i, row in enumerate(doc):
        for field, (kind, nullable) in FIELDS.items():
            value = row.get(field)
            if value is None and (nullable or (field in OPTIONAL and field not in row)):
                cols[field].append(None)
                continue
            if field not in row:
                raise TraceFormatError(f"{shown}: request {i + 1} has no {field!r}")
            if type(value) is not kind:
                raise TraceFormatError(f"{shown}: request {i + 1}: {field!r} is not "
                                       f"{'a whole number' if kind is int else 'text'}")
            lo, hi = RANGE.get(field, (0, NS_MAX))
            if kind is int and not lo <= value <= hi:
                raise TraceFormatError(f"{shown}: request {i + 1}: {field!r} = {value} is out of range")
            cols[field].append(printable(value)[:200] if kind is str else value)
        _check_times(shown, i, cols["start_ns"][-1], cols["ttft_ns"][-1], cols["total_ns"][-1])
    df = pd.DataFrame(cols).astype(COLUMNS)
    if df["request"].duplicated().any():
        raise TraceFormatError(f"{shown}: request number {int(df['request'][df['request'].duplicated()].iloc[0])} "
                               "appears twice: one run's file holds each request once")
    return df[list(COLUMNS)]


def _check_times(shown: str, i: int, start: int, ttft: int | None, total: int | None) -> None:
    """A request ends after its first token, and its window's end (start + ttft or total) is a
    time on the 64-bit clock: what every later sum assumes."""
    if ttft is not None and total is not None and total < ttft:
        raise TraceFormatError(f"{shown}: request {i + 1}: 'total_ns' = {total} is less than its 'ttft_ns' = "
                               f"{ttft}: a request ends after its first token")
    longest = max(x for x in (ttft, total, 0) if x is not None)
    if start + longest > NS_MAX:
        raise TraceFormatError(f"{shown}: request {i + 1}: 'start_ns' + {'total_ns' if longest == total else 'ttft_ns'} "
                               f"is past {NS_MAX} ns (the latest time a trace holds; its sums stay in 64 bits)")


def _check_counts(shown: str, raw: bytes) -> None:
    """At most MAX_REQUESTS objects and lists and MAX_VALUES values, counted outside strings
    before anything is parsed: what the parsed file can cost is bounded by these, not its size."""
    # With escaped backslashes and quotes taken out, every quote opens or closes a string.
    text = np.frombuffer(raw.replace(b"\\\\", b"").replace(b'\\"', b""), np.uint8)
    outside = ~np.logical_xor.accumulate(text == ord('"'))
    containers = int(np.count_nonzero(((text == ord("{")) | (text == ord("["))) & outside))
    values = int(np.count_nonzero((text == ord(",")) & outside)) + 1  # a key and its value are one
    if containers > MAX_REQUESTS + 1 or values > MAX_VALUES:
        what = f"{containers} objects and lists" if containers > MAX_REQUESTS + 1 else f"{values} values"
        raise TraceFormatError(f"{shown}: {what}, more than a request file holds (at most {MAX_REQUESTS} "
                               f"requests of {MAX_VALUES // MAX_REQUESTS} values on average): not a request file")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


# `--requests -`: this leg has no request file.
NO_REQUESTS = "-"


def leg_requests(traces, given=()) -> list | None:
    """Each leg's request file: the ones given (one per trace, in order; NO_REQUESTS or None
    skips a leg), else NAME.requests.json beside each NAME.parquet where there is one; None when
    no leg has one."""
    if given:
        if len(given) != len(traces):
            raise UsageError(f"--requests given {len(given)} times for {len(traces)} traces: give one "
                             f"request file per trace, in the same order ({NO_REQUESTS} for a leg without "
                             "one), or none, to pair each NAME.parquet with NAME.requests.json beside it")
        if all(p is None or p == NO_REQUESTS for p in given):
            return None
        return [None if p is None or p == NO_REQUESTS else read_requests(p) for p in given]
    paired = [requests_path(t) for t in traces]
    if not any(p.exists() for p in paired):
        return None
    return [read_requests(p) if p.exists() else None for p in paired]


def lacking_requests(traces, requests: list | None) -> list[str]:
    """One warning per leg without a request file, when other legs have one."""
    if requests is None:
        return []
    return [f"leg {i + 1} ({printable(t)}) has no request file (--requests, or NAME.requests.json beside "
            "NAME.parquet): no requests drawn for it" for i, (t, r) in enumerate(zip(traces, requests)) if r is None]


def request_pid_choices(traces, requests: list | None, choices=()) -> tuple[str, ...]:
    """--requests-pid, checked against the traces and request files: once, or once per trace."""
    choices = tuple(choices)
    if choices and len(choices) not in (1, len(traces)):
        raise UsageError(f"--requests-pid given {len(choices)} times for {len(traces)} traces: give it once "
                         "(a process label, the same in every leg) or once per trace, in the same order")
    if choices and requests is None:
        raise UsageError("--requests-pid says which process a leg's requests went to: there is no request "
                         "file (--requests, or NAME.requests.json beside NAME.parquet)")
    return choices
