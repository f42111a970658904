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

A multimodal network (LTX-2: ``{"video", "audio"}`` latents, ``fastgen.networks.modalities``) samples the same way:
each modality's starting latents drawn as its pipeline draws them (``PipelineNoise``: per prompt, all videos, then
all audio), every modality on the same grid and guided with its own scale (``SamplingPlan.scale``: LTX2Pipeline's
``guidance_scale`` for video, ``audio_guidance_scale`` for audio) and the run's guidance rescale, STG and
modality-isolation guidance (``SamplingPlan.extra``: ``model.guidance_rescale``, ``model.stg_scale`` /
``model.stg_blocks``, ``model.modality_isolation_scale``) as the pipeline combines them, and decoded by the codec - video by the video VAE, audio by the audio VAE and the vocoder
- into an MP4 with its sound track, a WAV and ``samples.npz`` per run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

import torch
from torch import nn

from fastgen.methods.multimodal import pipeline_guided_x0
from fastgen.networks import modalities
from fastgen.networks.conditioning_frames import WithConditioningFrames, temporal_factor, with_given_frames
from fastgen.pipelines.noise import PipelineNoise, seeded
from fastgen.pipelines.schedulers import SamplingPlan, plan_of
from fastgen.pipelines.world import conditioning_latents
from fastgen.utils.errors import UsageError


def to_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """``[-1, 1]`` pixels ``(B, C, H, W)`` / ``(B, C, F, H, W)`` as 8-bit ``(B, H, W, C)`` / ``(B, F, H, W, C)``,
    as diffusers' ``VaeImageProcessor.postprocess`` rounds them."""
    x = (pixels.float() / 2 + 0.5).clamp(0, 1)
    x = x.permute(0, 2, 3, 1) if x.dim() == 4 else x.permute(0, 2, 3, 4, 1)
    return (x * 255).round().to(torch.uint8).cpu()


@torch.no_grad()
def ode_sample(net: nn.Module, noise: modalities.Sample, condition: torch.Tensor, uncondition: torch.Tensor | None,
               plan: SamplingPlan) -> modalities.Sample:
    """The DDIM ODE over ``plan.times`` from ``noise`` with guidance ``plan.guidance``: on the denoised estimate
    when it is linear (then the same as guiding the noise or the velocity, as the pipelines do), else on the
    native prediction by the backbone's own rule (``DiffusersBackbone.guide``; Qwen-Image's norm rescale of the
    velocity), converted to the denoised estimate after. ``noise`` may be a multimodal sample (a dict of modalities,
    ``fastgen.networks.modalities``; LTX-2): every modality steps on the same grid, each guided with its own scale
    ``plan.scale(modality)`` (LTX2Pipeline's ``guidance_scale`` / ``audio_guidance_scale``), both sides evaluated
    when any modality is guided (as the pipeline does when either scale is above 1), and with ``plan.extra`` its STG
    and modality-isolation passes and guidance rescale, combined as ``LTX2Pipeline.__call__`` combines them on the
    denoised estimates (``fastgen.methods.multimodal.pipeline_guided_x0``).
    Returns the last denoised estimate, or with ``plan.end > 0`` the state one more DDIM step reaches at ``end``."""
    schedule = net.noise_scheduler
    backbone = getattr(net, "backbone", None)
    native = not getattr(backbone, "linear_guidance", True)
    names = list(noise) if modalities.is_multimodal(noise) else []
    if names and native:
        raise ValueError("a multimodal network guides linearly per modality; this backbone's guidance is not linear")
    scales = {name: plan.scale(name) for name in names}
    x = noise
    x0 = x
    guided = uncondition is not None and (plan.guided(names) if names else plan.guidance != 1.0)
    for i, t in enumerate(plan.times):
        like = modalities.first_tensor(x)
        t_vec = torch.full((modalities.batch_size(x),), t, device=like.device, dtype=like.dtype)
        if names:  # LTX2Pipeline's combination: CFG, STG, modality isolation, rescale (plan.extra)
            x0 = pipeline_guided_x0(net, x, t_vec, condition, uncondition if guided else None,
                                    scales if guided else None, plan.extra)
        elif guided:
            kind = net.native_pred_type if native else "x0"
            both = net(modalities.cat([x, x]), torch.cat([t_vec, t_vec]), condition=torch.cat([condition, uncondition]),
                       fwd_pred_type=kind)
            c, u = modalities.chunk(both, 2)
            if native:
                x0 = schedule.convert(backbone.guide(c, u, plan.guidance), x, t_vec, kind, "x0")
            else:
                x0 = u + plan.guidance * (c - u)
        else:
            x0 = net(x, t_vec, condition=condition, fwd_pred_type="x0")
        if i + 1 < len(plan.times) or plan.end > 0:
            a, b = schedule.ddim_coefficients(t, plan.times[i + 1] if i + 1 < len(plan.times) else plan.end)
            x = modalities.per_modality(lambda x0_m, x_m: float(a) * x0_m + float(b) * x_m, x0, x)
    return x if plan.end > 0 else x0


#: a latent sample's shape: one ``(C, ...)`` shape, or a multimodal model's ``{modality: shape}`` (``modality_shapes``)
LatentShape = Union[Sequence[int], Mapping[str, Sequence[int]]]


class PromptSampler:
    """A run's network with its family's codec: ``latents(prompts, seeds)`` samples, ``pixels`` decodes.

    ``guidance`` replaces the run's ``model.guidance_scale``; ``modality_guidance`` (a multimodal model's
    ``{modality: scale}``) updates its ``model.modality_guidance_scales`` - both for the ODE of a teacher or an SFT
    network (``plan_of``); a distilled student samples without guidance."""

    def __init__(self, model: Any, net: nn.Module, which: str, codec: Any, steps: int | None = None,
                 guidance: float | None = None, negative_prompt: str = "",
                 modality_guidance: Mapping[str, float] | None = None) -> None:
        self.model, self.net, self.which, self.codec = model, net, which, codec
        self.negative_prompt = negative_prompt
        self.student = which != "teacher" and hasattr(model, "generate")
        if self.student and (guidance not in (None, 1.0) or any(s != 1.0 for s in (modality_guidance or {}).values())):
            raise UsageError("--guidance: a distilled student samples without classifier-free guidance (its "
                             "teacher's guidance is baked in); guidance is for --teacher")
        self.plan = None if self.student else plan_of(model, which, steps, guidance, modality_guidance)
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

    @property
    def frame_rate(self) -> float | None:
        """The frame rate the network's video positions assume (LTX-2's ``fps``, the pipeline's ``frame_rate``), so
        that a video file and its sound track last equally long; ``None`` when the network has none."""
        fps = getattr(getattr(self.net, "backbone", None), "fps", None)
        return float(fps) if fps else None

    @property
    def sample_rate(self) -> int:
        """The rate (Hz) of ``pixels``' waveforms (the codec's vocoder); 0 for a family without sound."""
        return int(getattr(self.codec, "sample_rate", 0) or 0)

    @torch.no_grad()
    def latents(self, prompts: Sequence[str], seeds: Sequence[int], latent_shape: LatentShape,
                clip: torch.Tensor | None = None) -> modalities.Sample:
        """Normalised latents for ``prompts`` (sample ``i`` from ``seeds[i]``); a multimodal model's (``latent_shape``
        a ``{modality: shape}`` dict) as a dict of them. ``clip``: video-to-world - the ``(1, C, n, H, W)`` pixels
        (``fastgen.pipelines.world.load_clip``) every sample continues, its latent frames given clean."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        generators = seeded(seeds)
        given, net = None, self.net
        if clip is not None:  # encoded with each sample's generator before its noise is drawn, as the pipeline does
            encoded, frames = self._conditioning(clip, len(prompts), latent_shape, generators)
            given = encoded.to(self.device, self.dtype)
            # a distilled student re-noises between its steps: the wrapper puts the given frames back each time
            net = WithConditioningFrames(self.net, frames, clean=given)
        noise = PipelineNoise(self.codec.family, generators, global_seed=seeds[0])
        schedule = self.net.noise_scheduler
        sigma_max = float(schedule.sigma(torch.tensor(float(schedule.t_max), dtype=torch.float64)))
        x_t = modalities.per_modality(lambda v: v.to(self.dtype),
                                      noise.initial(latent_shape, self.device, sigma_max))
        if given is not None:
            x_t = with_given_frames(x_t, given, net.frames)
        fit = getattr(self.codec, "fit_latent_shape", None)
        if fit is not None:  # Cosmos 3: the prompt's templates name the sample's frame count and resolution
            fit(latent_shape)
        condition = self.condition(prompts)
        was_training = self.net.training
        self.net.eval()
        try:
            with self.model.inference_autocast():
                if self.student:
                    out = self.model.generate(net, x_t, condition, generator=noise, **self.student_options)
                else:
                    assert self.plan is not None
                    names = list(x_t) if modalities.is_multimodal(x_t) else []
                    guided = self.plan.guided(names) if names else self.plan.guidance != 1.0
                    uncondition = self.uncondition(len(prompts)) if guided else None
                    out = ode_sample(net, x_t, condition, uncondition, self.plan)
        finally:
            self.net.train(was_training)
        return modalities.per_modality(lambda v: v.float(), out)

    def _conditioning(self, clip: torch.Tensor, count: int, latent_shape: LatentShape,
                      generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, int]:
        """The conditioning clip's latents for ``count`` samples and how many latent frames they give (one line
        when the network or the method cannot continue a clip)."""
        if not getattr(getattr(self.net, "backbone", None), "takes_conditioning_frames", False):
            raise UsageError("--image / --video: this network reads no condition mask; a video-to-world model (e.g. "
                             "Cosmos Predict2's Video2World) continues a clip")
        if self.student and not type(self.model).__dict__.get("supports_conditioning_frames", False):
            raise UsageError(f"--image / --video: {type(self.model).__name__}'s students generate every frame; "
                             "sample its --teacher")
        if isinstance(latent_shape, Mapping) or len(latent_shape) != 4:
            raise UsageError(f"--image / --video continue a video; this model samples {latent_shape}")
        factor = temporal_factor(self.codec.vae)
        num_frames = (int(latent_shape[1]) - 1) * factor + 1
        clip = clip.to(self.codec.device, self.codec.dtype)
        own = getattr(self.codec, "conditioning_latents", None)  # a family that prepares it otherwise (Predict 2.5)
        if own is not None:
            return own([clip] * count, num_frames, generators)
        return conditioning_latents(self.codec, [clip] * count, num_frames, generators)

    def pixels(self, latents: modalities.Sample) -> torch.Tensor | dict[str, torch.Tensor]:
        """8-bit images ``(B, H, W, C)`` or videos ``(B, F, H, W, C)`` of ``latents``; of a multimodal sample,
        ``{"video": 8-bit videos, "audio": float32 waveforms (B, channels, samples) at sample_rate}`` (the codec's
        audio VAE and vocoder, as the pipeline's ``output_type="np"`` audio)."""
        decoded = self.codec.decode_latents(modalities.per_modality(lambda v: v.to(self.codec.dtype), latents))
        if modalities.is_multimodal(decoded):
            return {"video": to_uint8(decoded["video"]), "audio": decoded["audio"].float().cpu()}
        return to_uint8(decoded)


def write_prompt_samples(sampler: PromptSampler, prompts: Sequence[str], seeds: Sequence[int], out_dir: Path,
                         latent_shape: LatentShape, batch_size: int = 8, fps: int | None = None,
                         progress: Callable[[int], None] | None = None,
                         clip: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """Sample ``prompts`` (sample ``i`` from ``seeds[i]``) in batches and write ``NNNN.png`` (images) or
    ``NNNN.mp4`` (videos of more than one frame) into ``out_dir``, plus ``samples.json``: one record per file
    (``file``, ``prompt``, ``seed``). Returns the records.

    A multimodal model (video and audio, LTX-2) writes, as ``fastgen sample``'s audio-visual path does, ``NNNN.mp4``
    with its sound as an AAC track, ``NNNN.wav`` (16-bit PCM; the record's ``audio``) and ``samples.npz``: ``arr_0``
    the uint8 videos ``(N, F, H, W, C)``, ``audio`` the float32 audio latents as sampled, ``waveform`` the float32
    sound ``(N, channels, samples)`` and ``sample_rate``. ``fps``: the videos' frame rate (default 16; a video with
    sound at the network's own, ``PromptSampler.frame_rate``, so that picture and sound last equally long).
    ``clip``: video-to-world, the pixels every sample continues (``PromptSampler.latents``)."""
    from fastgen.pipelines.media import write_mp4, write_png
    from fastgen.utils.io import atomic_open

    rate = fps if fps is not None else 16
    av_rate = fps if fps is not None else max(1, round(sampler.frame_rate or 16))
    records: list[dict[str, Any]] = []
    sound: dict[str, list[np.ndarray]] = {"arr_0": [], "audio": [], "waveform": []}
    for start in range(0, len(prompts), batch_size):
        chunk, chunk_seeds = list(prompts[start:start + batch_size]), list(seeds[start:start + batch_size])
        latents = sampler.latents(chunk, chunk_seeds, latent_shape, clip=clip)
        decoded = sampler.pixels(latents)
        if isinstance(decoded, dict):
            records += _write_audio_video(sampler, decoded, chunk, chunk_seeds, start, out_dir, av_rate)
            sound["arr_0"].append(decoded["video"].numpy())
            sound["audio"].append(latents["audio"].float().cpu().numpy())
            sound["waveform"].append(decoded["audio"].numpy().astype(np.float32))
            if progress is not None:
                progress(len(chunk))
            continue
        pixels = decoded.numpy()
        for offset, (prompt, seed, sample) in enumerate(zip(chunk, chunk_seeds, pixels)):
            index = start + offset
            if sample.ndim == 4 and sample.shape[0] > 1:
                name = f"{index:04d}.mp4"
                write_mp4(out_dir / name, sample, fps=rate)
            else:
                name = f"{index:04d}.png"
                write_png(out_dir / name, sample[0] if sample.ndim == 4 else sample)
            records.append({"file": name, "prompt": prompt, "seed": int(seed)})
        if progress is not None:
            progress(len(chunk))
    if sound["arr_0"]:
        arrays = {key: np.concatenate(parts) for key, parts in sound.items()}
        with atomic_open(out_dir / "samples.npz", "wb") as handle:
            np.savez(handle, **arrays, sample_rate=np.array(sampler.sample_rate))
    with atomic_open(out_dir / "samples.json", "w") as handle:
        json.dump(records, handle, indent=1)
    return records


def _write_audio_video(sampler: PromptSampler, decoded: dict[str, torch.Tensor], prompts: list[str],
                       seeds: list[int], start: int, out_dir: Path, fps: int) -> list[dict[str, Any]]:
    """One batch of a video-and-audio model: ``NNNN.mp4`` with the sound track and ``NNNN.wav`` per sample."""
    from fastgen.callbacks.log_modules.media import save_wav
    from fastgen.pipelines.media import write_mp4

    if set(decoded) != {"video", "audio"}:
        raise UsageError(f"writing multimodal samples needs the modalities video and audio; got {sorted(decoded)}")
    rate = sampler.sample_rate
    if rate <= 0:
        raise UsageError("the codec has no vocoder sample rate to write the samples' sound at")
    records = []
    for offset, (prompt, seed) in enumerate(zip(prompts, seeds)):
        index = start + offset
        video, waveform = decoded["video"][offset].numpy(), decoded["audio"][offset]
        name, wav = f"{index:04d}.mp4", f"{index:04d}.wav"
        write_mp4(out_dir / name, video, fps=fps, audio=waveform.numpy(), sample_rate=rate)
        save_wav(waveform, rate, out_dir / wav)
        records.append({"file": name, "audio": wav, "prompt": prompt, "seed": int(seed)})
    return records


__all__ = ["LatentShape", "PromptSampler", "ode_sample", "to_uint8", "write_prompt_samples"]
