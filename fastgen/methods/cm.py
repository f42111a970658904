"""CM: discrete-time consistency models - consistency training (CT) and consistency distillation (CD)
(Song et al. 2023, "Consistency Models"), with the curriculum and loss of Easy Consistency Tuning
(Geng et al. 2024, "Consistency Models Made Easy", ECT).

The consistency function is the network's ``x0`` estimate, ``f(x_t, t) = net(x_t, t, fwd_pred_type="x0")``; the
schedule's preconditioning gives ``f(x, t) -> x`` as ``t -> 0`` (EDM's ``c_skip -> 1``, ``c_out -> 0``; for
rectified flow ``x0 = x_t - t v`` exactly), the boundary condition of Song et al. 2023, Eq. 5. One step:

* ``t`` from the training-time proposal (``config.t_dist``; default the schedule's own: EDM's log-normal,
  logit-normal for rectified flow), ``eps ~ N(0, I)``, ``x_t = alpha_t x0 + sigma_t eps``;
* ``r = ratio * t`` (ECT's mapping ``Delta t = t / q^a``; with ``ratio_k > 0`` the ``n(t) = 1 + k sigmoid(-b t)``
  factor: ``r = t (1 - (1 - ratio) n(t))``, clipped at 0). ``ratio`` is ``self.ct_ratio``, which
  ``CTScheduleCallback`` sets before every step (``1 - 1/q^(stage+1)``);
* ``x_r``: **CT** - the same noise at the earlier time, ``x_r = alpha_r x0 + sigma_r eps`` (Song et al. 2023,
  Eq. 10, which makes the target an unbiased estimate of the ODE step); **CD** - one step of the teacher's
  probability-flow ODE from ``x_t`` (Euler, or Heun as in Song et al. 2023, Algorithm 2 with EDM's solver), with
  classifier-free guidance when ``guidance_scale`` is set;
* target ``sg(f(x_r, r))`` from the *online* network without gradients - no EMA target network (ECT, Sec. 3;
  iCT, Song & Dhariwal 2023, Sec. 3.2) - and ``x_r`` itself where ``r = 0`` (the boundary condition: at
  ``r = 0`` CT regresses on the data, i.e. diffusion pre-training, ECT's ``Delta t = t`` limit);
* loss ``E[ w(t, r) d(f(x_t, t), sg f(x_r, r)) ]`` with ``w = 1 / (t - r)`` (ECT's weighting; ``uniform``: 1) and
  ``d`` the pseudo-Huber distance ``sqrt(||.||^2 + c^2) - c`` (iCT, Sec. 3.3) or the mean squared error.

Sampling (``generator_fn``): one evaluation ``f(x_T, T)``, or Song et al.'s multistep sampler over ``t_list``
(re-noise the estimate to the next time with fresh noise; ``DistillationModel.generate``).

Logged keys (``loss_dict``): ``total_loss``, ``cm_loss`` (the weighted consistency loss), ``ct_ratio`` (the
ratio used), ``unweighted_cm_loss`` (mean distance before the ``1/(t - r)`` weight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastgen.methods.cm_utils import (
    as_tensor_dict,
    batch_mask,
    consistency_distance,
    teacher_velocity,
    time_distribution,
)
from fastgen.methods.distill import DistillationModel
from fastgen.networks.noise_schedules import expand_like
from fastgen.utils.errors import ConfigError


class CMModel(DistillationModel):
    def __init__(self, config: Any) -> None:
        if config.mode not in ("ct", "cd"):
            raise ConfigError(f"model.mode must be ct or cd, got {config.mode!r}")
        if not 0.0 <= config.ct_ratio < 1.0:
            raise ConfigError(f"model.ct_ratio must be in [0, 1), got {config.ct_ratio}")
        super().__init__(config)
        # Set by CTScheduleCallback before every step (plain attributes, not state: the callback recomputes them).
        self.ct_ratio: float = float(config.ct_ratio)
        self.ct_stage: int = 0
        self.time_dist = time_distribution(self.noise_scheduler, config.t_dist, config.t_mean, config.t_std)

    def uses_teacher(self) -> bool:
        return self.config.mode == "cd"

    # ---- pieces -------------------------------------------------------------------------------------------------
    def train_time_range(self) -> tuple[float, float]:
        """``[low, high]`` of the training times ``t`` (TCM's second stage narrows it)."""
        scheduler = self.noise_scheduler
        low = float(scheduler.t_min) if scheduler.t_min > 0 else 1e-4 * float(scheduler.t_max)
        return low, float(scheduler.t_max)

    def r_of(self, t: torch.Tensor) -> torch.Tensor:
        """``r = t (1 - (1 - ratio) n(t))`` clipped at 0; ``n = 1`` unless ``ratio_k > 0`` (ECT, Sec. 3)."""
        decay = 1.0 - float(self.ct_ratio)
        if self.config.ratio_k > 0:
            decay = decay * (1.0 + self.config.ratio_k * torch.sigmoid(-self.config.ratio_b * t))
        return (t * (1.0 - decay)).clamp_min(0.0)

    @torch.no_grad()
    def teacher_step(self, x_t: torch.Tensor, t: torch.Tensor, r: torch.Tensor,
                     condition: torch.Tensor | None) -> torch.Tensor:
        """One Euler or Heun step of the teacher's ODE from ``t`` to ``r`` (Heun's correction only where r > 0)."""
        dt = expand_like(r - t, x_t)
        d_cur = teacher_velocity(self, x_t, t, condition)
        x_euler = x_t + dt * d_cur
        if self.config.cd_solver == "euler":
            return x_euler
        positive = r > 0
        d_next = teacher_velocity(self, x_euler, torch.where(positive, r, t), condition)
        x_heun = x_t + dt * 0.5 * (d_cur + d_next)
        return torch.where(batch_mask(positive, x_t), x_heun, x_euler)

    def earlier_state(self, x0: torch.Tensor, eps: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                      r: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        """``x_r``: the same noise at ``r`` (CT) or the teacher's ODE step (CD)."""
        if self.config.mode == "ct":
            return self.noise_scheduler.add_noise(x0, eps, r)
        return self.teacher_step(x_t, t, r, condition)

    def target_function(self) -> Any:
        """The consistency function the targets come from: the online network (TCM truncates it)."""
        return self.net

    @torch.no_grad()
    def consistency_target(self, x_r: torch.Tensor, r: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        """``sg(f(x_r, r))`` from the online network, and ``x_r`` where ``r = 0`` (the boundary condition).

        The network runs on the whole batch even when no ``r`` is positive (rare): asking first would make the host
        wait for the device every step, and a step whose work depends on tensor values cannot be traced on fake
        tensors (``fastgen dryrun``'s training peak)."""
        positive = r > 0
        r_safe = torch.where(positive, r, torch.ones_like(r))  # never evaluate the network at t = 0
        f_r = self.target_function()(x_r, r_safe, condition=condition, fwd_pred_type="x0")
        return torch.where(batch_mask(positive, x_r), torch.nan_to_num(f_r), x_r)

    def weight(self, t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        if self.config.weighting == "uniform":
            return torch.ones_like(t, dtype=torch.float32)
        return 1.0 / (t - r).float().clamp_min(1e-8)

    def sample_batch_times(self, batch: int, device: torch.device) -> torch.Tensor:
        low, high = self.train_time_range()
        return self.time_dist.sample(batch, device, low=low, high=high, generator=self.rng).to(self.precision)

    # ---- the step -----------------------------------------------------------------------------------------------
    def consistency_terms(self, x0: torch.Tensor, condition: torch.Tensor | None, t: torch.Tensor,
                          replace_target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_t, r, pred, distance)`` of the consistency loss at times ``t``: noise ``x0`` to ``x_t``, take the
        earlier state ``x_r`` (teacher step or shared noise), its target ``f(x_r, r)`` without gradients, which
        ``replace_target(target, x_t)`` may overwrite (TCM's stage-1 boundary targets), and the student's
        ``pred = f(x_t, t)``; ``distance = d(pred - target)`` per sample."""
        r = self.r_of(t)
        eps = self.rng.randn_like(x0)
        x_t = self.noise_scheduler.add_noise(x0, eps, t)
        with torch.no_grad():
            x_r = self.earlier_state(x0, eps, x_t, t, r, condition)
            target = self.consistency_target(x_r, r, condition)
            if replace_target is not None:
                target = replace_target(target, x_t)
        pred = self.net(x_t, t, condition=condition, fwd_pred_type="x0")
        distance = consistency_distance(pred - target, self.config.distance, self.config.huber_c)
        return x_t, r, pred, distance

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = data["real"].to(self.precision)
        condition = self.condition_of(data)
        t = self.sample_batch_times(x0.shape[0], x0.device)
        x_t, r, pred, distance = self.consistency_terms(x0, condition, t)
        loss = (self.weight(t, r) * distance).mean()
        loss_dict = {"total_loss": loss, **as_tensor_dict(
            {"cm_loss": loss, "unweighted_cm_loss": distance.mean(), "ct_ratio": self.ct_ratio}, loss)}
        return loss_dict, {"x_t": x_t, "pred": pred.detach(), "t": t, "r": r}
