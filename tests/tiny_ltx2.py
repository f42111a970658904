"""LTX-2's pipeline (``LTX2Pipeline``) at toy size from the real classes, with a Gemma tokenizer built here from a
letter vocabulary (no downloads): what the LTX-2 network, codec and sampling tests run on.

Sizes: 32x32 pixels -> 4x4 video latents of 2 channels (VAE: 8 in space, 2 in time, so 9 frames -> 5); 16-bin
stereo mel spectrograms -> 2 channels x 4 bins, 4 in time; a 2-layer Gemma-3 16 wide (3 hidden states stacked);
connectors with 4 registers (so prompts are tokenised to a multiple of 4: ``MAX_SEQUENCE_LENGTH``); a 2-stage
vocoder. Both VAEs carry non-trivial latent statistics (and the video VAE a scaling factor), so normalisation is
tested, not the identity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_SEQUENCE_LENGTH = 8  # the connectors' registers (4) divide it
PIXELS = 32  # LTX2Pipeline takes multiples of 32
FRAMES = 9  # -> 5 latent frames; 9 / 24 s of audio -> 9 latent audio frames
FRAME_RATE = 24.0


def gemma_tokenizer() -> Any:
    """``GemmaTokenizer`` (byte-fallback BPE without merges) over Gemma's special tokens, ``▁`` and the letters."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "▁": 5}
    for c in LETTERS:
        vocab[c] = len(vocab)
    return GemmaTokenizer(vocab=vocab, merges=[])


def gemma_encoder(vocab_size: int, hidden: int = 16, layers: int = 2) -> Any:
    """``Gemma3ForConditionalGeneration`` (the class LTX-2's pipeline loads) with ``layers`` text layers ``hidden``
    wide and a 1-layer SigLIP tower it never uses."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config={"vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                     "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                     "max_position_embeddings": 64, "sliding_window": 8, "query_pre_attn_scalar": 8},
        vision_config={"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 8, "patch_size": 4},
        mm_tokens_per_image=4, boi_token_index=3, eoi_token_index=3, image_token_index=3)
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_connectors(hidden: int = 16, layers: int = 2) -> Any:
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    return LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=layers + 1, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=hidden // 2, video_connector_num_layers=1,
        video_connector_num_learnable_registers=4, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=hidden // 2, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=4, rope_type="split").eval()


def tiny_video_vae(latent_channels: int = 2) -> Any:
    """``AutoencoderKLLTX2Video``: 4x4 patches, one spatio-temporal downsampling (8 in space, 2 in time); latents
    normalised by means 0.1, -0.2 and stds 1.5, 1.75, scaling factor 0.9."""
    from diffusers import AutoencoderKLLTX2Video

    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=latent_channels, block_out_channels=(8, 8),
        down_block_types=("LTX2VideoDownBlock3D",) * 2, decoder_block_out_channels=(8,), layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True, False), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatiotemporal", "spatial"),
        upsample_type=("spatiotemporal",), upsample_residual=(True,), upsample_factor=(2,), patch_size=4,
        scaling_factor=0.9).eval()
    vae.latents_mean.copy_(torch.tensor([0.1 * (i + 1) * (-1) ** i for i in range(latent_channels)]))
    vae.latents_std.copy_(torch.tensor([1.5 + 0.25 * i for i in range(latent_channels)]))
    return vae


def tiny_audio_vae(latent_channels: int = 2, mel_bins: int = 16) -> Any:
    """``AutoencoderKLLTX2Audio`` over 16-bin stereo mels: latents of ``latent_channels`` x 4 bins; its packed
    statistics (``latent_channels * 4`` entries) are non-trivial."""
    from diffusers import AutoencoderKLLTX2Audio

    packed = latent_channels * mel_bins // 4
    vae = AutoencoderKLLTX2Audio(base_channels=packed, output_channels=2, ch_mult=(1, 2, 2), num_res_blocks=1,
                                 in_channels=2, latent_channels=latent_channels, mel_bins=mel_bins).eval()
    vae.latents_mean.copy_(torch.linspace(-0.3, 0.3, packed))
    vae.latents_std.copy_(torch.linspace(0.8, 1.6, packed))
    return vae


def tiny_vocoder(mel_bins: int = 16) -> Any:
    from diffusers.pipelines.ltx2 import LTX2Vocoder

    return LTX2Vocoder(in_channels=2 * mel_bins, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[4, 4],
                       upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1]],
                       output_sampling_rate=16000).eval()


def tiny_ltx2_pipeline(transformer: Any) -> Any:
    """``LTX2Pipeline`` around ``transformer`` (an ``LTX2VideoTransformer3DModel`` of ``TINY_LTX2``) with LTX-2's
    scheduler config (``LTX2_SCHEDULER``: exponential dynamic shift, shift_terminal)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

    from fastgen.configs.net_ltx2 import LTX2_SCHEDULER

    tokenizer = gemma_tokenizer()
    scheduler = FlowMatchEulerDiscreteScheduler(**LTX2_SCHEDULER, use_dynamic_shifting=True,
                                                time_shift_type="exponential")
    return LTX2Pipeline(scheduler=scheduler, vae=tiny_video_vae(), audio_vae=tiny_audio_vae(),
                        text_encoder=gemma_encoder(len(tokenizer)), tokenizer=tokenizer, connectors=tiny_connectors(),
                        transformer=transformer, vocoder=tiny_vocoder())


def saved_tiny_pipeline(folder: Path) -> Any:
    """A ``TINY_LTX2`` network (seed 0; 80 video tokens set its sampling shift, as ``LTX2Pipeline``'s dynamic shift
    does for 5 x 4 x 4 latents) in a tiny ``LTX2Pipeline`` saved at ``folder``; returns the network's config."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_ltx2 import TINY_LTX2, ltx2_transformer

    torch.manual_seed(0)
    net_config = ltx2_transformer(TINY_LTX2, video_seq_len=80)
    tiny_ltx2_pipeline(instantiate(net_config).backbone.model).save_pretrained(folder)
    return net_config


def random_clip_shards(codec: Any, captions: list[str], folder: Path) -> dict[str, list[int]]:
    """WebDataset shards (4 samples each) in ``folder`` of the codec's latents of random clips and spectrograms
    (``latent.npy``, ``audio_latent.npy``; generator seed 1) and its condition of ``captions`` (``text.npy``), the
    fields ``encode-data`` writes; returns the samples' modality shapes."""
    import io

    import numpy as np

    from fastgen.datasets.webdataset import write_shards

    def npy(array: torch.Tensor) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, array.numpy())
        return buffer.getvalue()

    g = torch.Generator().manual_seed(1)
    count = len(captions)
    video = codec.encode_images(torch.rand(count, 3, FRAMES, PIXELS, PIXELS, generator=g) * 2 - 1)
    audio = codec.encode_audio(torch.randn(count, 2, 36, 16, generator=g))
    text = codec.condition(codec.encode_prompts(captions))
    write_shards(({"__key__": f"{i:04d}", "latent.npy": npy(video[i]), "audio_latent.npy": npy(audio[i]),
                   "text.npy": npy(text[i])} for i in range(count)), folder, samples_per_shard=4)
    return {"video": list(video.shape[1:]), "audio": list(audio.shape[1:])}
