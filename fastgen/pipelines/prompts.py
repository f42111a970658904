"""Sampling a run from prompts as the family's diffusers pipeline samples it (``fastgen sample --prompt``).

The codec (``fastgen.networks.codecs``) encodes the prompts as the pipeline's ``encode_prompt`` does; the starting
latents and any re-noising are drawn as the pipeline draws them (``fastgen.pipelines.noise``: sample ``i`` from
``torch.Generator().manual_seed(seeds[i])``); the network samples with its own rule - a distilled student with its
method's ``generate`` (the sampler it was trained with), a teacher or a fine-tuned model with the DDIM ODE over its
grid and classifier-free guidance against the negative prompt's embedding (``u + s (c - u)``, Ho & Salimans 2022,
Eq. 6; Qwen-Image's rescaled to the conditional velocity's norm, as its pipeline's ``true_cfg_scale``; CogVideoX's
plain, as its pipeline's default ``use_dynamic_cfg=False``) - and the codec decodes. Pixels become 8-bit exactly as diffusers' image processor makes them
(``round(255 clamp(x / 2 + 1/2, 0, 1))``), so an exported pipeline reproduces the files bit for bit up to
floating-point order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.networks import modalities
from fastgen.pipelines.noise import PipelineNoise, seeded
from fastgen.pipelines.schedulers import SamplingPlan, plan_of
from fastgen.utils.errors import UsageError


def to_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """``[-1, 1]`` pixels ``(B, C, H, W)`` / ``(B, C, F, H, W)`` as 8-bit ``(B, H, W, C)`` / ``(B, F, H, W, C)``,
    as diffusers' ``VaeImageProcessor.postprocess`` rounds them."""
    x = (pixels.float() / 2 + 0.5).clamp(0, 1)
    x = x.permute(0, 2, 3, 1) if x.dim() == 4 else x.permute(0, 2, 3, 4, 1)
    return (x * 255).round().to(torch.uint8).cpu()


@torch.no_grad()
def ode_sample(net: nn.Module, noise: torch.Tensor, condition: torch.Tensor, uncondition: torch.Tensor | None,
               plan: SamplingPlan) -> torch.Tensor:
    """The DDIM ODE over ``plan.times`` from ``noise`` with guidance ``plan.guidance``: on the denoised estimate
    when it is linear (then the same as guiding the noise or the velocity, as the pipelines do), else on the
    native prediction by the backbone's own rule (``DiffusersBackbone.guide``; Qwen-Image's norm rescale of the
    velocity), converted to the denoised estimate after. ``noise`` may be a multimodal sample (a dict of modalities,
    ``fastgen.networks.modalities``; LTX-2): every modality steps on the same grid, guided with the same scale.
    Returns the last denoised estimate, or with ``plan.end > 0`` the state one more DDIM step reaches at ``end``."""
    schedule = net.noise_scheduler
    backbone = getattr(net, "backbone", None)
    native = not getattr(backbone, "linear_guidance", True)
    x = noise
    x0 = x
    guided = plan.guidance != 1.0 and uncondition is not None
    for i, t in enumerate(plan.times):
        like = modalities.first_tensor(x)
        t_vec = torch.full((modalities.batch_size(x),), t, device=like.device, dtype=like.dtype)
        if guided:
            kind = net.native_pred_type if native else "x0"
            both = net(modalities.cat([x, x]), torch.cat([t_vec, t_vec]), condition=torch.cat([condition, uncondition]),
                       fwd_pred_type=kind)
            c, u = modalities.chunk(both, 2)
            if native:
                x0 = schedule.convert(backbone.guide(c, u, plan.guidance), x, t_vec, kind, "x0")
            else:
                x0 = modalities.per_modality(lambda c_m, u_m: u_m + plan.guidance * (c_m - u_m), c, u)
        else:
            x0 = net(x, t_vec, condition=condition, fwd_pred_type="x0")
        if i + 1 < len(plan.times) or plan.end > 0:
            a, b = schedule.ddim_coefficients(t, plan.times[i + 1] if i + 1 < len(plan.times) else plan.end)
            x = modalities.per_modality(lambda x0_m, x_m: float(a) * x0_m + float(b) * x_m, x0, x)
    return x if plan.end > 0 else x0


class PromptSampler:
    """A run's network with its family's codec: ``latents(prompts, seeds)`` samples, ``pixels`` decodes."""

    def __init__(self, model: Any, net: nn.Module, which: str, codec: Any, steps: int | None = None,
                 guidance: float | None = None, negative_prompt: str = "") -> None:
        self.model, self.net, self.which, self.codec = model, net, which, codec
        self.negative_prompt = negative_prompt
        self.student = which != "teacher" and hasattr(model, "generate")
        if self.student and guidance not in (None, 1.0):
            raise UsageError("--guidance: a distilled student samples without classifier-free guidance (its "
                             "teacher's guidance is baked in); guidance is for --teacher")
        self.plan = None if self.student else plan_of(model, which, steps, guidance)
        # a student whose step count is a sampling choice (PDD's blocks) takes --steps; the others sample as trained
        options = getattr(model, "sampling_options", None) if self.student else None
        self.student_options: dict[str, Any] = options(steps) if options is not None else {}
        self.dtype = next(net.parameters()).dtype
        self.device = next(net.parameters()).device

    def condition(self, prompts: Sequence[str]) -> torch.Tensor:
        return self.codec.condition(self.codec.encode_prompts(list(prompts))).to(self.device, self.dtype)

    def uncondition(self, count: int) -> torch.Tensor:
        """Guidance's negative side, as the pipeline encodes ``negative_prompt`` (SDXL: zeros for the empty one)."""
        encoded = self.codec.encode_negative([self.negative_prompt] * count)
        return self.codec.condition(encoded).to(self.device, self.dtype)

    @torch.no_grad()
    def latents(self, prompts: Sequence[str], seeds: Sequence[int], latent_shape: Sequence[int]) -> torch.Tensor:
        """Normalised latents for ``prompts`` (sample ``i`` from ``seeds[i]``)."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        noise = PipelineNoise(self.codec.family, seeded(seeds), global_seed=seeds[0])
        schedule = self.net.noise_scheduler
        sigma_max = float(schedule.sigma(torch.tensor(float(schedule.t_max), dtype=torch.float64)))
        x_t = noise.initial(latent_shape, self.device, sigma_max).to(self.dtype)
        fit = getattr(self.codec, "fit_latent_shape", None)
        if fit is not None:  # Cosmos 3: the prompt's templates name the sample's frame count and resolution
            fit(latent_shape)
        condition = self.condition(prompts)
        was_training = self.net.training
        self.net.eval()
        try:
            with self.model.inference_autocast():
                if self.student:
                    out = self.model.generate(self.net, x_t, condition, generator=noise, **self.student_options)
                else:
                    assert self.plan is not None
                    uncondition = (self.uncondition(len(prompts)) if self.plan.guidance != 1.0 else None)
                    out = ode_sample(self.net, x_t, condition, uncondition, self.plan)
        finally:
            self.net.train(was_training)
        return out.float()

    def pixels(self, latents: torch.Tensor) -> torch.Tensor:
        """8-bit images ``(B, H, W, C)`` or videos ``(B, F, H, W, C)`` of ``latents``."""
        return to_uint8(self.codec.decode_latents(latents.to(self.codec.dtype)))




def write_prompt_samples(sampler: PromptSampler, prompts: Sequence[str], seeds: Sequence[int], out_dir: Path,
                         latent_shape: Sequence[int], batch_size: int = 8, fps: int = 16,
                         progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Sample ``prompts`` (sample ``i`` from ``seeds[i]``) in batches and write ``NNNN.png`` (images) or
    ``NNNN.mp4`` (videos of more than one frame) into ``out_dir``, plus ``samples.json``: one record per file
    (``file``, ``prompt``, ``seed``). Returns the records."""
    from fastgen.pipelines.media import write_mp4, write_png
    from fastgen.utils.io import atomic_open

    records: list[dict[str, Any]] = []
    for start in range(0, len(prompts), batch_size):
        chunk, chunk_seeds = list(prompts[start:start + batch_size]), list(seeds[start:start + batch_size])
        pixels = sampler.pixels(sampler.latents(chunk, chunk_seeds, latent_shape)).numpy()
        for offset, (prompt, seed, sample) in enumerate(zip(chunk, chunk_seeds, pixels)):
            index = start + offset
            if sample.ndim == 4 and sample.shape[0] > 1:
                name = f"{index:04d}.mp4"
                write_mp4(out_dir / name, sample, fps=fps)
            else:
                name = f"{index:04d}.png"
                write_png(out_dir / name, sample[0] if sample.ndim == 4 else sample)
            records.append({"file": name, "prompt": prompt, "seed": int(seed)})
        if progress is not None:
            progress(len(chunk))
    with atomic_open(out_dir / "samples.json", "w") as handle:
        json.dump(records, handle, indent=1)
    return records


__all__ = ["PromptSampler", "ode_sample", "to_uint8", "write_prompt_samples"]
