"""What a rank actually holds: bytes of parameters (and buffers), gradients and optimizer state, measured on the
live model. Sharded tensors (FSDP2 DTensors) count their local shard only, so under ``trainer.fsdp`` this is the
per-rank share that ``fastgen dryrun`` estimates and ``fastgen.profiling.estimate`` predicts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed support
    DTensor = None  # type: ignore[assignment,misc]


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank stores for ``tensor`` (a DTensor's local shard)."""
    if DTensor is not None and isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return int(tensor.numel()) * int(tensor.element_size())


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def state_bytes(model: Any) -> dict[str, int]:
    """``{"parameters", "gradients", "optimizer_state"}``: local bytes of every parameter and buffer of ``model``,
    of the gradients present now, and of the tensors in ``model.optimizer_dict``'s states."""
    params = _unique([*model.parameters(), *model.buffers()])
    grads = [p.grad for p in _unique(model.parameters()) if p.grad is not None]
    optimizer_state = [v for opt in getattr(model, "optimizer_dict", {}).values() for state in opt.state.values()
                       for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": sum(map(local_nbytes, params)),
        "gradients": sum(map(local_nbytes, grads)),
        "optimizer_state": sum(map(local_nbytes, optimizer_state)),
    }
