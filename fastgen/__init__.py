"""fastgen: train diffusion models and distill them into few-step generators.

Importing the package loads ``.env`` from the working directory (python-dotenv); variables already present in
the environment take precedence. The import stays light on purpose: no torch, no wandb, so that the command line
starts instantly.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _load_dotenv() -> None:
    import os

    path = os.path.join(os.getcwd(), ".env")
    if not os.path.isfile(path):
        return
    try:
        from dotenv import load_dotenv
    except ImportError:  # pragma: no cover - python-dotenv is a hard dependency
        return
    load_dotenv(path, override=False)


_load_dotenv()
