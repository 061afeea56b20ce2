"""ckptrace as a library: `ckptrace.open(path) -> Trace` and `ckptrace.compare([...]) -> Comparison`.

A thin facade over the analyzers (as Holistic Trace Analysis' `TraceAnalysis` is over its own):
a Trace is one trace file opened and checked once (ckptrace.core.trace.TraceFile) and analysed once,
when a table is first asked for, batch by batch as `analyze` reads it. Every table is a typed
DataFrame with its unit in each column name (`fill_ns`, `bytes`); a figure that was not recorded
is NA, never 0. The commands are users of this module, so a notebook gets exactly what
`analyze --json` and `compare --json` print (docs/api.md, tests/test_api.py).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import cached_property

import pandas as pd

from ckptrace.analyzers import Analysis, analyze_file
from ckptrace.analyzers.compare import Comparison as Result, compare as compare_analyses, compare_per_process, gate
from ckptrace.analyzers.compare_config import DEFAULTS
from ckptrace.analyzers.gpu import GPU_COPY_COLUMNS, gpu_summary
from ckptrace.analyzers.leg_checks import check_distinct
from ckptrace.analyzers.metrics import METRICS as REGISTRY
from ckptrace.analyzers.requests import (process_analysis, request_pids, request_process, request_summary,
                                         request_table)
from ckptrace.core.errors import AnalysisError
from ckptrace.core.meta import TraceMeta
from ckptrace.renderers.json import SCHEMA_VERSION
from ckptrace.core.requests_file import leg_requests, read_requests, request_pid_choices
from ckptrace.core.terminal import printable
from ckptrace.core.trace import BATCH_ROWS, Trace as TraceData, TraceFile, empty_frame, read_trace

__all__ = ["SCHEMA_VERSION", "Comparison", "Trace", "compare", "compare_processes", "open"]

PathLike = str | os.PathLike
PROCESS_COLUMNS = {"pid": "int64", "label": "str", "comm": "str", "executable": "object", "build_id": "object",
                   "profile": "object", "exited_ns": "Int64", "start_ticks": "Int64"}
SUMMARY_COLUMNS = {"label": "str", "unit": "str", "count": "int64", "not_recorded": "int64", "mean": "float64",
                   "median": "float64", "p90": "float64", "p99": "float64"}
MEMORY_COLUMNS = {"peak_held_bytes": "Int64", "peak_held_ns": "Int64", "end_held_bytes": "Int64",
                  "buffers_mapped": "Int64", "buffer_bytes_mapped": "Int64", "released_bytes": "Int64",
                  "peak_rss_bytes": "Int64", "rss_samples": "Int64"}


def open(path: PathLike, *, batch_rows: int = BATCH_ROWS) -> Trace:  # noqa: A001 (ckptrace.open, as io.open)
    """The trace file at `path`, opened and checked once (a bad file raises TraceFormatError, one
    line). Use it as a context manager, or call close()."""
    return Trace(path, batch_rows=batch_rows)


class Trace:
    """One trace: its metadata at once, its tables analysed on first use (see the module docstring)."""

    def __init__(self, path: PathLike, *, batch_rows: int = BATCH_ROWS):
        self.file = TraceFile(path)
        self.path = self.file.path
        self.batch_rows = batch_rows
        self._requests: dict[tuple, tuple[pd.DataFrame, dict]] = {}

    # -- the file

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; tables already computed stay usable."""
        self.file.close()

    def __repr__(self) -> str:
        return f"<ckptrace.Trace {printable(self.path)!r} label={printable(self.label)!r}>"

    @property
    def meta(self) -> TraceMeta:
        """The recording's metadata (ckptrace.core.meta.TraceMeta; `.to_json()` is analyze --json's `trace`).
        A recording cut short (a killed recorder's stream) says so in `complete` and `cut_short`."""
        return self.file.stream_trace()[1] if self.file.stream else self.file.meta

    @property
    def label(self) -> str:
        """The recording's label (`record --label`; else the file's name): how compare groups legs."""
        return TraceData(events=None, meta=self.meta, path=self.path).label

    @cached_property
    def analysis(self) -> Analysis:
        """The analyzers' result (ckptrace.analyzers.Analysis), what the renderers and dashboards
        take; every table below is one of its fields."""
        return analyze_file(self.file, self.batch_rows)

    def events(self) -> pd.DataFrame:
        """Every event of the trace (ckptrace.core.trace.COLUMNS), read whole from the open file."""
        a = self.analysis
        if a.trace.events is None:
            a.trace.events = read_trace(self.file).events
        return a.trace.events

    # -- tables

    @property
    def processes(self) -> pd.DataFrame:
        """One row per recorded process: pid, label (how compare --per-process groups it), comm,
        executable, build_id, profile, exited_ns (NA: ran to the end), start_ticks."""
        rows = [{k: p[k] for k in PROCESS_COLUMNS} for p in self.analysis.processes]
        return pd.DataFrame(rows, columns=list(PROCESS_COLUMNS)).astype(PROCESS_COLUMNS)

    def checkpoints(self) -> pd.DataFrame:
        """One row per checkpoint (analyzers/checkpoints.py; docs/metrics.md says what each column means).
        A pool hit has no fill: its fill_ns is 0 and pool_hit True."""
        return self.analysis.checkpoints

    def iterations(self) -> pd.DataFrame:
        """One row per iteration (update_slots call, else llama_decode to llama_decode), prefill or decode."""
        return self.analysis.iterations

    def restores(self) -> pd.DataFrame:
        """One row per restore (load_tgt/load_dft, state_restore; trace format 3)."""
        return self.analysis.restores

    def evictions(self) -> pd.DataFrame:
        """One row per checkpoint buffer unmapped by create_checkpoint before its checkpoint."""
        return self.analysis.evictions

    def prompt_saves(self) -> pd.DataFrame:
        """One row per prompt-cache save and its copies."""
        return self.analysis.prompt_saves

    def slot_files(self) -> pd.DataFrame:
        """One row per slot save or restore to a file (/slots; trace format 5) and its copies."""
        return self.analysis.slot_files

    def gpu_copies(self) -> pd.DataFrame:
        """One row per state copy that made CUDA calls (analyzers/gpu.py): enqueue, wait and host
        time, where it copied to (`dst`), the destination's and the driver's faults. Empty for a
        trace of no CUDA target (`meta.gpu` is None)."""
        gpu = self.analysis.gpu
        return empty_frame(GPU_COPY_COLUMNS) if gpu is None else gpu

    def gpu_summary(self) -> dict | None:
        """The CUDA copies by destination (analyze --json's gpu.summary); None without a CUDA target."""
        gpu = self.analysis.gpu
        return None if gpu is None else gpu_summary(gpu)

    def summary(self, process: int | str | None = None) -> pd.DataFrame:
        """The distributions, one row per metric (index `metric`, as analyze --json's
        summary.stats): label, unit, count (values recorded), not_recorded, mean, median, p90, p99
        (NaN: no values, or some not recorded). `process`: one process's (pid or label)."""
        stats = self._summary(process)["stats"]
        rows = [{"metric": name, "label": REGISTRY[name].label if name in REGISTRY else name,
                 "unit": REGISTRY[name].unit if name in REGISTRY else "", **d} for name, d in stats.items()]
        frame = pd.DataFrame(rows, columns=["metric", *SUMMARY_COLUMNS]).set_index("metric")
        return frame.astype({k: v for k, v in SUMMARY_COLUMNS.items()})

    def figures(self, process: int | str | None = None) -> dict:
        """The single figures: counts, rates, shares, reliability and notes (analyze --json's
        summary without its `stats`, plain JSON values). `process`: one process's."""
        return {k: v for k, v in self._summary(process).items() if k not in ("stats", "requests")}

    def memory(self, process: int | str | None = None) -> pd.DataFrame:
        """Checkpoint memory and RSS, one row: peak_held_bytes, peak_held_ns, end_held_bytes,
        buffers_mapped, buffer_bytes_mapped, released_bytes, peak_rss_bytes, rss_samples (NA: not
        recorded). `process`: one process's."""
        m = self._memory(process)
        return pd.DataFrame([{k: m[k] for k in MEMORY_COLUMNS}], columns=list(MEMORY_COLUMNS)).astype(MEMORY_COLUMNS)

    def memory_limit(self, process: int | str | None = None) -> dict | None:
        """The cgroup memory limit check (analyzers/memory_limit.py `limit_report`: the limit the trace
        recorded, RSS and what llama.cpp PR #201's pool would hold at peak, a warning when near); None
        unless the recording kept a limit."""
        return self._memory(process).get("limit")

    def releases(self, process: int | str | None = None) -> pd.DataFrame:
        """One row per release of checkpoint buffer memory (an munmap or mremap that gave pages back)."""
        return self._memory(process)["releases"]

    def requests(self, file: PathLike, process: int | str | None = None) -> pd.DataFrame:
        """Each request of a request file (`ckptrace drive --json -o FILE`), its time to first
        token split into checkpoint, restore and the rest (analyze --requests' rows). `process`
        (pid or label) names the process the requests went to in a trace of several."""
        return self._requests_of(file, process)[0]

    def request_summary(self, file: PathLike, process: int | str | None = None) -> dict:
        """The distributions over those requests (analyze --json's summary.requests)."""
        return self._requests_of(file, process)[1]

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every derived table by name (what `analyze --parquet DIR` writes, one file each)."""
        return {"checkpoints": self.checkpoints(), "iterations": self.iterations(), "restores": self.restores(),
                "evictions": self.evictions(), "prompt_saves": self.prompt_saves(), "releases": self.releases(),
                "summary": self.summary().reset_index(), "processes": self.processes, "gpu_copies": self.gpu_copies()}

    # -- helpers

    def _process(self, process: int | str | None) -> dict | None:
        if process is None:
            return None
        entries = self.analysis.processes
        found = [p for p in entries if str(p["pid"]) == str(process)] or \
            [p for p in entries if p["label"] == process]
        if len(found) != 1:
            listed = ", ".join(f"{p['pid']} ({printable(p['label'])})" for p in entries)
            raise AnalysisError(f"{printable(self.path)}: process {printable(str(process))!r} is "
                                f"{'not one' if not found else 'more than one'} of its processes ({listed})")
        return found[0]

    def _summary(self, process) -> dict:
        p = self._process(process)
        return self.analysis.summary if p is None else p["summary"]

    def _memory(self, process) -> dict:
        p = self._process(process)
        return self.analysis.memory if p is None else p["memory"]

    def _requests_of(self, file: PathLike, process) -> tuple[pd.DataFrame, dict]:
        key = (os.fspath(file), None if process is None else str(process))
        if key not in self._requests:
            self.events()  # the split reads spans the batched analysis does not keep
            a = self.analysis
            pid = request_process(a.trace, key[1])
            table = request_table(read_requests(file), a, source=printable(file), pid=pid)
            self._requests[key] = (table, request_summary(table, a.trace, pid=pid))
        return self._requests[key]


class Comparison:
    """Baseline against candidate over A/B/A legs (analyzers/compare.py says every rule)."""

    def __init__(self, result: Result):
        self.result = result  # the analyzers' Comparison: what the renderers take

    def __repr__(self) -> str:
        return (f"<ckptrace.Comparison {printable(self.candidate)!r} against {printable(self.baseline)!r}: "
                f"{len(self.metrics)} metrics>")

    baseline = property(lambda self: self.result.baseline, doc="The baseline's label (the first leg's).")
    candidate = property(lambda self: self.result.candidate, doc="The candidate's label.")
    legs = property(lambda self: self.result.legs, doc="One row per leg, in run order (build_ids comma-separated).")
    metrics = property(lambda self: self.result.metrics,
                       doc="One row per compared metric: both arms' statistic, change_pct with its 95% interval, "
                           "drift_pct, verdict (and the plain difference where the baseline is 0).")
    pool = property(lambda self: self.result.pool, doc="Pool hits and misses apart (empty without pool hits).")
    memory = property(lambda self: self.result.memory, doc="Peak held checkpoint memory and RSS per arm (MiB).")
    ttft = property(lambda self: self.result.ttft,
                    doc="Each TTFT percentile's change split into what the traced checkpoint path explains and "
                        "the rest (analyzers/ttft.py); None without request files.")
    warnings = property(lambda self: list(self.result.warnings), doc="Why a figure may mislead, one line each.")
    explanation = property(lambda self: self.result.explanation, doc="The headline and what moved, as sentences.")
    samples = property(lambda self: self.result.samples, doc="What an arm's samples are.")
    statistic = property(lambda self: self.result.statistic, doc="What an arm is summarised by (mean).")
    seed = property(lambda self: self.result.seed)
    n_boot = property(lambda self: self.result.n_boot, doc="Bootstrap resamples per arm and metric.")
    min_effect_pct = property(lambda self: self.result.min_effect_pct)

    @property
    def headline(self) -> str:
        """The answer in one sentence: what the candidate removes per checkpoint and per prefill
        iteration (on CPU, with its interval), its hit rate and its memory cost (analyzers/headline.py)."""
        head = getattr(self.result, "headline", None)
        if isinstance(head, dict) and head.get("sentence"):
            return head["sentence"]
        return head if isinstance(head, str) and head else self.explanation.split(". ")[0].rstrip(".") + "."

    headline_figures = property(lambda self: self.result.headline or {},
                                doc="The headline's figures: checkpoint, prefill, ttft_p90, hit_rate, memory.")
    warmup = property(lambda self: self.result.warmup, doc="Each arm's warm-up, left out of the metrics (--warmup).")
    warmup_setting = property(lambda self: self.result.warmup_setting, doc="The --warmup it ran with (N or auto).")
    machine = property(lambda self: self.result.machine, doc="The machine-state guard: one state or how the legs differ.")

    def verdict(self, metric: str) -> str:
        """A metric's verdict: faster, slower, no change, within drift, not judged, not measured or
        not recorded. A metric this comparison does not have is an AnalysisError naming those it has."""
        rows = self.metrics.loc[self.metrics["metric"] == metric, "verdict"]
        if not len(rows):
            raise AnalysisError(f"this comparison has no metric {printable(metric)!r}; it has "
                                + ", ".join(self.metrics["metric"]))
        return str(rows.iloc[0])

    def gate(self, fail_on: str, metrics: Sequence[str] | None = None):
        """`compare --fail-on`: (rows that trip it, named rows not judged, named rows judged)."""
        return gate(self.result, fail_on, None if metrics is None else list(metrics))


def legs_with_requests(traces: Sequence, requests=None, requests_pid: Iterable[str] = (), distinct: bool = False
                       ) -> tuple[list[Trace], list | None, list, list[str]]:
    """The legs of a comparison, each opened, with its request frame (None: the leg has none) and
    the pid its requests went to (None: all of it): `requests` one file per trace (None or "-"
    for a leg without), else NAME.requests.json beside each NAME.parquet where there is one.
    Also the lines saying which legs are compared as one process. `distinct`: a recording given
    twice is refused before any leg is analysed (compare's rule, analyzers/leg_checks.py)."""
    paths = [t.path if isinstance(t, Trace) else os.fspath(t) for t in traces]
    frames = leg_requests(paths, tuple(requests or ()))
    choices = request_pid_choices(paths, frames, tuple(requests_pid))
    legs: list[Trace] = []
    try:
        for t in traces:
            legs.append(t if isinstance(t, Trace) else Trace(t))
    except BaseException:
        for leg, given in zip(legs, traces):
            if leg is not given:
                leg.close()
        raise
    if distinct:
        try:
            check_distinct([(leg.path, leg.meta) for leg in legs])
        except AnalysisError:
            for leg, given in zip(legs, traces):
                if leg is not given:
                    leg.close()
            raise
    if frames is not None:
        for leg, frame in zip(legs, frames):
            if frame is not None:
                leg.events()  # the request split reads rows the batched analysis does not keep
    pids = request_pids([leg.analysis.trace for leg in legs], frames, choices)
    alone = [f"leg {i + 1}: only pid {pid} is compared (the process its requests went to)"
             for i, pid in enumerate(pids) if pid is not None]
    return legs, frames, pids, alone


def compare(traces: Sequence, *, requests=None, requests_pid: Iterable[str] = (), seed: int = DEFAULTS.seed,
            n_boot: int = DEFAULTS.n_boot, min_effect_pct: float = DEFAULTS.min_effect_pct,
            warmup: int | str = DEFAULTS.warmup) -> Comparison:
    """Compare legs given in run order (paths or open Traces; A/B/A): the first label is the
    baseline, the second the candidate. `requests`: a request file per leg (None or "-" for a leg
    without; default: NAME.requests.json beside each trace where there is one) adds TTFT and
    throughput; `requests_pid`: the process they went to, once or per leg; `warmup`: each
    thread's warm-up (N prefill iterations or "auto"), left out of the metrics and reported apart."""
    legs, frames, pids, alone = legs_with_requests(traces, requests, requests_pid, distinct=True)
    try:
        analyses = [process_analysis(leg.analysis, pid) for leg, pid in zip(legs, pids)]
    finally:
        for leg, given in zip(legs, traces):
            if leg is not given:
                leg.close()  # opened here: its tables are computed (or it failed)
    result = compare_analyses(analyses, seed=seed, n_boot=n_boot, min_effect_pct=min_effect_pct, requests=frames,
                              warmup=warmup)
    result.warnings += alone
    return Comparison(result)


def compare_processes(traces: Sequence, *, seed: int = DEFAULTS.seed, n_boot: int = DEFAULTS.n_boot,
                      min_effect_pct: float = DEFAULTS.min_effect_pct,
                      warmup: int | str = DEFAULTS.warmup) -> dict[str, Comparison]:
    """`compare --per-process`: process label -> its comparison across the legs that hold it."""
    files = [t.file if isinstance(t, Trace) else t for t in traces]
    return {label: Comparison(c) for label, c in
            compare_per_process(files, seed=seed, n_boot=n_boot, min_effect_pct=min_effect_pct, warmup=warmup)}

