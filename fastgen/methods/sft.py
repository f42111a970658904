"""SFT: supervised diffusion training - denoising score matching (EDM) or flow matching.

The loss is the weighted regression of the network's native prediction onto its target at a random time:

* EDM: ``E_{sigma, x0, eps} [ lambda(sigma) || D(x0 + sigma eps; sigma) - x0 ||^2 ]`` with ``ln sigma ~
  N(P_mean, P_std^2)`` and ``lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2``
  (Karras et al. 2022, Eq. 2 and Table 1);
* flow matching: ``E_{t, x0, eps} || v(x_t, t) - (eps - x0) ||^2`` with ``x_t = (1 - t) x0 + t eps``
  (Lipman et al. 2023, Eq. 23; Liu et al. 2023, Eq. 1).

Class labels are dropped (replaced by the all-zero label) with probability ``condition_dropout`` so that the
same network also learns the unconditional model that classifier-free guidance needs (Ho & Salimans 2022).

Video-to-world (``model.conditioning_frames = k``, ``fastgen.networks.conditioning_frames``): the first ``k`` latent
frames of the noised video are the data's clean frames, the network is told so, and the loss averages over the
other frames only (a list of counts: one drawn per step, ``draw_conditioning_frames``).

Multimodal samples (``model.modality_shapes``, a dict of modalities in ``real``): every modality is noised at its
training time (shared or per modality, ``fastgen.methods.multimodal.training_times``) with its own noise, the
network predicts all of them in one pass, and the loss is the weighted sum of the modalities' losses above.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.methods.model import FastGenModel
from fastgen.methods.multimodal import check_modalities, combine_losses, training_times
from fastgen.networks.conditioning_frames import generated_frames_mean, with_given_frames
from fastgen.networks.layers import as_one_hot
from fastgen.networks.modalities import is_multimodal, per_modality


class SFTModel(FastGenModel):
    supports_modalities = True
    supports_conditioning_frames = True

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = per_modality(lambda x: x.to(self.precision), data["real"])
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
        if is_multimodal(x0):
            return self.multimodal_step(x0, condition)
        t = scheduler.sample_t(x0.shape[0], device=x0.device, generator=rng).to(x0.dtype)
        eps = rng.randn_like(x0)
        x_t = scheduler.add_noise(x0, eps, t)
        given = self.draw_conditioning_frames()
        if given:
            x_t = with_given_frames(x_t, x0, given)
            pred = self.net(x_t, t, condition=condition, conditioning_frames=given)
        else:
            pred = self.net(x_t, t, condition=condition)
        target = scheduler.target(x0, eps, t)
        per_sample = generated_frames_mean((pred.float() - target.float()).square(), given)
        loss = (scheduler.loss_weight(t.float()) * per_sample).mean()
        return {"total_loss": loss, "denoising_loss": loss.detach()}, {"x_t": x_t, "pred": pred, "t": t}

    def multimodal_step(self, x0: dict[str, torch.Tensor], condition: torch.Tensor | None
                        ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The loss above per modality, weighted and summed (module docstring)."""
        check_modalities(self.config, x0)
        scheduler = self.noise_scheduler
        t = training_times(self, x0)
        eps = {name: self.rng.randn_like(x) for name, x in x0.items()}
        x_t = per_modality(scheduler.add_noise, x0, eps, t)
        pred = self.net(x_t, t, condition=condition)
        losses = {}
        for name in x0:
            target = scheduler.target(x0[name], eps[name], t[name])
            per_sample = (pred[name].float() - target.float()).square().flatten(1).mean(dim=1)
            losses[name] = (scheduler.loss_weight(t[name].float()) * per_sample).mean()
        total, logged = combine_losses(self.config, losses, "denoising_loss")
        return {"total_loss": total, "denoising_loss": total.detach(), **logged}, {"x_t": x_t, "pred": pred, "t": t}
