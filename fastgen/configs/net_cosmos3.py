"""Network configs for Cosmos 3 (``fastgen.networks.cosmos3``): ``Cosmos3OmniTransformer`` on rectified flow.
Needs ``pip install 'fastgen[diffusers]'``.

The architecture dicts are checked field by field against NVIDIA/cosmos-framework: the released checkpoints'
model configs (``cosmos_framework/inference/configs/model/Cosmos3-Nano.yaml`` and ``Cosmos3-Super.yaml``), the
Qwen3-VL text configs they build on (``cosmos_framework/model/generator/reasoner/qwen3_vl/configs/
Qwen3-VL-8B-Instruct.json`` and ``Qwen3-VL-32B-Instruct.json``) and its diffusers converter
(``cosmos_framework/inference2/_convert_model_to_diffusers.py``, with ``arch_mapping.py``: which model-config entry
becomes which ``Cosmos3OmniTransformer`` argument); and against diffusers' ``Cosmos3OmniTransformer``
(huggingface/diffusers, ``src/diffusers/models/transformers/transformer_cosmos3.py``; its own conversion script,
``scripts/convert_cosmos3_to_diffusers.py``, was removed from diffusers and survives only in its history). The
released ``transformer/config.json`` itself was not read - no weights or Hub files could be downloaded here;
``model.pretrained_model_path`` replaces the whole dict with the folder's own ``transformer/config.json`` when a run
starts (``adopt_folder_architecture``), so only ``fastgen dryrun`` figures depend on it. The pipeline builds on
Qwen3-VL-8B-Instruct's tokenizer and Wan 2.2 TI2V-5B's VAE (48 latent channels, 16x spatial and 4x temporal
compression).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import flow_schedule

#: Cosmos3-Nano's transformer: a Qwen3-VL-8B text stack twice (understanding + generation streams): 36 layers,
#: 4096 wide, 32 query / 8 key-value heads of 128, SiLU MLPs of 12288, vocabulary 151936, mRoPE sections
#: (24, 20, 20) at theta 5e6 (``Qwen3-VL-8B-Instruct.json``; ``rope_axes_dim`` stands for its ``rope_scaling``'s
#: ``mrope_section``). From ``Cosmos3-Nano.yaml``: 48 latent channels in 2x2 patches (192 a token), fps modulation
#: at base 24, the mRoPE reset and 15000 margin, sound generation on 64 channels (the 48 kHz AVAE, hop 1920: 25
#: latents/s), action generation on 64 channels (``max_action_dim``) with 32 embodiment domains (frozen
#: here: fastgen trains video and sound). ``timestep_scale`` 0.001 is the converter's
#: 1 / ``num_train_timesteps`` (1000) x ``timestep_range`` (1).
COSMOS3_NANO: dict[str, Any] = {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rope_theta": 5000000.0,
    "rope_axes_dim": [24, 20, 20], "rms_norm_eps": 1e-6, "hidden_act": "silu", "qk_norm_for_text": True,
    "latent_channel": 48, "latent_patch_size": 2, "patch_latent_dim": 192, "base_fps": 24,
    "enable_fps_modulation": True, "unified_3d_mrope_reset_spatial_ids": True,
    "unified_3d_mrope_temporal_modality_margin": 15000, "timestep_scale": 0.001, "sound_gen": True, "sound_dim": 64,
    "sound_latent_fps": 25.0, "action_gen": True, "action_dim": 64, "num_embodiment_domains": 32,
}
#: Cosmos3-Super's transformer: a Qwen3-VL-32B text stack twice - 64 layers, 5120 wide, 64 query / 8 key-value
#: heads of 128, MLPs of 25600 (``Qwen3-VL-32B-Instruct.json``); every other field as Nano's (``Cosmos3-Super.yaml``
#: differs from ``Cosmos3-Nano.yaml`` only in the text config, the reasoner it starts from and training settings).
COSMOS3_SUPER: dict[str, Any] = {**COSMOS3_NANO, "hidden_size": 5120, "intermediate_size": 25600,
                                 "num_hidden_layers": 64, "num_attention_heads": 64}
#: The pipeline's scheduler (``UniPCMultistepScheduler``, flow prediction) approximates Cosmos 3's native
#: ``FlowUniPCMultistepScheduler`` with shift 5 (a comment of diffusers' since-removed conversion script); fastgen's
#: sampling grid shifts by it. (The training configs shift by resolution: 3, 5 and 10 at 256, 480 and 720.)
COSMOS3_SHIFT = 5.0
#: The VAE's compression (Wan 2.2 TI2V-5B: 4 in time, 16 in space) and channels, for ``cosmos3_latent_shape``.
COSMOS3_LATENTS: dict[str, int] = {"channels": 48, "temporal": 4, "spatial": 16}

#: Cosmos 3 at toy size for 1-channel 8x8 digits: 2 layers 16 wide (2 query heads of 8, 1 key-value head), 2x2
#: patches of 1 channel, a 300-token vocabulary (``tests/tiny_cosmos3.py``'s byte tokenizer), mRoPE sections (2, 1, 1).
TINY_COSMOS3: dict[str, Any] = {
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 300, "rope_theta": 10000.0, "rope_axes_dim": [2, 1, 1],
    "latent_channel": 1, "latent_patch_size": 2, "patch_latent_dim": 4, "rms_norm_eps": 1e-6,
}
#: The same with a sound path of 2 channels and Nemotron-style layers (ReLU^2 MLPs, no text query/key norms, the
#: text keys normed for the generation queries), the model's other variant.
TINY_COSMOS3_SOUND: dict[str, Any] = {**TINY_COSMOS3, "sound_gen": True, "sound_dim": 2, "hidden_act": "relu2",
                                      "qk_norm_for_text": False, "use_und_k_norm_for_gen": True}


def cosmos3_latent_shape(num_frames: int, height: int, width: int,
                         latents: dict[str, int] | None = None) -> list[int]:
    """The latent shape ``Cosmos3OmniPipeline`` samples for ``num_frames`` frames of ``height x width`` pixels:
    ``(C, (F - 1) / 4 + 1, H / 16, W / 16)`` (``num_frames = 1``: an image, one latent frame)."""
    s = {**COSMOS3_LATENTS, **(latents or {})}
    return [s["channels"], (num_frames - 1) // s["temporal"] + 1, height // s["spatial"], width // s["spatial"]]


def cosmos3_transformer(config: dict[str, Any], tokenizer: str | None = None, negative_ids: list[int] | None = None,
                        negative_prompt: str = "", fps: float = 24.0, temporal_compression: int = 4,
                        spatial_compression: int = 16, prompt_embeddings: str | None = None, num_prompts: int = 0,
                        prompt_tokens: int = 1, shift: float = COSMOS3_SHIFT) -> DictConfig:
    """A ``Cosmos3OmniTransformer`` (``fastgen.networks.cosmos3.Cosmos3Transformer``) on rectified flow:
    logit-normal training times, sampling times shifted by ``shift`` (the pipeline's flow shift, 5). The null
    condition: ``negative_ids``, or the pipeline's ``negative_prompt`` tokenised from ``tokenizer`` (a pipeline
    folder; ``model.pretrained_model_path`` sets it when its folder has a ``text_tokenizer/``)."""
    backbone = LazyCall("fastgen.networks.cosmos3.Cosmos3Transformer")(
        config=dict(config), tokenizer=tokenizer, negative_ids=None if negative_ids is None else list(negative_ids),
        negative_prompt=negative_prompt, fps=fps, temporal_compression=temporal_compression,
        spatial_compression=spatial_compression, prompt_embeddings=prompt_embeddings, num_prompts=num_prompts,
        prompt_tokens=prompt_tokens,
    )
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(backbone=backbone,
                                                                   noise_scheduler=flow_schedule(shift=shift))


__all__ = ["COSMOS3_LATENTS", "COSMOS3_NANO", "COSMOS3_SHIFT", "COSMOS3_SUPER", "TINY_COSMOS3", "TINY_COSMOS3_SOUND",
           "cosmos3_latent_shape", "cosmos3_transformer"]
