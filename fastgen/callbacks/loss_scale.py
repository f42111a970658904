"""LossScaleCallback: dynamic loss scaling for float16 autocast (``model.precision_amp=float16``).

float16 has 5 exponent bits: gradients below ``2^-24`` flush to zero. Dynamic loss scaling (Micikevicius et al.
2018, "Mixed Precision Training", Sec. 3.2) multiplies the loss by a scale ``S`` before backward, so the gradients
are ``S`` times larger and representable, divides them by ``S`` before the optimizer step, and adapts ``S``: a
step whose gradients overflowed (a non-finite value anywhere) is skipped and ``S`` is multiplied by
``backoff_factor``; after ``growth_interval`` finite steps in a row ``S`` is multiplied by ``growth_factor``. The
defaults are ``torch.amp.GradScaler``'s (``2^16``, 2, 0.5, 2000).

Why not ``torch.amp.GradScaler``: its overflow test is per rank, and under FSDP2 each rank sees only its shards of
the gradients, so ranks could disagree on skipping a step and leave their collectives out of step; here the
decision is collective (``any_rank``), taken once per step over every stepped module. Its state (the scale and
the count of finite steps) is this callback's, saved in checkpoints with the other callbacks', so a resume
continues with the same scale.

The trainer adds this callback first (as ``loss_scale``) when ``model.precision_amp=float16`` and the config has
none; configure one under ``trainer.callbacks.loss_scale`` to change its factors. It must run before any callback
that reads gradients (``GradClipCallback``): unscaling happens in its ``on_optimizer_step_begin``, and a step it
skips for overflow is not counted as a non-finite step by the clipping callback. Logged: ``amp/loss_scale``,
``amp/overflow_skips``.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.grad_clip import _local_gradients
from fastgen.distributed import group as dist_utils
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

OVERFLOW = "float16 gradient overflow"


class LossScaleCallback(Callback):
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ConfigError("loss_scale: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                              "growth_interval >= 1 are required")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.finite_streak = 0
        self.overflow_skips = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward runs on: the loss times the current scale."""
        return loss * self.scale

    @torch.no_grad()
    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None:
        modules = model.trainable_modules
        grads = [p.grad for name in self.trainer.stepping for p in modules[name].parameters() if p.grad is not None]
        local, _ = _local_gradients(grads)  # sharded gradients: this rank's shards
        if local:
            torch._foreach_mul_(local, 1.0 / self.scale)
            finite = bool(torch.stack([torch.isfinite(g).all() for g in local]).all())
        else:
            finite = True
        overflow = dist_utils.any_rank(not finite)
        if overflow:
            self.overflow_skips += 1
            self.finite_streak = 0
            self.scale *= self.backoff_factor
            self.trainer.skip_step(f"{OVERFLOW} at iteration {iteration}")
            logger.info("iteration %d: float16 gradients overflowed, step skipped; loss scale now %g", iteration,
                        self.scale)
        else:
            self.finite_streak += 1
            if self.finite_streak >= self.growth_interval:
                self.scale *= self.growth_factor
                self.finite_streak = 0
        self.trainer.log_scalar("amp/loss_scale", self.scale)
        self.trainer.log_scalar("amp/overflow_skips", float(self.overflow_skips))

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "finite_streak": self.finite_streak, "overflow_skips": self.overflow_skips}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scale = float(state_dict.get("scale", self.scale))
        self.finite_streak = int(state_dict.get("finite_streak", 0))
        self.overflow_skips = int(state_dict.get("overflow_skips", 0))
