"""CausalSFT (diffusion forcing; Chen et al. 2024) of a block-causal Wan on moving digits: diffusers'
``WanTransformer3DModel`` at ``WAN_MOVING_DIGITS`` size with block-causal self-attention over 4 chunks of 2 frames
(``causal_wan_transformer``; Yin et al. 2025, Sec. 3.1), every chunk trained at its own noise level (per-frame
times: Wan 2.2's per-token timestep path), sampled chunk by chunk with the KV cache. The settings of
``Digits/config_causal_sft_moving_digits`` (Adam 1e-3, batch 32, power EMA, 10% label dropout), rectified flow
unshifted as ``Digits/config_sft_wan_moving_digits``; labels through 10 stand-in prompt embeddings.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_causal_sft_moving_digits import create_config as dit_causal_sft
from fastgen.configs.net_diffusers import WAN_MOVING_DIGITS, causal_wan_transformer


def create_config() -> BaseConfig:
    config = dit_causal_sft()
    config.model.net = causal_wan_transformer(WAN_MOVING_DIGITS, chunk_frames=2, num_prompts=10, shift=1.0)
    return config
