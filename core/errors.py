"""The one exception family ckptrace raises; the CLI prints it as a single line."""


class CkptraceError(Exception):
    """A failure the user can act on. str() is the whole message: one line, with the fix."""

    exit_code = 1


class NotPermitted(CkptraceError):
    """Missing privilege (root: CAP_SYS_ADMIN, tracefs readable)."""


class EbpfUnavailable(CkptraceError):
    """bcc, kernel headers, tracefs or a needed kernel feature is missing."""


class SymbolError(CkptraceError):
    """A probe point could not be resolved in the target's objects."""


class TargetError(CkptraceError):
    """The process or command to trace is not usable (dead PID, no such command...)."""


class TraceFormatError(CkptraceError):
    """A file is not a trace this version can read."""


class AnalysisError(CkptraceError):
    """The traces do not hold what the analysis needs (no checkpoints, one leg...)."""


class UsageError(CkptraceError):
    """Options that contradict each other or the files given (exit 2, as click's usage errors)."""

    exit_code = 2
