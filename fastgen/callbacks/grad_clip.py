"""GradClipCallback: global-norm gradient clipping with non-finite handling.

Before each optimizer step the gradients of the modules being stepped are rescaled so that their global L2 norm
``||g|| = sqrt(sum_i ||g_i||^2)`` is at most ``grad_norm`` (Pascanu et al. 2013, Alg. 2), using
fused ``_foreach`` kernels. The finiteness test reads that single norm (one host sync per step), not each
tensor: a NaN or Inf anywhere makes the global norm non-finite.

A non-finite norm skips the optimizer step (gradients are zeroed, schedulers do not advance), is counted and
logged, and after ``max_consecutive_nonfinite`` consecutive skips training stops with a clear error rather than
silently training on. Logged keys: ``grad_norm`` (before clipping), ``grad/nonfinite_skips``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.utils.errors import FastGenRuntimeError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


@torch.no_grad()
def clip_global_norm_(grads: list[torch.Tensor], max_norm: float | None) -> float:
    """Scale ``grads`` in place so their global L2 norm is at most ``max_norm``; return the norm before.

    Fused ``_foreach`` kernels on every device (``clip_grad_norm_(foreach=True)`` refuses CPU tensors, and its
    fallback is a per-tensor loop). The norm is read on the host once: that single sync serves the finiteness
    test and lets the rescale be skipped when no clipping is needed. A non-finite norm leaves ``grads`` as they
    are (the caller discards them).
    """
    local, sharded_groups = _local_gradients(grads)
    norms = torch._foreach_norm(local)
    if norms[0].dtype != torch.float32:
        norms = [n.float() for n in norms]
    squares = torch.stack(norms).square()
    if not sharded_groups:
        total = float(squares.sum().sqrt())
    else:  # replicated gradients count once; each sharded group's squares are summed over its shard ranks
        replicated = sharded_groups.pop(None, [])
        total_sq = squares[replicated].sum() if replicated else squares.new_zeros(())
        for group, indices in sharded_groups.items():
            part = squares[indices].sum().reshape(1).to(_device_of(group))
            torch.distributed.all_reduce(part, group=group)
            total_sq = total_sq + part.to(total_sq.device).reshape(())
        total = float(total_sq.sqrt())
    if max_norm is not None and math.isfinite(total) and total > max_norm:
        torch._foreach_mul_(local, float(max_norm) / (total + 1e-6))
    return total


def _local_gradients(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[Any, list[int]]]:
    """Each gradient as the tensor this rank stores, and - when some are sharded DTensors - the indices of the
    gradients by the process group their shards are spread over (``None``: replicated, counted once).

    The global norm of a sharded gradient is the root of the sum of its shards' squared norms (Zhao et al. 2023,
    "PyTorch FSDP", Sec. 4: gradient clipping over sharded gradients), so each group needs one all-reduce of one
    number; replicated dimensions (HSDP's replicate axis) hold copies and are not summed."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # torch built without distributed support
        return grads, {}
    if not any(isinstance(g, DTensor) for g in grads):
        return grads, {}
    local: list[torch.Tensor] = []
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        if not isinstance(g, DTensor):
            local.append(g)
            groups.setdefault(None, []).append(i)
            continue
        local.append(g.to_local())
        dims = [d for d, p in enumerate(g.placements) if isinstance(p, Shard)]
        if not dims:
            groups.setdefault(None, []).append(i)
        else:
            if len(dims) > 1:
                raise ValueError(f"gradient clipping supports one sharded mesh dimension, got {g.placements}")
            groups.setdefault(g.device_mesh.get_group(dims[0]), []).append(i)
    return local, groups


def _device_of(group: Any) -> torch.device:
    backend = str(torch.distributed.get_backend(group))
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")


class GradClipCallback(Callback):
    def __init__(self, grad_norm: float | None = 1.0, modules: list[str] | None = None,
                 max_consecutive_nonfinite: int = 20) -> None:
        self.grad_norm = grad_norm
        self.modules = list(modules) if modules else None
        self.max_consecutive_nonfinite = int(max_consecutive_nonfinite)
        self.nonfinite_total = 0
        self.nonfinite_streak = 0
        self._params: dict[tuple[str, ...], list[torch.Tensor]] = {}

    def _parameters(self, model: Any, names: list[str]) -> list[torch.Tensor]:
        key = tuple(names)
        if key not in self._params:
            modules = model.trainable_modules
            chosen = [n for n in names if self.modules is None or n in self.modules]
            self._params[key] = [p for n in chosen for p in modules[n].parameters() if p.requires_grad]
        return self._params[key]

    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None:
        if self.trainer.step_skipped:  # an earlier callback skipped it (a float16 overflow): not ours to count
            return
        grads = [p.grad for p in self._parameters(model, self.trainer.stepping) if p.grad is not None]
        if not grads:
            return
        total = clip_global_norm_(grads, self.grad_norm)
        self.trainer.log_scalar("grad_norm", total)
        if math.isfinite(total):
            self.nonfinite_streak = 0
            return
        self.nonfinite_total += 1
        self.nonfinite_streak += 1
        self.trainer.skip_step(f"non-finite gradient norm ({float(total)}) at iteration {iteration}")
        self.trainer.log_scalar("grad/nonfinite_skips", float(self.nonfinite_total))
        logger.warning(
            "non-finite gradient norm at iteration %d: optimizer step skipped (%d in a row, %d in total)",
            iteration, self.nonfinite_streak, self.nonfinite_total,
        )
        if self.nonfinite_streak >= self.max_consecutive_nonfinite:
            raise FastGenRuntimeError(
                f"training diverged: {self.nonfinite_streak} consecutive optimizer steps had non-finite gradients "
                f"(last at iteration {iteration}); lower the learning rate or check the data, then resume from "
                "the last checkpoint"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"nonfinite_total": self.nonfinite_total, "nonfinite_streak": self.nonfinite_streak}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.nonfinite_total = int(state_dict.get("nonfinite_total", 0))
        self.nonfinite_streak = int(state_dict.get("nonfinite_streak", 0))
