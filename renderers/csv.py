"""`analyze --csv DIR`: the checkpoint and iteration tables as checkpoints.csv and iterations.csv."""
from __future__ import annotations

from pathlib import Path

from ckptrace.errors import CkptraceError


def write_csv(analysis, directory: str) -> list[Path]:
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        paths = [d / "checkpoints.csv", d / "iterations.csv"]
        analysis.checkpoints.to_csv(paths[0], index=False)
        analysis.iterations.to_csv(paths[1], index=False)
    except OSError as e:
        raise CkptraceError(f"cannot write CSV files to {d}: {e.strerror or e}; choose a writable --csv DIR") from None
    return paths
