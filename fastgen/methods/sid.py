"""SiD: score identity distillation - DMD2's fake score, GAN branch and alternation with SiD's generator loss
(Zhou et al. 2024, "Score identity Distillation: Exponentially Fast Distillation of Pretrained Diffusion Models for
One-Step Generation"; with the GAN branch, Zhou et al. 2025, "Adversarial Score identity Distillation", SiDA).

DMD follows the score difference as a fixed direction: the teacher and the fake score are evaluated without
gradients, and only the student's sample ``x`` carries them (``fastgen.methods.dmd2``). SiD instead writes the
Fisher divergence between the teacher's and the student's noised distributions with Tweedie's formula and score
identities, and differentiates the resulting loss *through* both denoisers' inputs. With ``x = G(z)``, its
noising ``x_t = alpha_t x + sigma_t eps`` and the denoised estimates ``f_real`` (teacher) and ``f_fake`` (fake
score), the generator loss of SiD Sec. 4 is

    L_SiD = w [ (1 - alpha) ||f_real(x_t) - f_fake(x_t)||^2 + (f_real(x_t) - f_fake(x_t))^T (f_fake(x_t) - x) ],
    w = 1 / sg(mean_{C,H,W} |x - f_real(x_t)|)

computed here in the authors' rearranged per-element form ``w D ((f_real - x) - alpha D)``, ``D = f_real -
f_fake``. ``alpha = 1`` keeps only the second term; the paper uses ``alpha = 1.2`` (``sid_alpha``), which it found
to lower FID. Holding the denoisers fixed, the partial derivative w.r.t. ``x`` is ``w (f_fake - f_real)``, DMD's
own gradient; what SiD adds is the part through ``x_t``, where both denoisers are differentiated (their weights
stay frozen in this step). The loss is averaged over elements like DMD's surrogate, so ``vsd_loss_weight`` and the
GAN weight mean the same in both. It costs one backward pass through the teacher and the fake score per student
iteration. On digits it is behind DMD at this project's budgets (README, "Quick start").

Logged keys: those of DMD2, with ``sid_loss`` in place of ``vsd_loss``.
"""

from __future__ import annotations

import torch

from fastgen.methods.dmd2 import DMD2Model, denoising_gap, frozen


class SiDModel(DMD2Model):
    def distribution_matching_loss(self, x: torch.Tensor, condition: torch.Tensor | None
                                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """SiD's generator loss with gradients through ``x`` and through both denoisers' inputs."""
        x_rep, cond_rep, t, x_t = self.noised_draws(x, condition)
        with frozen(self.teacher, self.fake_score):
            d_real = self.teacher_x0(x_t, t, cond_rep).float()
            d_fake = self.fake_score(x_t, t, condition=cond_rep, fwd_pred_type="x0").float()
        x_rep = x_rep.float()
        with torch.no_grad():
            normaliser = denoising_gap(x_rep, d_real).view(-1, *([1] * (x.dim() - 1)))
        difference = d_real - d_fake
        per_element = difference * ((d_real - x_rep) - self.config.sid_alpha * difference) / normaliser
        loss = torch.nan_to_num(per_element).mean()
        grad_norm = (difference.detach() / normaliser).flatten(1).norm(dim=1).mean()
        return loss, {"sid_loss": loss.detach(), "dmd_grad_norm": grad_norm}, x_t.detach(), t
