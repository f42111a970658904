"""sCM: continuous-time consistency models in TrigFlow - sCT and sCD (Lu & Song 2024, "Simplifying,
stabilizing and scaling continuous-time consistency models").

**TrigFlow** (Sec. 2): ``x_t = cos(t) x0 + sin(t) z``, ``z ~ N(0, sigma_d^2 I)``, ``t in [0, pi/2]``, with the
consistency function ``f(x_t, t) = cos(t) x_t - sin(t) sigma_d F(x_t, t)`` (Eq. 6). The student ``net`` may use any
schedule of ``fastgen.networks.noise_schedules``: a TrigFlow state is mapped to the network's coordinates by equal
noise-to-signal ratio (``cm_utils.map_state``; for EDM ``sigma = sigma_d tan t``, ``x = x_t / cos t``), the network's
``x0`` estimate there *is* ``f``, and ``sigma_d F = (cos(t) x_t - f) / sin(t)`` (for a native
``TrigFlowScheduler`` network, its ``flow`` prediction directly). An EDM-preconditioned network is exactly a
TrigFlow network with ``c_noise = ln(sigma_d tan t) / 4`` (see ``TrigFlowScheduler``), so EDM teachers and students
need no conversion of weights.

**Loss** (Sec. 4, Algorithm 1). With ``dx_t/dt`` from the teacher (sCD: ``(cos(t) x_t - D_teacher) / sin(t)``,
classifier-free guided when ``guidance_scale`` is set) or from the data (sCT: ``cos(t) z - sin(t) x0``), and the
tangent of the student along the ODE from forward-mode AD,
``cos(t) sin(t) dF/dt = jvp(F, (x_t, t), (cos(t) sin(t) dx_t/dt, cos(t) sin(t)))`` (``torch.func.jvp``; central
finite differences with ``jvp="finite_difference"``, or automatically when the network's ops lack forward-AD
formulas), the target direction is

    g = -cos^2(t) (sigma_d F^- - dx_t/dt) - r cos(t) sin(t) (x_t + sigma_d dF^-/dt)       (Eq. 8, with warm-up)

where ``F^-`` is the stop-gradient student and ``r = min(1, iteration / tangent_warmup_iters)`` the tangent
warm-up (Sec. 4.2; ``r = 1`` when the warm-up is 0). Tangent normalisation ``g <- g / (||g|| + c)`` with the RMS
norm over the sample (Sec. 4.2, ``c = 0.1``). The loss is ``||F - F^- - g||^2 / D``, with adaptive weighting
(Sec. 4.3, Eq. 9) ``e^{-w(t)} ||F - F^- - g||^2 / D + w(t)`` when ``adaptive_weighting`` is on, ``w`` a small
network of the time (module ``logvar``, its own optimizer ``logvar_optimizer``). Its gradient w.r.t. the student
is ``-2 g^T grad F``, the continuous-time consistency gradient of Eq. 7.

Training times: ``sigma_d tan t`` log-normal with ``P_mean``, ``P_std`` (Sec. 4.1), truncated to
``[sigma_min, sigma_max]`` and to the network's own range (a rectified-flow network's ``t = 1`` is ``sigma = inf``:
training reaches ``t = sigma_max / (1 + sigma_max)``, so raise ``sigma_max`` for such students). Sampling (``generator_fn``): ``f(x_T, T)`` in one step,
or the multistep consistency sampler over ``t_list`` in the network's time (``DistillationModel.generate``).

Logged keys (``loss_dict``): ``total_loss``, ``scm_loss`` (mean unweighted ``||F - F^- - g||^2 / D``),
``tangent_warmup`` (``r``), ``tangent_norm`` (mean RMS of ``g`` before normalisation) and, with adaptive weighting,
``logvar`` (mean ``w(t)``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from fastgen.methods.cm_utils import (
    Tangents,
    TimeDistribution,
    as_tensor_dict,
    noise_to_signal,
    x0_at,
)
from fastgen.methods.distill import DistillationModel
from fastgen.networks.layers import FourierEmbedding
from fastgen.networks.noise_schedules import TrigFlowScheduler, expand_like
from fastgen.utils.errors import ConfigError


class LogVarHead(nn.Module):
    """``w(t)`` of the adaptive weighting: Fourier features of ``ln(sigma_d tan t) / 4`` -> linear -> scalar,
    starting at 0 (weight 1)."""

    def __init__(self, sigma_data: float, dim: int = 64) -> None:
        super().__init__()
        self.sigma_data = float(sigma_data)
        self.fourier = FourierEmbedding(dim, scale=1.0)
        self.linear = nn.Linear(dim, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        c = (self.sigma_data * torch.tan(t.float())).clamp_min(1e-8).log() / 4
        return self.linear(self.fourier(c)).squeeze(1)


class SCMModel(DistillationModel):
    def __init__(self, config: Any) -> None:
        if config.mode not in ("ct", "cd"):
            raise ConfigError(f"model.mode must be ct or cd, got {config.mode!r}")
        if config.tangent_warmup_iters < 0:
            raise ConfigError("model.tangent_warmup_iters must be >= 0")
        super().__init__(config)
        sigma_data = config.sigma_data or getattr(self.noise_scheduler, "sigma_data", 0.5)
        self.sigma_data = float(sigma_data)
        self.trig = TrigFlowScheduler(sigma_data=self.sigma_data, sigma_min=config.sigma_min,
                                      sigma_max=config.sigma_max)
        self.time_dist = TimeDistribution("tan_lognormal", config.P_mean, config.P_std, sigma_data=self.sigma_data)
        self.tangents = Tangents(config.jvp, config.fd_step)
        self.logvar: nn.Module | None = LogVarHead(self.sigma_data) if config.adaptive_weighting else None
        self._time_range = self._compute_time_range()

    def uses_teacher(self) -> bool:
        return self.config.mode == "cd"

    @property
    def model_dict(self) -> dict[str, nn.Module]:
        modules = super().model_dict
        if self.logvar is not None:
            modules["logvar"] = self.logvar
        return modules

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        modules: dict[str, nn.Module] = {"net": self.net}
        if self.logvar is not None:
            modules["logvar"] = self.logvar
        return modules

    # ---- TrigFlow ---------------------------------------------------------------------------------------------
    def time_range(self) -> tuple[float, float]:
        """TrigFlow times whose noise-to-signal ratio lies in ``[sigma_min, sigma_max]`` and the net's range:
        constants of the config and the schedule, computed once on the host at construction (so a step never
        reads a tensor's value, and can be traced on fake tensors)."""
        return self._time_range

    def _compute_time_range(self) -> tuple[float, float]:
        scheduler = self.noise_scheduler
        range_ = torch.tensor([scheduler.t_min, scheduler.t_max], dtype=torch.float64, device="cpu")
        ends = noise_to_signal(scheduler, range_)
        low = max(self.config.sigma_min, float(ends[0]))
        high = min(self.config.sigma_max, float(ends[1]))
        return math.atan(low / self.sigma_data), math.atan(high / self.sigma_data)

    def native_trigflow(self, net: nn.Module) -> bool:
        scheduler = net.noise_scheduler
        return isinstance(scheduler, TrigFlowScheduler) and scheduler.sigma_data == self.sigma_data

    def velocity(self, net: nn.Module, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        """``sigma_d F(x_t, t)`` of ``net`` in TrigFlow coordinates (differentiable in ``x``, ``t``)."""
        if self.native_trigflow(net):
            return net(x, t, condition=condition, fwd_pred_type="flow")
        x0 = x0_at(net, self.trig, x, t, condition)
        return (expand_like(torch.cos(t), x) * x - x0) / expand_like(torch.sin(t), x)

    @torch.no_grad()
    def teacher_velocity(self, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        """The teacher's ``dx_t/dt`` in TrigFlow (``(cos(t) x_t - D) / sin(t)``, guided when configured)."""
        assert self.teacher is not None
        x0 = x0_at(self.teacher, self.trig, x, t, condition, call=self.teacher_x0)
        return (expand_like(torch.cos(t), x) * x - x0) / expand_like(torch.sin(t), x)

    def warmup(self, iteration: int) -> float:
        """The tangent warm-up coefficient ``r`` (1 without warm-up)."""
        steps = int(self.config.tangent_warmup_iters)
        return 1.0 if steps <= 0 else min(1.0, iteration / steps)

    # ---- the step ---------------------------------------------------------------------------------------------
    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x0 = data["real"].to(self.precision)
        condition = self.condition_of(data)
        low, high = self.time_range()
        t = self.time_dist.sample(x0.shape[0], x0.device, low=low, high=high, generator=self.rng).to(self.precision)
        z = self.rng.randn_like(x0) * self.sigma_data
        cos_t, sin_t = expand_like(torch.cos(t), x0), expand_like(torch.sin(t), x0)
        x_t = cos_t * x0 + sin_t * z
        if self.config.mode == "ct":
            dxt_dt = cos_t * z - sin_t * x0
        else:
            dxt_dt = self.teacher_velocity(x_t, t, condition)
        v = self.velocity(self.net, x_t, t, condition)
        cs = torch.cos(t) * torch.sin(t)
        jvp = self.tangents(lambda x_, t_: self.velocity(self.net, x_, t_, condition), (x_t, t),
                            (expand_like(cs, x0) * dxt_dt, cs))
        r = self.warmup(iteration)
        v_minus = v.detach()
        g = -(cos_t**2) * (v_minus - dxt_dt) - r * (expand_like(cs, x0) * x_t + jvp)
        g_norm = g.float().flatten(1).square().mean(dim=1).sqrt()  # RMS: invariant to the data size
        if self.config.tangent_norm_c is not None:
            g = g / expand_like(g_norm + self.config.tangent_norm_c, g).to(g.dtype)
        f_diff = (v - v_minus) / self.sigma_data
        per_sample = (f_diff - g).float().flatten(1).square().mean(dim=1)
        stats: dict[str, Any] = {"scm_loss": per_sample.mean(), "tangent_warmup": r, "tangent_norm": g_norm.mean()}
        if self.logvar is not None:
            logvar = self.logvar(t)
            loss = (torch.exp(-logvar) * per_sample + logvar).mean()
            stats["logvar"] = logvar.mean()
        else:
            loss = per_sample.mean()
        loss_dict = {"total_loss": loss, **as_tensor_dict(stats, loss)}
        return loss_dict, {"x_t": x_t, "t": t, "velocity": v.detach(), "g": g.detach()}
