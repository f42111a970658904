"""EMACallback: exponential moving averages of the trained network.

After every optimizer step, ``ema <- beta * ema + (1 - beta) * net`` for every parameter (buffers are copied),
done for all tensors at once with a fused ``torch._foreach_lerp_`` (``lerp(ema, net, 1 - beta)`` is the same
update), not a Python loop per parameter. ``beta`` follows one of three schedules:

* ``constant`` - ``beta`` as given.
* ``power`` - EDM2's power-function EMA: ``beta_t = (1 - 1/t)^(gamma + 1)`` at update ``t`` (Karras et al. 2024,
  "Analyzing and Improving the Training Dynamics of Diffusion Models", Eq. 3); ``gamma = 6.94`` gives a
  relative width ``sigma_rel ~ 0.05``.
* ``halflife`` - EDM's schedule: ``beta = 0.5^(B / max(h, 1e-8))`` with ``B`` the *global* batch size and half-life
  ``h = halflife_kimg * 1000`` images, ramped up as ``h = min(h, n_img * rampup_ratio)`` where ``n_img`` is
  the number of images seen (Karras et al. 2022, training loop; Appendix F.1).

Before ``start_iter`` the EMA copies the network (``beta = 0``). Several EMAs can run at once, each a
callback with its own ``ema_name`` matching a name in ``model.use_ema``. Logged keys: ``ema/<name>_beta``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from fastgen.callbacks.callback import Callback


def ema_beta(kind: str, iteration: int, *, beta: float = 0.999, gamma: float = 6.94, halflife_kimg: float = 500.0,
             rampup_ratio: float | None = 0.05, batch_size: int = 1) -> float:
    """The decay ``beta`` after ``iteration`` completed optimizer steps (see the module docstring)."""
    if kind == "constant":
        return float(beta)
    if kind == "power":
        t = max(iteration, 1)
        return (1.0 - 1.0 / t) ** (gamma + 1.0)
    if kind == "halflife":
        halflife_nimg = halflife_kimg * 1000.0
        if rampup_ratio is not None:
            halflife_nimg = min(halflife_nimg, iteration * batch_size * rampup_ratio)
        return 0.5 ** (batch_size / max(halflife_nimg, 1e-8))
    raise ValueError(f"unknown EMA type {kind!r}; use 'constant', 'power' or 'halflife'")


class EMACallback(Callback):
    def __init__(self, ema_name: str = "ema", type: Literal["constant", "power", "halflife"] = "constant",  # noqa: A002
                 beta: float = 0.999, gamma: float = 6.94, halflife_kimg: float = 500.0,
                 rampup_ratio: float | None = 0.05, start_iter: int = 0) -> None:
        ema_beta(type, 1, beta=beta, gamma=gamma, halflife_kimg=halflife_kimg, rampup_ratio=rampup_ratio)
        self.ema_name = ema_name
        self.kind = type
        self.beta, self.gamma = beta, gamma
        self.halflife_kimg, self.rampup_ratio = halflife_kimg, rampup_ratio
        self.start_iter = start_iter
        self.last_beta = 0.0
        self._pairs: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None

    def on_model_init_end(self, model: Any) -> None:
        if self.ema_name not in model.ema_nets:
            raise ValueError(
                f"EMACallback(ema_name={self.ema_name!r}) has no EMA network: set model.use_ema to include "
                f"{self.ema_name!r} (it has {list(model.ema_nets) or 'none'})"
            )

    def _tensors(self, model: Any) -> tuple[list[torch.Tensor], ...]:
        if self._pairs is None:
            ema = model.ema_nets[self.ema_name]
            src_p = [p.detach() for p in model.net.parameters()]
            dst_p = [p.detach() for p in ema.parameters()]
            src_b = [b for b in model.net.buffers()]
            dst_b = [b for b in ema.buffers()]
            self._pairs = (dst_p, src_p, dst_b, src_b)
        return self._pairs

    @torch.no_grad()
    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        dst_p, src_p, dst_b, src_b = self._tensors(model)
        if iteration <= self.start_iter:
            beta = 0.0
        else:
            beta = ema_beta(self.kind, iteration - self.start_iter, beta=self.beta, gamma=self.gamma,
                            halflife_kimg=self.halflife_kimg, rampup_ratio=self.rampup_ratio,
                            batch_size=self.trainer.global_batch_size)
        if beta == 0.0:
            torch._foreach_copy_(dst_p, src_p)
        else:
            torch._foreach_lerp_(dst_p, src_p, 1.0 - beta)
        if dst_b:
            torch._foreach_copy_(dst_b, src_b)
        self.last_beta = beta
        self.trainer.log_scalar(f"ema/{self.ema_name}_beta", beta)

    def state_dict(self) -> dict[str, Any]:
        # The EMA weights themselves are in the checkpoint's model_dict; only the schedule position lives here.
        return {"last_beta": self.last_beta}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_beta = float(state_dict.get("last_beta", 0.0))
