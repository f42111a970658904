"""Network configs for Cosmos Predict2 (``fastgen.networks.cosmos_predict2``): ``CosmosTransformer3DModel`` on its
EDM-time rectified-flow schedule (``EDMFlowScheduler``). Needs ``pip install 'fastgen[diffusers]'``.

The architecture dicts are the "Cosmos-2.0-Diffusion-{2B,14B}-{Text2Image,Video2World}" entries of diffusers'
conversion script (huggingface/diffusers, ``scripts/convert_cosmos_to_diffusers.py``, ``TRANSFORMER_CONFIGS``), field
for field, the config that script writes to each ``transformer/config.json``; all four also agree with
nvidia-cosmos/cosmos-predict2's own network configs (``cosmos_predict2/configs/base/config_text2image.py`` and
``config_video2world.py``: width, depth, heads, adaptive-LayerNorm LoRA, RoPE extrapolation ratios). 2B: 28 blocks of
16 heads of 128; 14B: 36 blocks of 40 heads of 128; T5-11B's 1024-wide text, the adaptive-LayerNorm LoRA of 256,
``1 x 2 x 2`` patches of 16 latent channels, the padding-mask channel, the video-to-world models' extra condition-mask
channel (``in_channels`` 17), no learnable positions (``extra_pos_embed_type`` None: the source configs have no
per-block absolute embedding). ``rope_scale`` (time, height, width): ``(1, 4, 4)`` for both text-to-image models,
``(1, 3, 3)`` for 2B video-to-world and ``(20/24, 2, 2)`` for 14B video-to-world; it and ``max_size`` set no
parameter. The released ``config.json`` files themselves could not be downloaded here; ``model.pretrained_model_path``
replaces the whole dict with the folder's own ``config.json`` when a run starts (``adopt_folder_architecture``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall

#: Cosmos-Predict2-2B-Text2Image's transformer (``nvidia/Cosmos-Predict2-2B-Text2Image``): 28 blocks, 2048 wide.
COSMOS_PREDICT2_2B_T2I: dict[str, Any] = {
    "in_channels": 16, "out_channels": 16, "num_attention_heads": 16, "attention_head_dim": 128, "num_layers": 28,
    "mlp_ratio": 4.0, "text_embed_dim": 1024, "adaln_lora_dim": 256, "max_size": [128, 240, 240],
    "patch_size": [1, 2, 2], "rope_scale": [1.0, 4.0, 4.0], "concat_padding_mask": True,
    "extra_pos_embed_type": None,
}
#: Cosmos-Predict2-14B-Text2Image's transformer: 36 blocks, 5120 wide (40 heads of 128).
COSMOS_PREDICT2_14B_T2I: dict[str, Any] = {**COSMOS_PREDICT2_2B_T2I, "num_attention_heads": 40, "num_layers": 36}
#: The Video2World models: the same transformers reading a condition-mask channel besides the latents, with their own
#: RoPE extrapolation (2B: 3 in space; 14B: 2 in space and 20/24 in time).
COSMOS_PREDICT2_2B_V2W: dict[str, Any] = {**COSMOS_PREDICT2_2B_T2I, "in_channels": 17, "rope_scale": [1.0, 3.0, 3.0]}
COSMOS_PREDICT2_14B_V2W: dict[str, Any] = {**COSMOS_PREDICT2_14B_T2I, "in_channels": 17,
                                           "rope_scale": [20.0 / 24.0, 2.0, 2.0]}
#: The pipelines' EDM constants (``Cosmos2TextToImagePipeline.__init__`` registers them into its scheduler).
COSMOS_PREDICT2_SIGMAS: dict[str, float] = {"sigma_min": 0.002, "sigma_max": 80.0, "sigma_data": 1.0}
#: Wan 2.1's VAE: 16 channels, 4x in time, 8x in space; for ``cosmos_predict2_latent_shape``.
COSMOS_PREDICT2_LATENTS: dict[str, int] = {"channels": 16, "temporal": 4, "spatial": 8}

#: Cosmos Predict2 at toy size for 1-channel 8x8 digits: 2 blocks 24 wide (2 heads of 12: the rotary split gives
#: frames, rows and columns 4 channels of a head each - its NTK factor needs more than 2), 16-wide text, the
#: padding-mask channel, learnable positions (so that the tests cover them).
TINY_COSMOS_PREDICT2: dict[str, Any] = {
    "in_channels": 1, "out_channels": 1, "num_attention_heads": 2, "attention_head_dim": 12, "num_layers": 2,
    "mlp_ratio": 2.0, "text_embed_dim": 16, "adaln_lora_dim": 8, "max_size": [8, 16, 16], "patch_size": [1, 2, 2],
    "rope_scale": [1.0, 2.0, 2.0], "concat_padding_mask": True, "extra_pos_embed_type": "learnable",
}
#: Cosmos Predict2's Video2World architecture for 8-frame 8x16 moving digits in pixel space (one channel and the
#: condition mask): 4 blocks of 4 heads of 16, MLP ratio 4, 16-wide text (the labels' prompt bank); 307,520 parameters.
COSMOS_PREDICT2_V2W_MOVING_DIGITS: dict[str, Any] = {
    "in_channels": 2, "out_channels": 1, "num_attention_heads": 4, "attention_head_dim": 16, "num_layers": 4,
    "mlp_ratio": 4.0, "text_embed_dim": 16, "adaln_lora_dim": 16, "max_size": [8, 16, 16], "patch_size": [1, 2, 2],
    "rope_scale": [1.0, 2.0, 2.0], "concat_padding_mask": True, "extra_pos_embed_type": None,
}
#: The same as a video-to-world model (a condition-mask channel) without learnable positions.
TINY_COSMOS_PREDICT2_V2W: dict[str, Any] = {**TINY_COSMOS_PREDICT2, "in_channels": 2, "extra_pos_embed_type": None}


def cosmos_predict2_latent_shape(num_frames: int, height: int, width: int,
                                 latents: dict[str, int] | None = None) -> list[int]:
    """The latent shape the pipelines sample for ``num_frames`` frames of ``height x width`` pixels: ``(C, (F - 1) / 4
    + 1, H / 8, W / 8)``; an image (``num_frames = 1``, the text-to-image pipeline) is ``(C, H / 8, W / 8)``."""
    s = {**COSMOS_PREDICT2_LATENTS, **(latents or {})}
    spatial = [height // s["spatial"], width // s["spatial"]]
    if num_frames == 1:
        return [s["channels"], *spatial]
    return [s["channels"], (num_frames - 1) // s["temporal"] + 1, *spatial]


def cosmos_predict2_schedule(P_mean: float = 0.0, P_std: float = 1.0) -> DictConfig:  # noqa: N803 - paper names
    """``EDMFlowScheduler`` with the pipelines' ``sigma_min`` 0.002, ``sigma_max`` 80, ``sigma_data`` 1 and Karras'
    ``rho`` 7 (what their scheduler's ``use_karras_sigmas`` grid uses). ``P_mean`` / ``P_std``: the training
    distribution of ``ln sigma`` (0 and 1: a logit-normal flow time; as nvidia-cosmos/cosmos-predict2's
    ``RectifiedFlowAB2Scheduler.sample_sigma`` draws it, ``cosmos_predict2/schedulers/rectified_flow_scheduler.py``)."""
    return LazyCall("fastgen.networks.noise_schedules.EDMFlowScheduler")(
        **COSMOS_PREDICT2_SIGMAS, P_mean=P_mean, P_std=P_std, rho=7.0,
    )


def cosmos_predict2_transformer(config: dict[str, Any], fps: float = 16.0, text_tokens: int = 512,
                                prompt_embeddings: str | None = None, num_prompts: int = 0,
                                prompt_tokens: int | None = None) -> DictConfig:
    """A ``CosmosTransformer3DModel`` (``fastgen.networks.cosmos_predict2.CosmosPredict2Transformer``) on
    ``cosmos_predict2_schedule``. ``text_tokens``: the length conditions are zero-padded to (512, the pipelines');
    the prompt bank's rows are that long unless ``prompt_tokens`` says."""
    backbone = LazyCall("fastgen.networks.cosmos_predict2.CosmosPredict2Transformer")(
        config=dict(config), fps=fps, text_tokens=text_tokens, prompt_embeddings=prompt_embeddings,
        num_prompts=num_prompts, prompt_tokens=prompt_tokens,
    )
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(backbone=backbone,
                                                                   noise_scheduler=cosmos_predict2_schedule())


__all__ = ["COSMOS_PREDICT2_V2W_MOVING_DIGITS", "COSMOS_PREDICT2_14B_T2I", "COSMOS_PREDICT2_14B_V2W", "COSMOS_PREDICT2_2B_T2I", "COSMOS_PREDICT2_2B_V2W",
           "COSMOS_PREDICT2_LATENTS", "COSMOS_PREDICT2_SIGMAS", "TINY_COSMOS_PREDICT2", "TINY_COSMOS_PREDICT2_V2W",
           "cosmos_predict2_latent_shape", "cosmos_predict2_schedule", "cosmos_predict2_transformer"]
