"""ckptrace: where llama-server's prefill time goes when it saves context checkpoints.

As a library (docs/api.md): `ckptrace.open(path)` gives a Trace, `ckptrace.compare([...])` a
Comparison. They are imported on first use, so `import ckptrace` (and the CLI) stays light.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

try:
    __version__ = version("ckptrace")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports them when first used
    from ckptrace.api import SCHEMA_VERSION, Comparison, Trace, compare, compare_processes, open

__all__ = ["SCHEMA_VERSION", "Comparison", "Trace", "__version__", "compare", "compare_processes", "open"]
API = {"SCHEMA_VERSION", "Comparison", "Trace", "compare", "compare_processes", "open"}


def __getattr__(name: str):
    if name in API:  # imported by name, so the root package itself imports none of the layers
        return getattr(importlib.import_module("ckptrace.api"), name)
    raise AttributeError(f"module 'ckptrace' has no attribute {name!r}")
