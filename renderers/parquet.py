"""`analyze --parquet DIR`: every derived table as a Parquet file, for DuckDB, pandas or any
Parquet reader (docs/api.md, "SQL over a trace").

One file per table of ckptrace.api.Trace.tables() (and requests.parquet with --requests), each
with its declared types: a figure not recorded is a null, never 0. A pool hit is a checkpoint
row with `pool_hit` true and `fill_ns` 0 (its buffer did not grow, so there was no fill): an
average of fill over the checkpoint table counts it, as analyze does; the trace's own fill
rows do not include it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ckptrace.core.output import write_output

from .csv import make_folder

TABLES = ("checkpoints", "iterations", "restores", "evictions", "prompt_saves", "releases", "summary", "processes",
          "gpu_copies")  # gpu_copies: empty for a trace of no CUDA target


def parquet_paths(directory: str, requests: bool) -> list[Path]:
    """The files `analyze --parquet DIR` writes (requests.parquet only with --requests)."""
    return [Path(directory) / f"{n}.parquet" for n in (*TABLES, *(["requests"] if requests else []))]


def write_parquet(tables: dict[str, pd.DataFrame], directory: str, requests: pd.DataFrame | None = None) -> list[Path]:
    """Each file replaced atomically (ckptrace.core.output); the folder is created if missing."""
    make_folder(directory, "--parquet DIR")
    frames = [tables[n] for n in TABLES] + ([] if requests is None else [requests])
    paths = parquet_paths(directory, requests is not None)
    for path, frame in zip(paths, frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        write_output(path, lambda f, t=table: pq.write_table(t, f, compression="zstd"), what="Parquet file")
    return paths
