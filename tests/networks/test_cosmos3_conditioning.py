"""Cosmos 3's image / video to video (``fastgen.networks.conditioning_frames`` through ``Cosmos3Transformer`` and
``Cosmos3Codec.conditioning_latents``): the tiny ``Cosmos3OmniPipeline`` called with ``image=`` or ``video=``
(``tests/tiny_cosmos3.py``: the real classes at toy size) is the oracle; SFT trains with a given frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastgen_testing import random_frames
from tiny_cosmos3 import SPATIAL, TEMPORAL, cosmos3_pipeline, sft_model, tiny_transformer

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_cosmos3 import TINY_COSMOS3, cosmos3_transformer

SIZES = {"temporal_compression": TEMPORAL, "spatial_compression": SPATIAL}
PROMPT = "a red cat"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Cosmos 3 pipeline; rectified-flow Euler over fastgen's 3-step grid (1, 2/3, 1/3)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = tmp_path_factory.mktemp("cosmos3_conditioning") / "pipeline"
    cosmos3_pipeline(tiny_transformer(TINY_COSMOS3), FlowMatchEulerDiscreteScheduler(shift=1.0, shift_terminal=1 / 3)
                     ).save_pretrained(path)
    return path


def _clip(frames: list[Any]) -> torch.Tensor:
    """``(1, 3, n, 16, 16)`` pixels in ``[-1, 1]`` of PIL frames (what ``fastgen.pipelines.world.load_clip`` reads)."""
    pixels = torch.stack([torch.from_numpy(np.asarray(f)).permute(2, 0, 1) for f in frames], dim=1)
    return (pixels.float() / 127.5 - 1.0)[None]


@pytest.mark.parametrize(("clip_frames", "given", "guidance"), [(1, 1, 3.0), (6, 2, 1.0)], ids=["image", "clip"])
def test_continuing_an_image_or_a_clip_is_the_pipelines(folder: Path, clip_frames: int, given: int,
                                                        guidance: float) -> None:
    """``PromptSampler.latents(..., clip=...)`` on a 5-frame (3 latent frames) sample: the codec's conditioning (an
    image is the first latent frame, a clip's first 3 frames the first two; repeat-padded, the VAE's mode), the
    given frames' tokens without a time embedding, their velocity zero - equals ``Cosmos3OmniPipeline(image=...)``
    / ``(video=...)`` latents (1e-4), the given frames included (both keep them clean)."""
    from diffusers import Cosmos3OmniPipeline

    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.prompts import PromptSampler

    pipe = Cosmos3OmniPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    model = sft_model(folder, TINY_COSMOS3, guidance, [1, 3, 8, 8])
    codec = load_codec(folder)
    frames = random_frames(clip_frames, seed=clip_frames)
    clean, k = codec.conditioning_latents([_clip(frames)], 5)
    assert k == given
    sampler = PromptSampler(model, model.net, "net", codec, steps=3, guidance=guidance)
    ours = sampler.latents([PROMPT], [4], [1, 3, 8, 8], clip=_clip(frames))
    media = {"image": frames[0]} if clip_frames == 1 else {"video": frames}
    theirs = pipe(PROMPT, generator=torch.Generator().manual_seed(4), output_type="latent", num_frames=5, height=16,
                  width=16, num_inference_steps=3, guidance_scale=guidance, **media).video
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours[:, :, :k], clean[:, :, :k], atol=1e-6, rtol=0)


def test_sft_trains_with_the_first_frame_given(folder: Path) -> None:
    """SFT of the tiny Cosmos 3 with ``model.conditioning_frames = 1``: the network sees the data's first latent
    frame clean (its tokens without a time embedding) and the loss is over the other frames; a step runs and its
    loss is finite and has a gradient."""
    from fastgen.configs.methods.config_sft import create_config

    config = create_config()
    config.model.net = cosmos3_transformer(TINY_COSMOS3, negative_ids=[1, 2, 3], num_prompts=10, prompt_tokens=3,
                                           shift=1.0, **SIZES)
    config.model.input_shape = [1, 3, 8, 8]
    config.model.num_classes = 10
    config.model.conditioning_frames = 1
    model = instantiate(config.model_class, config=config.model)
    data = {"real": torch.randn(2, 1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),
            "condition": torch.tensor([3, 5])}
    losses, outputs = model.single_train_step(data, 0)
    assert torch.isfinite(losses["total_loss"])
    losses["total_loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.net.parameters())


def test_given_frames_with_sound_are_refused_in_one_line() -> None:
    """``model.conditioning_frames`` on a multimodal (video + sound) model: a one-line ConfigError."""
    from fastgen.configs.methods.config_sft import create_config
    from fastgen.configs.net_cosmos3 import TINY_COSMOS3_SOUND
    from fastgen.utils.errors import ConfigError

    config = create_config()
    config.model.net = cosmos3_transformer(TINY_COSMOS3_SOUND, negative_ids=[1, 2], shift=1.0, **SIZES)
    config.model.input_shape = [1, 3, 8, 8]
    config.model.modality_shapes = {"video": [1, 3, 8, 8], "audio": [2, 5]}
    config.model.conditioning_frames = 1
    with pytest.raises(ConfigError, match="multimodal sample"):
        instantiate(config.model_class, config=config.model)


def test_an_image_of_another_size_is_prepared_as_the_pipeline_prepares_it(folder: Path, tmp_path: Path) -> None:
    """``fastgen sample --image FILE`` of a 24x20 file for 16x16 samples: ``load_clip`` with the codec's
    ``conditioning_image`` (the pipeline's own aspect-keeping resize and centre crop, not the video processor's
    Lanczos resize of a clip's frames) continues it as ``Cosmos3OmniPipeline(image=...)`` does (1e-4); the video
    processor's resize would give other pixels."""
    from diffusers import Cosmos3OmniPipeline
    from PIL import Image

    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.pipelines.world import load_clip

    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / "first.png")
    pipe = Cosmos3OmniPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    model = sft_model(folder, TINY_COSMOS3, 3.0, [1, 3, 8, 8])
    codec = load_codec(folder)
    clip = load_clip(str(tmp_path / "first.png"), 16, 16, codec.conditioning_image)
    assert clip.shape == (1, 3, 1, 16, 16)
    assert (clip - load_clip(str(tmp_path / "first.png"), 16, 16)).abs().mean() > 0.02
    ours = PromptSampler(model, model.net, "net", codec, steps=3, guidance=3.0).latents([PROMPT], [4], [1, 3, 8, 8],
                                                                                          clip=clip)
    with Image.open(tmp_path / "first.png") as image:
        theirs = pipe(PROMPT, generator=torch.Generator().manual_seed(4), output_type="latent", num_frames=5,
                      height=16, width=16, num_inference_steps=3, guidance_scale=3.0, image=image.convert("RGB")).video
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
