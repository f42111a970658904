"""ForcedWeightNormCallback: EDM2's forced weight normalisation, once before every training step.

EDM2 (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", Sec. 2.3,
Eq. 66) keeps every magnitude-preserving layer's stored weight at a fixed norm: before each step
``w_i <- w_i / (eps + ||w_i|| / sqrt(fan_in))`` for every output channel ``i``, so ``||w_i|| = sqrt(fan_in)``
(unit-variance elements). ``MPConv.forward`` also normalises (Eqs. 46-47), so the output does not depend on the
norm; forcing it stops the weights from growing under Adam, which would otherwise decay the effective learning
rate over training.

EDM2 does this inside ``MPConv.forward`` in training mode; here it runs at ``on_training_step_begin`` (before the
first forward of the step), under ``torch.no_grad``, over every ``MPConv`` of the chosen modules of
``model.model_dict`` (default: ``model.trainable_modules``; EMA copies are left alone, as in EDM2, since their
forward normalises anyway). The pass is fused (``fastgen.networks.edm2.forced_weight_norm_``): weights are
grouped by fan-in, their row norms computed in one kernel per group and written back with one
``torch._foreach_copy_``. Weight lists are collected once and cached.

Logged keys: ``fwn/num_weights`` (once, at the first step). Modules without any ``MPConv`` trigger one warning.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.networks.edm2 import forced_weight_norm_, mpconv_weights
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class ForcedWeightNormCallback(Callback):
    def __init__(self, modules: list[str] | None = None, eps: float = 1e-4) -> None:
        self.modules = list(modules) if modules else None
        self.eps = float(eps)
        self._weights: list[torch.Tensor] | None = None

    def _collect(self, model: Any) -> list[torch.Tensor]:
        if self.modules is None:
            chosen = dict(model.trainable_modules)
        else:
            available = model.model_dict
            missing = [name for name in self.modules if name not in available]
            if missing:
                raise ValueError(
                    f"ForcedWeightNormCallback(modules={self.modules}): {missing} not in the model's modules "
                    f"{sorted(available)}"
                )
            chosen = {name: available[name] for name in self.modules}
        weights = mpconv_weights(list(chosen.values()))
        if not weights:
            logger.warning("ForcedWeightNormCallback: modules %s contain no MPConv layer; nothing to normalise",
                           sorted(chosen))
        return weights

    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        first = self._weights is None
        if self._weights is None:
            self._weights = self._collect(model)
        if self._weights:
            forced_weight_norm_(self._weights, eps=self.eps)
        if first:
            self.trainer.log_scalar("fwn/num_weights", len(self._weights))
