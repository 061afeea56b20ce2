"""`analyze --csv DIR`: the checkpoint and iteration tables as checkpoints.csv and iterations.csv
(and requests.csv with --requests)."""
from __future__ import annotations

import errno
from pathlib import Path

from ckptrace.errors import CkptraceError
from ckptrace.output import write_output
from ckptrace.terminal import printable


def write_csv(analysis, directory: str, requests=None) -> list[Path]:
    """Each file replaced atomically (ckptrace.output); the folder is created if missing."""
    d = Path(directory)
    try:
        if d.exists() and not d.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CkptraceError(f"cannot create {printable(d)}: {e.strerror or e}; choose a writable --csv DIR") from None
    paths = [d / "checkpoints.csv", d / "iterations.csv"]
    tables = [analysis.checkpoints, analysis.iterations]
    if requests is not None:
        paths.append(d / "requests.csv")
        tables.append(requests)
    for path, table in zip(paths, tables):
        write_output(path, lambda f, t=table: t.to_csv(f, index=False), what="CSV file")
    return paths
