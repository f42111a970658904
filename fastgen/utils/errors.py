"""Exception types that the command line maps to exit codes.

``UsageError`` (exit 2) is for anything the user can fix by changing what they typed or wrote in a config:
a missing file, an unknown key, a wrong type, an output folder that cannot be written. ``FastGenRuntimeError``
(exit 1) is for failures while running, such as a corrupt checkpoint. Both carry a one-line, actionable message;
the command line prints only that line unless ``FASTGEN_DEBUG=1``.
"""

from __future__ import annotations


def first_line(exc: BaseException | None) -> str:
    """The first line of an exception's text (its type's name when it has none): what goes into a one-line
    message that wraps another error. For DCP's ``CheckpointException``, which wraps every failed rank's error with
    its traceback (``failures``), the first failed rank's own error's last line, named by its rank."""
    if exc is None:
        return "NoneType"
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        inner = failures[rank]
        if isinstance(inner, tuple):  # DCP keeps (exception, traceback summary)
            inner = inner[0]
        text = str(inner).strip()
        return f"rank {rank}: {(text.splitlines()[-1] if text else type(inner).__name__)[:300]}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """An exception as the one line the command line prints for it: fastgen's own errors as they are (their text
    is the message), any other prefixed with its type; whitespace and line breaks collapsed."""
    text = " ".join(str(exc).split())
    if isinstance(exc, FastGenError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FastGenError(Exception):
    """Base class of the errors fastgen raises on purpose (expected failures with a clear message)."""

    exit_code = 1


class UsageError(FastGenError):
    """Bad input: a config, an override, a path or an option. Exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """The config could not be loaded, overridden or validated."""


class FastGenRuntimeError(FastGenError):
    """A failure during a run that is not a bug: corrupt checkpoint, diverged training, missing data."""

    exit_code = 1


class CheckpointError(FastGenRuntimeError):
    """A checkpoint is missing, truncated, corrupt or incompatible with the model."""


class TrainingInterrupted(FastGenRuntimeError):
    """SIGTERM / SIGINT stopped training after a checkpoint was saved; rerunning the command resumes.

    The exit code follows the shell convention for the signal (128 + signal number).
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class StartUpInterrupted(TrainingInterrupted):
    """SIGTERM stopped a run before its first step. Nothing was saved, and the run directory the run made is gone;
    rerunning the command starts afresh. Under a multi-rank launch it is usually torch's agent stopping the ranks
    that were still starting once another one failed, so it is reported as a consequence, not the cause."""
