"""Network configs for LTX-2 (``fastgen.networks.ltx2``; HaCohen et al. 2026): the audio-visual transformer on
rectified flow, sampled at its pipeline's times. Needs ``pip install 'fastgen[diffusers]'``.

A multimodal model: a recipe sets ``model.modality_shapes = {"video": [C, F, H, W], "audio": [C_a, T_a, M_a]}``
(``ltx2_modality_shapes`` derives them from a clip's pixel size, frame count and frame rate as the pipeline does)::

    config.model.net = ltx2_transformer(LTX2_19B, video_seq_len=6144)
    config.model.modality_shapes = ltx2_modality_shapes(512, 768, 121, 24.0)
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import flow_schedule
from fastgen.configs.net_diffusers import qwenimage_shift

#: LTX-2 (19B, ``Lightricks/LTX-2``): every field checked against the ``version == "2.0"`` transformer entry of
#: diffusers' ``scripts/convert_ltx2_to_diffusers.py`` (huggingface/diffusers) - the config its conversion writes to
#: ``transformer/config.json`` - and against the defaults of ltx-core's transformer configurator
#: (Lightricks/LTX-2, ``packages/ltx-core/src/ltx_core/model/transformer/model_configurator.py``): 48 blocks; video
#: 4096 wide (32 heads of 128) over 128-channel latents, audio 2048 wide (32 heads of 64) over 8 channels x 16 mel
#: bins; Gemma-3-12B's 3840-wide states, projected by the transformer itself (LTX-2.0: ``use_prompt_embeddings``),
#: ``rope_type`` "split". The entry's other keys (no gated attention, no cross-attention modulation,
#: ``perturbed_attn`` False, FFN biases) are ``LTX2VideoTransformer3DModel``'s defaults, so they are left out here.
#: Not checkable without the checkpoint: ``cross_attn_timestep_scale_multiplier`` 1000 is the conversion script's
#: value; ltx-core reads its counterpart (``av_ca_timestep_scale_multiplier``) from the checkpoint's metadata and
#: falls back to 1 - it sets no parameter, only the audio-video cross-attention gates' time input.
#: No ``perturbed_attn`` (LTX-2.0's blocks ignore STG, so ``model.stg_scale`` is refused on it; LTX-2.3's sets it).
LTX2_19B: dict[str, Any] = {
    "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
    "attention_head_dim": 128, "cross_attention_dim": 4096, "vae_scale_factors": [8, 32, 32], "pos_embed_max_pos": 20,
    "base_height": 2048, "base_width": 2048, "audio_in_channels": 128, "audio_out_channels": 128,
    "audio_patch_size": 1, "audio_patch_size_t": 1, "audio_num_attention_heads": 32, "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048, "audio_scale_factor": 4, "audio_pos_embed_max_pos": 20,
    "audio_sampling_rate": 16000, "audio_hop_length": 160, "num_layers": 48, "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads", "norm_elementwise_affine": False, "norm_eps": 1e-6, "caption_channels": 3840,
    "attention_bias": True, "attention_out_bias": True, "rope_theta": 10000.0, "rope_double_precision": True,
    "causal_offset": 1, "timestep_scale_multiplier": 1000, "cross_attn_timestep_scale_multiplier": 1000,
    "rope_type": "split",
}
#: LTX-2's ``scheduler/scheduler_config.json`` entries that set its sampling times (``FlowMatchEulerDiscreteScheduler``
#: with the exponential dynamic shift): ``mu`` linear in the video token count between (1024, 0.95) and (4096, 2.05),
#: and the grid's last time stretched to ``shift_terminal`` 0.1 - the scheduler diffusers' conversion script
#: (``scripts/convert_ltx2_to_diffusers.py``) builds for the non-distilled checkpoint (the distilled one: no dynamic
#: shift, no terminal).
LTX2_SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 1024, "max_image_seq_len": 4096, "base_shift": 0.95, "max_shift": 2.05, "shift_terminal": 0.1,
}
#: The VAEs' compressions (LTX-2's video VAE: 8 in time, 32 in space, 128 latent channels; its audio VAE: 4 in time
#: and in mel bins, 8 latent channels over 64 mel bins, 16 kHz with a 160-sample hop), for ``ltx2_modality_shapes``;
#: from the 2.0 video and audio VAE entries of diffusers' ``scripts/convert_ltx2_to_diffusers.py``.
LTX2_LATENTS: dict[str, Any] = {
    "channels": 128, "temporal": 8, "spatial": 32, "audio_channels": 8, "mel_bins": 64, "audio_compression": 4,
    "sample_rate": 16000, "hop_length": 160,
}

#: LTX-2 at toy size around ``tests/tiny_ltx2.py``'s pipeline: 2 video latent channels, 2 audio channels x 4 mel bins,
#: 2 blocks of 2 heads (video 16 wide, audio 8), 16-wide text per stream.
TINY_LTX2: dict[str, Any] = {
    "in_channels": 2, "out_channels": 2, "num_attention_heads": 2, "attention_head_dim": 8, "cross_attention_dim": 16,
    "audio_in_channels": 8, "audio_out_channels": 8, "audio_num_attention_heads": 2, "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8, "num_layers": 2, "caption_channels": 16, "rope_type": "split",
    "vae_scale_factors": [2, 8, 8],
}
#: LTX-2 at toy size for the audio-visual digits (``fastgen.datasets.audio_video_digits``: 1x8x8x16 videos, 1x8x16
#: spectrograms) in pixel space: 2x2 spatial patches (4 channels a token), one audio token per frame (16 bins).
TINY_LTX2_AV_DIGITS: dict[str, Any] = {
    **TINY_LTX2, "in_channels": 4, "out_channels": 4, "patch_size": 2, "audio_in_channels": 16,
    "audio_out_channels": 16, "vae_scale_factors": [1, 1, 1],
}
#: A small LTX-2 that learns the audio-visual digits on a CPU (``LTX2/config_sft_ltx2_av_digits``): 4 blocks, video 4
#: heads x 16 (64 wide), audio 2 heads x 16 (32 wide), the same patching as ``TINY_LTX2_AV_DIGITS``.
LTX2_AV_DIGITS: dict[str, Any] = {
    **TINY_LTX2_AV_DIGITS, "num_attention_heads": 4, "attention_head_dim": 16, "cross_attention_dim": 64,
    "audio_num_attention_heads": 2, "audio_attention_head_dim": 16, "audio_cross_attention_dim": 32, "num_layers": 4,
}


def ltx2_shift(video_seq_len: int, scheduler: dict[str, Any] | None = None) -> float:
    """The time shift ``LTX2Pipeline`` samples with for ``video_seq_len`` video tokens: ``exp(mu)``, ``mu`` from its
    ``calculate_shift`` - the rule Qwen-Image's pipeline uses (``qwenimage_shift``), with LTX-2's constants."""
    return qwenimage_shift(video_seq_len, {**LTX2_SCHEDULER, **(scheduler or {})})


def ltx2_modality_shapes(height: int, width: int, num_frames: int, frame_rate: float,
                         latents: dict[str, Any] | None = None) -> dict[str, list[int]]:
    """The latent shapes ``LTX2Pipeline`` samples for a ``height x width`` clip of ``num_frames`` frames at
    ``frame_rate``: video ``(C, (F - 1) / 8 + 1, H / 32, W / 32)``; audio ``(C_a, round(F / fps * 16000 / 160 / 4),
    M / 4)``."""
    s = {**LTX2_LATENTS, **(latents or {})}
    audio_frames = round(num_frames / frame_rate * s["sample_rate"] / s["hop_length"] / s["audio_compression"])
    return {"video": [s["channels"], (num_frames - 1) // s["temporal"] + 1, height // s["spatial"], width // s["spatial"]],
            "audio": [s["audio_channels"], audio_frames, s["mel_bins"] // s["audio_compression"]]}


def ltx2_transformer(config: dict[str, Any], fps: float = 24.0, use_cross_timestep: bool = True,
                     prompt_embeddings: str | None = None, num_prompts: int = 0, prompt_tokens: int = 1,
                     video_seq_len: int = 6144, scheduler: dict[str, Any] | None = None,
                     logit_mean: float = 0.0, logit_std: float = 1.0) -> DictConfig:
    """An ``LTX2VideoTransformer3DModel`` on rectified flow: logit-normal training times (``logit_mean``,
    ``logit_std``); sampling times as ``LTX2Pipeline`` sets them for ``video_seq_len`` video tokens (6144: its
    default 121 frames of 512x768) - the dynamic shift ``ltx2_shift`` as a static one, and ``shift_terminal``
    (``scheduler``: the pipeline's scheduler config, default ``LTX2_SCHEDULER``). ``fps`` and ``use_cross_timestep``:
    ``fastgen.networks.ltx2.LTX2Transformer``."""
    settings = {**LTX2_SCHEDULER, **(scheduler or {})}
    backbone = LazyCall("fastgen.networks.ltx2.LTX2Transformer")(
        config=dict(config), fps=fps, use_cross_timestep=use_cross_timestep, prompt_embeddings=prompt_embeddings,
        num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    )
    schedule = flow_schedule(logit_mean=logit_mean, logit_std=logit_std, shift=ltx2_shift(video_seq_len, settings),
                             shift_terminal=settings.get("shift_terminal"))
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(backbone=backbone, noise_scheduler=schedule)


__all__ = ["LTX2_19B", "LTX2_AV_DIGITS", "LTX2_LATENTS", "LTX2_SCHEDULER", "TINY_LTX2", "TINY_LTX2_AV_DIGITS",
           "ltx2_modality_shapes",
           "ltx2_shift", "ltx2_transformer"]
