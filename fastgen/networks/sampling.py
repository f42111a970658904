"""Deterministic samplers for the probability-flow ODE ``dx/dt = flow(x, t)``.

``heun_sample`` is EDM's Algorithm 1 (Karras et al. 2022) with ``S_churn = 0``: an Euler step followed by a
second-order (trapezoidal) correction, except on the last step into ``t = 0``; ``N`` steps cost ``2N - 1``
network evaluations (18 steps -> 35). It runs in the dtype of the starting noise: nothing is promoted to
float64 (which would make CPU sampling several times slower for no visible gain). The state may be a multimodal
sample (a dict of modalities, ``fastgen.networks.modalities``): every modality moves along the same time grid.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastgen.networks.modalities import Sample, batch_size, first_tensor, per_modality
from fastgen.networks.noise_schedules import NoiseScheduler

FlowFn = Callable[[Sample, torch.Tensor], Sample]


@torch.no_grad()
def heun_sample(flow_fn: FlowFn, noise: Sample, scheduler: NoiseScheduler, steps: int) -> Sample:
    """Integrate from ``t_max`` to 0. ``flow_fn(x, t_batch)`` returns ``dx/dt``; ``noise`` is ``x_{t_max}``."""
    like = first_tensor(noise)
    times = scheduler.sampling_times(steps, device=like.device).to(like.dtype)
    x = noise
    batch = batch_size(x)
    for i in range(steps):
        t_cur, t_next = times[i], times[i + 1]
        h = t_next - t_cur
        d_cur = flow_fn(x, t_cur.expand(batch))
        x_next = per_modality(lambda a, d: a + h * d, x, d_cur)
        if t_next > 0:
            d_next = flow_fn(x_next, t_next.expand(batch))
            x_next = per_modality(lambda a, d, e: a + h * 0.5 * (d + e), x, d_cur, d_next)
        x = x_next
    return x


@torch.no_grad()
def euler_sample(flow_fn: FlowFn, noise: Sample, scheduler: NoiseScheduler, steps: int) -> Sample:
    """First-order Euler integration (one evaluation per step)."""
    like = first_tensor(noise)
    times = scheduler.sampling_times(steps, device=like.device).to(like.dtype)
    x = noise
    for i in range(steps):
        h = times[i + 1] - times[i]
        x = per_modality(lambda a, d: a + h * d, x, flow_fn(x, times[i].expand(batch_size(x))))
    return x
