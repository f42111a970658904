"""PDD - Parallel Decoding Distillation (arXiv 2607.26004): one student evaluation gives a velocity for every later
interval of a fixed time grid, and contiguous intervals fuse into one evaluation at sampling time.

Everything runs in rectified-flow (RF) coordinates, ``x_t = (1 - t) x0 + t eps`` with velocity ``v = eps - x0``
(Liu et al. 2023), whatever schedule the networks were trained with: a network's ``x0`` estimate at the RF state
``(x, t)`` is read at the state with the same signal-to-noise ratio in its own schedule
(``fastgen.methods.cm_utils.map_state``), and ``v = (x - x0) / t``. So an EDM teacher (the shipped digits U-Net)
is distilled through the same ODE it samples, reparametrised.

* The grid: ``N`` intervals ``t_0 > ... > t_N = 0`` with ``t_i = t_max * s u_i / (1 + (s - 1) u_i)``,
  ``u_i = 1 - i / N`` (the time shift of Esser et al. 2024, Eq. 23, scaled to start at ``t_max``).
* The student: the teacher with its output projection widened into ``N`` heads, each a copy of the teacher's
  (``fastgen.networks.heads``), so at initialisation every head is the teacher's velocity.
* Training (the paper's objective): draw an interval ``n`` (aligned to ``block_size_min``) and a target interval
  ``k`` uniform in ``[n, min(n + block_size_max, N))``; noise the data to ``x_n``; one student pass gives all heads
  ``v_j(x_n)``; integrate the student's own heads ``n .. k-1`` without gradient,
  ``x̄_k = x_n + sum_{j=n}^{k-1} (t_{j+1} - t_j) v_j(x_n)``; regress head ``k`` onto the teacher's (guided)
  velocity at ``(x̄_k, t_k)`` - an Euler target, or the teacher's midpoint velocity
  ``v_T(x̄_k + (Δ_k / 2) v_T(x̄_k, t_k), t_k + Δ_k / 2)``.
* Sampling: a partition of the grid into blocks (``inference_blocks``, or ``steps`` near-equal blocks); each block
  ``[s, e)`` is one evaluation at ``x_s`` with the heads fused into ``sum_j w_j v_j``,
  ``w_j = (t_{j+1} - t_j) / (t_e - t_s)``, then ``x_e = x_s + (t_e - t_s) v``. Blocks of one interval are the
  per-interval Euler steps; one block of all ``N`` is a one-evaluation sampler - from one trained student.

Multimodal samples (``model.modality_shapes``, ``fastgen.networks.modalities``; LTX-2's video and audio): the
backbone names one output projection per stream (``head_projections()``) and each is widened into its own ``N``
heads, copies of the teacher's projection of that stream. The streams share the one grid and one time per sample
(``x_n`` of every modality at ``t_n``, as ``LTX2Pipeline`` samples both streams at one time), so everything above
holds per modality: the student's self-integration to ``x̄_k``, the teacher's (guided, per-modality scale
``model.modality_guidance_scales`` else ``model.guidance_scale``: ``fastgen.methods.multimodal.guide``) velocity
target at ``(x̄_k, t_k)`` for every stream from one teacher evaluation of the dict, and the regression of each
stream's head ``k``; the loss is ``sum_m w_m L_m`` (``combine_losses``: ``model.modality_loss_weights``, each
``L_m`` logged as ``pdd_loss_<m>``). One fused pass fuses every stream's heads with the same block weights, so a
block is one Euler step of the whole dict, and ``--to diffusers`` exports every stream's fused projections
(``fastgen.pipelines.pdd_blocks``). Not supported, refused in one line: independent per-modality times
(``model.modality_times = "independent"``: the heads are tied to one grid shared by the streams).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.cm_utils import map_state
from fastgen.methods.distill import DistillationModel
from fastgen.methods.multimodal import check_modalities, combine_losses
from fastgen.networks.heads import fuse_heads, head_projections_of, widen_outputs, widen_state_dict
from fastgen.networks.modalities import Sample, batch_size, first_tensor, is_multimodal, per_modality
from fastgen.networks.noise_schedules import NoiseScheduler, RectifiedFlowScheduler, expand_like
from fastgen.utils.errors import ConfigError

RF = RectifiedFlowScheduler()


def shifted_grid(intervals: int, shift: float, t_max: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``intervals + 1`` RF times from ``t_max`` to 0: ``t_max * s u / (1 + (s - 1) u)`` at ``u = 1 - i / N``
    (Esser et al. 2024, Eq. 23)."""
    u = torch.linspace(1.0, 0.0, intervals + 1, dtype=torch.float64, device="cpu")  # CPU even in a meta build
    return (t_max * shift * u / (1.0 + (shift - 1.0) * u)).to(dtype)


def fusion_weights(grid: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The head weights of block ``[start, end)``: ``w_j = (t_{j+1} - t_j) / (t_end - t_start)`` on its heads and
    0 elsewhere (they sum to 1)."""
    if not 0 <= start < end <= grid.numel() - 1:
        raise ValueError(f"block [{start}, {end}) is not inside the grid's {grid.numel() - 1} intervals")
    steps = grid[1:] - grid[:-1]
    weights = torch.zeros_like(steps)
    weights[start:end] = steps[start:end] / (grid[end] - grid[start])
    return weights


def even_blocks(intervals: int, steps: int) -> list[int]:
    """``steps`` block sizes summing to ``intervals``, as equal as they can be (the larger ones last, where the
    grid's intervals are small in a shifted grid)."""
    if not 1 <= steps <= intervals:
        raise ValueError(f"a PDD student on {intervals} intervals samples with 1 to {intervals} steps, not {steps}")
    base, extra = divmod(intervals, steps)
    return [base + (1 if i >= steps - extra else 0) for i in range(steps)]


class PDDModel(DistillationModel):
    student_sampler = "pdd"
    supports_modalities = True  # per-modality heads, targets and losses on one shared grid (module docstring)

    def __init__(self, config: Any) -> None:
        if getattr(config, "modality_shapes", None) and getattr(config, "modality_times", "shared") != "shared":
            raise ConfigError("model.modality_times='independent': PDD's heads sit on one time grid shared by the "
                              "modalities; use 'shared'")
        if config.t_list:
            raise ConfigError("model.t_list is not used by PDD: its student samples with model.inference_blocks "
                              "(or `fastgen sample --steps`)")
        n = int(config.grid_size)
        if n < 1:
            raise ConfigError(f"model.grid_size must be at least 1, got {n}")
        if not 1 <= config.block_size_min <= n or n % config.block_size_min:
            raise ConfigError(f"model.block_size_min ({config.block_size_min}) must divide model.grid_size ({n})")
        if config.block_size_max is not None and not 1 <= config.block_size_max <= n:
            raise ConfigError(f"model.block_size_max must be between 1 and model.grid_size ({n})")
        if config.grid_shift <= 0:
            raise ConfigError("model.grid_shift must be positive")
        if config.grid_max_t is not None and not 0.0 < config.grid_max_t <= 1.0:
            raise ConfigError("model.grid_max_t is a rectified-flow time: it must be in (0, 1]")
        self._grid: torch.Tensor | None = None
        super().__init__(config)
        if config.inference_blocks is not None:
            self.check_blocks(list(config.inference_blocks), "model.inference_blocks")

    # ---- the grid and the heads -----------------------------------------------------------------------------
    def grid_max_t(self, scheduler: Any) -> float:
        """``model.grid_max_t``, else the RF time of the student schedule's ``t_max`` (``sigma / (1 + sigma)`` for
        EDM's ``sigma_max``; the schedule's own ``t_max`` for rectified flow)."""
        if self.config.grid_max_t is not None:
            return float(self.config.grid_max_t)
        if isinstance(scheduler, RectifiedFlowScheduler):
            return float(scheduler.t_max)
        t_max = torch.tensor([float(scheduler.t_max)], dtype=torch.float64, device="cpu")
        _, t_rf = map_state(scheduler, RF, torch.zeros(1, dtype=torch.float64, device="cpu"), t_max)
        return float(t_rf)

    def adapt_net(self, net: nn.Module) -> None:
        """Widen the student's output projection - each modality's, for a multimodal backbone - into ``grid_size``
        heads, storing the grid with them."""
        grid = shifted_grid(int(self.config.grid_size), float(self.config.grid_shift),
                            self.grid_max_t(net.noise_scheduler))
        self._grid = grid
        widen_outputs(net, int(self.config.grid_size), grid)

    @property
    def grid(self) -> torch.Tensor:
        """The RF time grid (float64, CPU; ``grid_size + 1`` times from ``grid_max_t`` to 0)."""
        assert self._grid is not None
        return self._grid

    def student_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A teacher-architecture state dict with its output projection repeated into every head."""
        return widen_state_dict(state, self.net)

    def check_blocks(self, blocks: list[int], what: str) -> list[int]:
        if not blocks or any(int(b) < 1 for b in blocks) or sum(int(b) for b in blocks) != self.config.grid_size:
            raise ConfigError(f"{what} must be positive block sizes summing to model.grid_size "
                              f"({self.config.grid_size}), got {blocks}")
        return [int(b) for b in blocks]

    # ---- velocities in RF coordinates --------------------------------------------------------------------------
    def _rf_velocity(self, x: torch.Tensor, t: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """``v = (x - x0) / t``; ``x0`` may carry a heads axis after the batch."""
        if x0.dim() == x.dim() + 1:
            x = x.unsqueeze(1)
        return (x - x0) / expand_like(t, x0)

    @staticmethod
    def _to_schedule(scheduler: NoiseScheduler, x: Sample, t: torch.Tensor) -> tuple[Sample, torch.Tensor]:
        """The RF state ``(x, t)`` in ``scheduler``'s coordinates; a multimodal ``x`` keeps its one shared time
        (the mapped time depends on ``t`` only). Any rectified-flow schedule *is* RF coordinates (``alpha = 1 - t``,
        ``sigma = t``; its logit-normal training times and sampling shift do not change the state): mapping through
        the noise-to-signal ratio there would clamp it at ``t = 1`` and evaluate the network at ``1 - 1e-4`` on
        rescaled noise, which the diffusers pipeline the student is exported to does not do."""
        if isinstance(scheduler, RectifiedFlowScheduler):
            return x, t
        if not is_multimodal(x):
            return map_state(RF, scheduler, x, t)
        mapped = {name: map_state(RF, scheduler, v, t) for name, v in x.items()}
        return {name: m[0] for name, m in mapped.items()}, next(iter(mapped.values()))[1]

    def student_velocity(self, net: nn.Module, x: Sample, t: torch.Tensor, condition: torch.Tensor | None) -> Sample:
        """``net``'s RF velocity at ``(x, t)``: ``(B, N, ...)`` with all heads, or ``(B, ...)`` inside ``fuse_heads``
        (per modality for a multimodal ``x``)."""
        xs, ts = self._to_schedule(net.noise_scheduler, x, t)
        x0 = net(xs, ts, condition=condition, fwd_pred_type="x0")
        return per_modality(lambda a, b: self._rf_velocity(a, t, b), x, x0)

    def teacher_velocity(self, x: Sample, t: torch.Tensor, condition: torch.Tensor | None) -> Sample:
        """The teacher's (guided: ``model.guidance_scale``, per modality ``model.modality_guidance_scales``) RF
        velocity at ``(x, t)``."""
        xs, ts = self._to_schedule(self.teacher.noise_scheduler, x, t)
        return per_modality(lambda a, b: self._rf_velocity(a, t, b), x, self.teacher_x0(xs, ts, condition))

    # ---- the step ----------------------------------------------------------------------------------------------
    def draw_intervals(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n, k)`` per sample: ``n`` uniform over the multiples of ``block_size_min`` below ``N``, ``k`` uniform
        in ``[n, min(n + block_size_max, N))`` (the paper's target-interval distribution)."""
        n_total, low = int(self.config.grid_size), int(self.config.block_size_min)
        high = int(self.config.block_size_max or n_total)
        n = low * self.rng.randint(n_total // low, (batch,), device=device)
        span = torch.clamp(n_total - n, max=high)
        k = n + (self.rng.rand((batch,), device=device) * span).long().clamp(max=span - 1)
        return n, k

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        real = per_modality(lambda x: x.to(self.precision), data["real"])
        if is_multimodal(real):
            check_modalities(self.config, real)
        condition = self.condition_of(data)
        like = first_tensor(real)
        batch, device, dtype = batch_size(real), like.device, like.dtype
        grid = self.grid.to(device=device, dtype=torch.float32)
        n, k = self.draw_intervals(batch, device)
        t_n = grid[n].to(dtype)  # one time per sample, shared by its modalities
        eps = per_modality(self.rng.randn_like, real)
        x_n = per_modality(lambda x0, e: RF.add_noise(x0, e, t_n), real, eps)
        heads = self.student_velocity(self.net, x_n, t_n, condition)  # (B, N, ...) per modality
        rows = torch.arange(batch, device=device)
        with torch.no_grad():
            steps = (grid[1:] - grid[:-1]).to(dtype)
            index = torch.arange(int(self.config.grid_size), device=device)
            take = ((index >= n[:, None]) & (index < k[:, None])).to(dtype) * steps  # (B, N)
            # x̄_k = x_n + sum_{j=n}^{k-1} (t_{j+1} - t_j) v_j(x_n), every modality with its own heads
            x_k = per_modality(lambda x, h: x + torch.einsum("bj,bj...->b...", take, h.detach()), x_n, heads)
            t_k = grid[k].to(dtype)
            target = self.teacher_velocity(x_k, t_k, condition)
            if self.config.teacher_integrator == "midpoint":
                half = (grid[k + 1] - grid[k]).to(dtype) / 2
                x_mid = per_modality(lambda x, v: x + expand_like(half, x) * v, x_k, target)
                target = self.teacher_velocity(x_mid, t_k + half, condition)
        pred = per_modality(lambda h: h[rows, k], heads)
        logged: dict[str, torch.Tensor] = {}
        if is_multimodal(pred):  # sum_m w_m L_m (fastgen.methods.multimodal.combine_losses)
            losses = {name: (pred[name].float() - target[name].float()).square().mean() for name in pred}
            loss, logged = combine_losses(self.config, losses, "pdd_loss")
        else:
            loss = (pred.float() - target.float()).square().mean()
        with torch.no_grad():
            span = (k - n).float().mean()
        loss_dict = {"total_loss": loss, "pdd_loss": loss.detach(), "pdd_target_span": span, **logged}
        return loss_dict, {"generated": per_modality(lambda x: x.detach(), x_k), "target": target}

    # ---- sampling ----------------------------------------------------------------------------------------------
    def generate(self, net: nn.Module, noise: Sample, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None,
                 blocks: list[int] | None = None) -> Sample:
        """The fused-block sampler from prior ``noise`` (``x_{t_max}`` of the student's schedule; a dict of
        modalities for a multimodal model, all at the block's one time): one evaluation per block of ``blocks``
        (default ``model.inference_blocks``, else one block per interval)."""
        if times is not None:
            raise ValueError("a PDD student samples on its grid: pass blocks, not times")
        blocks = self.check_blocks(list(blocks), "blocks") if blocks else self.sampling_blocks()
        if not head_projections_of(net):
            raise ValueError("PDD samples with the student (its widened heads); the teacher samples with Heun")
        grid64 = self.grid
        like = first_tensor(noise)
        grid = grid64.to(device=like.device, dtype=like.dtype)
        scheduler = net.noise_scheduler
        sigma_max = scheduler.sigma(torch.tensor(float(scheduler.t_max), dtype=torch.float64))
        x = per_modality(lambda z: grid[0] * (z / sigma_max.to(z)), noise)
        batch, start = batch_size(noise), 0
        for size in blocks:
            end = start + size
            t = grid[start].expand(batch)
            with fuse_heads(net, fusion_weights(grid64, start, end)):
                v = self.student_velocity(net, x, t, condition)
            x = per_modality(lambda a, b: a + (grid[end] - grid[start]) * b, x, v)  # x_e = x_s + (t_e - t_s) v
            start = end
        return x

    def generator_fn(self, net: nn.Module, noise: torch.Tensor, steps: int | None = None,
                     condition: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """The teacher samples with Heun; the student with ``steps`` near-equal blocks (``even_blocks``) when given,
        else ``model.inference_blocks``."""
        if net is self.teacher:
            return super().generator_fn(net, noise, steps, condition, generator=generator)
        with torch.no_grad():
            return self.generate(net, noise, condition, blocks=self.sampling_blocks(steps))

    def sampling_blocks(self, steps: int | None = None) -> list[int]:
        """The blocks the student samples with: ``steps`` near-equal ones (``even_blocks``) when given, else
        ``model.inference_blocks``, else one per interval."""
        n_total = int(self.config.grid_size)
        if steps:
            return even_blocks(n_total, int(steps))
        return self.check_blocks(list(self.config.inference_blocks or [1] * n_total), "model.inference_blocks")

    def block_times(self, blocks: list[int]) -> list[float]:
        """The RF times the blocks start at (where the sampler evaluates the student)."""
        starts = [0]
        for size in blocks[:-1]:
            starts.append(starts[-1] + size)
        return [float(self.grid[i]) for i in starts]

    def sampling_options(self, steps: int | None) -> dict[str, Any]:
        """``generate``'s arguments for ``steps`` sampling steps (``fastgen sample --prompt --steps``)."""
        return {"blocks": self.sampling_blocks(steps)}


__all__ = ["PDDModel", "even_blocks", "fusion_weights", "shifted_grid"]
