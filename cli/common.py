"""Terminal plumbing shared by the commands: one Rich console (stderr), logging setup, config resolution.

Only the ``cli`` package talks to the terminal. Heavy libraries (torch, wandb) are imported inside command
bodies, never at module import, so ``fastgen --help`` starts instantly.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from fastgen.configs.config import BaseConfig

DEFAULT_RECIPE = "Digits/config_dmd2_digits"
ARGV: list[str] = []  # the command line as `main` received it (the launcher hands it on to its workers)
_console: Console | None = None
_out: Console | None = None


def console() -> Console:
    """The stderr console: progress, logs, errors."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True, highlight=False)
    return _console


def out() -> Console:
    """The stdout console: a command's actual output (config trees, tables, paths)."""
    global _out
    if _out is None:
        from rich.console import Console

        _out = Console(highlight=False)
        if not _out.is_terminal and "COLUMNS" not in os.environ:
            _out.width = 200  # piped output: do not squeeze tables and paths into 80 columns
    return _out


def interactive() -> bool:
    return console().is_terminal and os.environ.get("FASTGEN_NO_PROGRESS") != "1"


def setup_logging(level: str = "INFO") -> None:
    import logging

    from fastgen.utils.logging import install_handler

    if interactive():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console(), show_path=False, show_level=True,
                                               log_time_format="[%X]", markup=False, rich_tracebacks=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    install_handler(handler, level)


def resolve_config(config_spec: str | None, overrides: list[str] | None) -> BaseConfig:
    """Load ``config_spec`` (default: the quick-start recipe), apply overrides, validate."""
    from fastgen.configs.config_utils import apply_overrides, load_config, validate_config

    config = load_config(config_spec or DEFAULT_RECIPE)
    apply_overrides(config, overrides or [])
    return validate_config(config)


def print_error(message: str) -> None:
    from rich.markup import escape

    console().print(f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True)
