"""A tiny random ``Cosmos3OmniPipeline`` of the real classes, built here without downloads: a byte-level Qwen
tokenizer with the chat template's and Cosmos 3's special tokens, a one-level Wan VAE (16x16 pixels -> 8x8 latents,
time halved), and the transformer of ``fastgen.configs.net_cosmos3``'s ``TINY_COSMOS3*`` configs."""

from __future__ import annotations

from typing import Any

import torch

#: a Qwen-style chat template (system / user turns, then the assistant's generation prompt)
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: the tiny VAE's compressions (what the wrapper is told: ``temporal_compression`` / ``spatial_compression``)
TEMPORAL, SPATIAL = 2, 2


def cosmos3_tokenizer() -> Any:
    """One token per byte (the 256 byte-level symbols), ``<|endoftext|>`` (the end-of-text token the pipeline
    appends), ``<|im_start|>`` / ``<|im_end|>`` and ``<|vision_start|>``: 260 ids."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    vocab = {"<|endoftext|>": 0}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|vision_start|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def cosmos3_vae(channels: int = 1) -> Any:
    """Wan's VAE (the class Cosmos 3's pipeline loads) at toy size: one level (16x16 -> 8x8), time halved once
    (5 frames -> 3, one frame -> one), per-channel means 0.1, -0.2, ... and stds 1.5, 1.75, ..."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=channels, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
                            latents_mean=[0.1 * (i + 1) * (-1) ** i for i in range(channels)],
                            latents_std=[1.5 + 0.25 * i for i in range(channels)],
                            scale_factor_temporal=TEMPORAL, scale_factor_spatial=SPATIAL).eval()


def cosmos3_sound_tokenizer() -> Any:
    """Cosmos 3's sound tokenizer (``Cosmos3AVAEAudioTokenizer``) at toy size: 2 latent channels (the tiny sound
    model's ``sound_dim``), stereo waveforms at 96 Hz, 4 samples per latent (so 5 frames at 24 fps are 20 samples,
    5 latents)."""
    from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer

    torch.manual_seed(3)
    return Cosmos3AVAEAudioTokenizer(sampling_rate=96, vocoder_input_dim=2, dec_dim=8, dec_c_mults=(1, 2),
                                     dec_strides=(2, 2), dec_out_channels=2, enc_dim=8, enc_intermediate_dim=16,
                                     enc_num_layers=1, enc_num_blocks=1, enc_n_fft=8, enc_hop_length=2,
                                     enc_latent_dim=4, enc_c_mults=(1, 2), enc_strides=(2, 1), hop_size=4).eval()


def cosmos3_pipeline(transformer: Any, scheduler: Any = None, **options: Any) -> Any:
    """``Cosmos3OmniPipeline`` around ``transformer`` with the toy tokenizer and VAE, no safety checker, and
    ``scheduler`` (default: rectified-flow Euler, the scheduler fastgen's exports use)."""
    from diffusers import Cosmos3OmniPipeline, FlowMatchEulerDiscreteScheduler

    vae = cosmos3_vae(int(transformer.config.latent_channel))
    return Cosmos3OmniPipeline(transformer=transformer, text_tokenizer=cosmos3_tokenizer(), vae=vae,
                               scheduler=scheduler or FlowMatchEulerDiscreteScheduler(),
                               enable_safety_checker=False, **options)


def tiny_transformer(config: dict[str, Any], seed: int = 0) -> Any:
    """The tiny ``Cosmos3OmniTransformer`` with every parameter drawn (its zero-initialised modality embeddings
    too), so that each part of the model shows in the outputs."""
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(seed)
    model = Cosmos3OmniTransformer.from_config(dict(config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("modality_embed"):
                p.normal_(0.0, 0.5)
    return model.eval()


def sft_model(folder: Any, config: dict[str, Any], guidance: float, input_shape: list[int],
              modality_shapes: dict[str, list[int]] | None = None) -> Any:
    """An SFT model (eval mode) of the tiny Cosmos 3 ``config`` from the pipeline ``folder`` (its weights and
    tokenizer), on ``input_shape`` latents (with ``modality_shapes``: a multimodal model), guided with ``guidance``
    over 3 sampling steps; prompts condition it (``num_classes`` 1)."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.methods.config_sft import create_config
    from fastgen.configs.net_cosmos3 import cosmos3_transformer

    recipe = create_config()
    recipe.model.net = cosmos3_transformer(config, tokenizer=str(folder), shift=1.0, temporal_compression=TEMPORAL,
                                           spatial_compression=SPATIAL)
    recipe.model.pretrained_model_path = str(folder)
    if modality_shapes is not None:
        recipe.model.modality_shapes = {name: list(shape) for name, shape in modality_shapes.items()}
    recipe.model.input_shape = list(input_shape)
    recipe.model.num_classes = 1
    recipe.model.sample_steps = 3
    recipe.model.guidance_scale = guidance
    model = instantiate(recipe.model_class, config=recipe.model)
    model.init_weights()
    return model.eval()
