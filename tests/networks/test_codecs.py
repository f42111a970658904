"""Codecs against diffusers itself (issue 34, point 1): for SD 1.5, SDXL, Flux, Wan, Qwen-Image and CogVideoX, a tiny random pipeline of the real
diffusers / transformers classes (tokenizers built here from vocabularies, no downloads) is saved as a folder;
``load_codec`` reads it back, and its prompt embeddings equal the pipeline's ``encode_prompt``, its latents the
pipeline's normalisation of ``vae.encode``, and its decoding of the pipeline's own final latents the image (or video)
the pipeline returns for the same call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import (
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    WanPipeline,
    WanTransformer3DModel,
)
from tiny_pipelines import (
    clip_encoder,
    clip_tokenizer,
    t5_tokenizer,
    tiny_cogvideox_pipeline,
    tiny_qwenimage_pipeline,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_vae,
)
from transformers import (
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

from fastgen.configs.net_diffusers import (
    TINY_COGVIDEOX,
    TINY_FLUX,
    TINY_QWEN_IMAGE,
    TINY_SDXL_UNET,
    TINY_WAN,
)
from fastgen.networks.codecs import (
    CogVideoXCodec,
    FluxCodec,
    QwenImageCodec,
    SDCodec,
    SDXLCodec,
    WanCodec,
    load_codec,
)

PROMPTS = ["a red cat", "two dogs on a hill at night"]


def pixels(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(5)) * 2 - 1


def saved(pipe: Any, folder: Path, reload: bool = True) -> tuple[Any, Path]:
    """The pipeline as a user has it: saved to a folder and loaded back by diffusers (the codec reads the same).
    ``reload=False`` keeps the one in memory (diffusers needs ``accelerate`` to load umT5, kept in float32 parts)."""
    pipe.save_pretrained(folder)
    return (type(pipe).from_pretrained(folder) if reload else pipe), folder


def test_sd15(tmp_path: Path) -> None:
    torch.manual_seed(0)
    pipe = tiny_sd_pipeline()
    pipe, folder = saved(pipe, tmp_path / "sd")
    codec = load_codec(folder)
    assert isinstance(codec, SDCodec) and not any(p.requires_grad for p in codec.parameters())

    with torch.no_grad():  # as the pipeline's __call__ runs it
        expected = pipe.encode_prompt(PROMPTS, "cpu", 1, False)[0]
    assert torch.equal(codec.encode_prompts(PROMPTS)["text"], expected)

    x = pixels(2, 3, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(x).latent_dist.mode()
    assert torch.equal(codec.encode_images(x), raw * pipe.vae.config.scaling_factor)  # the img2img pipeline's z

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 16, "width": 16, "guidance_scale": 1.0}
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).images
    image = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).images
    ours = (codec.decode_latents(latents) / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(ours, image, atol=1e-6, rtol=0)


def test_sdxl(tmp_path: Path) -> None:
    """Two CLIP encoders' penultimate states concatenated, the second's pooled projection, zeros for the empty
    negative prompt (force_zeros_for_empty_prompt); the size-and-crop time ids travel in row 0 of the condition."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    pipe, folder = saved(tiny_sdxl_pipeline(UNet2DConditionModel(**{**TINY_SDXL_UNET, "in_channels": 4,
                                                                    "out_channels": 4}), latent_channels=4),
                         tmp_path / "sdxl")
    codec = load_codec(folder)
    assert isinstance(codec, SDXLCodec) and codec.force_zeros_for_empty_prompt

    with torch.no_grad():
        text, negative, pooled, negative_pooled = pipe.encode_prompt(PROMPTS, device="cpu", num_images_per_prompt=1,
                                                                     do_classifier_free_guidance=True)
    encoded = codec.encode_prompts(PROMPTS)
    assert torch.equal(encoded["text"], text) and torch.equal(encoded["pooled"], pooled)
    negatives = codec.encode_negative(["", ""])
    assert torch.equal(negatives["text"], negative) and torch.equal(negatives["pooled"], negative_pooled)
    condition = codec.condition({**encoded, "time_ids": torch.tensor([[32.0, 24, 0, 4, 16, 16]] * 2)})
    assert condition.shape == (2, 13, 16) and torch.equal(condition[:, 1:], text)
    assert torch.equal(condition[:, 0, :8], pooled) and condition[0, 0, 8:14].tolist() == [32, 24, 0, 4, 16, 16]
    # what encode-data records for a 40x30 (w x h) photo center-cropped (left 5) and resized to 16
    assert SDXLCodec.time_ids((40, 30), (5, 0, 30), 16) == [30.0, 40.0, 0.0, 3.0, 16.0, 16.0]
    # ... and to 32x16 (w x h): the full width, rows 5..25 (top 5 -> 4 in the resized image), target (16, 32)
    assert SDXLCodec.time_ids((40, 30), (0, 5, 40, 20), (32, 16)) == [30.0, 40.0, 4.0, 0.0, 16.0, 32.0]

    x = pixels(2, 3, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(x).latent_dist.mode()
    assert torch.equal(codec.encode_images(x), raw * pipe.vae.config.scaling_factor)

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 16, "width": 16, "guidance_scale": 1.0}
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).images
    image = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).images
    ours = (codec.decode_latents(latents) / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(ours, image, atol=1e-6, rtol=0)


def test_flux(tmp_path: Path) -> None:
    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                 decoder_start_token_id=0)).eval()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(),
                        vae=tiny_vae(1, shift_factor=0.1159, scaling_factor=0.3611),
                        text_encoder=clip_encoder(TINY_FLUX["pooled_projection_dim"]), tokenizer=clip_tokenizer(),
                        text_encoder_2=t5, tokenizer_2=t5_tokenizer(),
                        transformer=FluxTransformer2DModel(**TINY_FLUX))
    pipe, folder = saved(pipe, tmp_path / "flux")
    codec = load_codec(folder, max_sequence_length=10)
    assert isinstance(codec, FluxCodec)

    with torch.no_grad():
        text, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None, max_sequence_length=10)
    encoded = codec.encode_prompts(PROMPTS)
    assert torch.equal(encoded["text"], text) and torch.equal(encoded["pooled"], pooled)
    condition = codec.condition(encoded)
    assert condition.shape == (2, 11, 16) and torch.equal(condition[:, 1:], text)

    x = pixels(2, 3, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(x).latent_dist.mode()
    expected = (raw - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    assert torch.equal(codec.encode_images(x), expected)

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 32, "width": 32, "max_sequence_length": 10}
    packed = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).images
    image = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).images
    latents = pipe._unpack_latents(packed, 32, 32, pipe.vae_scale_factor)
    ours = (codec.decode_latents(latents) / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(ours, image, atol=1e-6, rtol=0)


def test_wan(tmp_path: Path) -> None:
    torch.manual_seed(0)
    z = 4
    vae = AutoencoderKLWan(base_dim=8, z_dim=z, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
                           latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.5, 2.0, 1.0]).eval()
    umt5 = UMT5EncoderModel(UMT5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).eval()
    pipe = WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5, vae=vae,
                       transformer=WanTransformer3DModel(**{**TINY_WAN, "in_channels": z, "out_channels": z}),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe, folder = saved(pipe, tmp_path / "wan", reload=False)
    codec = load_codec(folder, max_sequence_length=12)
    assert isinstance(codec, WanCodec)

    with torch.no_grad():
        expected = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=12)[0]
    encoded = codec.encode_prompts(PROMPTS)
    assert torch.equal(encoded["text"], expected)
    assert encoded["text_mask"].sum(1).tolist() == (encoded["text"].abs().sum(-1) > 0).sum(1).tolist()

    video = pixels(1, 3, 5, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(video).latent_dist.mode()
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, z, 1, 1, 1)
    std = torch.tensor(pipe.vae.config.latents_std).view(1, z, 1, 1, 1)
    torch.testing.assert_close(codec.encode_images(video), (raw - mean) / std, atol=1e-6, rtol=1e-6)
    assert codec.encode_images(pixels(2, 3, 16, 16)).shape == (2, z, 1, 8, 8)  # an image is one frame

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 16, "width": 16, "num_frames": 5,
            "guidance_scale": 1.0, "max_sequence_length": 12}
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).frames
    frames = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).frames  # (B, F, C, H, W)
    ours = (codec.decode_latents(latents) / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)
    torch.testing.assert_close(ours, frames, atol=1e-5, rtol=0)


def test_qwenimage(tmp_path: Path) -> None:
    """Qwen2.5-VL's last states of the templated prompt, the template's first 34 tokens dropped, each prompt's own
    tokens (``_get_qwen_prompt_embeds``): equal to ``encode_prompt`` over its batch-longest padding, zeros after it,
    the mask the same; the negative prompt "" as the pipeline encodes it; the 5-D VAE's mode normalised per
    channel as the Qwen-Image pipelines do, an image one frame; decoding the pipeline's final latents gives its
    image."""
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    torch.manual_seed(0)
    z = 4
    transformer = QwenImageTransformer2DModel(**{**TINY_QWEN_IMAGE, "in_channels": 4 * z, "out_channels": z})
    pipe, folder = saved(tiny_qwenimage_pipeline(transformer, latent_channels=z), tmp_path / "qwenimage")
    assert isinstance(pipe, QwenImagePipeline)
    codec = load_codec(folder, max_sequence_length=160)
    assert isinstance(codec, QwenImageCodec) and not any(p.requires_grad for p in codec.parameters())

    with torch.no_grad():
        text, mask = pipe.encode_prompt(PROMPTS, device="cpu")
        negative, negative_mask = pipe.encode_prompt([""], device="cpu")
    encoded = codec.encode_prompts(PROMPTS)
    length = text.shape[1]
    assert encoded["text"].shape == (2, 160, 16) and length < 160 and mask is not None and not mask.all()
    assert torch.equal(encoded["text"][:, :length], text) and not encoded["text"][:, length:].any()
    assert torch.equal(encoded["text_mask"][:, :length], mask) and not encoded["text_mask"][:, length:].any()
    assert torch.equal(codec.condition(encoded), encoded["text"])
    assert torch.equal(encoded["text"].ne(0).any(-1).long(), encoded["text_mask"])  # what the network reads back
    empty = codec.encode_negative([""])
    assert negative_mask is None  # one prompt: no padding, the pipeline passes no mask
    assert torch.equal(empty["text"][:, : negative.shape[1]], negative) and empty["text_mask"].sum() == negative.shape[1]
    short = QwenImageCodec(codec.vae, max_sequence_length=100, **codec.tokenizers, **codec.encoders)
    assert torch.equal(short.encode_prompts(PROMPTS)["text"], text[:, :100])  # __call__'s max_sequence_length cut

    x = pixels(2, 3, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(x.unsqueeze(2)).latent_dist.mode()
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, z, 1, 1, 1)
    std = torch.tensor(pipe.vae.config.latents_std).view(1, z, 1, 1, 1)
    assert torch.equal(codec.encode_images(x), ((raw - mean) * (1.0 / std))[:, :, 0])  # _encode_vae_image's z
    torch.testing.assert_close(codec.encode_images(x), ((raw - mean) / std)[:, :, 0], atol=1e-6, rtol=1e-6)

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 16, "width": 16}
    packed = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).images
    image = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).images
    latents = pipe._unpack_latents(packed, 16, 16, pipe.vae_scale_factor)[:, :, 0]  # (B, C, 1, h, w) -> one frame
    ours = (codec.decode_latents(latents) / 2 + 0.5).clamp(0, 1)
    assert ours.shape == image.shape == (1, 3, 16, 16)
    torch.testing.assert_close(ours, image, atol=1e-6, rtol=0)


def test_cogvideox(tmp_path: Path) -> None:
    """T5's last states of the prompt padded to 226 tokens without an attention mask (``_get_t5_prompt_embeds``),
    the negative prompt "" encoded the same way; the 3-D VAE's mode times ``scaling_factor`` (the video-to-video
    pipeline's latents, channel major), an image one frame; decoding the pipeline's own final (frame-major) latents
    gives its video."""
    from diffusers import CogVideoXPipeline, CogVideoXTransformer3DModel

    torch.manual_seed(0)
    z = 4
    transformer = CogVideoXTransformer3DModel(**{**TINY_COGVIDEOX, "in_channels": z, "out_channels": z})
    pipe, folder = saved(tiny_cogvideox_pipeline(transformer, latent_channels=z), tmp_path / "cogvideox")
    assert isinstance(pipe, CogVideoXPipeline)
    codec = load_codec(folder)
    assert isinstance(codec, CogVideoXCodec) and not any(p.requires_grad for p in codec.parameters())

    with torch.no_grad():
        text, negative = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=True, device="cpu")
    encoded = codec.encode_prompts(PROMPTS)
    assert encoded["text"].shape == (2, 226, 16) and torch.equal(encoded["text"], text)
    assert encoded["text"][:, -1].abs().sum() > 0  # the padding tokens are encoded (no mask), not zeros
    assert torch.equal(codec.condition(codec.encode_negative(["", ""])), negative)
    short = CogVideoXCodec(codec.vae, max_sequence_length=12, **codec.tokenizers, **codec.encoders)
    with torch.no_grad():
        twelve = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=12, device="cpu")[0]
    assert torch.equal(short.encode_prompts(PROMPTS)["text"], twelve)

    video = pixels(1, 3, 5, 16, 16)
    with torch.no_grad():
        raw = pipe.vae.encode(video).latent_dist.mode()
    assert torch.equal(codec.encode_images(video), raw * pipe.vae.config.scaling_factor)
    assert codec.encode_images(pixels(2, 3, 16, 16)).shape == (2, z, 1, 8, 8)  # an image is one frame

    call = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": 16, "width": 16, "num_frames": 5,
            "guidance_scale": 1.0}
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(3)).frames  # (B, F, C, h, w)
    frames = pipe(**call, output_type="pt", generator=torch.Generator().manual_seed(3)).frames  # (B, F, C, H, W)
    ours = (codec.decode_latents(latents.transpose(1, 2)) / 2 + 0.5).clamp(0, 1).transpose(1, 2)
    assert ours.shape == frames.shape == (1, 5, 3, 16, 16)
    torch.testing.assert_close(ours, frames, atol=1e-6, rtol=0)


def test_a_folder_that_is_not_a_pipeline_is_one_line(tmp_path: Path) -> None:
    from fastgen.utils.errors import UsageError

    with pytest.raises(UsageError, match="not a diffusers pipeline folder"):
        load_codec(tmp_path)
    (tmp_path / "model_index.json").write_text('{"_class_name": "KandinskyPipeline"}')
    with pytest.raises(UsageError, match="no codec for the pipeline 'KandinskyPipeline'"):
        load_codec(tmp_path)
