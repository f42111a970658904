"""SFT: supervised diffusion training - denoising score matching (EDM) or flow matching.

The loss is the weighted regression of the network's native prediction onto its target at a random time:

* EDM: ``E_{sigma, x0, eps} [ lambda(sigma) || D(x0 + sigma eps; sigma) - x0 ||^2 ]`` with ``ln sigma ~
  N(P_mean, P_std^2)`` and ``lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2``
  (Karras et al. 2022, Eq. 2 and Table 1);
* flow matching: ``E_{t, x0, eps} || v(x_t, t) - (eps - x0) ||^2`` with ``x_t = (1 - t) x0 + t eps``
  (Lipman et al. 2023, Eq. 23; Liu et al. 2023, Eq. 1).

Class labels are dropped (replaced by the all-zero label) with probability ``condition_dropout`` so that the
same network also learns the unconditional model that classifier-free guidance needs (Ho & Salimans 2022).
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.methods.model import FastGenModel
from fastgen.networks.layers import as_one_hot


class SFTModel(FastGenModel):
    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = data["real"].to(self.precision)
        condition = self.condition_of(data)
        dropout = float(getattr(self.config, "condition_dropout", 0.0))
        rng = self.rng
        if condition is not None and dropout > 0:
            condition = as_one_hot(condition, self.num_classes)
            # one draw per sample, broadcast over a label row or a (tokens, width) text embedding
            keep = (rng.rand((condition.shape[0], 1), device=condition.device) >= dropout).to(condition.dtype)
            keep = keep.reshape(-1, *([1] * (condition.dim() - 1)))
            condition = condition * keep
        scheduler = self.noise_scheduler
        t = scheduler.sample_t(x0.shape[0], device=x0.device, generator=rng).to(x0.dtype)
        eps = rng.randn_like(x0)
        x_t = scheduler.add_noise(x0, eps, t)
        pred = self.net(x_t, t, condition=condition)
        target = scheduler.target(x0, eps, t)
        per_sample = (pred.float() - target.float()).square().flatten(1).mean(dim=1)
        loss = (scheduler.loss_weight(t.float()) * per_sample).mean()
        return {"total_loss": loss, "denoising_loss": loss.detach()}, {"x_t": x_t, "pred": pred, "t": t}
