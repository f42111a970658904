"""MeanFlow: one-step generation with an average-velocity network (Geng et al. 2025, "Mean Flows for one-step
generative modeling").

On the rectified-flow path ``z_t = (1 - t) x0 + t eps`` with instantaneous velocity ``v = eps - x0`` (Eq. 1-2), the
network ``u(z_t, r, t)`` (the ``r`` input of the network contract; backbones built with ``use_r=True``) models the
*average* velocity over ``[r, t]``, ``u = 1/(t - r) int_r^t v(z_tau, tau) dtau`` (Eq. 3). Differentiating
``(t - r) u = int_r^t v`` in ``t`` gives the MeanFlow identity (Eq. 6)

    u(z_t, r, t) = v(z_t, t) - (t - r) d/dt u(z_t, r, t),   d/dt u = v . grad_z u + d_t u   (Eq. 8)

so the training target is ``u_tgt = v - (t - r) sg(d/dt u)``, with the total derivative computed as one
Jacobian-vector product of ``u`` along the tangent ``(dz/dt, dr/dt, dt/dt) = (v, 0, 1)`` (``torch.func.jvp``;
central finite differences with ``jvp="finite_difference"``, or automatically when forward AD is not supported by
the network's ops). The loss is ``sg(w) ||u - sg(u_tgt)||^2`` with the adaptive weight
``w = 1 / (||Delta||^2 + c)^p`` (Sec. 4.3; ``p = 0``: plain squared error), ``||.||^2`` summed over the sample.

Times: ``t`` and ``r`` are drawn independently from a logit-normal (``t_mean``, ``t_std``) and sorted so that
``t >= r``; a fraction ``1 - ratio_r_neq_t`` of the batch gets ``r = t``, where ``u_tgt = v`` and the loss is
exactly flow matching (Lipman et al. 2023). ``v`` is ``eps - x0`` (``mode="data"``: training from data, no
teacher) or the teacher's velocity at ``(z_t, t)`` (``mode="distill"``; guided when ``guidance_scale`` is set).

Sampling: ``x_r = x_t - (t - r) u(x_t, r, t)`` (Eq. 12); one step is ``x0 = x1 - u(x1, 0, 1)``, more steps follow
``t_list`` (or ``steps`` uniform steps when ``generator_fn`` is asked for a number of steps).

Logged keys (``loss_dict``): ``total_loss``, ``meanflow_loss`` (the weighted loss), ``unweighted_loss`` (mean
``||Delta||^2 / D``), ``fm_fraction`` (share of the batch with ``r = t``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.cm_utils import (
    Tangents,
    TimeDistribution,
    as_tensor_dict,
    backbone_uses_r,
    teacher_velocity,
)
from fastgen.methods.distill import DistillationModel
from fastgen.networks.noise_schedules import RectifiedFlowScheduler, expand_like
from fastgen.utils.errors import ConfigError


class MeanFlowModel(DistillationModel):
    student_sampler = "meanflow"

    def __init__(self, config: Any) -> None:
        if config.mode not in ("data", "distill"):
            raise ConfigError(f"model.mode must be data or distill, got {config.mode!r}")
        if not 0.0 <= config.ratio_r_neq_t <= 1.0:
            raise ConfigError(f"model.ratio_r_neq_t must be in [0, 1], got {config.ratio_r_neq_t}")
        if config.adaptive_p < 0 or config.adaptive_c <= 0:
            raise ConfigError("model.adaptive_p must be >= 0 and model.adaptive_c > 0")
        super().__init__(config)
        if not isinstance(self.noise_scheduler, RectifiedFlowScheduler):
            raise ConfigError(f"MeanFlow needs a rectified-flow network (noise_scheduler=flow_schedule()), not "
                              f"{type(self.noise_scheduler).__name__}")
        if backbone_uses_r(self.net) is False:
            raise ConfigError("MeanFlow needs the network's second time input: build the backbone with use_r=True")
        self.time_dist = TimeDistribution("logit_normal", config.t_mean, config.t_std,
                                          scale=float(self.noise_scheduler.t_max))
        self.tangents = Tangents(config.jvp, config.fd_step)

    def uses_teacher(self) -> bool:
        return self.config.mode == "distill"

    # ---- pieces -------------------------------------------------------------------------------------------------
    def sample_t_r(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``t >= r`` from two logit-normal draws; ``r = t`` for a ``1 - ratio_r_neq_t`` share of the batch."""
        a = self.time_dist.sample(batch, device, generator=self.rng)
        b = self.time_dist.sample(batch, device, generator=self.rng)
        t, r = torch.maximum(a, b), torch.minimum(a, b)
        equal = self.rng.rand(batch, device=device) >= self.config.ratio_r_neq_t
        r = torch.where(equal, t, r)
        return t.to(self.precision), r.to(self.precision)

    def instantaneous_velocity(self, x0: torch.Tensor, eps: torch.Tensor, z: torch.Tensor, t: torch.Tensor,
                               condition: torch.Tensor | None) -> torch.Tensor:
        """``v = eps - x0`` (data) or the teacher's velocity at ``(z_t, t)`` (distill; ``t >= 1e-3``)."""
        if self.config.mode == "data":
            return eps - x0
        with torch.no_grad():
            return teacher_velocity(self, z, t.clamp_min(1e-3), condition)

    def total_derivative(self, z: torch.Tensor, t: torch.Tensor, r: torch.Tensor, v: torch.Tensor,
                         condition: torch.Tensor | None) -> torch.Tensor:
        """``d/dt u(z_t, r, t)`` along ``(v, 1, 0)`` (Eq. 8), computed only for the rows with ``r != t``: the target
        multiplies it by ``t - r``, so the flow-matching rows (``1 - ratio_r_neq_t`` of the batch, 75% at the
        paper's setting) need no Jacobian-vector product, the most expensive pass of the step. With no such row the
        JVP still runs on one row (its result is multiplied by 0), so every rank of a sharded network runs the same
        forward passes."""
        rows = (r != t).nonzero().squeeze(1)
        if rows.numel() == 0:
            rows = rows.new_zeros(1)
        sub_condition = condition[rows] if condition is not None else None
        t_rows, r_rows = t[rows], r[rows]
        partial = self.tangents(lambda z_, t_, r_: self.net(z_, t_, condition=sub_condition, r=r_, fwd_pred_type="flow"),
                                (z[rows], t_rows, r_rows), (v[rows], torch.ones_like(t_rows), torch.zeros_like(r_rows)))
        return torch.zeros_like(v).index_copy(0, rows, partial.to(v.dtype))

    # ---- the step -----------------------------------------------------------------------------------------------
    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = data["real"].to(self.precision)
        condition = self.condition_of(data)
        t, r = self.sample_t_r(x0.shape[0], x0.device)
        eps = self.rng.randn_like(x0)
        z = self.noise_scheduler.add_noise(x0, eps, t)
        v = self.instantaneous_velocity(x0, eps, z, t, condition)
        u = self.net(z, t, condition=condition, r=r, fwd_pred_type="flow")
        dudt = self.total_derivative(z, t, r, v, condition)
        u_target = (v - expand_like(t - r, v) * dudt).detach()
        squared = (u - u_target).float().flatten(1).square().sum(dim=1)
        weight = (squared.detach() + self.config.adaptive_c).pow(-self.config.adaptive_p)
        loss = (weight * squared).mean()
        stats = {"meanflow_loss": loss, "unweighted_loss": squared.mean() / squared.new_tensor(x0[0].numel()),
                 "fm_fraction": (r == t).float().mean()}
        loss_dict = {"total_loss": loss, **as_tensor_dict(stats, loss)}
        return loss_dict, {"x_t": z, "t": t, "r": r, "u": u.detach()}

    # ---- sampling -----------------------------------------------------------------------------------------------
    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        """``x_r = x_t - (t - r) u(x_t, r, t)`` over ``times`` (from ``t_max`` down; the final 0 is implied)."""
        times = [*(times or self.student_times()), 0.0]
        x = noise
        batch = x.shape[0]
        for t, r in zip(times[:-1], times[1:]):
            t_vec = torch.full((batch,), t, device=x.device, dtype=x.dtype)
            r_vec = torch.full((batch,), r, device=x.device, dtype=x.dtype)
            x = x - (t - r) * net(x, t_vec, condition=condition, r=r_vec, fwd_pred_type="flow")
        return x

    def generator_fn(self, net: nn.Module, noise: torch.Tensor, steps: int | None = None,
                     condition: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """The teacher samples with Heun; the MeanFlow network with ``steps`` uniform steps, or ``t_list``."""
        if self.teacher is not None and net is self.teacher:
            return super().generator_fn(net, noise, steps, condition, generator=generator)
        times = None
        if steps:
            t_max = float(self.noise_scheduler.t_max)
            times = [t_max * (1.0 - i / steps) for i in range(steps)]
        with torch.no_grad():
            return self.generate(net, noise, condition, times)


__all__ = ["MeanFlowModel"]
