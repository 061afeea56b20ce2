"""ckptrace: where llama-server's prefill time goes when it saves context checkpoints."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ckptrace")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
