"""Chunk-by-chunk generation with a block-causal video network (``fastgen.networks.causal_dit``).

Each chunk of frames is integrated from noise to data (Heun's method over the schedule's grid, EDM Algorithm 1)
while attending to the chunks already generated; then the finished chunk is written into the key/value cache at
the *context time* - 0 (clean), or a small noise level the way CausVid and Self-Forcing refresh their caches
(Yin et al. 2025, Sec. 3.2; Huang et al. 2025, Sec. 3.3) - and the next chunk starts. Classifier-free guidance
keeps two caches, tagged ``cond`` and ``uncond``. ``keep_frames`` rolls the caches (the last ``keep_frames``
frames only), which lets a network generate videos longer than it was trained on (extrapolation at absolute frame
positions).

``use_cache=False`` is the same sampler without the cache: every evaluation re-runs the whole prefix (the finished
chunks at the context time, then the current one) and keeps the current chunk's output - what a block-causal
network computes anyway, so both give the same video (``tests/networks/test_causal_dit.py``); it is the baseline of
``benchmarks/causal_cache.py``.

``rollout_chunks`` is the few-step students' version (CausalKD, CausVid, Self-Forcing; ``fastgen.methods.causal``):
each chunk goes through the student's own times - an ``x0`` estimate, then the method's move to the next time
(fresh noise for CausVid and Self-Forcing, a deterministic DDIM step for CausalKD) - and may stop early at an
*exit step* whose evaluation alone carries gradients (Self-Forcing's stochastic gradient truncation; Huang et al.
2025, Sec. 3.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource, as_noise_source
from fastgen.networks.layers import as_one_hot
from fastgen.networks.sampling import heun_sample


@torch.no_grad()
def sample_chunks(net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None, steps: int,
                  guidance: float | None = None, num_classes: int = 0, context_time: float = 0.0,
                  keep_frames: int | None = None, use_cache: bool = True, generator: RandomSource = None
                  ) -> torch.Tensor:
    """A video ``(B, C, F, H, W)`` from ``noise`` (``x_{t_max}``), chunk by chunk (module docstring)."""
    backbone = net.backbone
    scheduler = net.noise_scheduler
    chunk = int(backbone.chunk_frames)
    batch, frames = noise.shape[0], noise.shape[2]
    if frames % chunk:
        raise ValueError(f"{frames} frames are not a whole number of {chunk}-frame chunks")
    if keep_frames is not None and not use_cache:
        raise ValueError("keep_frames rolls the cache: it needs use_cache")
    cond = as_one_hot(condition, num_classes).to(noise.dtype) if condition is not None and num_classes > 0 else condition
    guided = guidance is not None and cond is not None
    tags = [("cond", cond)] + ([("uncond", torch.zeros_like(cond))] if guided else [])
    context = max(float(context_time), float(scheduler.t_min))
    backbone.clear_caches()
    done: list[torch.Tensor] = []  # finished chunks at the context time (the uncached prefix)
    out: list[torch.Tensor] = []
    try:
        for start in range(0, frames, chunk):

            def evaluate(x: torch.Tensor, t: torch.Tensor, c: torch.Tensor | None, tag: str) -> torch.Tensor:
                if use_cache:
                    with backbone.kv_cache(tag):
                        return net(x, t, condition=c, fwd_pred_type="flow")
                prefix = torch.cat([*done, x], dim=2)
                times = torch.cat([torch.full((batch, start), context, dtype=t.dtype, device=t.device),
                                   t[:, None].expand(batch, x.shape[2])], dim=1)
                return net(prefix, times, condition=c, fwd_pred_type="flow")[:, :, start:]

            def flow(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                preds = [evaluate(x, t, c, tag) for tag, c in tags]
                return preds[0] if not guided else preds[1] + float(guidance) * (preds[0] - preds[1])

            x0 = heun_sample(flow, noise[:, :, start:start + chunk], scheduler, steps)
            out.append(x0)
            if start + chunk >= frames:
                break
            t_ctx = torch.full((batch,), context, dtype=x0.dtype, device=x0.device)
            x_ctx = x0 if context == 0 else scheduler.add_noise(x0, as_noise_source(generator).randn_like(x0), t_ctx)
            if use_cache:
                for tag, c in tags:
                    with backbone.kv_cache(tag, write=True, keep_frames=keep_frames):
                        net(x_ctx, t_ctx, condition=c)
            else:
                done.append(x_ctx)
    finally:
        backbone.clear_caches()
    return torch.cat(out, dim=2)


#: The move from one student time to the next: ``next_state(x0, x, t, t_next, noise) -> x_{t_next}`` (``x0``: the
#: network's estimate at the state ``x`` of time ``t``; ``noise``: where fresh noise comes from).
NextState = Callable[[torch.Tensor, torch.Tensor, float, float, RandomSource], torch.Tensor]


def rollout_chunks(net: nn.Module, start: torch.Tensor, condition: torch.Tensor | None, times: Sequence[float],
                   next_state: NextState, exits: Sequence[int] | None = None, context_time: float = 0.0,
                   generator: RandomSource = None) -> torch.Tensor:
    """A video from ``start`` (the states at ``times[0]``, ``(B, C, F, H, W)``), chunk by chunk with the KV cache.

    Chunk ``c`` is evaluated at ``times[0], times[1], ...`` up to its exit step ``exits[c]`` (default: the last);
    its output is that step's ``x0``. Only the exit step's evaluation runs with gradients (when they are enabled):
    the earlier steps and the cache writes of finished chunks (at ``context_time``, clean when 0) run without, so
    a training rollout back-propagates through one evaluation per chunk. The caches are cleared before and after."""
    backbone = net.backbone
    scheduler = net.noise_scheduler
    chunk = int(backbone.chunk_frames)
    batch, frames = start.shape[0], start.shape[2]
    if frames % chunk:
        raise ValueError(f"{frames} frames are not a whole number of the student's {chunk}-frame chunks")
    stops = list(exits) if exits is not None else [len(times) - 1] * (frames // chunk)
    if len(stops) != frames // chunk or any(not 0 <= s < len(times) for s in stops):
        raise ValueError(f"exits {stops} must give one step in 0..{len(times) - 1} per chunk ({frames // chunk})")
    source = as_noise_source(generator)
    context = max(float(context_time), float(scheduler.t_min))
    grad = torch.is_grad_enabled()
    out: list[torch.Tensor] = []
    backbone.clear_caches()
    try:
        for index, first in enumerate(range(0, frames, chunk)):
            x = start[:, :, first:first + chunk]
            x0 = x
            for step in range(stops[index] + 1):
                t = torch.full((batch,), float(times[step]), device=x.device, dtype=x.dtype)
                with backbone.kv_cache("cond"), torch.set_grad_enabled(grad and step == stops[index]):
                    x0 = net(x, t, condition=condition, fwd_pred_type="x0")
                if step < stops[index]:
                    with torch.no_grad():
                        x = next_state(x0, x, float(times[step]), float(times[step + 1]), source)
            out.append(x0)
            if first + chunk < frames:  # the finished chunk into the cache at the context time
                with torch.no_grad(), backbone.kv_cache("cond", write=True):
                    t_ctx = torch.full((batch,), context, device=x.device, dtype=x.dtype)
                    x_ctx = x0 if context == 0 else scheduler.add_noise(x0, source.randn_like(x0), t_ctx)
                    net(x_ctx.detach(), t_ctx, condition=condition)
    finally:
        backbone.clear_caches()
    return torch.cat(out, dim=2)


__all__ = ["NextState", "rollout_chunks", "sample_chunks"]
