"""f-distill: DMD2 with the distribution-matching gradient weighted for a chosen f-divergence
(Xu et al. 2025, "One-step Diffusion Models with f-Divergence Distribution Matching").

Minimising ``D_f(p_data || p_student)`` instead of DMD's reverse KL changes the score-difference gradient only by
a per-sample weight ``h(r) = f''(r) r^2`` of the density ratio ``r(x_t) = p_data,t(x_t) / p_student,t(x_t)``
(Xu et al. 2025, Sec. 4, the f-divergence gradient). The ratio comes from the GAN discriminator that DMD2 already
trains: with the logistic losses of ``fastgen.methods.dmd2``, the optimal logit is ``log r`` (Goodfellow et al.
2014, Prop. 1), so ``r = exp(D(x_t))``. Weights are normalised to mean 1 over the batch and clipped to
``[0, f_weight_clip]`` (the paper's normalisation keeps the step size of DMD). For each divergence:

=================  ===============================  =====================
divergence         f(r)                             h(r) = f''(r) r^2
=================  ===============================  =====================
reverse KL (DMD)   -log r                           1
forward KL         r log r                          r
Jensen-Shannon     r log r - (r+1) log((r+1)/2)     r / (r + 1)
Jeffreys           (r - 1) log r                    r + 1
squared Hellinger  (sqrt(r) - 1)^2                  sqrt(r) / 2
=================  ===============================  =====================

Needs the GAN branch (``model.gan_loss_weight_gen > 0``). Logged keys: those of DMD2 plus ``f_weight_max``.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.methods.dmd2 import DMD2Model
from fastgen.utils.errors import ConfigError


def f_divergence_weight(log_ratio: torch.Tensor, divergence: str) -> torch.Tensor:
    """``h(r) = f''(r) r^2`` evaluated from ``log r`` (computed in log space where it matters, so large logits
    do not overflow before clipping)."""
    log_ratio = log_ratio.float().clamp(-20.0, 20.0)
    if divergence == "reverse_kl":
        return torch.ones_like(log_ratio)
    if divergence == "forward_kl":
        return log_ratio.exp()
    if divergence == "js":
        return torch.sigmoid(log_ratio)  # r / (r + 1)
    if divergence == "jeffreys":
        return log_ratio.exp() + 1.0
    if divergence == "squared_hellinger":
        return 0.5 * (0.5 * log_ratio).exp()
    raise ValueError(f"unknown f-divergence {divergence!r}")


class FDistillModel(DMD2Model):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if not self.use_gan:
            raise ConfigError("f-distill estimates density ratios with the GAN discriminator: set model.gan_loss_weight_gen > 0")
        f_divergence_weight(torch.zeros(1), config.f_divergence)  # fail at build time on an unknown name
        self._last_weight_max = torch.zeros(())

    def vsd_weight(self, x: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, d_real: torch.Tensor,
                   d_fake: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        with torch.no_grad():
            log_ratio = self.discriminate(x_t, t, condition, parts=self.config.vsd_num_noise)
            weight = f_divergence_weight(log_ratio, self.config.f_divergence)
            weight = (weight / weight.mean().clamp_min(1e-12)).clamp(0.0, self.config.f_weight_clip)
        self._last_weight_max = weight.max()
        return weight

    def student_step(self, real: torch.Tensor, condition: torch.Tensor | None,
                     noise: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        loss_dict, outputs = super().student_step(real, condition, noise)
        loss_dict["f_weight_max"] = self._last_weight_max
        return loss_dict, outputs
