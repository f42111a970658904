"""Cosmos 3's codec: its frozen Wan 2.2 VAE and its "text encoder" - the tokenizer and the transformer's own token
embedding table - used exactly as ``Cosmos3OmniPipeline`` uses them (``fastgen.networks.codecs`` for the other
families).

* **Video** (``AutoencoderKLWan``; Cosmos3-Nano: Wan 2.2 TI2V-5B's, 48 channels, 16x spatial and 4x temporal
  compression): the posterior's mode, per channel ``z = (E(x) - mu_c) * (1 / sigma_c)`` with the VAE config's
  ``latents_mean`` / ``latents_std`` in the VAE's dtype (``_encode_video``); decoding is the inverse,
  ``D(z / (1 / sigma_c) + mu_c)`` (``__call__``'s postprocess). Videos ``(B, 3, F, H, W)`` in ``[-1, 1]``; an image
  is one frame.
* **Text**: the pipeline runs no text encoder - the transformer embeds the token ids itself. A prompt becomes the
  pipeline's ids (``fastgen.networks.cosmos3.prompt_ids``: the duration / resolution sentences for the codec's
  ``num_frames``, ``height``, ``width``, ``fps``; the system turn when the folder's ``default_use_system_prompt``
  says; the chat template; end-of-text and vision-start) and then rows of the transformer's ``embed_tokens`` (read
  from the folder's ``transformer/`` safetensors alone), zero-padded to ``max_tokens``: the network's condition
  (``fastgen.networks.cosmos3``). The negative side is the same with the inverse sentences (``encode_negative``).
* **Sound** (a folder with a ``sound_tokenizer``: ``Cosmos3AVAEAudioTokenizer``, the audio VAE whose latents the
  model's sound path generates): a multimodal sample ``{"video": ..., "audio": (B, sound_dim, T)}`` decodes to
  ``{"video": pixels, "audio": waveforms (B, channels, samples)}`` at the tokenizer's ``sampling_rate``, as the
  pipeline's ``decode_sound`` does it - the latents as they are (the tokenizer applies no normalisation); waveforms
  encode to latents with ``encode_audio`` (the posterior's mode, or a sample with a generator).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.networks.codecs import Codec, _component, has_component
from fastgen.networks.conditioning_frames import encode_given_clips
from fastgen.networks.cosmos3 import load_tokenizer, prompt_ids
from fastgen.networks.modalities import is_multimodal
from fastgen.utils.errors import UsageError


def read_embedding_table(folder: Path, subfolder: str = "transformer") -> torch.Tensor:
    """``embed_tokens.weight`` of the transformer's safetensors in ``folder/subfolder`` (one file or the shard its
    index names), read alone - the rest of the model stays on disk."""
    from safetensors import safe_open

    root = folder / subfolder
    key = "embed_tokens.weight"
    index = root / "diffusion_pytorch_model.safetensors.index.json"
    file = root / "diffusion_pytorch_model.safetensors"
    if index.is_file():
        shard = json.loads(index.read_text())["weight_map"].get(key)
        file = root / str(shard)
    if not file.is_file():
        raise UsageError(f"{root}: no {key} in its safetensors (the Cosmos 3 transformer embeds the prompt's tokens)")
    with safe_open(str(file), framework="pt") as handle:
        if key not in handle.keys():
            raise UsageError(f"{file}: no {key} (the Cosmos 3 transformer embeds the prompt's tokens)")
        return handle.get_tensor(key)


class Cosmos3Codec(Codec):
    """Cosmos 3's VAE, tokenizer and token embedding table (module docstring); the prompts are encoded for samples
    of ``num_frames`` frames of ``height x width`` pixels at ``fps`` (the pipeline's defaults: 189 frames of
    720x1280 at 24; 1 frame: an image)."""

    family = "cosmos3"
    video = True

    def __init__(self, vae: nn.Module, num_frames: int = 189, height: int = 720, width: int = 1280, fps: float = 24.0,
                 use_system_prompt: bool = True, add_resolution_template: bool = True,
                 add_duration_template: bool = True, max_tokens: int = 512, sound_tokenizer: nn.Module | None = None,
                 **parts: Any) -> None:
        super().__init__(vae, **parts)
        # not among the encoders: FSDP (model.encode_batches) wraps those, and the tokenizer is called by method
        self.sound_tokenizer = sound_tokenizer
        self.num_frames, self.height, self.width, self.fps = int(num_frames), int(height), int(width), float(fps)
        self.templates = {"use_system_prompt": bool(use_system_prompt),
                          "add_resolution_template": bool(add_resolution_template),
                          "add_duration_template": bool(add_duration_template)}
        self.max_tokens = int(max_tokens)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32, text: bool = True,
                        **kwargs: Any) -> Cosmos3Codec:
        folder = Path(folder).expanduser()
        parts: dict[str, Any] = {}
        if text:
            index = json.loads((folder / "model_index.json").read_text())
            kwargs.setdefault("use_system_prompt", bool(index.get("default_use_system_prompt", True)))
            table = read_embedding_table(folder).to(dtype)
            embedding = nn.Embedding(*table.shape, _weight=table).requires_grad_(False)
            parts = {"tokenizer": load_tokenizer(str(folder)), "embed_tokens": embedding}
        if has_component(folder, "sound_tokenizer") and (folder / "sound_tokenizer").is_dir():
            parts["sound_tokenizer"] = _component(folder, "sound_tokenizer", dtype).requires_grad_(False).eval()
        return cls(_component(folder, "vae", dtype), **parts, **kwargs)

    # ---- latents -------------------------------------------------------------------------------------------
    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``mu`` and ``1 / sigma`` as the pipeline makes them: in the VAE's dtype, then moved to ``like``."""
        config, dtype = self.vae.config, self.dtype
        mean = torch.tensor(config.latents_mean, dtype=dtype)
        inv_std = 1.0 / torch.tensor(config.latents_std, dtype=dtype)
        shape = (1, -1, 1, 1, 1)
        return mean.view(shape).to(like.device, like.dtype), inv_std.view(shape).to(like.device, like.dtype)

    @staticmethod
    def _as_video(x: torch.Tensor) -> torch.Tensor:
        return x if x.dim() == 5 else x.unsqueeze(2)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        mean, inv_std = self._stats(raw)
        return (raw - mean) * inv_std

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, inv_std = self._stats(latents)
        return latents / inv_std + mean

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return super().encode_images(self._as_video(pixels), generator)

    def decode_latents(self, latents: Any) -> Any:
        """Videos ``(B, 3, F, H, W)``; the images of 4-D latents (one frame) as ``(B, 3, H, W)``; a sample with
        sound as ``{"video": pixels, "audio": waveforms}`` (``decode_audio``)."""
        if is_multimodal(latents):
            unknown = set(latents) - {"video", "audio"}
            if unknown:
                raise UsageError(f"Cosmos 3 decodes video and audio; the sample also holds {sorted(unknown)}")
            return {"video": self.decode_latents(latents["video"]), "audio": self.decode_audio(latents["audio"])}
        decoded = super().decode_latents(self._as_video(latents))
        return decoded[:, :, 0] if latents.dim() == 4 else decoded

    @staticmethod
    def conditioning_image(image: Any, height: int, width: int) -> torch.Tensor:
        """``(1, 3, 1, H, W)`` in ``[-1, 1]`` of a PIL image, as ``Cosmos3OmniPipeline`` prepares an ``image=``
        (its ``_preprocess_conditioning_image``: scaled to cover ``H x W`` keeping its aspect, bilinear with
        antialiasing, centre-cropped, rounded to 8 bits) - not the video processor's resize of a clip's frames."""
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image

        return _preprocess_conditioning_image(image, height=height, width=width).unsqueeze(2)

    def conditioning_latents(self, clips: Sequence[torch.Tensor], num_frames: int,
                             generators: Sequence[torch.Generator] | None = None) -> tuple[torch.Tensor, int]:
        """Image / video to video (``fastgen.networks.conditioning_frames``) as ``Cosmos3OmniPipeline.prepare_latents``
        conditions a sample: an image is the first pixel frame, a clip its first ``t + 1`` frames (the call's
        default ``condition_frame_indexes_vision`` (0, 1) with ``condition_video_keep="first"``; ``t`` the VAE's
        temporal compression), repeat-padded with the last one to ``num_frames`` and encoded whole to the posterior's
        mode (``_encode_video``: no generator draw); one latent frame is given for an image, two for a clip."""
        factor = int(self.vae.config.scale_factor_temporal)
        padded = []
        for clip in clips:
            given = 1 if clip.shape[2] == 1 else 2
            clip = clip[:, :, : (given - 1) * factor + 1]
            tail = clip[:, :, -1:].expand(-1, -1, max(num_frames - clip.shape[2], 0), -1, -1)
            padded.append((torch.cat([clip, tail], dim=2)[:, :, :num_frames], given))
        return encode_given_clips(self, padded)

    # ---- sound ---------------------------------------------------------------------------------------------
    def _sound(self) -> nn.Module:
        if self.sound_tokenizer is None:
            raise UsageError("this Cosmos 3 pipeline folder has no sound_tokenizer: it makes no sound")
        return self.sound_tokenizer

    @torch.no_grad()
    def decode_audio(self, latents: torch.Tensor) -> torch.Tensor:
        """Waveforms ``(B, channels, samples)`` at ``sample_rate`` of ``(B, sound_dim, T)`` sound latents: the
        tokenizer's decoder in its dtype (the pipeline's ``decode_sound``, a batch at once)."""
        tokenizer = self._sound()
        dtype = next(tokenizer.parameters()).dtype
        return tokenizer.decode(latents.to(self.device, dtype))

    @torch.no_grad()
    def encode_audio(self, waveforms: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B, sound_dim, T)`` latents of waveforms ``(B, channels, samples)`` at ``sample_rate``: the
        tokenizer's posterior mode, or a sample with ``generator`` (it pads to its hop and normalises the volume)."""
        tokenizer = self._sound()
        dtype = next(tokenizer.parameters()).dtype
        posterior = tokenizer.encode(waveforms.to(self.device, dtype)).latent_dist
        return posterior.mode() if generator is None else posterior.sample(generator=generator)

    @torch.no_grad()
    def encode_waveforms(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``(B, sound_dim, ceil(N / hop))`` latents of stereo waveforms ``(B, 2, N)`` at ``waveform_rate``, each
        encoded on its own: the tokenizer normalises the volume by the peak of everything it is given at once, so a
        batch would scale each clip by the loudest one. ``ceil(N / hop)`` is the pipeline's sound length for a clip
        of ``N`` samples (``Cosmos3OmniPipeline``: ``T_sound``), and what Cosmos 3's tokenizer (hop 1920 at 48 kHz)
        encodes; a toy tokenizer whose STFT frames one more is cut to it."""
        count = -(-waveforms.shape[-1] // int(self._sound()._hop_size))
        return torch.cat([self.encode_audio(wave[None]) for wave in waveforms])[:, :, :count]

    @property
    def waveform_rate(self) -> int:
        """The rate (Hz) of the waveforms ``encode_waveforms`` takes (the tokenizer's); 0 without one."""
        return self.sample_rate

    @property
    def sample_rate(self) -> int:
        """The tokenizer's waveform rate (Hz); 0 without one."""
        return int(self.sound_tokenizer.config.sampling_rate) if self.sound_tokenizer is not None else 0

    # ---- text ----------------------------------------------------------------------------------------------
    def fit_latent_shape(self, shape: Sequence[int]) -> None:
        """Encode prompts for samples of latent ``shape`` (``(C, F, H, W)``, or ``(C, H, W)``: an image): the
        pixel size the pipeline would be called with - ``(F - 1) t + 1`` frames of ``H s x W s`` through the VAE
        config's temporal / spatial compression ``t`` / ``s`` - which the templates name. ``fastgen sample`` and
        ``encode-data`` call it before encoding prompts."""
        config = self.vae.config
        if isinstance(shape, Mapping):  # a sample with sound: the video's shape names the templates
            shape = shape["video"]
        frames = int(shape[1]) if len(shape) == 4 else 1
        self.num_frames = (frames - 1) * int(config.scale_factor_temporal) + 1
        self.height = int(shape[-2]) * int(config.scale_factor_spatial)
        self.width = int(shape[-1]) * int(config.scale_factor_spatial)

    def token_ids(self, prompts: list[str], negative: bool = False) -> list[list[int]]:
        """The pipeline's ids of each prompt (its negative prompt's with ``negative``) at the codec's sample size."""
        return [prompt_ids(self.tokenizers["tokenizer"], prompt, negative=negative, num_frames=self.num_frames,
                           height=self.height, width=self.width, fps=self.fps, **self.templates) for prompt in prompts]

    @torch.no_grad()
    def _embed(self, ids: list[list[int]]) -> dict[str, torch.Tensor]:
        longest = max(len(row) for row in ids)
        if longest > self.max_tokens:
            raise UsageError(f"a prompt of {longest} tokens is longer than the Cosmos 3 codec's max_tokens "
                             f"({self.max_tokens}): raise max_tokens (the pipeline does not truncate)")
        table = self.encoders["embed_tokens"]
        text = torch.zeros(len(ids), self.max_tokens, table.embedding_dim, dtype=table.weight.dtype, device=self.device)
        mask = torch.zeros(len(ids), self.max_tokens, dtype=torch.long, device=self.device)
        for i, row in enumerate(ids):
            text[i, : len(row)] = table(torch.tensor(row, device=self.device))
            mask[i, : len(row)] = 1
        return {"text": text, "text_mask": mask}

    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        return self._embed(self.token_ids(prompts))

    def encode_negative(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        return self._embed(self.token_ids(prompts, negative=True))


__all__ = ["Cosmos3Codec", "read_embedding_table"]
