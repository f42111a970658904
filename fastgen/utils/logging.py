"""Rank-aware logging for library code.

Library modules never print; they call ``get_logger(__name__)``. Records from ranks other than 0 are dropped
unless a record is marked ``extra={"all_ranks": True}``, so a message is not repeated once per GPU. The command
line decides where records go (Rich on a terminal, plain lines otherwise) by configuring the ``fastgen`` logger.
"""

from __future__ import annotations

import logging
import os

_ROOT = "fastgen"


class RankZeroFilter(logging.Filter):
    """Keep records on rank 0 and records explicitly flagged for all ranks; prefix the rank when not 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = _current_rank()
        if rank == 0:
            return True
        if getattr(record, "all_ranks", False):
            record.msg = f"[rank {rank}] {record.msg}"
            return True
        return False


def _current_rank() -> int:
    # The process group may not exist yet (or at all): torchrun's RANK is the reliable early source.
    return int(os.environ.get("RANK", "0"))


def get_logger(name: str) -> logging.Logger:
    """Return the logger for a fastgen module (a child of the ``fastgen`` logger)."""
    if not name.startswith(_ROOT):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)


class RedactSecretsFilter(logging.Filter):
    """Scrub secrets from a record's message before any handler writes it: the values of environment variables that
    name secrets and URL passwords (``fastgen.utils.secrets``), read when the record is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from fastgen.utils.secrets import redact_text, secret_values

        message = record.getMessage()
        cleaned = redact_text(message, secret_values())
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_handler(handler: logging.Handler, level: str | int = "INFO") -> None:
    """Route fastgen's records to ``handler`` (rank-0 filtered), replacing a handler installed earlier.

    Filters must sit on the handler: a filter on a parent logger does not see records from child loggers.
    """
    root = logging.getLogger(_ROOT)
    for old in [h for h in root.handlers if getattr(h, "_fastgen_handler", False)]:
        root.removeHandler(old)
    handler.addFilter(RankZeroFilter())
    handler.addFilter(RedactSecretsFilter())
    handler._fastgen_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.propagate = False
    set_log_level(level)


def set_log_level(level: str | int) -> None:
    """Set the level of every fastgen logger; accepts names such as ``"DEBUG"`` (case-insensitive)."""
    if isinstance(level, str):
        resolved = logging.getLevelName(level.upper())
        if not isinstance(resolved, int):
            from fastgen.utils.errors import UsageError

            raise UsageError(f"unknown log level {level!r}; use one of DEBUG, INFO, WARNING, ERROR")
        level = resolved
    logging.getLogger(_ROOT).setLevel(level)
