"""Every metric ckptrace reports, in one table: its name, label, unit, where its values come from,
what kind of figure it is, and which way is better.

compare (analyzers/compare.py), the summary's distributions (summary.py), every renderer (text,
Markdown, the dashboard), the Prometheus exporter (exporters/prometheus.py) and the benchmarks
read this table; none keeps its own list. A new metric of an existing column is one entry here
(and its test): e.g. `Metric("checkpoint_copy_cpu_ns", "copy on CPU", "ns", "checkpoint",
("copy_cpu_ns",), CPU, compare=True)` makes compare judge the copy's on-CPU time, the text and
Markdown tables show it, and `--fail-on --metrics` accept it.
"""
from __future__ import annotations

from dataclasses import dataclass

# What kind of figure a metric is. Wall-clock figures (times, time to first token, throughput)
# include run-queue wait, so a busy machine moves them (compare reads them "not judged" then);
# on-CPU times and counts are judged as usual.
WALL, CPU, COUNT = "wall", "cpu", "count"
# Where the samples come from: a row of the checkpoint table, a prefill iteration, a restore, a
# prompt-cache save, a completed request (from its leg's request file).
SAMPLES = ("checkpoint", "prefill iteration", "restore", "prompt save", "request")


@dataclass(frozen=True)
class Metric:
    name: str  # the name in --json, --metrics and the summary (its unit its suffix)
    label: str  # the one label every renderer shows (text, Markdown, dashboard), without its unit
    unit: str  # of the values: ns, faults, bytes, ms, tok/s
    sample: str  # one of SAMPLES: what one value is of
    columns: tuple[str, ...] = ()  # the sample table's columns, summed per sample
    kind: str = WALL  # WALL, CPU or COUNT
    higher_is_better: bool = False  # times and counts: lower is better; throughput: higher
    compare: bool = False  # compared by `compare` (in this table's order)
    summary: bool = False  # a distribution in analyze's summary (summary.stats)
    percentile: int | None = None  # a request metric: the percentile of TTFT it is (None: throughput)
    series: str = ""  # the per-checkpoint Prometheus histogram (exporters/prometheus.py), "" for none
    help: str = ""  # what the figure is (the Prometheus HELP text, docs/metrics.md)

    @property
    def shown_unit(self) -> str:
        """The unit a reader sees: times in ms, other units as they are."""
        return "ms" if self.unit == "ns" else self.unit

    @property
    def heading(self) -> str:
        """The label with the unit shown (a table's row name): 'ckpt fill ms', 'ckpt faults'."""
        return self.label if self.unit == "faults" else f"{self.label} {self.shown_unit}"

    @property
    def wall(self) -> bool:
        return self.kind == WALL


_ALL = [
    Metric("checkpoint_fill_ns", "ckpt fill", "ns", "checkpoint", ("fill_ns",), WALL, compare=True, summary=True,
           series="checkpoint_fill_seconds",
           help="Wall time zero-filling the checkpoint buffer's growth (vector resize), page faults included; "
                "0 for a pool hit."),
    Metric("checkpoint_copy_ns", "ckpt copy", "ns", "checkpoint", ("copy_ns",), WALL, compare=True, summary=True,
           series="checkpoint_copy_seconds", help="Wall time copying the state in (llama_state_seq_get_data_ext)."),
    Metric("checkpoint_fault_ns", "ckpt fault", "ns", "checkpoint", ("fault_ns",), CPU, compare=True, summary=True,
           series="checkpoint_fault_seconds",
           help="On-CPU cost of the checkpoint's page faults (span on-CPU time minus the same work on resident "
                "pages), where measured (not observed where a fill or copy had faults that could not be measured)."),
    Metric("checkpoint_total_ns", "ckpt total", "ns", "checkpoint", ("total_ns",), WALL, compare=True, summary=True,
           series="checkpoint_seconds",
           help="Wall time of each checkpoint (update_tgt/update_dft, entry to return)."),
    Metric("prefill_iteration_ns", "prefill iter", "ns", "prefill iteration", ("span_ns",), WALL, compare=True,
           summary=True, help="Wall time of each prefill iteration."),
    Metric("checkpoint_faults", "ckpt faults", "faults", "checkpoint", ("fill_faults", "copy_faults"), COUNT,
           compare=True, help="Page faults of each checkpoint's fill and copy."),
    Metric("checkpoint_fill_cpu_ns", "fill on CPU", "ns", "checkpoint", ("fill_cpu_ns",), CPU, compare=True,
           summary=True, help="The thread's on-CPU time in the fill."),
    Metric("checkpoint_copy_cpu_ns", "copy on CPU", "ns", "checkpoint", ("copy_cpu_ns",), CPU, summary=True,
           help="The thread's on-CPU time in the copy."),
    Metric("checkpoint_total_cpu_ns", "ckpt on CPU", "ns", "checkpoint", ("cpu_ns",), CPU, compare=True, summary=True,
           series="checkpoint_cpu_seconds", help="The thread's on-CPU time during the checkpoint."),
    Metric("checkpoint_wait_ns", "ckpt wait", "ns", "checkpoint", ("wait_ns",), WALL, summary=True,
           series="checkpoint_wait_seconds",
           help="Time the thread waited for a CPU (run queue) during the checkpoint."),
    Metric("prefill_iteration_cpu_ns", "prefill on CPU", "ns", "prefill iteration", ("cpu_ns",), CPU, compare=True,
           summary=True, help="The thread's on-CPU time in each prefill iteration (update_slots): the host's work "
                              "per prefill iteration, compare's headline."),
    Metric("checkpoint_bytes", "ckpt state", "bytes", "checkpoint", ("bytes",), COUNT, series="checkpoint_bytes",
           help="State bytes copied into each checkpoint."),
    # Restores and prompt-cache saves (trace format 3), per restore or save: compared only when a
    # leg recorded any.
    Metric("restore_total_ns", "restore", "ns", "restore", ("total_ns",), WALL, compare=True,
           help="Wall time of each restore."),
    Metric("restore_copy_ns", "restore copy", "ns", "restore", ("copy_ns",), WALL, compare=True,
           help="Wall time of each restore's state copy."),
    Metric("prompt_save_total_ns", "prompt save", "ns", "prompt save", ("total_ns",), WALL, compare=True,
           help="Wall time of each prompt-cache save."),
    Metric("prompt_save_copy_ns", "prompt save copy", "ns", "prompt save", ("copy_ns",), WALL, compare=True,
           help="Wall time of each prompt-cache save's copies."),
    Metric("checkpoint_other_ns", "ckpt other", "ns", "checkpoint", ("other_ns",), WALL, compare=True,
           help="Wall time of each checkpoint outside its fill and copy (total - fill - copy)."),
    # From each leg's request file (`ckptrace drive --json`): the statistic is the percentile itself
    # (or tokens per second), bootstrapped over the arm's completed requests.
    Metric("ttft_p50_ms", "ttft p50", "ms", "request", ("ttft_ns",), WALL, compare=True, percentile=50,
           help="Median time to first token."),
    Metric("ttft_p90_ms", "ttft p90", "ms", "request", ("ttft_ns",), WALL, compare=True, percentile=90,
           help="90th percentile of time to first token."),
    Metric("ttft_p99_ms", "ttft p99", "ms", "request", ("ttft_ns",), WALL, compare=True, percentile=99,
           help="99th percentile of time to first token."),
    Metric("throughput_tok_s", "throughput", "tok/s", "request", ("predicted_tokens",), WALL,
           higher_is_better=True, compare=True, help="Tokens generated per second of the arm's requests."),
]
METRICS: dict[str, Metric] = {m.name: m for m in _ALL}
# Compared for pool hits and misses apart (a pool's effect), in this order.
POOL = ("checkpoint_total_ns", "checkpoint_fill_ns", "checkpoint_total_cpu_ns", "checkpoint_fill_cpu_ns")


def compared(sample: str | None = None) -> list[Metric]:
    """The metrics `compare` judges, in order (of one sample kind, when given)."""
    return [m for m in _ALL if m.compare and (sample is None or m.sample == sample)]


def label(name: str) -> str:
    """A metric's label, or the name itself for a name this table lacks."""
    m = METRICS.get(name)
    return m.label if m else name


def heading(name: str) -> str:
    """A metric's label with its unit shown, or the name itself for a name this table lacks."""
    m = METRICS.get(name)
    return m.heading if m else name
