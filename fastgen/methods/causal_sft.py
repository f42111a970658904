"""CausalSFT: diffusion forcing (Chen et al. 2024, "Diffusion Forcing: next-token prediction meets full-sequence
diffusion", Sec. 3) - flow matching / denoising score matching in which every chunk of frames has its own noise
level, drawn independently from the schedule's training distribution, so that a block-causal video network
(``fastgen.networks.causal_dit``) learns to denoise a chunk given earlier chunks at any noise level, clean ones
included: what chunk-by-chunk generation feeds it.

The loss is SFT's, per frame: ``E || w(t_f) (pred_f - target_f) ||^2`` averaged over frames, with ``t_f`` the time
of frame ``f``'s chunk. Labels drop out with ``condition_dropout`` as in SFT.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.methods.model import FastGenModel
from fastgen.networks.layers import as_one_hot
from fastgen.utils.errors import ConfigError


class CausalSFTModel(FastGenModel):
    def chunk_frames(self) -> int:
        frames = getattr(self.net.backbone, "chunk_frames", None)
        if frames is None:
            raise ConfigError("CausalSFT trains a chunked video network (model.net with chunk_frames, e.g. "
                              "fastgen.configs.net_dit.causal_video_dit)")
        return int(frames)

    def frame_times(self, batch: int, frames: int, device: torch.device) -> torch.Tensor:
        """``(B, F)``: one draw from the schedule's training distribution per chunk, repeated over its frames."""
        chunk = self.chunk_frames()
        if frames % chunk:
            raise ConfigError(f"the videos have {frames} frames, not a multiple of the network's {chunk}-frame chunks")
        t = self.noise_scheduler.sample_t(batch * (frames // chunk), device=device, generator=self.rng)
        return t.reshape(batch, frames // chunk).repeat_interleave(chunk, dim=1)

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = data["real"].to(self.precision)
        if x0.dim() != 5:
            raise ConfigError(f"CausalSFT trains on videos (B, C, F, H, W); got a batch of shape {tuple(x0.shape)}")
        condition = self.condition_of(data)
        dropout = float(getattr(self.config, "condition_dropout", 0.0))
        rng = self.rng
        if condition is not None and dropout > 0:
            condition = as_one_hot(condition, self.num_classes)
            keep = (rng.rand((condition.shape[0], 1), device=condition.device) >= dropout).to(condition.dtype)
            condition = condition * keep.reshape(-1, *([1] * (condition.dim() - 1)))
        scheduler = self.noise_scheduler
        t = self.frame_times(x0.shape[0], x0.shape[2], x0.device).to(x0.dtype)
        eps = rng.randn_like(x0)
        x_t = scheduler.add_noise(x0, eps, t)
        pred = self.net(x_t, t, condition=condition)
        target = scheduler.target(x0, eps, t)
        per_frame = (pred.float() - target.float()).square().mean(dim=(1, 3, 4))  # (B, F)
        loss = (scheduler.loss_weight(t.float()) * per_frame).mean()
        return {"total_loss": loss, "denoising_loss": loss.detach()}, {"x_t": x_t, "pred": pred, "t": t}

    def generator_fn(self, net: torch.nn.Module, noise: torch.Tensor, steps: int | None = None,
                     condition: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """A block-causal network generates chunk by chunk with its KV cache (``sample_chunks``: Heun per chunk,
        the finished chunk cached clean); a bidirectional one samples the whole video with Heun."""
        if not getattr(net.backbone, "causal", False):
            return super().generator_fn(net, noise, steps, condition, generator=generator)
        from fastgen.networks.causal_sampling import sample_chunks

        return sample_chunks(net, noise, condition, int(steps or self.config.sample_steps),
                             guidance=self.config.guidance_scale, num_classes=self.num_classes, generator=generator)


__all__ = ["CausalSFTModel"]
