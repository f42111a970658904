"""ParamCountCallback: how many parameters each module of ``model.model_dict`` has, globally and on this rank.

At ``on_train_begin`` every module's parameters are counted (shared parameters once): ``total`` and
``trainable`` (``requires_grad``). Under FSDP2 / tensor parallelism a parameter is a DTensor: its ``numel()``
is the *global* size while this rank stores only ``to_local().numel()``, so counting local tensors (or counting a
DTensor's ``numel()`` as memory) would be off by the shard factor. Both are reported: ``global`` is the model's
size (what a paper quotes), ``local`` is what this rank holds (what its memory pays for); for plain tensors they
are equal.

Logged keys: ``params/<module>/total`` and ``params/<module>/trainable`` (global counts), plus
``params/<module>/total_local`` and ``params/<module>/trainable_local`` for modules holding sharded parameters.
Rank 0 also logs a table through the ``fastgen`` logger. The numbers stay available as ``self.counts``::

    {"net": {"total": ..., "trainable": ..., "total_local": ..., "trainable_local": ...}, "ema": {...}}
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils
from fastgen.utils.logging import get_logger

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed support
    DTensor = None  # type: ignore[assignment,misc]

logger = get_logger(__name__)

KEYS = ("total", "trainable", "total_local", "trainable_local")


def count_parameters(module: nn.Module) -> dict[str, int]:
    """``total`` / ``trainable`` (global) and ``total_local`` / ``trainable_local`` (this rank) for ``module``."""
    counts = dict.fromkeys(KEYS, 0)
    for p in module.parameters():  # parameters() yields a tensor shared by two submodules once
        global_n = p.numel()
        local_n = p.to_local().numel() if DTensor is not None and isinstance(p, DTensor) else global_n
        counts["total"] += global_n
        counts["total_local"] += local_n
        if p.requires_grad:
            counts["trainable"] += global_n
            counts["trainable_local"] += local_n
    return counts


def format_table(counts: dict[str, dict[str, int]]) -> str:
    """A plain-text table, one row per module and a sum row (modules do not share parameters in fastgen)."""
    header = ("module", "total", "trainable", "local total", "local trainable")
    rows = [(name, *(f"{c[k]:,}" for k in KEYS)) for name, c in counts.items()]
    if len(counts) > 1:
        rows.append(("(all)", *(f"{sum(c[k] for c in counts.values()):,}" for k in KEYS)))
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)])


class ParamCountCallback(Callback):
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def count(self, model: Any) -> dict[str, dict[str, int]]:
        """Count every module of ``model.model_dict`` and store the result in ``self.counts``."""
        self.counts = {name: count_parameters(module) for name, module in model.model_dict.items()}
        return self.counts

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        counts = self.count(model)
        for name, c in counts.items():
            self.trainer.log_scalar(f"params/{name}/total", float(c["total"]))
            self.trainer.log_scalar(f"params/{name}/trainable", float(c["trainable"]))
            if c["total_local"] != c["total"]:
                self.trainer.log_scalar(f"params/{name}/total_local", float(c["total_local"]))
                self.trainer.log_scalar(f"params/{name}/trainable_local", float(c["trainable_local"]))
        if dist_utils.is_rank0():
            logger.info("parameters (global; local = on this rank):\n%s", format_table(counts))
