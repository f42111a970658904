"""LTX-2, the joint audio-visual diffusion transformer (HaCohen et al. 2026, "LTX-2: Efficient Joint Audio-Visual
Foundation Model"), in the multimodal network contract (``fastgen.networks.modalities``): diffusers'
``LTX2VideoTransformer3DModel`` called as ``LTX2Pipeline`` calls it.

The model runs two token streams side by side - video tokens of the 3-D VAE's latents and audio tokens of the
audio VAE's latent spectrogram - with self-attention, text cross-attention and feed-forward per stream and
audio-to-video / video-to-audio cross-attention between them in every block, and returns one velocity per stream.
What the backbone is given (``DiffusionNet``'s multimodal forward) and what it hands the model:

* ``x = {"video": (B, C, F, H, W), "audio": (B, C_a, T_a, M_a)}``: the normalised latents in the layouts the VAEs
  produce (``fastgen.networks.ltx2_codec``). Video is packed into tokens of ``p_t x p x p`` patches, channel major
  inside a token and frame-row-column order over tokens (``LTX2Pipeline._pack_latents``); audio into one token per
  latent frame holding every channel's mel bins (``_pack_audio_latents`` without patch sizes, as the pipeline
  calls it - so the model's audio patch sizes must be 1). The outputs are unpacked back to the input layouts.
* ``c_noise = {"video": t_v, "audio": t_a}`` (rectified-flow times in ``[0, 1]``, ``(B,)``): each stream's
  ``timestep`` and ``sigma`` are its time times ``timestep_scale_multiplier`` (1000; the pipeline passes the
  scheduler's ``timestep``, which is ``1000 sigma``, as both). The two may differ (``model.modality_times =
  "independent"``); the cross-modal attention's modulation then reads the *other* stream's time when
  ``use_cross_timestep`` (the pipeline's default, LTX-2.3's behaviour) and the stream's own when not (LTX-2.0's).
* RoPE positions: the pipeline's - video patches at their pixel-space ``[start, end)`` bounds (VAE scale factors,
  the causal first frame), the frame axis in seconds at ``fps``; audio frames in seconds from the mel hop - from the
  latent sizes (``num_frames``, ``height``, ``width``, ``audio_num_frames``), computed inside the model as the
  pipeline computes them.
* ``condition``: ``(B, T, D_v + D_a)`` - the video stream's text embedding and the audio stream's (the outputs of
  ``LTX2TextConnectors``: Gemma-3's hidden states through one connector per stream) **concatenated on the last
  axis**, so that the methods' one condition tensor per sample (concatenated across batches, zeroed for
  classifier-free-guidance dropout) carries both. ``D_v`` and ``D_a`` are the model's ``caption_channels`` each
  (LTX-2.0: the transformer projects them itself) or, without ``use_prompt_embeddings`` (LTX-2.3: the connectors
  project per stream), its ``cross_attention_dim`` and ``audio_cross_attention_dim``. The text attention mask is
  read back from the condition as Qwen-Image's is: a token whose row is all zero is padding. The pipeline's
  connectors fill padding with learnable registers and hand the transformer an all-ones mask, so encoded prompts
  have no zero row and nothing is masked - exactly the pipeline's call; the null condition (all zeros) masks every
  token, which over identical (zero) keys is the same uniform attention as masking none. Labels pick rows of a
  prompt bank (``num_prompts``, as for the other diffusers backbones).
* ``feature_indices``: the chosen blocks' **video** tokens as ``(B, D, F' h, w)`` maps (frames stacked along the
  height), for discriminator heads.

Guidance is ``LTX2Pipeline``'s per stream (``fastgen.methods.multimodal.pipeline_guided_x0``): classifier-free
guidance with each stream's scale (``guidance_scale`` / ``audio_guidance_scale``: ``model.guidance_scale`` and
``model.modality_guidance_scales``), spatio-temporal guidance (STG, Hyung et al. 2024, arXiv 2411.18664: the
self-attention of ``model.stg_blocks`` skipped, ``model.stg_scale``), modality-isolation guidance (the audio-to-video
and video-to-audio attention off, ``model.modality_isolation_scale``) and the guidance rescale of Lin et al. 2024
(``model.guidance_rescale``), all on the denoised estimates. ``perturbed`` is how those extra passes call the model
(its ``spatio_temporal_guidance_blocks`` / ``isolate_modalities``); the plain call passes neither.
PDD's widened heads (``fastgen.networks.heads``): one per stream, ``head_projections()`` - video ``proj_out``
(rows per token ``(channel, p_t, p, p)``, as ``pack_video`` packs them) and audio ``audio_proj_out`` (rows
``(channel, mel bin)``), both channel major, so the unpacking below reads ``heads * C`` channels head-major; there
is no single ``head_projection``. Shard units (FSDP, activation checkpointing, ``torch.compile``): every
transformer block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from fastgen.networks.diffusers_nets import DiffusersBackbone, _tokens_to_map
from fastgen.networks.heads import HeadSpec
from fastgen.networks.modalities import is_multimodal
from fastgen.utils.errors import UsageError

MODALITIES = ("video", "audio")


def pack_video(latents: torch.Tensor, patch: int = 1, patch_t: int = 1) -> torch.Tensor:
    """``(B, C, F, H, W)`` latents as ``(B, F/p_t * H/p * W/p, C p_t p p)`` tokens: over tokens frame, row, column;
    inside a token the channel, then the patch's frame, row and column offsets (``LTX2Pipeline._pack_latents``)."""
    b, c, f, h, w = latents.shape
    patches = latents.reshape(b, c, f // patch_t, patch_t, h // patch, patch, w // patch, patch)
    return patches.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (f // patch_t) * (h // patch) * (w // patch), -1)


def unpack_video(tokens: torch.Tensor, frames: int, height: int, width: int, patch: int = 1,
                 patch_t: int = 1) -> torch.Tensor:
    """``pack_video`` undone: ``(B, f h w, C p_t p p)`` tokens of an ``f x h x w`` patch grid as ``(B, C, f p_t,
    h p, w p)`` latents."""
    b = tokens.shape[0]
    patches = tokens.reshape(b, frames, height, width, -1, patch_t, patch, patch)
    c = patches.shape[4]
    return patches.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, c, frames * patch_t, height * patch, width * patch)


def pack_audio(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, T, M)`` audio latents as ``(B, T, C M)`` tokens, one per latent frame, channel major
    (``LTX2Pipeline._pack_audio_latents`` without patch sizes)."""
    return latents.transpose(1, 2).flatten(2, 3)


def unpack_audio(tokens: torch.Tensor, mel_bins: int) -> torch.Tensor:
    """``pack_audio`` undone: ``(B, T, C M)`` tokens as ``(B, C, T, M)`` latents."""
    return tokens.unflatten(2, (-1, mel_bins)).transpose(1, 2)


class LTX2Transformer(DiffusersBackbone):
    """``LTX2VideoTransformer3DModel`` in the multimodal contract (module docstring): ``forward(x, c_noise,
    condition)`` with ``x`` and ``c_noise`` dicts of ``video`` and ``audio``, returning their velocities.

    ``fps``: the frame rate the video positions are measured at (the pipeline's ``frame_rate / motion_speed``; 24
    by default, as the pipeline's); ``use_cross_timestep``: which time modulates the cross-modal attention (module
    docstring; the pipeline's default, True)."""

    model_class = "LTX2VideoTransformer3DModel"
    weights_subfolder = "transformer"
    text_dim_key = "caption_channels"

    def __init__(self, config: dict[str, Any], fps: float = 24.0, use_cross_timestep: bool = True,
                 prompt_embeddings: str | None = None, num_prompts: int = 0, prompt_tokens: int = 1) -> None:
        for key in ("audio_patch_size", "audio_patch_size_t"):
            if int(config.get(key, 1)) != 1:
                raise UsageError(f"LTX2Transformer: {key}={config[key]} is not supported; LTX2Pipeline packs one "
                                 "audio token per latent frame (patch sizes 1)")
        if not fps > 0:
            raise UsageError(f"LTX2Transformer: fps must be positive, got {fps}")
        super().__init__(config, prompt_embeddings, num_prompts, prompt_tokens)
        self.video_text_dim = self.stream_text_widths(config)[0]
        self.fps = float(fps)
        self.use_cross_timestep = bool(use_cross_timestep)
        self._perturbation: dict[str, Any] = {}  # set only inside ``perturbed``

    @contextmanager
    def perturbed(self, stg_blocks: Sequence[int] = (), isolate_modalities: bool = False) -> Iterator[None]:
        """Calls inside are ``LTX2Pipeline``'s extra guidance passes. ``stg_blocks``: the model's
        ``spatio_temporal_guidance_blocks``, whose self-attention returns its values (STG, arXiv 2411.18664; only a
        model built with ``perturbed_attn``, LTX-2.3's config, reads them: ``check_stg_blocks``). ``isolate_modalities``:
        no audio-to-video / video-to-audio attention (modality-isolation guidance)."""
        before = self._perturbation
        self._perturbation = {"spatio_temporal_guidance_blocks": [int(b) for b in stg_blocks] or None,
                              "isolate_modalities": bool(isolate_modalities)}
        try:
            yield
        finally:
            self._perturbation = before

    def check_stg_blocks(self, blocks: Sequence[int]) -> str | None:
        """Why STG at ``blocks`` would do nothing (one line), or ``None``: diffusers' blocks read the perturbation
        only with ``perturbed_attn`` (LTX-2.3; LTX-2.0's config lacks it and its STG pass equals the conditional one),
        and the blocks must exist."""
        if not getattr(self.model.config, "perturbed_attn", False):
            return ("the network's config has no perturbed_attn (LTX-2.0's): its blocks ignore STG, so the pass would "
                    "equal the conditional one; LTX-2.3's config sets perturbed_attn")
        count = len(self.model.transformer_blocks)
        if not blocks or any(not 0 <= int(b) < count for b in blocks):
            return f"model.stg_blocks {list(blocks)} must name blocks 0..{count - 1}"
        return None

    @staticmethod
    def stream_text_widths(config: dict[str, Any]) -> tuple[int, int]:
        """``(D_v, D_a)``: the widths of the video and audio text embeddings the model takes (module docstring)."""
        defaults = {"caption_channels": 3840, "cross_attention_dim": 4096, "audio_cross_attention_dim": 2048}
        get = lambda key: int(config.get(key, defaults[key]))  # noqa: E731
        if config.get("use_prompt_embeddings", True):
            return get("caption_channels"), get("caption_channels")
        return get("cross_attention_dim"), get("audio_cross_attention_dim")

    @classmethod
    def text_width(cls, config: dict[str, Any]) -> int:
        return sum(cls.stream_text_widths(config))

    def shard_units(self) -> list[torch.nn.Module]:
        return list(self.model.transformer_blocks)

    def head_projections(self) -> dict[str, HeadSpec]:
        """PDD's widened projections, one per stream (module docstring): ``unpack_video`` / ``unpack_audio`` take the
        channel count from the tokens, so a widened projection's ``heads * C`` channels come out head-major."""
        return {"video": HeadSpec("model.proj_out"), "audio": HeadSpec("model.audio_proj_out")}

    @staticmethod
    def text_mask(text: torch.Tensor) -> torch.Tensor:
        """``(B, T)``: 1 for a prompt's own tokens, 0 for all-zero rows (padding, or the null condition)."""
        return text.ne(0).any(dim=-1).to(torch.int64)

    def _streams(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The video and audio latents of ``x``, checked against the model's patches and widths (one-line errors)."""
        if not is_multimodal(x) or set(x) != set(MODALITIES):
            found = sorted(x) if is_multimodal(x) else f"a {type(x).__name__}"
            raise ValueError(f"LTX2Transformer takes a dict of {list(MODALITIES)} latents (model.modality_shapes); "
                             f"got {found}")
        video, audio = x["video"], x["audio"]
        config = self.model.config
        if video.dim() != 5 or audio.dim() != 4:
            raise ValueError(f"LTX2Transformer: video latents are (B, C, F, H, W) and audio latents (B, C, T, M); got "
                             f"{tuple(video.shape)} and {tuple(audio.shape)}")
        p, p_t = config.patch_size, config.patch_size_t
        if video.shape[2] % p_t or video.shape[3] % p or video.shape[4] % p:
            raise ValueError(f"LTX2Transformer patches video latents {p_t}x{p}x{p}: frames, height and width must be "
                             f"multiples, got {tuple(video.shape[2:])}")
        if video.shape[1] * p_t * p * p != config.in_channels:
            raise ValueError(f"LTX2Transformer: {video.shape[1]} video latent channels in {p_t}x{p}x{p} patches do "
                             f"not make the model's in_channels {config.in_channels}")
        if audio.shape[1] * audio.shape[3] != config.audio_in_channels:
            raise ValueError(f"LTX2Transformer: audio latents of {audio.shape[1]} channels x {audio.shape[3]} mel "
                             f"bins do not make the model's audio_in_channels {config.audio_in_channels}")
        return video, audio

    def _call(self, x: Any, c_noise: Any, text: torch.Tensor) -> dict[str, torch.Tensor]:
        video, audio = self._streams(x)
        if not is_multimodal(c_noise) or set(c_noise) != set(MODALITIES):
            raise ValueError(f"LTX2Transformer takes one time per modality: c_noise must be a dict of {list(MODALITIES)}")
        config = self.model.config
        p, p_t = config.patch_size, config.patch_size_t
        _, _, frames, height, width = video.shape
        scale = float(config.timestep_scale_multiplier)
        t_video = (c_noise["video"] * scale).to(video.dtype)
        t_audio = (c_noise["audio"] * scale).to(audio.dtype)
        mask = self.text_mask(text)
        out_video, out_audio = self.model(
            hidden_states=pack_video(video, p, p_t), audio_hidden_states=pack_audio(audio),
            encoder_hidden_states=text[..., : self.video_text_dim], audio_encoder_hidden_states=text[..., self.video_text_dim:],
            timestep=t_video, audio_timestep=t_audio, sigma=t_video, audio_sigma=t_audio,
            encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=frames, height=height,
            width=width, fps=self.fps, audio_num_frames=audio.shape[2], use_cross_timestep=self.use_cross_timestep,
            return_dict=False, **self._perturbation,
        )
        return {"video": unpack_video(out_video, frames // p_t, height // p, width // p, p, p_t),
                "audio": unpack_audio(out_audio, audio.shape[3])}

    def _feature_map(self, output: Any, x: Any) -> torch.Tensor:
        video = x["video"]  # every block returns (video tokens, audio tokens)
        p, p_t = self.model.config.patch_size, self.model.config.patch_size_t
        return _tokens_to_map(output[0], (video.shape[2] // p_t) * (video.shape[3] // p), video.shape[4] // p)


__all__ = ["LTX2Transformer", "MODALITIES", "pack_audio", "pack_video", "unpack_audio", "unpack_video"]
