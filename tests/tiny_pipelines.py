"""Tiny random diffusers pipelines of the real classes, with tokenizers built here from small vocabularies (no
downloads): what the codec, encode-data and export tests run on."""

from __future__ import annotations

from typing import Any

from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    T5TokenizerFast,
)

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def clip_tokenizer(max_length: int = 12) -> CLIPTokenizer:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in LETTERS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def clip_encoder(hidden: int) -> CLIPTextModel:
    return CLIPTextModel(CLIPTextConfig(vocab_size=54, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=12,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()


def clip_encoder_with_projection(hidden: int, projection: int) -> CLIPTextModelWithProjection:
    """SDXL's second text encoder at toy size: its ``text_embeds`` (the projected pooled vector) are ``projection``
    wide."""
    return CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=54, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=12, bos_token_id=0, eos_token_id=1, pad_token_id=1, projection_dim=projection)).eval()


def tiny_sdxl_pipeline(unet: Any, latent_channels: int = 1) -> Any:
    """SDXL's pipeline at toy size around ``unet`` (``TINY_SDXL_UNET``: 16-wide text = 8 + 8 from the two encoders,
    an 8-wide pooled vector): a 2-level VAE (16x16 pixels -> 8x8 latents), two CLIP encoders of 2 layers (the
    penultimate state is SDXL's), the second with a projection."""
    from diffusers import StableDiffusionXLPipeline

    encoder = CLIPTextModel(CLIPTextConfig(vocab_size=54, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                           num_attention_heads=2, max_position_embeddings=12, bos_token_id=0,
                                           eos_token_id=1, pad_token_id=1)).eval()
    return StableDiffusionXLPipeline(vae=tiny_vae(latent_channels, scaling_factor=0.13025), text_encoder=encoder,
                                     text_encoder_2=clip_encoder_with_projection(8, 8), tokenizer=clip_tokenizer(),
                                     tokenizer_2=clip_tokenizer(), unet=unet, scheduler=DDIMScheduler())


def qwen_tokenizer() -> Any:
    """A byte-level BPE ``Qwen2Tokenizer`` without merges: one token per byte (the 256 byte symbols), plus Qwen's
    end-of-text and the chat template's ``<|im_start|>`` / ``<|im_end|>`` as special tokens."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    vocab = {"<|endoftext|>": 0}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tokenizer


def qwen_text_encoder(hidden: int, vocab_size: int) -> Any:
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, the class Qwen-Image's pipeline loads) at toy size: 2 text
    layers ``hidden`` wide (multimodal RoPE sections for 4-dim half-heads), a 1-block vision tower it never uses."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "max_position_embeddings": 2048, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": hidden,
                       "patch_size": 2, "spatial_merge_size": 1, "temporal_patch_size": 1, "window_size": 8,
                       "fullatt_block_indexes": [0]})
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def tiny_qwenimage_pipeline(transformer: Any, latent_channels: int = 1) -> Any:
    """Qwen-Image's pipeline at toy size around ``transformer`` (``TINY_QWEN_IMAGE``: 16-wide text): a one-level
    ``AutoencoderKLQwenImage`` (16x16 pixels -> 8x8 latents; per-channel means 0.1, -0.2, ... and stds 1.5, 1.75,
    ...), the toy Qwen2.5-VL and byte tokenizer, and Qwen-Image's own scheduler config (dynamic exponential shift,
    shift_terminal 0.02)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
    )

    from fastgen.configs.net_diffusers import QWEN_IMAGE_SCHEDULER

    tokenizer = qwen_tokenizer()
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=latent_channels, dim_mult=[1, 1], num_res_blocks=1,
                                 temperal_downsample=[False],
                                 latents_mean=[0.1 * (i + 1) * (-1) ** i for i in range(latent_channels)],
                                 latents_std=[1.5 + 0.25 * i for i in range(latent_channels)]).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER, use_dynamic_shifting=True,
                                                time_shift_type="exponential")
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=qwen_text_encoder(16, len(tokenizer)),
                             tokenizer=tokenizer, transformer=transformer)


def t5_tokenizer() -> T5TokenizerFast:
    return T5TokenizerFast(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
                           + [(c, -2.0) for c in LETTERS], extra_ids=0)


def tiny_vae(latent_channels: int, **config: Any) -> AutoencoderKL:
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                         latent_channels=latent_channels, norm_num_groups=8, sample_size=16, **config).eval()


def tiny_sd_pipeline() -> StableDiffusionPipeline:
    """SD 1.5's pipeline at toy size: a 2-level VAE (4 latent channels, 16x16 -> 8x8), a 1-layer CLIP, a small U-Net."""
    return StableDiffusionPipeline(
        vae=tiny_vae(4), text_encoder=clip_encoder(16), tokenizer=clip_tokenizer(),
        unet=UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                  block_out_channels=(16, 32), attention_head_dim=4, cross_attention_dim=16,
                                  norm_num_groups=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
        scheduler=DDIMScheduler(), safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def tiny_family_pipeline(family: str, network: Any) -> Any:
    """A pipeline of ``family`` (sd, sdxl, flux, wan, qwenimage, cogvideox) around ``network`` (the diffusers model of a fastgen
    network built from ``fastgen.configs.net_diffusers``' ``TINY_*`` configs): one latent channel, 16x16 pixels ->
    8x8 latents, text encoders as wide as the network's text input (16; Flux's pooled 8)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        WanPipeline,
    )
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    if family == "sd":
        return StableDiffusionPipeline(vae=tiny_vae(1), text_encoder=clip_encoder(16), tokenizer=clip_tokenizer(),
                                       unet=network, scheduler=DDIMScheduler(), safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
    if family == "sdxl":
        return tiny_sdxl_pipeline(network)
    if family == "qwenimage":
        return tiny_qwenimage_pipeline(network)
    if family == "cogvideox":
        return tiny_cogvideox_pipeline(network)
    if family == "flux":
        t5 = T5EncoderModel(T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                     decoder_start_token_id=0)).eval()
        return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), transformer=network,
                            vae=tiny_vae(1, shift_factor=0.1159, scaling_factor=0.3611),
                            text_encoder=clip_encoder(8), tokenizer=clip_tokenizer(), text_encoder_2=t5,
                            tokenizer_2=t5_tokenizer())
    if family == "wan":
        vae = AutoencoderKLWan(base_dim=8, z_dim=1, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
                               latents_mean=[0.1], latents_std=[1.5]).eval()
        umt5 = UMT5EncoderModel(UMT5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                           num_heads=2)).eval()
        return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5, vae=vae, transformer=network,
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    raise ValueError(family)


def tiny_cogvideox_vae(latent_channels: int = 1, scaling_factor: float = 0.7) -> Any:
    """CogVideoX's causal 3-D VAE at toy size: 2 levels (16x16 pixels -> 8x8 latents), time halved once
    (``temporal_compression_ratio`` 2: 5 frames -> 3, one frame -> one)."""
    from diffusers import AutoencoderKLCogVideoX

    return AutoencoderKLCogVideoX(block_out_channels=(8, 16), down_block_types=("CogVideoXDownBlock3D",) * 2,
                                  up_block_types=("CogVideoXUpBlock3D",) * 2, latent_channels=latent_channels,
                                  layers_per_block=1, norm_num_groups=4, temporal_compression_ratio=2,
                                  sample_height=16, sample_width=16, scaling_factor=scaling_factor).eval()


def tiny_cogvideox_pipeline(transformer: Any, latent_channels: int = 1) -> Any:
    """CogVideoX's pipeline at toy size around ``transformer`` (``TINY_COGVIDEOX``: 16-wide text): the toy 3-D VAE, a
    1-layer T5 with the letter tokenizer, and CogVideoX-5b's own scheduler config (``CogVideoXDDIMScheduler``, v
    prediction, zero terminal SNR, trailing)."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline
    from transformers import T5Config, T5EncoderModel

    from fastgen.configs.net_diffusers import COGVIDEOX_5B_SCHEDULER

    t5 = T5EncoderModel(T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                 decoder_start_token_id=0)).eval()
    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_5B_SCHEDULER, timestep_spacing="trailing", clip_sample=False)
    return CogVideoXPipeline(tokenizer=t5_tokenizer(), text_encoder=t5, vae=tiny_cogvideox_vae(latent_channels),
                             transformer=transformer, scheduler=scheduler)
