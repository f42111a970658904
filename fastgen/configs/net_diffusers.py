"""Network configs for the diffusers-backed backbones (``fastgen.networks.diffusers_nets``; needs
``pip install 'fastgen[diffusers]'``), each with the noise schedule its model was trained with.

The architecture dicts are the models' published ``config.json`` entries, so a recipe sizes (``fastgen dryrun``)
and builds on the meta device without the weights; the weights come from ``model.pretrained_model_path`` when a
run starts. The ``TINY_*`` dicts are the same classes at toy size, for tests and CPU smoke runs on digits
(1-channel 8x8 "latents")::

    config.model.net = flux_transformer(TINY_FLUX, num_prompts=10)   # labels 0..9 pick 10 stand-in prompts
    config.model.net = sd_unet(SD15_UNET)                             # + model.pretrained_model_path=/weights/sd15
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import flow_schedule

#: Stable Diffusion 1.5's U-Net (``unet/config.json``): 859,520,964 parameters.
SD15_UNET: dict[str, Any] = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
    "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "norm_num_groups": 32, "flip_sin_to_cos": True, "freq_shift": 0,
}

#: SDXL 1.0 base's U-Net (``unet/config.json``): text-time added conditioning (pooled 1280 + 6 x 256 time ids).
SDXL_UNET: dict[str, Any] = {
    "sample_size": 128, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
    "block_out_channels": [320, 640, 1280], "attention_head_dim": [5, 10, 20], "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "transformer_layers_per_block": [1, 2, 10], "use_linear_projection": True, "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64, "addition_time_embed_dim": 256, "projection_class_embeddings_input_dim": 2816,
    "norm_num_groups": 32, "flip_sin_to_cos": True, "freq_shift": 0,
}

#: FLUX.1-dev's transformer (``transformer/config.json``): 19 double-stream and 38 single-stream blocks.
FLUX1_DEV: dict[str, Any] = {
    "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
    "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
    "axes_dims_rope": [16, 56, 56],
}

#: Wan 2.1 T2V 1.3B's transformer (``transformer/config.json``).
WAN21_T2V_1_3B: dict[str, Any] = {
    "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16,
    "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30,
    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024,
}

#: Qwen-Image's transformer (``Qwen/Qwen-Image``, ``transformer/config.json``): 60 double-stream blocks, 3072 wide
#: (24 heads of 128), Qwen2.5-VL-7B's 3584-wide text states; 20,430,401,088 parameters.
QWEN_IMAGE: dict[str, Any] = {
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
    "num_attention_heads": 24, "joint_attention_dim": 3584, "guidance_embeds": False, "axes_dims_rope": [16, 56, 56],
}
#: Qwen-Image's ``scheduler/scheduler_config.json`` (``FlowMatchEulerDiscreteScheduler``): the resolution-dependent
#: ("dynamic", exponential) shift from the image's token count, and the grid's last time stretched to 0.02.
QWEN_IMAGE_SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 256, "max_image_seq_len": 8192, "base_shift": 0.5, "max_shift": 0.9, "shift_terminal": 0.02,
}

#: CogVideoX-5b's transformer (``THUDM/CogVideoX-5b``, ``transformer/config.json``): 42 blocks, 3072 wide (48 heads of
#: 64), T5-XXL's 4096-wide states of 226 tokens, 3-D rotary positions; trained on 49 frames of 480x720
#: (13x60x90 latents). Checked against diffusers' ``scripts/convert_cogvideox_to_diffusers.py`` (huggingface/diffusers:
#: its version-1.0 sizes and the 5b / 2b values its arguments document), ``CogVideoXTransformer3DModel``'s defaults
#: for the rest.
COGVIDEOX_5B: dict[str, Any] = {
    "num_attention_heads": 48, "attention_head_dim": 64, "in_channels": 16, "out_channels": 16, "flip_sin_to_cos": True,
    "freq_shift": 0, "time_embed_dim": 512, "text_embed_dim": 4096, "num_layers": 42, "dropout": 0.0,
    "attention_bias": True, "sample_width": 90, "sample_height": 60, "sample_frames": 49, "patch_size": 2,
    "temporal_compression_ratio": 4, "max_text_seq_length": 226, "activation_fn": "gelu-approximate",
    "timestep_activation_fn": "silu", "norm_elementwise_affine": True, "norm_eps": 1e-5,
    "spatial_interpolation_scale": 1.875, "temporal_interpolation_scale": 1.0,
    "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False,
}
#: CogVideoX-2b's transformer: 30 blocks, 1920 wide (30 heads of 64), sincos positions instead of rotary ones.
COGVIDEOX_2B: dict[str, Any] = {**COGVIDEOX_5B, "num_attention_heads": 30, "num_layers": 30,
                                "use_rotary_positional_embeddings": False}
#: The ``scheduler/scheduler_config.json`` entries of CogVideoX-5b (``CogVideoXDDIMScheduler``) that define its
#: training schedule: scaled-linear betas, v prediction, zero terminal SNR, no SNR shift (2b: ``snr_shift_scale``
#: 3.0, ``COGVIDEOX_2B_SCHEDULER``); ``timestep_spacing="trailing"`` is the grid ``DiscreteVPScheduler`` samples. The
#: same values as the scheduler config that conversion script writes.
COGVIDEOX_5B_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "prediction_type": "v_prediction", "rescale_betas_zero_snr": True, "snr_shift_scale": 1.0,
}
COGVIDEOX_2B_SCHEDULER: dict[str, Any] = {**COGVIDEOX_5B_SCHEDULER, "snr_shift_scale": 3.0}

# Toy sizes of the same classes for 1-channel 8x8 inputs (digits).
TINY_SD_UNET: dict[str, Any] = {
    "sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1, "block_out_channels": [16, 32],
    "attention_head_dim": 4, "cross_attention_dim": 16, "norm_num_groups": 8,
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
}
TINY_SDXL_UNET: dict[str, Any] = {
    "sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1, "block_out_channels": [16, 32],
    "attention_head_dim": 4, "cross_attention_dim": 16, "norm_num_groups": 8,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"], "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
    "addition_embed_type": "text_time", "addition_time_embed_dim": 4, "projection_class_embeddings_input_dim": 32,
}
TINY_FLUX: dict[str, Any] = {
    "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 16, "pooled_projection_dim": 8, "guidance_embeds": False,
    "axes_dims_rope": [2, 2, 4],
}
TINY_QWEN_IMAGE: dict[str, Any] = {
    "patch_size": 2, "in_channels": 4, "out_channels": 1, "num_layers": 2, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 16, "axes_dims_rope": [2, 2, 4],
}
#: A small Wan for pixel-space moving digits (1 channel, 8 frames of 8x16; ``Digits/config_sft_wan_moving_digits``).
WAN_MOVING_DIGITS: dict[str, Any] = {
    "patch_size": [1, 2, 2], "num_attention_heads": 4, "attention_head_dim": 16, "in_channels": 1, "out_channels": 1,
    "text_dim": 16, "freq_dim": 64, "ffn_dim": 256, "num_layers": 4, "rope_max_seq_len": 32,
}
#: CogVideoX at toy size: 1 channel, 8x8 latents of one frame, rotary positions as CogVideoX-5b (the sincos ones of
#: 2b: ``"use_rotary_positional_embeddings": False``), 8 text tokens of width 16; heads of 16 (the rotary split
#: gives each spatial axis 3/8 of a head, which must be even).
TINY_COGVIDEOX: dict[str, Any] = {
    "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 1, "out_channels": 1, "time_embed_dim": 16,
    "text_embed_dim": 16, "num_layers": 2, "sample_width": 8, "sample_height": 8, "sample_frames": 1, "patch_size": 2,
    "temporal_compression_ratio": 2, "max_text_seq_length": 8, "use_rotary_positional_embeddings": True,
}
TINY_WAN: dict[str, Any] = {
    "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 8, "in_channels": 1, "out_channels": 1,
    "text_dim": 16, "freq_dim": 32, "ffn_dim": 32, "num_layers": 2, "rope_max_seq_len": 32,
}


def sd_schedule(prediction_type: str = "eps") -> DictConfig:
    """Stable Diffusion's DDPM schedule: 1000 steps, scaled-linear betas 0.00085 to 0.012."""
    return LazyCall("fastgen.networks.noise_schedules.DiscreteVPScheduler")(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        prediction_type=prediction_type,
    )


def _wrapped(backbone: DictConfig, schedule: DictConfig) -> DictConfig:
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(backbone=backbone, noise_scheduler=schedule)


def sd_unet(config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
            prompt_tokens: int = 1, schedule: DictConfig | None = None) -> DictConfig:
    """A ``UNet2DConditionModel`` on SD's discrete VP schedule (epsilon prediction unless ``schedule`` says)."""
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.SDUNet")(
        config=dict(config), prompt_embeddings=prompt_embeddings, num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), schedule if schedule is not None else sd_schedule())


def sdxl_unet(config: dict[str, Any], vae_scale_factor: int = 8, prompt_embeddings: str | None = None,
              num_prompts: int = 0, prompt_tokens: int = 1, schedule: DictConfig | None = None) -> DictConfig:
    """SDXL's ``UNet2DConditionModel`` on SD's discrete VP schedule (SDXL keeps SD's scaled-linear betas)."""
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.SDXLUNet")(
        config=dict(config), vae_scale_factor=vae_scale_factor, prompt_embeddings=prompt_embeddings,
        num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), schedule if schedule is not None else sd_schedule())


def flux_transformer(config: dict[str, Any], guidance: float = 3.5, prompt_embeddings: str | None = None,
                     num_prompts: int = 0, prompt_tokens: int = 1, shift: float = 3.0) -> DictConfig:
    """A ``FluxTransformer2DModel`` on rectified flow: logit-normal training times (Esser et al. 2024, Eq. 19) and
    sampling times shifted by ``shift`` (Eq. 23; FLUX.1-dev's pipeline shifts by about 3 at 1024x1024)."""
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.FluxTransformer")(
        config=dict(config), guidance=guidance, prompt_embeddings=prompt_embeddings, num_prompts=num_prompts,
        prompt_tokens=prompt_tokens,
    ), flow_schedule(shift=shift))


def wan_transformer(config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
                    prompt_tokens: int = 1, shift: float = 5.0) -> DictConfig:
    """A ``WanTransformer3DModel`` on rectified flow, sampling shift 5 (Wan 2.1's text-to-video default)."""
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.WanTransformer")(
        config=dict(config), prompt_embeddings=prompt_embeddings, num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), flow_schedule(shift=shift))


def causal_wan_transformer(config: dict[str, Any], chunk_frames: int = 1, causal: bool = True,
                           attention_backend: str = "auto", prompt_embeddings: str | None = None, num_prompts: int = 0,
                           prompt_tokens: int = 1, shift: float = 5.0) -> DictConfig:
    """``wan_transformer`` made block-causal over chunks of ``chunk_frames`` (latent) frames, with tagged KV caches
    (``fastgen.networks.causal_wan.CausalWanTransformer``; CausVid, Yin et al. 2025, Sec. 3.1): the student of
    the causal video methods. ``causal=False`` is the stock bidirectional Wan with the same parameter names."""
    return _wrapped(LazyCall("fastgen.networks.causal_wan.CausalWanTransformer")(
        config=dict(config), chunk_frames=chunk_frames, causal=causal, attention_backend=attention_backend,
        prompt_embeddings=prompt_embeddings, num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), flow_schedule(shift=shift))


def qwenimage_shift(image_seq_len: int, scheduler: dict[str, Any] | None = None) -> float:
    """The time shift ``QwenImagePipeline`` samples with for ``image_seq_len`` packed latent tokens (``(H/2)(W/2)``;
    4096 at 1024x1024): ``exp(mu)`` with ``mu`` linear in the token count between ``(base_image_seq_len,
    base_shift)`` and ``(max_image_seq_len, max_shift)`` (the pipeline's ``calculate_shift``). The scheduler's
    exponential dynamic shift ``e^mu / (e^mu + 1/t - 1)`` is exactly the static shift ``s t / (1 + (s - 1) t)``
    with ``s = e^mu``, and its default grid ``linspace(1, 1/N, N)`` is the uniform one."""
    config = {**QWEN_IMAGE_SCHEDULER, **(scheduler or {})}
    slope = (config["max_shift"] - config["base_shift"]) / (config["max_image_seq_len"] - config["base_image_seq_len"])
    mu = config["base_shift"] + slope * (image_seq_len - config["base_image_seq_len"])
    return math.exp(mu)


def qwenimage_transformer(config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
                          prompt_tokens: int = 1, image_seq_len: int = 4096,
                          scheduler: dict[str, Any] | None = None) -> DictConfig:
    """A ``QwenImageTransformer2DModel`` on rectified flow: logit-normal training times; sampling times as
    Qwen-Image's pipeline sets them for latents of ``image_seq_len`` packed tokens - its dynamic shift
    (``qwenimage_shift``) and its scheduler's ``shift_terminal`` (``scheduler``: the pipeline's scheduler config,
    default ``QWEN_IMAGE_SCHEDULER``). A run samples at the latent size it trains on: pass that size's
    ``(H/2)(W/2)``."""
    settings = {**QWEN_IMAGE_SCHEDULER, **(scheduler or {})}
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.QwenImageTransformer")(
        config=dict(config), prompt_embeddings=prompt_embeddings, num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), flow_schedule(shift=qwenimage_shift(image_seq_len, settings), shift_terminal=settings.get("shift_terminal")))


def cogvideox_schedule(scheduler: dict[str, Any] | None = None) -> DictConfig:
    """CogVideoX's discrete VP schedule from its ``scheduler_config.json`` entries (default ``COGVIDEOX_5B_SCHEDULER``):
    what ``CogVideoXDDIMScheduler`` computes - betas, the SNR shift, the zero-terminal-SNR rescale - and v prediction."""
    settings = {**COGVIDEOX_5B_SCHEDULER, **(scheduler or {})}
    prediction = {"v_prediction": "v", "epsilon": "eps"}.get(settings["prediction_type"])
    if prediction is None:
        raise ValueError(f"prediction_type {settings['prediction_type']!r}: CogVideoX predicts v_prediction or epsilon")
    return LazyCall("fastgen.networks.noise_schedules.DiscreteVPScheduler")(
        num_train_timesteps=settings["num_train_timesteps"], beta_start=settings["beta_start"],
        beta_end=settings["beta_end"], beta_schedule=settings["beta_schedule"], prediction_type=prediction,
        snr_shift_scale=settings["snr_shift_scale"], rescale_betas_zero_snr=settings["rescale_betas_zero_snr"],
    )


def cogvideox_transformer(config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
                          prompt_tokens: int | None = None, scheduler: dict[str, Any] | None = None) -> DictConfig:
    """A ``CogVideoXTransformer3DModel`` on CogVideoX's schedule (``cogvideox_schedule``; ``scheduler``: its
    ``scheduler_config.json`` entries, default CogVideoX-5b's - pass ``COGVIDEOX_2B_SCHEDULER`` for 2b). The
    prompt bank's rows are ``max_text_seq_length`` (226) tokens unless ``prompt_tokens`` says."""
    return _wrapped(LazyCall("fastgen.networks.diffusers_nets.CogVideoXTransformer")(
        config=dict(config), prompt_embeddings=prompt_embeddings, num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    ), cogvideox_schedule(scheduler))
