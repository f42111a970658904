"""What the causal video students share (CausalKD, CausVid, Self-Forcing): a block-causal student that generates a
video chunk by chunk with its KV cache (``fastgen.networks.causal_dit``; Yin et al. 2025, "From slow bidirectional
to fast autoregressive video diffusion models", Sec. 3.1), taught by a *bidirectional* teacher that sees the whole
video at once.

* ``require_causal_student`` / ``require_bidirectional``: one-line errors when the networks are the wrong way round.
* ``chunk_times``: the per-frame ``(B, F)`` times of diffusion forcing (Chen et al. 2024, Sec. 3) restricted to the
  student's few steps - one index into ``t_list`` per chunk, drawn independently - which CausalKD and CausVid train
  on (CausVid Sec. 3.2: the student denoises every chunk at its own level, the earlier chunks at theirs).
* ``CausalDMD2Model``: DMD2 (``fastgen.methods.dmd2``) with such a student; sampling is the chunk-by-chunk rollout
  over ``t_list`` (``fastgen.networks.causal_sampling.rollout_chunks``: ``x0``, fresh noise at the next time, the
  finished chunk cached at ``context_time``). Subclasses say how the student's training videos are made:
  ``fastgen.methods.causvid`` from noised data, ``fastgen.methods.self_forcing`` from its own rollouts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.dmd2 import DMD2Model
from fastgen.networks.causal_sampling import rollout_chunks
from fastgen.utils.errors import ConfigError


def require_causal_student(net: nn.Module, method: str) -> int:
    """The student's chunk length in frames; a ``ConfigError`` unless ``net`` is a block-causal video network."""
    backbone = net.backbone
    if not getattr(backbone, "causal", False) or not hasattr(backbone, "kv_cache"):
        raise ConfigError(f"{method} trains a block-causal student: model.net must be a chunked causal video network "
                          "(fastgen.configs.net_dit.causal_video_dit)")
    return int(backbone.chunk_frames)


def require_bidirectional(module: nn.Module | None, name: str, method: str) -> None:
    """A ``ConfigError`` when ``module`` (the teacher or the fake score) is a causal network."""
    if module is not None and getattr(module.backbone, "causal", False):
        raise ConfigError(f"{method}'s {name} (model.{name}) scores whole videos: make it a bidirectional video "
                          "network (causal_video_dit(causal=False)); model.net is the causal student")


def chunk_times(times: list[float], batch: int, frames: int, chunk: int, rng: Any,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, t)``: for every sample and chunk an index into the student's ``times`` drawn uniformly (``rng``, a
    step's keyed stream: per-sample rows), as ``(B, F)`` per frame, and the matching per-frame times ``(B, F)``."""
    if frames % chunk:
        raise ConfigError(f"the videos have {frames} frames, not a multiple of the student's {chunk}-frame chunks")
    index = rng.randint(len(times), (batch, frames // chunk), device=device).repeat_interleave(chunk, dim=1)
    return index, torch.tensor(times, dtype=torch.float64, device=device)[index]


def per_frame(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B, F)`` values as ``(B, 1, F, 1, 1)`` against videos ``like`` ``(B, C, F, H, W)``."""
    return values.to(like.dtype)[:, None, :, None, None]


class CausalDMD2Model(DMD2Model):
    """DMD2 with a block-causal student, a bidirectional teacher and fake score (module docstring)."""

    student_sampler = "causal"
    method_name = "a causal DMD2 method"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.chunk_frames = require_causal_student(self.net, self.method_name)
        for name in ("teacher", "fake_score"):
            require_bidirectional(getattr(self, name), name, self.method_name)

    def renoise(self, x0: torch.Tensor, x: torch.Tensor, t: float, t_next: float, noise: Any) -> torch.Tensor:
        """DMD2's multi-step move: the estimate ``x0`` noised afresh to ``t_next``."""
        t_vec = torch.full((x0.shape[0],), t_next, device=x0.device, dtype=x0.dtype)
        return self.noise_scheduler.add_noise(x0, noise.randn_like(x0), t_vec)

    def rollout(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                exits: list[int] | None = None, generator: RandomSource = None) -> torch.Tensor:
        """The autoregressive video from ``noise`` (``rollout_chunks`` with the student's times and fresh noise)."""
        times = self.student_times()
        return rollout_chunks(net, self.start_state(noise, times[0]), condition, times, self.renoise, exits,
                              context_time=float(self.config.context_time), generator=generator)

    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        if times is not None:
            raise ValueError(f"{type(self).__name__} samples over model.t_list, chunk by chunk")
        if not getattr(net.backbone, "causal", False):
            raise ValueError("the rollout is the causal student's sampler")
        return self.rollout(net, noise, condition, generator=generator)


__all__ = ["CausalDMD2Model", "chunk_times", "per_frame", "require_bidirectional", "require_causal_student"]
