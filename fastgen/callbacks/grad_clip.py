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
    norms = torch._foreach_norm(grads)
    if norms[0].dtype != torch.float32:
        norms = [n.float() for n in norms]
    total = float(torch.linalg.vector_norm(torch.stack(norms)))
    if max_norm is not None and math.isfinite(total) and total > max_norm:
        torch._foreach_mul_(grads, float(max_norm) / (total + 1e-6))
    return total


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
