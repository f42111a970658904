"""Cosmos 3 with sound (``fastgen.networks.cosmos3_codec``'s sound tokenizer, ``PipelineNoise``'s modality order,
``PromptSampler`` on a multimodal Cosmos 3 model): the tiny ``Cosmos3OmniPipeline`` with a sound tokenizer
(``tests/tiny_cosmos3.py``: the real classes at toy size) is the oracle for the latents and the waveform it makes
with ``enable_sound=True``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_cosmos3 import SPATIAL, TEMPORAL, cosmos3_pipeline, cosmos3_sound_tokenizer, sft_model, tiny_transformer

from fastgen.configs.net_cosmos3 import TINY_COSMOS3_SOUND

SIZES = {"temporal_compression": TEMPORAL, "spatial_compression": SPATIAL}
SHAPES = {"video": [1, 3, 8, 8], "audio": [2, 5]}  # 5 frames of 16x16 at 24 fps; 20 samples at 96 Hz, 4 a latent
PROMPT = "a dog barks"


@pytest.fixture(scope="module")
def sound_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Cosmos 3 pipeline with the sound path and its sound tokenizer; rectified-flow Euler over the
    grid (1, 2/3, 1/3), the grid fastgen's 3-step ODE evaluates."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    folder = tmp_path_factory.mktemp("cosmos3_sound") / "pipeline"
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, shift_terminal=1 / 3)
    cosmos3_pipeline(tiny_transformer(TINY_COSMOS3_SOUND), scheduler,
                     sound_tokenizer=cosmos3_sound_tokenizer()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("guidance", [1.0, 3.0], ids=["plain", "guided"])
def test_prompt_sampling_with_sound_is_the_pipelines(sound_folder: Path, guidance: float) -> None:
    """``PromptSampler`` on a video + sound Cosmos 3 model: the pipeline's noise (generator ``i``: sample ``i``'s
    vision noise, then its sound noise), the codec's prompt and negative prompt, 3 ODE steps with guidance ``s``
    (both streams, as the pipeline guides them), give ``Cosmos3OmniPipeline``'s video latents (1e-4) and, decoded
    by the codec's sound tokenizer, the waveform the pipeline returns (1e-4), at its sampling rate."""
    from diffusers import Cosmos3OmniPipeline

    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.prompts import PromptSampler

    pipe = Cosmos3OmniPipeline.from_pretrained(sound_folder)
    pipe.set_progress_bar_config(disable=True)
    model = sft_model(sound_folder, TINY_COSMOS3_SOUND, guidance, SHAPES["video"], SHAPES)
    codec = load_codec(sound_folder)
    assert codec.sample_rate == 96
    sampler = PromptSampler(model, model.net, "net", codec, steps=3, guidance=guidance)
    ours = sampler.latents([PROMPT], [7], SHAPES)
    out = pipe(PROMPT, generator=torch.Generator().manual_seed(7), output_type="latent", num_frames=5, height=16,
               width=16, fps=24.0, num_inference_steps=3, guidance_scale=guidance, enable_sound=True)
    torch.testing.assert_close(ours["video"], out.video, atol=1e-4, rtol=0)
    decoded = sampler.pixels(ours)
    assert decoded["audio"].shape == (1, 2, 20)
    torch.testing.assert_close(decoded["audio"][0], out.sound.float(), atol=1e-4, rtol=0)


def test_the_codec_decodes_and_encodes_sound_with_the_tokenizer(sound_folder: Path, tmp_path: Path) -> None:
    """The codec's sound is the tokenizer's own: ``decode_audio`` is ``decode`` of the latents as they are,
    ``encode_audio`` the posterior's mode (or a sample with a generator); a folder without a sound tokenizer decodes
    video alone and refuses sound in one line."""
    from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer

    from fastgen.networks.codecs import load_codec
    from fastgen.utils.errors import UsageError

    codec = load_codec(sound_folder)
    tokenizer = Cosmos3AVAEAudioTokenizer.from_pretrained(sound_folder / "sound_tokenizer").eval()
    latents = torch.randn(2, 2, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(codec.decode_audio(latents), tokenizer.decode(latents))
        waves = torch.rand(2, 2, 20, generator=torch.Generator().manual_seed(2)) * 2 - 1
        assert torch.equal(codec.encode_audio(waves), tokenizer.encode(waves).latent_dist.mode())
        sampled = codec.encode_audio(waves, generator=torch.Generator().manual_seed(3))
        assert not torch.equal(sampled, codec.encode_audio(waves))
    silent = tmp_path / "silent"
    cosmos3_pipeline(tiny_transformer(TINY_COSMOS3_SOUND)).save_pretrained(silent)
    codec = load_codec(silent)
    assert codec.sound_tokenizer is None and codec.sample_rate == 0
    with pytest.raises(UsageError, match="no sound_tokenizer"):
        codec.decode_latents({"video": torch.zeros(1, 1, 3, 8, 8), "audio": latents})


def test_encode_data_writes_each_clips_sound_latents(sound_folder: Path, tmp_path: Path) -> None:
    """``fastgen encode-data`` with a sound tokenizer in the folder: each MP4's track over its 5 frames' span (5 / 24 s:
    20 samples at the tokenizer's 96 Hz) becomes ``audio_latent.npy``, the tokenizer's posterior mode of that
    waveform alone, its first ``T_sound`` (5, as the pipeline samples; the toy tokenizer frames 6) - so a clip 10x quieter, encoded in the same
    batch, gets the same latents (the tokenizer normalises each clip's peak, not the batch's). ``--no-sound`` writes
    the video alone."""
    import json

    import numpy as np
    from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer
    from fastgen_testing import run_in_process, shard_samples

    from fastgen.datasets.sound import read_sound
    from fastgen.pipelines.media import write_mp4

    src = tmp_path / "clips"
    src.mkdir()
    tone = np.sin(2 * np.pi * 20 * np.arange(48000) / 48000)
    for name, level in (("loud", 0.5), ("soft", 0.05)):
        write_mp4(src / f"{name}.mp4", np.zeros((5, 16, 16, 3), np.uint8), fps=24,
                  audio=np.stack([tone, -tone]) * level, sample_rate=48000)
        (src / f"{name}.txt").write_text(f"a {name} hum")
    args = ("--weights", str(sound_folder), "--resolution", "16", "--frames", "5", "--device", "cpu")
    result = run_in_process("encode-data", str(src), str(tmp_path / "shards"), *args)
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert index["audio_shape"] == SHAPES["audio"] and index["sound_rate"] == 96
    members = shard_samples(tmp_path / "shards")
    tokenizer = Cosmos3AVAEAudioTokenizer.from_pretrained(sound_folder / "sound_tokenizer").eval()
    for name in ("loud", "soft"):
        wave = torch.from_numpy(read_sound(src / f"{name}.mp4", 0.0, 20, 96))[None]
        with torch.no_grad():
            want = tokenizer.encode(wave).latent_dist.mode()[0, :, :SHAPES["audio"][1]]  # the toy frames one more
        torch.testing.assert_close(torch.from_numpy(members[f"a {name} hum"]["audio_latent"]), want, atol=1e-5, rtol=0)
    loud, soft = (members[f"a {name} hum"]["audio_latent"] for name in ("loud", "soft"))
    np.testing.assert_allclose(loud, soft, atol=0.05)
    result = run_in_process("encode-data", str(src), str(tmp_path / "video_only"), *args, "--no-sound")
    assert result.returncode == 0, result.stderr
    assert "audio_shape" not in json.loads((tmp_path / "video_only" / "index.json").read_text())
    assert all("audio_latent" not in sample for sample in shard_samples(tmp_path / "video_only").values())
