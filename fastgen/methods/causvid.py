"""CausVid (Yin et al. 2025, "From slow bidirectional to fast autoregressive video diffusion models"): DMD2
(``fastgen.methods.dmd2``) with a block-causal few-step student, a bidirectional teacher and a bidirectional fake
score, the student trained on *diffusion-forcing* inputs (CausVid Sec. 3.2).

A student iteration noises a data video chunk by chunk - chunk ``c`` to the student time ``t_list[i_c]``, the
indices drawn independently (``fastgen.methods.causal.chunk_times``) - and the block-causal student estimates the
clean video in one pass, ``x = G(x_t, t)``, chunk ``c`` seeing itself and the earlier chunks at their own noise
levels. DMD's distribution-matching gradient (DMD Eq. 7-8) is then taken on the whole video ``x`` with the
bidirectional teacher and fake score, exactly as DMD2 does for images; the fake score learns the student's videos
the same way (critic iterations). Because every chunk is trained at every student time, with earlier chunks noisy
or clean, the student generates autoregressively at test time (``CausalDMD2Model.rollout``: chunk by chunk over
``t_list``, each finished chunk cached at ``context_time``) although training never runs the rollout - what
Self-Forcing (``fastgen.methods.self_forcing``) changes.

A run usually starts from a CausalKD student (``model.student_ckpt``; CausVid Sec. 3.3, the ODE initialisation).
"""

from __future__ import annotations

import torch

from fastgen.methods.causal import CausalDMD2Model, chunk_times
from fastgen.utils.errors import ConfigError


class CausVidModel(CausalDMD2Model):
    method_name = "CausVid"

    def generate_for_training(self, noise: torch.Tensor, condition: torch.Tensor | None,
                              real: torch.Tensor | None = None) -> torch.Tensor:
        """``G(x_t, t)`` on the step's data videos noised to an independent student time per chunk."""
        if real is None or real.dim() != 5:
            raise ConfigError("CausVid's student starts from noised data videos (B, C, F, H, W)")
        _, t = chunk_times(self.student_times(), real.shape[0], real.shape[2], self.chunk_frames, self.rng, real.device)
        t = t.to(real.dtype)
        x_t = self.noise_scheduler.add_noise(real, self.rng.randn_like(real), t)
        return self.net(x_t, t, condition=condition, fwd_pred_type="x0")


__all__ = ["CausVidModel"]
