"""Self-Forcing (Huang et al. 2025, "Self Forcing: bridging the train-test gap in autoregressive video diffusion"):
a few-step block-causal student trained on its *own* autoregressive rollouts, with DMD2's distribution matching
against a bidirectional teacher and fake score on the whole generated video (``fastgen.methods.dmd2``).

The rollout (``rollout``) generates the video chunk by chunk exactly as sampling does - each chunk from noise
through the student's times ``t_list`` (x0, then re-noise to the next time), attending to the finished chunks in
the KV cache (``fastgen.networks.causal_dit``), then written into the cache at the context time - so training sees
the errors the student will see at test time (exposure bias is what teacher forcing and diffusion forcing leave).
Only one evaluation per chunk carries gradients: the chunk stops at an exit step drawn uniformly from the
student's steps, and that step's ``x0`` is the chunk's output; the earlier steps and the cache writes run without
gradients (Huang et al. 2025, Sec. 3.2, stochastic gradient truncation). The exit steps are drawn from the shared
stream (``self.rng.shared``), so every rank exits at the same steps and sharded networks run the same number of
collectives.

Sampling (``generate``) is the same rollout without gradients, every chunk through all of ``t_list``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource, as_noise_source
from fastgen.methods.dmd2 import DMD2Model
from fastgen.utils.errors import ConfigError


class SelfForcingModel(DMD2Model):
    student_sampler = "causal"
    last_exit_steps: list[int] | None = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if not getattr(self.net.backbone, "causal", False) or not hasattr(self.net.backbone, "kv_cache"):
            raise ConfigError("Self-Forcing trains a block-causal student: model.net must be a chunked causal video "
                              "network (fastgen.configs.net_dit.causal_video_dit)")
        for name, module in (("teacher", self.teacher), ("fake_score", self.fake_score)):
            if module is not None and getattr(module.backbone, "causal", False):
                raise ConfigError(f"Self-Forcing's {name} (model.{name}) scores whole videos: make it a bidirectional "
                                  "video network (causal_video_dit(causal=False)); model.net is the causal student")

    def exit_steps(self, chunks: int, device: torch.device) -> torch.Tensor:
        """``(chunks,)`` exit steps, uniform over the student's steps, the same on every rank (the shared stream)."""
        return self.rng.shared.randint(len(self.student_times()), (chunks,), device=device)

    def rollout(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                exits: list[int] | None = None, generator: RandomSource = None) -> torch.Tensor:
        """The autoregressive video from ``noise``: chunk ``c`` stops at step ``exits[c]`` (default: the last),
        whose evaluation alone runs with gradients (when enabled); the caches are cleared before and after."""
        backbone = net.backbone
        chunk = int(backbone.chunk_frames)
        times = self.student_times()
        batch, frames = noise.shape[0], noise.shape[2]
        if frames % chunk:
            raise ConfigError(f"{frames} frames are not a whole number of the student's {chunk}-frame chunks")
        exits = exits if exits is not None else [len(times) - 1] * (frames // chunk)
        source = as_noise_source(generator)
        scheduler = net.noise_scheduler
        context = max(float(self.config.context_time), float(scheduler.t_min))
        out = []
        backbone.clear_caches()
        try:
            for index, start in enumerate(range(0, frames, chunk)):
                x = self.start_state(noise[:, :, start:start + chunk], times[0])
                stop = int(exits[index])
                x0 = x
                for step in range(stop + 1):
                    t = torch.full((batch,), times[step], device=x.device, dtype=x.dtype)
                    with backbone.kv_cache("cond"), torch.set_grad_enabled(torch.is_grad_enabled() and step == stop):
                        x0 = net(x, t, condition=condition, fwd_pred_type="x0")
                    if step < stop:
                        with torch.no_grad():
                            t_next = torch.full((batch,), times[step + 1], device=x.device, dtype=x.dtype)
                            x = scheduler.add_noise(x0, source.randn_like(x0), t_next)
                out.append(x0)
                if start + chunk < frames:  # the finished chunk into the cache at the context time
                    with torch.no_grad(), backbone.kv_cache("cond", write=True):
                        t_ctx = torch.full((batch,), context, device=x.device, dtype=x.dtype)
                        x_ctx = x0 if context == 0 else scheduler.add_noise(x0, source.randn_like(x0), t_ctx)
                        net(x_ctx.detach(), t_ctx, condition=condition)
        finally:
            backbone.clear_caches()
        return torch.cat(out, dim=2)

    def generate_for_training(self, noise: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        chunks = noise.shape[2] // int(self.net.backbone.chunk_frames)
        exits = self.exit_steps(chunks, noise.device).tolist()
        self.last_exit_steps = list(exits)  # what the last training rollout drew (for logs and checks)
        return self.rollout(self.net, noise, condition, exits, generator=self.rng)

    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        if times is not None:
            raise ValueError("a Self-Forcing student samples over model.t_list, chunk by chunk")
        if not getattr(net.backbone, "causal", False):
            raise ValueError("the rollout is the causal student's sampler")
        return self.rollout(net, noise, condition, generator=generator)


__all__ = ["SelfForcingModel"]
