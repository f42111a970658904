"""``fastgen encode-data`` for LTX-2: captioned MP4 clips with sound (AAC, written with PyAV) become shards of the
tiny ``LTX2Pipeline``'s video latents, audio latents and text condition, which SFT then trains on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastgen_testing import shard_samples, two_iterations
from tiny_ltx2 import FRAME_RATE, FRAMES, PIXELS, saved_tiny_pipeline

from fastgen.configs.net_ltx2 import TINY_LTX2, ltx2_transformer
from fastgen.pipelines.media import write_mp4

CAPTIONS = {"loud": "a drum", "quiet": "a flute", "mono": "a bell"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ltx2_encode") / "pipeline"
    saved_tiny_pipeline(path)
    return path


def _clips(src: Path) -> dict[str, tuple[np.ndarray, np.ndarray | None, int]]:
    """12 frames of 40x48 at 24 fps with: stereo noise at 48 kHz (loud), a 700 Hz stereo tone at 44.1 kHz (quiet),
    a mono 300 Hz tone at 22.05 kHz; plus one without sound and an image (both skipped)."""
    rng = np.random.default_rng(0)
    src.mkdir()
    t = np.arange(22050) / 22050
    clips = {"loud": (rng.normal(0, 0.3, (2, 24000)).clip(-1, 1), 48000),
             "quiet": (np.stack([0.1 * np.sin(2 * np.pi * 700 * np.arange(22050) / 44100)] * 2), 44100),
             "mono": ((0.4 * np.sin(2 * np.pi * 300 * t))[None], 22050), "silent": (None, 0)}
    made = {}
    for name, (audio, rate) in clips.items():
        frames = rng.integers(0, 256, (12, 40, 48, 3), dtype=np.uint8)
        write_mp4(src / f"{name}.mp4", frames, fps=int(FRAME_RATE), audio=audio, sample_rate=rate or None)
        (src / f"{name}.txt").write_text(CAPTIONS.get(name, "nothing to hear"))
        made[name] = (frames, audio, rate)
    from PIL import Image

    Image.new("RGB", (40, 40)).save(src / "still.png")
    (src / "still.txt").write_text("a picture")
    return made


def _encode(src: Path, dst: Path, folder: Path, *extra: str) -> Any:
    from fastgen_testing import run_in_process

    return run_in_process("encode-data", str(src), str(dst), "--weights", str(folder), "--resolution", str(PIXELS),
                          "--frames", str(FRAMES), "--device", "cpu", "--batch-size", "2", *extra)


@pytest.fixture(scope="module")
def encoded(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ltx2_clips")
    clips = _clips(root / "clips")
    result = _encode(root / "clips", root / "shards", folder)
    assert result.returncode == 0, result.stderr
    return {"clips": clips, "dst": root / "shards", "members": shard_samples(root / "shards"),
            "index": json.loads((root / "shards" / "index.json").read_text())}


def test_clips_become_video_audio_and_text_fields(folder: Path, encoded: dict[str, Any]) -> None:
    """Each clip with sound: ``latent.npy`` the codec's video latents of its first 9 frames (centre-cropped,
    resized), ``audio_latent.npy`` the audio VAE's normalised latents of the log-mel spectrogram of its track over
    those frames' span (9 / 24 s at 16 kHz, stereo) - as many latent frames as ``LTX2Pipeline`` samples for 9
    frames at 24 fps - and ``text.npy`` the codec's condition of the caption. The clip without sound and the image
    are skipped and counted."""
    from fastgen.datasets.sound import read_sound
    from fastgen.datasets.sources import center_crop_resize_array
    from fastgen.networks.codecs import load_codec
    from fastgen.networks.log_mel import log_mel_spectrogram
    from fastgen.pipelines.media import read_mp4

    codec = load_codec(folder)  # prompts to the pipeline's 1024 tokens, as encode-data encodes them
    pipe_count = round(FRAMES / FRAME_RATE * 16000 / 160 / 4)  # LTX2Pipeline's audio_num_frames
    index, members = encoded["index"], encoded["members"]
    assert index["samples"] == 3 and index["skipped"] == 2
    assert index["audio_shape"] == [2, pipe_count, 4] and index["sound_rate"] == 16000
    assert index["latent_shape"] == [2, 5, 4, 4] and "audio_latent" in index["fields"]
    skipped = json.loads((encoded["dst"] / "shard-000000.json").read_text())["skipped"]
    assert any("silent.mp4: no audio track" in reason for reason in skipped), skipped
    assert any("still.png: an image" in reason for reason in skipped), skipped
    src = encoded["dst"].parent / "clips"
    for name, caption in CAPTIONS.items():
        sample = members[caption]
        frames = np.stack([center_crop_resize_array(f, PIXELS) for f in read_mp4(src / f"{name}.mp4")[:FRAMES]])
        pixels = torch.from_numpy(frames).float().permute(3, 0, 1, 2)[None] / 127.5 - 1
        torch.testing.assert_close(torch.from_numpy(sample["latent"]), codec.encode_images(pixels)[0], atol=1e-5,
                                   rtol=0)
        samples = int(FRAMES / FRAME_RATE * 16000)
        wave = torch.from_numpy(read_sound(src / f"{name}.mp4", 0.0, samples, 16000))[None]
        mel = log_mel_spectrogram(wave, 16000, n_fft=1024, hop_length=160, mel_bins=16)
        assert mel.shape[2] == samples // 160 + 1
        want = codec.encode_audio(mel)[0, :, :pipe_count]
        torch.testing.assert_close(torch.from_numpy(sample["audio_latent"]), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.from_numpy(sample["text"]),
                                   codec.condition(codec.encode_prompts([caption]))[0], atol=1e-5, rtol=0)
        assert sample["json"]["sound"] == {"start": 0.0, "rate": 16000, "samples": samples}
    latents = [members[c]["audio_latent"] for c in CAPTIONS.values()]
    assert not np.allclose(latents[0], latents[1]) and not np.allclose(latents[1], latents[2])


def test_sft_trains_on_the_shards(folder: Path, encoded: dict[str, Any], output_root: Path) -> None:
    """The shards are LTX-2's training data as written: SFT on the folder's transformer reads ``real.video`` /
    ``real.audio`` / ``condition`` from them and moves its weights in 2 iterations; the config's other sizes give
    way to the shards' (``index.json``), which ``config.yaml`` records."""
    from fastgen.configs.data import webdataset_loader
    from fastgen.configs.methods.config_sft import create_config as sft_config
    from fastgen.trainer import Trainer

    index = encoded["index"]
    config = sft_config()
    config.model.net = ltx2_transformer(TINY_LTX2, fps=FRAME_RATE, video_seq_len=80)
    config.model.pretrained_model_path = str(folder)
    config.model.modality_shapes = {"video": [2, 3, 8, 8], "audio": [2, 20, 4]}  # a recipe's other clip size
    config.model.input_shape = [2, 3, 8, 8]
    config.dataloader_train = webdataset_loader(
        [f"WDS:{encoded['dst']}"], batch_size=2, shuffle_buffer=4,
        fields={"real.video": "latent.npy", "real.audio": "audio_latent.npy", "condition": "text.npy"})
    two_iterations(config, "sft", group="ltx2_encode_data")
    from diffusers import LTX2VideoTransformer3DModel

    start = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer").state_dict()
    trainer = Trainer(config)
    model = trainer.run()
    assert trainer.iteration == 2
    from fastgen.configs.config_utils import load_config

    recorded = load_config(str(Path(config.log_config.save_path) / "config.yaml")).model
    assert {k: list(v) for k, v in recorded.modality_shapes.items()} == {"video": index["latent_shape"],
                                                                          "audio": index["audio_shape"]}
    moved = [k for k, v in model.net.backbone.model.state_dict().items() if not torch.equal(v, start[k])]
    assert moved


def test_without_sound_or_an_audio_vae_ltx2_is_refused_in_one_line(folder: Path, tmp_path: Path) -> None:
    import shutil

    (tmp_path / "clips").mkdir()
    write_mp4(tmp_path / "clips" / "a.mp4", np.zeros((9, 32, 32, 3), np.uint8), fps=24)
    (tmp_path / "clips" / "a.txt").write_text("a cat")
    result = _encode(tmp_path / "clips", tmp_path / "out", folder, "--no-sound")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "--no-sound: LTX-2" in lines[0], result.stderr
    result = _encode(tmp_path / "clips", tmp_path / "out", folder, "--frames", "8")
    assert result.returncode == 2 and "1 + 2 k frames" in result.stderr, result.stderr  # the tiny VAE: 2 in time
    deaf = tmp_path / "deaf"
    shutil.copytree(folder, deaf, ignore=shutil.ignore_patterns("audio_vae", "vocoder"))
    model_index = json.loads((deaf / "model_index.json").read_text())
    model_index.update(audio_vae=[None, None], vocoder=[None, None])
    (deaf / "model_index.json").write_text(json.dumps(model_index))
    result = _encode(tmp_path / "clips", tmp_path / "out2", deaf)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "no audio_vae" in lines[0], result.stderr
