"""Pieces shared by the consistency-family methods (CM, sCM, TCM, MeanFlow) and KD.

* ``map_state(src, dst, x, t)`` - the same noisy sample in another schedule's coordinates. Every schedule here is
  an interpolant ``x_t = alpha(t) x0 + sigma(t) eps``; two of them describe the same ``(x0, eps)`` mixture when
  their noise-to-signal ratios ``rho = sigma / alpha`` agree (Kingma et al. 2021, Sec. 3: a diffusion model is
  determined by its SNR up to a rescaling of ``x``). So ``t_dst = rho_dst^-1(rho_src(t))`` and
  ``x_dst = alpha_dst(t_dst) / alpha_src(t) * x``. This lets a teacher trained with one schedule guide a student
  with another (and sCM run in TrigFlow time on EDM or rectified-flow networks).
* ``TimeDistribution`` - training-time proposals (log-normal, logit-normal, tan-log-normal), truncated to an
  interval by inverse-CDF sampling (TCM trains on ``[t', T]`` only).
* ``consistency_distance`` - squared L2 or pseudo-Huber ``sqrt(||d||^2 + c^2) - c`` (Song & Dhariwal 2023,
  "Improved techniques for training consistency models", Sec. 3.3, with ``c = 0.00054 sqrt(D)``).
* ``Tangents`` - Jacobian-vector products ``d/de fn(p + e v)|_{e=0}``: forward-mode AD (``torch.func.jvp``), or a
  central finite difference ``(fn(p + h v) - fn(p - h v)) / 2h`` (error ``O(h^2)``) when asked, or automatically
  when the network's ops have no forward-AD formula.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource, rand, randn
from fastgen.networks.noise_schedules import (
    EDMNoiseScheduler,
    NoiseScheduler,
    RectifiedFlowScheduler,
    TrigFlowScheduler,
    expand_like,
)
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

RHO_MAX = 1e4  # noise-to-signal ratios are capped here (RF at t = 1 and TrigFlow at pi/2 have rho = inf)


# ---- schedules ----------------------------------------------------------------------------------------------
def same_schedule(a: NoiseScheduler, b: NoiseScheduler) -> bool:
    return a is b or (type(a) is type(b) and vars(a) == vars(b))


def noise_to_signal(scheduler: NoiseScheduler, t: torch.Tensor) -> torch.Tensor:
    """``rho(t) = sigma(t) / alpha(t)``, capped at ``RHO_MAX``."""
    alpha = scheduler.alpha(t)
    rho = scheduler.sigma(t) / alpha.clamp_min(1.0 / RHO_MAX)
    return rho.clamp(0.0, RHO_MAX)


def time_of_noise_to_signal(scheduler: NoiseScheduler, rho: torch.Tensor) -> torch.Tensor:
    """The inverse of ``noise_to_signal`` for the schedules of ``fastgen.networks.noise_schedules``."""
    if isinstance(scheduler, EDMNoiseScheduler):
        return rho  # alpha = 1, sigma = t
    if isinstance(scheduler, RectifiedFlowScheduler):
        return rho / (1.0 + rho)  # sigma / alpha = t / (1 - t)
    if isinstance(scheduler, TrigFlowScheduler):
        return torch.atan(rho / scheduler.sigma_data)  # sigma / alpha = sigma_d tan t
    raise ConfigError(f"no inverse noise-to-signal map for {type(scheduler).__name__}: use an EDM, rectified-flow "
                      "or TrigFlow schedule (or the same schedule for teacher and student)")


def map_state(src: NoiseScheduler, dst: NoiseScheduler, x: torch.Tensor,
              t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x', t')`` with the same ``(x0, eps)`` under ``dst`` as ``(x, t)`` under ``src`` (equal SNR)."""
    if same_schedule(src, dst):
        return x, t
    t_dst = time_of_noise_to_signal(dst, noise_to_signal(src, t)).to(t.dtype)
    scale = dst.alpha(t_dst) / src.alpha(t).clamp_min(1.0 / RHO_MAX)
    return x * expand_like(scale, x), t_dst


def x0_at(net: nn.Module, scheduler: NoiseScheduler, x: torch.Tensor, t: torch.Tensor,
          condition: torch.Tensor | None, call: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """``net``'s ``x0`` estimate for the state ``(x, t)`` given in ``scheduler``'s coordinates (``x0`` does not
    depend on the coordinates). ``call(x, t, condition)`` replaces the plain network call (e.g. guided)."""
    x_net, t_net = map_state(scheduler, net.noise_scheduler, x, t)
    if call is not None:
        return call(x_net, t_net, condition)
    return net(x_net, t_net, condition=condition, fwd_pred_type="x0")


def teacher_velocity(model: Any, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
    """A distillation method's teacher PF-ODE velocity ``dx/dt`` in the *student's* coordinates
    (``model.noise_scheduler``), from the teacher's (guided, ``model.teacher_x0``) ``x0`` estimate."""
    x0 = x0_at(model.teacher, model.noise_scheduler, x, t, condition, call=model.teacher_x0)
    return model.noise_scheduler.convert(x0, x, t, "x0", "flow")


def backbone_uses_r(net: nn.Module) -> bool | None:
    """Whether the backbone embeds the second time input ``r`` (None: cannot tell for this backbone)."""
    backbone = getattr(net, "backbone", net)
    embed = getattr(backbone, "embed", None)
    if embed is not None and hasattr(embed, "r_fourier"):
        return embed.r_fourier is not None
    if hasattr(backbone, "emb_r_fourier"):
        return backbone.emb_r_fourier is not None
    return None


# ---- training times -----------------------------------------------------------------------------------------
TimeKind = Literal["lognormal", "logit_normal", "tan_lognormal"]


@dataclass
class TimeDistribution:
    """``t = T(mean + std n)``, ``n ~ N(0, 1)``, with ``T`` = ``exp`` (EDM's log-normal, Karras et al. 2022,
    Table 1), ``scale * sigmoid`` (logit-normal, Esser et al. 2024, Eq. 19) or ``arctan(exp(.) / sigma_data)``
    (sCM's tan-log-normal, Lu & Song 2024, Sec. 4.1). ``sample(n, low, high)`` draws from the distribution
    truncated to ``[low, high]`` by inverting the CDF on ``u ~ U(F(low), F(high))``."""

    kind: TimeKind
    mean: float
    std: float
    scale: float = 1.0  # logit-normal: t_max
    sigma_data: float = 0.5  # tan-log-normal

    def _to_normal(self, t: float) -> float:
        """``(T^-1(t) - mean) / std`` (+-inf at the ends of the support)."""
        if self.kind == "lognormal":
            arg = math.log(t) if t > 0 else -math.inf
        elif self.kind == "logit_normal":
            p = t / self.scale
            arg = -math.inf if p <= 0 else (math.inf if p >= 1 else math.log(p / (1 - p)))
        else:
            arg = math.log(math.tan(t) * self.sigma_data) if 0 < t < math.pi / 2 else (-math.inf if t <= 0 else math.inf)
        return (arg - self.mean) / self.std

    def _from_normal(self, z: torch.Tensor) -> torch.Tensor:
        a = z * self.std + self.mean
        if self.kind == "lognormal":
            return a.exp()
        if self.kind == "logit_normal":
            return torch.sigmoid(a) * self.scale
        return torch.atan(a.exp() / self.sigma_data)

    def sample(self, n: int, device: torch.device | str = "cpu", low: float | None = None,
               high: float | None = None, generator: RandomSource = None) -> torch.Tensor:
        """``n`` times from ``generator`` (a training step's keyed stream; None: torch's global generator)."""
        if low is None and high is None:
            return self._from_normal(randn(n, device=device, generator=generator))
        cdf = lambda t: 0.5 * (1.0 + math.erf(self._to_normal(t) / math.sqrt(2.0)))  # noqa: E731
        u_lo = cdf(low) if low is not None else 0.0
        u_hi = cdf(high) if high is not None else 1.0
        u = u_lo + (u_hi - u_lo) * rand(n, device=device, dtype=torch.float64, generator=generator)
        z = torch.special.ndtri(u.clamp(1e-12, 1 - 1e-12)).float()
        t = self._from_normal(z)
        if low is not None or high is not None:
            t = t.clamp(low if low is not None else -math.inf, high if high is not None else math.inf)
        return t


def time_distribution(scheduler: NoiseScheduler, kind: str | None = None, mean: float | None = None,
                      std: float | None = None) -> TimeDistribution:
    """The proposal a method trains with: ``kind``/``mean``/``std`` when given, else the schedule's own."""
    if isinstance(scheduler, EDMNoiseScheduler):
        default: TimeDistribution = TimeDistribution("lognormal", scheduler.P_mean, scheduler.P_std)
    elif isinstance(scheduler, RectifiedFlowScheduler):
        default = TimeDistribution("logit_normal", scheduler.logit_mean, scheduler.logit_std, scale=scheduler.t_max)
    elif isinstance(scheduler, TrigFlowScheduler):
        default = TimeDistribution("tan_lognormal", scheduler.P_mean, scheduler.P_std, sigma_data=scheduler.sigma_data)
    elif kind is None or mean is None or std is None:
        raise ConfigError(f"set the method's t_dist, t_mean and t_std for the schedule {type(scheduler).__name__}")
    else:
        default = TimeDistribution(kind, mean, std)  # type: ignore[arg-type]
    return TimeDistribution(
        kind=kind or default.kind,  # type: ignore[arg-type]
        mean=default.mean if mean is None else float(mean),
        std=default.std if std is None else float(std),
        scale=float(scheduler.t_max) if (kind or default.kind) == "logit_normal" else default.scale,
        sigma_data=float(getattr(scheduler, "sigma_data", default.sigma_data)),
    )


# ---- distances ----------------------------------------------------------------------------------------------
def consistency_distance(delta: torch.Tensor, kind: str = "pseudo_huber", c: float | None = None) -> torch.Tensor:
    """Per-sample distance of a difference ``delta (B, ...)``: ``l2`` = mean of squares over the sample's ``D``
    elements; ``pseudo_huber`` = ``sqrt(||delta||^2 + c^2) - c`` with ``c = 0.00054 sqrt(D)`` by default
    (iCT, Song & Dhariwal 2023, Sec. 3.3)."""
    flat = delta.float().flatten(1)
    if kind == "l2":
        return flat.square().mean(dim=1)
    if kind == "pseudo_huber":
        c = 0.00054 * math.sqrt(flat.shape[1]) if c is None else float(c)
        return (flat.square().sum(dim=1) + c * c).sqrt() - c
    raise ValueError(f"unknown distance {kind!r}; use l2 or pseudo_huber")


# ---- tangents -----------------------------------------------------------------------------------------------
JVPMode = Literal["auto", "forward_ad", "finite_difference"]


class Tangents:
    """``jvp(fn, primals, tangents)`` -> the directional derivative of ``fn`` at ``primals`` along ``tangents``,
    without gradients (consistency targets are stop-gradient).

    ``mode``: ``forward_ad`` (``torch.func.jvp``: exact, one forward pass with dual numbers), ``finite_difference``
    (two extra forward passes, step ``fd_step`` along the tangent), or ``auto`` - forward AD until it raises
    (an op without a forward-mode formula, an ``autograd.Function`` without ``jvp``), then finite differences for
    the rest of the run, with one warning. A genuine error (bad shapes) is raised again by the fallback itself.
    """

    def __init__(self, mode: JVPMode = "auto", fd_step: float = 1e-3) -> None:
        if mode not in ("auto", "forward_ad", "finite_difference"):
            raise ValueError(f"unknown jvp mode {mode!r}; use auto, forward_ad or finite_difference")
        if fd_step <= 0:
            raise ValueError(f"fd_step must be positive, got {fd_step}")
        self.mode: str = mode
        self.fd_step = float(fd_step)

    @torch.no_grad()
    def __call__(self, fn: Callable[..., torch.Tensor], primals: tuple[torch.Tensor, ...],
                 tangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.mode != "finite_difference":
            try:
                with warnings.catch_warnings():  # torch's first forward-AD call scripts its decompositions
                    warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=DeprecationWarning)
                    return torch.func.jvp(fn, primals, tangents)[1]
            except (RuntimeError, NotImplementedError) as exc:
                if self.mode == "forward_ad":
                    raise
                logger.warning("forward-mode AD failed (%s); using finite differences for the JVP from now on",
                               str(exc).strip().splitlines()[0][:200])
                self.mode = "finite_difference"
        return self.finite_difference(fn, primals, tangents)

    def finite_difference(self, fn: Callable[..., torch.Tensor], primals: tuple[torch.Tensor, ...],
                          tangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
        h = self.fd_step
        plus = fn(*[p + h * v for p, v in zip(primals, tangents)])
        minus = fn(*[p - h * v for p, v in zip(primals, tangents)])
        return (plus - minus) / (2.0 * h)


def batch_mask(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A boolean ``(B,)`` mask shaped to broadcast against ``x (B, ...)`` (``expand_like`` casts to x's dtype)."""
    return mask.reshape(mask.shape[0], *([1] * (x.dim() - 1)))


def as_tensor_dict(values: dict[str, Any], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Scalars for ``loss_dict`` as detached 0-d tensors on ``like``'s device."""
    return {k: (v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), device=like.device))
            for k, v in values.items()}


__all__ = [
    "Tangents",
    "TimeDistribution",
    "as_tensor_dict",
    "backbone_uses_r",
    "batch_mask",
    "consistency_distance",
    "map_state",
    "noise_to_signal",
    "same_schedule",
    "teacher_velocity",
    "time_distribution",
    "time_of_noise_to_signal",
    "x0_at",
]
