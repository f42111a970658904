"""Pluggable log modules for ``WandbCallback`` (see ``base.LogModule`` for the hook signature)."""

from fastgen.callbacks.log_modules.base import LogModule, MediaEntry, gather_to_rank0
from fastgen.callbacks.log_modules.vipe import VipeLogger
from fastgen.callbacks.log_modules.vlm import VLMLogger, parse_score

__all__ = ["LogModule", "MediaEntry", "VLMLogger", "VipeLogger", "gather_to_rank0", "parse_score"]
