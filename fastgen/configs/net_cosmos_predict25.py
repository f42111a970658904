"""Network configs for Cosmos Predict 2.5 (``fastgen.networks.cosmos_predict25``): ``CosmosTransformer3DModel``
with its Qwen2.5-VL text projection, on rectified flow (``RectifiedFlowScheduler``). Needs ``pip install
'fastgen[diffusers]'``.

The architecture dicts are the "Cosmos-2.5-Predict-Base-2B" and "-14B" entries of diffusers' conversion script
(huggingface/diffusers, ``scripts/convert_cosmos_to_diffusers.py``, ``TRANSFORMER_CONFIGS``), field for field - the
config that script writes to ``transformer/config.json`` for the checkpoints of ``nvidia/Cosmos-Predict2.5-2B`` and
``-14B``; the released ``config.json`` files themselves could not be downloaded here. Predict2-2B's blocks (28 of 16
heads of 128, 2048 wide, adaptive LayerNorm LoRA of 256, ``1 x 2 x 2`` patches of 16 channels, the padding-mask
channel), the condition-mask channel (``in_channels`` 17), ``rope_scale`` ``(1, 3, 3)``, the projection of the
100,352-wide Qwen2.5-VL-7B states (28 layers x 3584) to the blocks' 1024-wide text (``use_crossattn_projection``,
``crossattn_proj_in_channels``, ``encoder_hidden_states_channels``); ``extra_pos_embed_type`` None although the source
config asks for learnable positions, because the checkpoints hold no weights for them (the script's own note). The 2B
RoPE ratios and text projection also match the training experiment of the released pre-trained checkpoint in
nvidia-cosmos/cosmos-predict2.5 (named in ``cosmos_predict2/_src/imaginaire/utils/checkpoint_db.py``, defined in
``cosmos_predict2/_src/predict2/configs/video2world/experiment/reason_embeddings/model_2B_reason_1p1_rectified_flow.py``),
and so does the schedule: training ``shift`` 5 with no dynamic shift, logit-normal training times (a sigmoid of a
standard normal, mean 0 and std 1: ``cosmos_predict2/_src/predict2/schedulers/rectified_flow.py``).
``model.pretrained_model_path`` replaces the architecture dict with the folder's own ``transformer/config.json`` when
a run starts (``adopt_folder_architecture``).


**The shift and exports.** ``Cosmos2_5_PredictBasePipeline`` takes no ``sigmas``; fastgen's export writes a
``FlowMatchEulerDiscreteScheduler`` (no shift, ``shift_terminal`` = the last time) that reproduces a uniform grid
from 1 (``fastgen.pipelines.schedulers``, as for Wan). A network sampled on a shifted grid (a teacher or SFT model
with ``shift`` 5, a student whose times are not uniform) trains and samples in fastgen, but its export is refused
in one line; ``shift=1.0`` (``cosmos_predict25_transformer(..., shift=1.0)``) gives exportable ODE grids.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net_cosmos_predict2 import COSMOS_PREDICT2_LATENTS, cosmos_predict2_latent_shape

#: Cosmos-Predict2.5-2B's transformer (``nvidia/Cosmos-Predict2.5-2B``, as diffusers converts it): Predict2-2B's
#: blocks reading a condition mask, with the 100,352 -> 1024 projection of Qwen2.5-VL-7B's states (module docstring).
COSMOS_PREDICT25_2B: dict[str, Any] = {
    "in_channels": 17, "out_channels": 16, "num_attention_heads": 16, "attention_head_dim": 128, "num_layers": 28,
    "mlp_ratio": 4.0, "text_embed_dim": 1024, "adaln_lora_dim": 256, "max_size": [128, 240, 240],
    "patch_size": [1, 2, 2], "rope_scale": [1.0, 3.0, 3.0], "concat_padding_mask": True,
    "extra_pos_embed_type": None, "use_crossattn_projection": True, "crossattn_proj_in_channels": 100352,
    "encoder_hidden_states_channels": 1024,
}
#: Cosmos-Predict2.5-14B's: 36 blocks, 5120 wide (40 heads of 128), the same text projection.
COSMOS_PREDICT25_14B: dict[str, Any] = {**COSMOS_PREDICT25_2B, "num_attention_heads": 40, "num_layers": 36}
#: Wan 2.1's VAE, as Predict2's: 16 channels, 4x in time, 8x in space.
COSMOS_PREDICT25_LATENTS: dict[str, int] = dict(COSMOS_PREDICT2_LATENTS)
#: the Predict 2.5 training shift (no dynamic shift)
COSMOS_PREDICT25_SHIFT = 5.0

#: Predict 2.5 at toy size for 1-channel 8x8 digits and the tiny test pipelines: Predict2's toy blocks (2 of 2 heads
#: of 12, 16-wide text) with the condition-mask channel and the text projection from the toy Qwen2.5-VL's states
#: (2 layers of 16: 32 wide; ``tests/tiny_cosmos_predict25.py``).
TINY_COSMOS_PREDICT25: dict[str, Any] = {
    "in_channels": 2, "out_channels": 1, "num_attention_heads": 2, "attention_head_dim": 12, "num_layers": 2,
    "mlp_ratio": 2.0, "text_embed_dim": 16, "adaln_lora_dim": 8, "max_size": [8, 16, 16], "patch_size": [1, 2, 2],
    "rope_scale": [1.0, 2.0, 2.0], "concat_padding_mask": True, "extra_pos_embed_type": None,
    "use_crossattn_projection": True, "crossattn_proj_in_channels": 32, "encoder_hidden_states_channels": 16,
}


def cosmos_predict25_latent_shape(num_frames: int, height: int, width: int) -> list[int]:
    """The latent shape ``Cosmos2_5_PredictBasePipeline`` samples: ``(16, (F - 1) / 4 + 1, H / 8, W / 8)``."""
    shape = cosmos_predict2_latent_shape(num_frames, height, width, COSMOS_PREDICT25_LATENTS)
    return shape if num_frames > 1 else [shape[0], 1, *shape[1:]]


def cosmos_predict25_schedule(shift: float = COSMOS_PREDICT25_SHIFT, logit_mean: float = 0.0,
                              logit_std: float = 1.0) -> DictConfig:
    """``RectifiedFlowScheduler``: ``x_t = (1 - t) x0 + t eps``, the network at ``c_noise = t`` (the pipeline's
    ``timestep = sigma``), sampling times shifted by ``shift``, logit-normal training times."""
    return LazyCall("fastgen.networks.noise_schedules.RectifiedFlowScheduler")(
        logit_mean=logit_mean, logit_std=logit_std, shift=shift)


def cosmos_predict25_transformer(config: dict[str, Any], text_tokens: int = 512, prompt_embeddings: str | None = None,
                                 num_prompts: int = 0, prompt_tokens: int | None = None,
                                 shift: float = COSMOS_PREDICT25_SHIFT) -> DictConfig:
    """A Predict 2.5 ``CosmosTransformer3DModel`` (``fastgen.networks.cosmos_predict25.CosmosPredict25Transformer``)
    on ``cosmos_predict25_schedule(shift)``. ``text_tokens``: the rows conditions are zero-padded to (512, the
    pipeline's ``max_sequence_length``); the prompt bank's rows are that long unless ``prompt_tokens`` says."""
    backbone = LazyCall("fastgen.networks.cosmos_predict25.CosmosPredict25Transformer")(
        config=dict(config), text_tokens=text_tokens, prompt_embeddings=prompt_embeddings, num_prompts=num_prompts,
        prompt_tokens=prompt_tokens,
    )
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(backbone=backbone,
                                                                   noise_scheduler=cosmos_predict25_schedule(shift))


__all__ = ["COSMOS_PREDICT25_14B", "COSMOS_PREDICT25_2B", "COSMOS_PREDICT25_LATENTS", "COSMOS_PREDICT25_SHIFT",
           "TINY_COSMOS_PREDICT25", "cosmos_predict25_latent_shape", "cosmos_predict25_schedule",
           "cosmos_predict25_transformer"]
