"""Noise drawn as a family's diffusers pipeline draws it, so that fastgen and the pipeline agree sample for sample.

For ``pipe(prompts, generator=generators)`` (one ``torch.Generator`` per prompt, or one for a single prompt) every
pipeline draws the starting latents with ``randn_tensor``: per prompt from its own generator, on the CPU for a CPU
generator, in the latents' layout ``(C, H, W)`` (SD, Flux before packing) or ``(C, F, H, W)`` (Wan). Multi-step
students then re-noise between steps (``x0``, then fresh noise at the next time): the scheduler draws that noise,

* SD (``StableDiffusionPipeline`` hands its generator to the scheduler): per prompt from its generator again;
* CogVideoX (``CogVideoXPipeline`` hands its generator to a scheduler whose ``step`` takes one): the same, but in
  its frame-major layout ``(F, C, H, W)`` (``prepare_latents``; the scheduler steps those latents), transposed to
  fastgen's ``(C, F, H, W)``;
* Flux, Wan and Qwen-Image (their pipelines call ``scheduler.step`` without the generator): from **torch's global
  generator**, one draw for the whole batch, in the layout the scheduler sees - Flux's and Qwen-Image's packed
  ``(B, H/2 * W/2, 4 C)`` tokens. (Qwen-Image's ``prepare_latents`` draws ``(1, C, H, W)`` per prompt - a frame
  axis of one in front - which is the same numbers as ``(C, H, W)``.)
  ``global_seed`` stands in for ``torch.manual_seed(global_seed)`` before the pipeline call.

Cosmos Predict2's pipelines start from ``sigma_max`` times that unit noise (EDM's latents ``x0 + sigma eps``:
``INITIAL_AT_SIGMA_MAX``); the others from the unit noise itself.

A multimodal sample (``fastgen.networks.modalities``) starts from one draw per modality, the modalities in the order
the family's pipeline draws them (``MODALITY_ORDER``), each as above: ``LTX2Pipeline`` calls ``prepare_latents``
(``randn_tensor`` of ``(B, C, F, H, W)``, every prompt's video from its generator) and then
``prepare_audio_latents`` (``(B, C_a, T_a, M_a)`` the same way), so generator ``i`` gives sample ``i``'s video and then
its audio, before packing either. LTX-2 students' re-noising would come from the global generator per modality
(``LTX2Pipeline`` steps its schedulers without one), which no exported pipeline reproduces (its stochastic sampling
is refused: ``fastgen.pipelines.schedulers``). ``Cosmos3OmniPipeline`` runs one prompt at a time and its
``prepare_latents`` draws that sample's vision noise and then its sound noise (``(sound_dim, T)``) from its generator:
the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fastgen.networks.diffusers_nets import pack_flux_latents, unpack_flux_latents

# families whose pipelines pass their generator to the scheduler's step (else the step draws from the global one)
STEP_TAKES_GENERATOR = {"sd": True, "sdxl": True, "flux": False, "wan": False, "qwenimage": False, "cogvideox": True,
                        "cosmos3": False, "cosmos2": False, "cosmos25": False, "ltx2": False}
# families whose schedulers step packed 2x2-patch tokens (the global draw is made in that layout)
PACKED_LATENTS = ("flux", "qwenimage")
# families whose pipelines hold video latents frame major, (B, F, C, H, W): their draws are made in that order
FRAME_MAJOR = ("cogvideox",)
# families whose pipelines multiply their starting unit noise by the schedule's sigma_max (``prepare_latents``)
INITIAL_AT_SIGMA_MAX = ("cosmos2",)
# multimodal families: the order in which their pipelines draw each modality's starting latents
MODALITY_ORDER = {"ltx2": ("video", "audio"), "cosmos3": ("video", "audio")}


def seeded(seeds: Sequence[int]) -> list[torch.Generator]:
    """One CPU generator per sample: ``torch.Generator().manual_seed(seed)``, as a pipeline's caller makes them."""
    return [torch.Generator().manual_seed(int(seed)) for seed in seeds]


class PipelineNoise:
    """A ``NoiseSource`` (``fastgen.distributed.keyed_rng``) for prompt sampling: ``initial`` draws the starting
    latents, ``randn_like`` the re-noising of multi-step samplers, each as the family's pipeline draws it."""

    def __init__(self, family: str, generators: Sequence[torch.Generator], global_seed: int,
                 dtype: torch.dtype = torch.float32) -> None:
        if family not in STEP_TAKES_GENERATOR:
            raise ValueError(f"no pipeline noise convention for the family {family!r}")
        self.family = family
        self.generators = list(generators)
        self.dtype = dtype
        self._global = torch.Generator().manual_seed(int(global_seed))

    def _per_sample(self, shape: Sequence[int]) -> torch.Tensor:
        if self.family in FRAME_MAJOR and len(shape) == 4:  # (C, F, H, W) drawn as the pipeline's (F, C, H, W)
            c, f, h, w = shape
            return torch.cat([torch.randn((1, f, c, h, w), generator=g, device="cpu", dtype=self.dtype)
                              for g in self.generators]).transpose(1, 2).contiguous()
        return torch.cat([torch.randn((1, *shape), generator=g, device="cpu", dtype=self.dtype)
                          for g in self.generators])

    def initial(self, latent_shape: Sequence[int] | Mapping[str, Sequence[int]], device: torch.device | str = "cpu",
                sigma_max: float = 1.0) -> torch.Tensor | dict[str, torch.Tensor]:
        """``(B, *latent_shape)`` starting latents (``prepare_latents``: one draw per sample's generator, times
        ``sigma_max`` - the schedule's ``sigma(t_max)`` - in the ``INITIAL_AT_SIGMA_MAX`` families); for a dict of
        per-modality shapes, a dict of them drawn in the pipeline's ``MODALITY_ORDER`` (module docstring)."""
        if isinstance(latent_shape, Mapping):
            order = MODALITY_ORDER.get(self.family)
            if order is None or set(latent_shape) != set(order):
                raise ValueError(f"no multimodal pipeline noise convention for the family {self.family!r} and the "
                                 f"modalities {sorted(latent_shape)}")
            drawn = {name: self.initial(latent_shape[name], device, sigma_max) for name in order}
            return {name: drawn[name] for name in latent_shape}
        noise = self._per_sample(latent_shape)
        if self.family in INITIAL_AT_SIGMA_MAX:
            noise = noise * sigma_max
        return noise.to(device)

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        if STEP_TAKES_GENERATOR[self.family]:
            noise = self._per_sample(x.shape[1:])
        elif self.family in PACKED_LATENTS:
            packed = torch.randn(pack_flux_latents(x).shape, generator=self._global, device="cpu", dtype=self.dtype)
            noise = unpack_flux_latents(packed, x.shape[-2], x.shape[-1])
        else:
            # Wan's pipeline holds (B, C, F, H, W) latents; a 4-D image latent is its one frame (same order)
            noise = torch.randn(x.shape, generator=self._global, device="cpu", dtype=self.dtype)
        return noise.to(device=x.device, dtype=x.dtype)

    def randn(self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> torch.Tensor:
        raise NotImplementedError("prompt sampling draws only latents-shaped noise (initial / randn_like)")

    def rand(self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor:
        raise NotImplementedError("prompt sampling draws only latents-shaped noise (initial / randn_like)")
