"""LADD: latent adversarial diffusion distillation (Sauer et al. 2024, "Fast High-Resolution Image Synthesis
with Latent Adversarial Diffusion Distillation").

The discriminator reads the *frozen teacher's* features: the student's sample ``x = G(z)`` and a real sample are
noised to the same time, ``x_t = alpha_t x + sigma_t eps`` (LADD Sec. 3.1, "noise the generated and real data
before passing them to the teacher"), the teacher returns features at ``feature_indices`` and trainable heads
(``fastgen.networks.discriminator``) turn them into one logit. Hinge losses (Sec. 3.1, following ADD):

* student iterations (``iteration % student_update_freq == 0``, optimizer ``net``):
  ``L_G = -E[D(teacher_features(x_t))]`` with gradients through the frozen teacher and heads into ``x``;
* discriminator iterations (optimizer ``discriminator``):
  ``L_D = E[max(0, 1 - D(real_t))] + E[max(0, 1 + D(sg(x)_t))]``.

Optionally ``distill_loss_weight > 0`` adds a regression of the 1-step output onto the teacher's denoised
estimate of the same noised sample (0, the default, is pure LADD; at high noise that estimate is close to the data
mean, so a large weight pulls samples together). Logged keys: ``total_loss``; student
iterations ``gan_gen_loss`` (and ``distill_loss``); discriminator iterations ``gan_disc_loss``,
``d_real_logit``, ``d_fake_logit`` (and ``r1_loss``).

``r1_weight > 0`` adds the R1 penalty ``gamma/2 E||grad_x D(real_t)||^2`` (Mescheder et al. 2018, Eq. 9) to
``L_D``, estimated by finite differences ``gamma/2 E[(D(real_t + s eps) - D(real_t))^2] / s^2`` (``s =
r1_fd_sigma``), which needs no second derivative through the frozen teacher.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fastgen.methods.dmd2 import DMD2Model, finite_difference_r1, frozen
from fastgen.methods.distill import DistillationModel
from fastgen.networks.discriminator import (FeatureDiscriminator, default_feature_indices, head_features, minibatch_groups,
                                            per_group, probe_feature_shapes)
from fastgen.utils.errors import ConfigError


class LADDModel(DistillationModel):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if config.student_update_freq < 1:
            raise ConfigError("model.student_update_freq must be >= 1")
        if config.r1_weight < 0 or config.r1_fd_sigma <= 0:
            raise ConfigError("model.r1_weight must be >= 0 and model.r1_fd_sigma > 0")
        if config.discriminator_minibatch_std < 0:
            raise ConfigError("model.discriminator_minibatch_std must be >= 0 (0 or 1: off)")
        self.feature_indices = list(config.feature_indices or default_feature_indices(self.teacher))
        shapes = probe_feature_shapes(self.teacher, list(config.input_shape), self.feature_indices, self.num_classes, t=1.0)
        self.discriminator: nn.Module = FeatureDiscriminator(
            shapes, hidden=config.discriminator_hidden, minibatch_std_group=config.discriminator_minibatch_std).to(self.precision)

    @property
    def model_dict(self) -> dict[str, nn.Module]:
        return {**super().model_dict, "discriminator": self.discriminator}

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"net": self.net, "discriminator": self.discriminator}

    def get_optimizers(self, iteration: int) -> list[str]:
        return ["net"] if iteration % self.config.student_update_freq == 0 else ["discriminator"]

    def discriminate(self, x_t: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None,
                     parts: int = 1) -> torch.Tensor:
        """Logits for ``x_t``; ``parts > 1`` says the batch is that many equal, separately judged parts (generated,
        real, real moved for R1), so minibatch-std groups stay inside one part."""
        features = head_features(self.teacher, x_t, t, condition, self.feature_indices)
        return self.discriminator(features, self.gan_groups(condition, x_t.shape[0], x_t.device, parts)).float()

    def gan_groups(self, condition: torch.Tensor | None, batch: int, device: torch.device,
                   parts: int = 1) -> torch.Tensor | None:
        """Minibatch-std groups (None when off): never across conditions or parts; each shares one noise level."""
        return minibatch_groups(batch, self.config.discriminator_minibatch_std, condition, parts, device)

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        real = data["real"].to(self.precision)
        condition = self.condition_of(data)
        scheduler = self.noise_scheduler
        noise = self.sample_noise(real.shape[0], real)
        t = per_group(lambda n: self.sample_noise_levels(n, real.device, self.config.t_dist),
                      self.gan_groups(condition, real.shape[0], real.device), real.shape[0])
        if iteration % self.config.student_update_freq == 0:
            x = self.generate(self.net, noise, condition, generator=self.rng)
            x_t = scheduler.add_noise(x, self.rng.randn_like(x), t)
            with frozen(self.discriminator):
                gen = -self.discriminate(x_t, t, condition).mean()
            total = gen
            loss_dict: dict[str, torch.Tensor] = {"gan_gen_loss": gen.detach()}
            if self.config.distill_loss_weight > 0:
                with torch.no_grad():
                    target = self.teacher_x0(x_t.detach(), t, condition)
                distill = F.mse_loss(x.float(), target.float())
                total = total + self.config.distill_loss_weight * distill
                loss_dict["distill_loss"] = distill.detach()
            loss_dict["total_loss"] = total
            return loss_dict, {"generated": x.detach(), "t": t}
        with torch.no_grad():
            x = self.generate(self.net, noise, condition, generator=self.rng)
        fake_t = scheduler.add_noise(x, self.rng.randn_like(x), t)
        real_t = scheduler.add_noise(real, self.rng.randn_like(real), t)
        judged = [fake_t, real_t]
        r1_on = self.config.r1_weight > 0 and torch.is_grad_enabled()
        if r1_on:
            judged.append(real_t + self.config.r1_fd_sigma * self.rng.randn_like(real_t))
        # One pass of the frozen teacher reads every part: the generated, the real and (for R1) the moved real samples.
        parts = len(judged)
        d_fake, d_real, *d_moved = self.discriminate(torch.cat(judged), t.repeat(parts),
                                                     DMD2Model.repeat(condition, parts), parts=parts).chunk(parts)
        disc = F.relu(1.0 - d_real).mean() + F.relu(1.0 + d_fake).mean()
        loss_dict = {"gan_disc_loss": disc.detach(), "d_real_logit": d_real.detach().mean(),
                     "d_fake_logit": d_fake.detach().mean()}
        if r1_on:
            r1 = finite_difference_r1(d_real, d_moved[0], self.config.r1_fd_sigma)
            disc = disc + 0.5 * self.config.r1_weight * r1
            loss_dict["r1_loss"] = r1.detach()
        return {"total_loss": disc, **loss_dict}, {"generated": x, "t": t}
