"""`analyze --csv DIR`: the checkpoint and iteration tables as checkpoints.csv and iterations.csv
(and requests.csv with --requests)."""
from __future__ import annotations

import errno
from pathlib import Path

from ckptrace.core.errors import CkptraceError
from ckptrace.core.output import write_output
from ckptrace.core.terminal import printable


def csv_paths(directory: str, requests: bool) -> list[Path]:
    """The files `analyze --csv DIR` writes (requests.csv only with --requests)."""
    names = ["checkpoints.csv", "iterations.csv"] + (["requests.csv"] if requests else [])
    return [Path(directory) / n for n in names]


def write_csv(analysis, directory: str, requests=None) -> list[Path]:
    """Each file replaced atomically (ckptrace.core.output); the folder is created if missing."""
    make_folder(directory, "--csv DIR")
    paths = csv_paths(directory, requests is not None)
    tables = [analysis.checkpoints, analysis.iterations] + ([] if requests is None else [requests])
    for path, table in zip(paths, tables):
        write_output(path, lambda f, t=table: t.to_csv(f, index=False), what="CSV file")
    return paths


def make_folder(directory: str, option: str) -> Path:
    """The folder tables are written into, created if missing; one error line if it can't be."""
    d = Path(directory)
    try:
        if d.exists() and not d.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CkptraceError(f"cannot create {printable(d)}: {e.strerror or e}; choose a writable {option}") from None
    return d
