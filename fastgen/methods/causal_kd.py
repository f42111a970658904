"""CausalKD: the ODE initialisation of a causal video student (Yin et al. 2025, "From slow bidirectional to fast
autoregressive video diffusion models", Sec. 3.3) - knowledge distillation (``fastgen.methods.kd``) of the
bidirectional teacher's ODE trajectories into a block-causal few-step student, under diffusion forcing.

The teacher solves whole videos from noise (Heun; cached in ``kd_data_path`` or on the fly), recording its state
at every student time ``t_0 = T > t_1 > ... > t_{k-1}`` (``x^T_{t_0}`` is the noise itself) and its sample. A
training step draws one student step ``i_c`` per chunk (``fastgen.methods.causal.chunk_times``) and gives the
block-causal student the teacher's video with chunk ``c`` at its state ``x^T_{t_{i_c}}`` - every chunk at its own
point of the same trajectory, as CausVid's initialisation does. Chunk ``c``'s estimate ``x0_c`` regresses the
``x0`` that the teacher's next state implies for a deterministic DDIM step (KD's target, Salimans & Ho 2022,
Algorithm 2)::

    x0*_c = (x^T_{t_{i_c + 1}} - b_i x^T_{t_{i_c}}) / a_i,   x_{t_{i+1}} = a_i x0 + b_i x_{t_i}  (DDIM, eta = 0)

which for the last step (``t_k = 0``) is the teacher's sample: a one-step student learns CausVid's ODE pairs
exactly, and a k-step student learns to follow the trajectory, so sampling can take the same deterministic steps.

Sampling is chunk by chunk with the KV cache (``fastgen.networks.causal_sampling.rollout_chunks``): each chunk
goes from noise through ``t_list`` by those DDIM steps and the finished chunk is cached at ``context_time``.
The result initialises CausVid or Self-Forcing (``model.student_ckpt``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.causal import chunk_times, per_frame, require_bidirectional, require_causal_student
from fastgen.methods.cm_utils import consistency_distance
from fastgen.methods.kd import KDModel
from fastgen.networks.causal_sampling import rollout_chunks
from fastgen.utils.errors import ConfigError


class CausalKDModel(KDModel):
    student_sampler = "causal"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.chunk_frames = require_causal_student(self.net, "CausalKD")
        require_bidirectional(self.teacher, "teacher", "CausalKD")

    def ddim_step(self, x0: torch.Tensor, x: torch.Tensor, t: float, t_next: float, noise: Any) -> torch.Tensor:
        """The deterministic DDIM step from ``x`` at ``t`` with the estimate ``x0`` to ``t_next`` (no noise)."""
        a, b = self.ddim_coefficients(t, t_next, x)
        return a * x0 + b * x

    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        if times is not None:
            raise ValueError("a CausalKD student samples over model.t_list, chunk by chunk")
        if not getattr(net.backbone, "causal", False):
            raise ValueError("the rollout is the causal student's sampler")
        times = self.student_times()
        return rollout_chunks(net, self.start_state(noise, times[0]), condition, times, self.ddim_step,
                              context_time=float(self.config.context_time), generator=generator)

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        times = self.student_times()
        condition = self.condition_of(data)
        noise, trajectory = self.pairs_of(data, condition)
        if noise.dim() != 5:
            raise ConfigError(f"CausalKD trains on videos (B, C, F, H, W); got noise of shape {tuple(noise.shape)}")
        batch, frames = noise.shape[0], noise.shape[2]
        # states[:, j] is the teacher's state at t_j (j < k) and its sample (j = k)
        states = torch.cat([self.start_state(noise, times[0])[:, None], trajectory], dim=1)
        index, t = chunk_times(times, batch, frames, self.chunk_frames, self.rng, noise.device)
        pick = index[:, None, None, :, None, None].expand(-1, 1, states.shape[2], -1, *states.shape[4:])
        x = states.gather(1, pick)[:, 0]  # chunk c at the teacher's state at t_{i_c}
        x_next = states.gather(1, pick + 1)[:, 0]  # ... and at the next student time
        pairs = [self.ddim_coefficients(times[i], times[i + 1] if i + 1 < len(times) else 0.0, noise)
                 for i in range(len(times))]
        a = torch.stack([p[0].reshape(()) for p in pairs])[index]  # (B, F)
        b = torch.stack([p[1].reshape(()) for p in pairs])[index]
        target = (x_next - per_frame(b, x) * x) / per_frame(a, x)
        x0 = self.net(x, t.to(x.dtype), condition=condition, fwd_pred_type="x0")
        loss = consistency_distance(x0 - target, self.config.distance, self.config.huber_c).mean()
        return {"total_loss": loss, "kd_loss": loss.detach()}, {"generated": x0.detach(), "target": trajectory[:, -1]}


__all__ = ["CausalKDModel"]
