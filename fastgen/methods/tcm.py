"""TCM: truncated consistency models (Lee et al. 2025, "Truncated Consistency Models").

A consistency model spends capacity on the denoising task near ``t = 0`` that one-step generation never uses.
TCM trains in two stages (Sec. 4):

* **stage 1** (``tcm_stage=1``): a standard consistency model over the whole range ``[0, T]`` - exactly
  ``fastgen.methods.cm`` (CT or CD, ECT's ratio schedule and weighting);
* **stage 2** (``tcm_stage=2``): a new network trained only for ``t in [t', T]``, whose consistency function is
  the *truncated* one (Sec. 4.1, Eq. 8)::

      f_trunc(x, t) = f_theta(x, t)   for t >= t'
                      f_1(x, t)       for t <  t'   (the frozen stage-1 model, ``stage1_net``)

  The consistency loss ``w(t, r) d(f_theta(x_t, t), sg f_trunc(x_r, r))`` with ``t`` from the training-time
  proposal truncated to ``[t', T]`` (inverse-CDF sampling) thus takes its target from the stage-1 model whenever
  ``r < t'``, and a ``boundary_prob`` share of each batch is trained at ``t = t'`` on the boundary loss
  ``boundary_weight * d(f_theta(x_t', t'), sg f_1(x_t', t'))`` (the boundary condition at ``t'``, Sec. 4.2), so
  that the stage-2 model stays anchored to a well-trained denoiser instead of to the data.

The stage-2 network and its EMA start from the stage-1 weights (``stage1_ckpt``; the frozen copy is stored in the
stage-2 checkpoints, so a stage-2 run directory is self-contained). Sampling uses ``f_trunc``: one step is
``f_theta(x_T, T)``; multistep samplers over ``t_list`` switch to the stage-1 model below ``t'``.

Logged keys (``loss_dict``): those of ``fastgen.methods.cm`` (``total_loss``, ``cm_loss``, ``unweighted_cm_loss``,
``ct_ratio``) and, in stage 2, ``boundary_loss`` (mean over the boundary samples; 0 when a batch has none) and
``boundary_fraction``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.checkpoint.weights import load_network_state, load_weights
from fastgen.configs.instantiate import instantiate
from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.cm import CMModel
from fastgen.methods.cm_utils import as_tensor_dict, batch_mask
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class TruncatedConsistencyFunction:
    """``f_trunc``: ``net`` at times ``>= t_prime``, the frozen stage-1 network below (called like a network)."""

    def __init__(self, net: nn.Module, stage1: nn.Module, t_prime: float) -> None:
        self.net, self.stage1, self.t_prime = net, stage1, float(t_prime)

    def __call__(self, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None = None,
                 **kwargs: Any) -> torch.Tensor:
        upper = t >= self.t_prime
        if bool(upper.all()):
            return self.net(x, t, condition=condition, **kwargs)
        if not bool(upper.any()):
            return self.stage1(x, t, condition=condition, **kwargs)
        return torch.where(batch_mask(upper, x), self.net(x, t, condition=condition, **kwargs),
                           self.stage1(x, t, condition=condition, **kwargs))


class TCMModel(CMModel):
    student_sampler = "truncated"

    frozen_modules: tuple[str, ...] = ("teacher", "stage1_net")

    def __init__(self, config: Any) -> None:
        if config.tcm_stage not in (1, 2):
            raise ValueError(f"model.tcm_stage must be 1 or 2, got {config.tcm_stage}")
        if not 0.0 <= config.boundary_prob < 1.0:
            raise ValueError(f"model.boundary_prob must be in [0, 1), got {config.boundary_prob}")
        super().__init__(config)
        self.stage1_net: nn.Module | None = None
        if config.tcm_stage == 2:
            if not self.noise_scheduler.t_min <= config.t_prime < self.noise_scheduler.t_max:
                raise ConfigError(f"model.t_prime={config.t_prime} must lie in the schedule's range "
                                  f"[{self.noise_scheduler.t_min}, {self.noise_scheduler.t_max})")
            self.stage1_net = instantiate(config.net).to(self.precision).requires_grad_(False).eval()

    @property
    def stage2(self) -> bool:
        return self.stage1_net is not None

    @property
    def model_dict(self) -> dict[str, nn.Module]:
        modules = super().model_dict
        if self.stage1_net is not None:
            modules["stage1_net"] = self.stage1_net
        return modules

    def frozen_source(self, name: str) -> str:
        return f"model.stage1_ckpt={self.config.stage1_ckpt}" if name == "stage1_net" else super().frozen_source(name)

    @torch.no_grad()
    def init_frozen_weights(self) -> None:
        """Stage 2: the frozen boundary model from the stage-1 checkpoint (on every start, fresh or resumed)."""
        super().init_frozen_weights()
        if self.stage1_net is None:
            return
        path = self.config.stage1_ckpt
        if not path:
            raise ConfigError("model.tcm_stage=2 needs model.stage1_ckpt (a checkpoint of the stage-1 run)")
        load_weights(self.stage1_net, load_network_state(path, self.config.stage1_ckpt_key), path, "model.net",
                     what="stage-1 weights")

    @torch.no_grad()
    def init_weights(self) -> None:
        """Stage 2: the frozen boundary model and the trained network both start from the stage-1 checkpoint: the
        boundary model is loaded first (``init_frozen_weights``) and the trained network copies it, one read."""
        super().init_weights()
        if self.stage1_net is None:
            return
        path = self.config.stage1_ckpt
        load_weights(self.net, self.stage1_net.state_dict(), path, "model.net", what="stage-1 weights")
        self.sync_ema_to_net()
        logger.info("TCM stage 2: boundary model and initial weights from %s (t' = %g)", path, self.config.t_prime)

    def truncated(self, net: nn.Module) -> Any:
        """``net`` with the stage-1 model below ``t'`` (stage 2), else ``net`` itself."""
        if self.stage1_net is None or net is self.stage1_net:
            return net
        return TruncatedConsistencyFunction(net, self.stage1_net, self.config.t_prime)

    # ---- stage-2 overrides of the consistency model ----------------------------------------------------------
    def train_time_range(self) -> tuple[float, float]:
        low, high = super().train_time_range()
        return (max(low, float(self.config.t_prime)), high) if self.stage2 else (low, high)

    def target_function(self) -> Any:
        return self.truncated(self.net)

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if not self.stage2:
            return super().single_train_step(data, iteration)
        assert self.stage1_net is not None
        x0 = data["real"].to(self.precision)
        condition = self.condition_of(data)
        batch = x0.shape[0]
        boundary = self.rng.rand(batch, device=x0.device) < self.config.boundary_prob
        t = self.sample_batch_times(batch, x0.device)
        t = torch.where(boundary, torch.full_like(t, self.config.t_prime), t)
        stage1_net = self.stage1_net

        def boundary_targets(target: torch.Tensor, x_t: torch.Tensor) -> torch.Tensor:
            """At ``t'`` the target is the frozen stage-1 model's own output (TCM's boundary condition)."""
            at_boundary = stage1_net(x_t, t, condition=condition, fwd_pred_type="x0")
            return torch.where(batch_mask(boundary, x_t), at_boundary, target)

        x_t, r, pred, distance = self.consistency_terms(x0, condition, t, replace_target=boundary_targets)
        weight = torch.where(boundary, torch.full_like(distance, self.config.boundary_weight), self.weight(t, r))
        loss = (weight * distance).mean()
        inner = ~boundary
        count_b, count_c = boundary.sum().clamp_min(1), inner.sum().clamp_min(1)
        stats = {
            "cm_loss": (weight * distance * inner).sum() / count_c,
            "unweighted_cm_loss": (distance * inner).sum() / count_c,
            "boundary_loss": (distance * boundary).sum() / count_b,
            "boundary_fraction": boundary.float().mean(),
            "ct_ratio": self.ct_ratio,
        }
        loss_dict = {"total_loss": loss, **as_tensor_dict(stats, loss)}
        return loss_dict, {"x_t": x_t, "pred": pred.detach(), "t": t, "r": r}

    # ---- sampling ------------------------------------------------------------------------------------------------
    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        return super().generate(self.truncated(net), noise, condition, times, generator)


__all__ = ["TCMModel", "TruncatedConsistencyFunction"]
