"""Audio-visual samples end to end (``fastgen.datasets.audio_video_digits`` with a toy two-stream network,
``tests/multimodal_nets.py``): the task's sound says the digit by its pitch and the position by its loudness; the
scores tell real pairs from shuffled ones; MP4 files carry the sound; a multimodal SFT run logs W&B (offline) GIF,
WAV and MP4-with-sound samples, ``fastgen sample`` writes the npz, the GIF and MP4 files with sound, ``fastgen
eval`` and ``train --eval-samples`` score video and sound."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen.datasets.audio_video_digits import (AudioVideoDigitsDataset, PITCH_OFFSET, SAMPLE_RATE,
                                                 bin_frequencies, spectrogram_to_waveform)
from fastgen.evaluation.audio_video_digits import score_audio_video


def dominant_frequency(wave: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(wave))
    return float(np.fft.rfftfreq(len(wave), 1.0 / rate)[spectrum.argmax()])


def test_the_sound_says_the_digit_and_follows_its_position() -> None:
    data = AudioVideoDigitsDataset("val")
    batch = data.get_batch(torch.arange(40))
    audio, labels = batch["real"]["audio"], batch["condition"]
    assert audio.shape == (40, 1, 8, 16) and audio.min() >= -1 and audio.max() <= 1
    loudest = ((audio + 1) / 2)[:, 0].mean(1).argmax(-1)
    assert torch.equal(loudest, labels + PITCH_OFFSET)
    envelope = ((audio + 1) / 2)[:, 0].amax(-1)
    torch.testing.assert_close(envelope, 0.3 + 0.7 * data.videos.offsets[:40].float() / 8, atol=1e-6, rtol=0)
    waves = spectrogram_to_waveform(audio[:3])
    assert waves.shape == (3, 1, SAMPLE_RATE) and waves.abs().max() <= 1
    for i in range(3):
        expected = float(bin_frequencies()[PITCH_OFFSET + int(labels[i])])
        assert abs(dominant_frequency(waves[i, 0].numpy(), SAMPLE_RATE) - expected) <= 2.0


def test_scores_tell_real_pairs_from_shuffled_and_noise() -> None:
    batch = AudioVideoDigitsDataset("val").get_batch(torch.arange(200))
    video, audio, labels = batch["real"]["video"], batch["real"]["audio"], batch["condition"].numpy()
    real = score_audio_video(video, audio, labels)
    assert real["pitch_accuracy"] == 1.0 and real["av_sync"] > 0.99 and real["spectral_fd"] < 0.1
    shuffled = score_audio_video(video, audio[torch.roll(torch.arange(200), 1)], labels)
    assert shuffled["pitch_accuracy"] < 0.3 and shuffled["av_sync"] < 0.3
    noise = score_audio_video(video, torch.rand_like(audio) * 2 - 1, labels)
    assert noise["spectral_fd"] > 20 * real["spectral_fd"]


def test_an_mp4_carries_the_sound(tmp_path: Path) -> None:
    from fastgen.pipelines.media import read_mp4, read_mp4_audio, write_mp4

    batch = AudioVideoDigitsDataset("val").get_batch(torch.arange(1))
    wave = spectrogram_to_waveform(batch["real"]["audio"])[0].numpy()
    frames = ((batch["real"]["video"][0, 0].numpy() + 1) * 127.5).astype(np.uint8)[..., None]
    write_mp4(tmp_path / "av.mp4", frames, fps=8, audio=wave, sample_rate=SAMPLE_RATE)
    assert read_mp4(tmp_path / "av.mp4").shape[0] == 8
    sound, rate = read_mp4_audio(tmp_path / "av.mp4")
    assert rate == SAMPLE_RATE and sound.shape[1] >= SAMPLE_RATE
    expected = float(bin_frequencies()[PITCH_OFFSET + int(batch["condition"][0])])
    assert abs(dominant_frequency(sound[0, :SAMPLE_RATE], rate) - expected) <= 2.0


RECIPE = '''
from omegaconf import DictConfig

from fastgen.configs.callbacks import WANDB_CALLBACK
from fastgen.configs.data import audio_video_digits_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from multimodal_nets import two_stream_net

SHAPES = {"video": [1, 8, 8, 16], "audio": [1, 8, 16]}


def create_config():
    config = sft_config()
    config.model.net = two_stream_net(SHAPES, num_classes=10, hidden=32)
    config.model.modality_shapes = SHAPES
    config.model.num_classes = 10
    config.model.sample_steps = 2
    config.dataloader_train = audio_video_digits_loader(batch_size=8)
    config.trainer.max_iter = 2
    config.trainer.save_ckpt_iter = 2
    config.trainer.callbacks = DictConfig(WANDB_CALLBACK)
    config.trainer.callbacks.wandb.sample_iter = 2
    config.trainer.callbacks.wandb.num_samples = 4
    config.trainer.callbacks.wandb.max_audio = 2
    config.log_config.group = "av"
    config.log_config.name = "tiny_av"
    config.log_config.wandb_mode = "offline"
    return config
'''


@pytest.mark.slow
def test_a_multimodal_run_logs_samples_and_evaluates_video_and_sound(tmp_path: Path) -> None:
    from fastgen_testing import run_cli

    from fastgen.pipelines.media import read_mp4_audio

    (tmp_path / "tiny_av.py").write_text(RECIPE)
    tests = str(Path(__file__).resolve().parents[1])
    env = {"FASTGEN_OUTPUT_ROOT": str(tmp_path / "out"), "WANDB_MODE": "offline", "PYTHONPATH": tests}
    trained = run_cli("train", "-c", str(tmp_path / "tiny_av.py"), "--eval-samples", "20", cwd=tmp_path, env=env,
                      timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "spectral_fd" in trained.stdout and "av_sync" in trained.stdout
    run_dir = tmp_path / "out" / "fastgen" / "av" / "tiny_av"
    samples = run_dir / "samples"
    assert (samples / "iter_0000002.gif").is_file()
    assert sorted(p.name for p in samples.glob("iter_0000002_*")) == [
        "iter_0000002_audio_0.wav", "iter_0000002_audio_1.wav", "iter_0000002_av_0.mp4", "iter_0000002_av_1.mp4"]
    sound, rate = read_mp4_audio(samples / "iter_0000002_av_0.mp4")
    assert rate == SAMPLE_RATE and sound.shape[1] >= SAMPLE_RATE
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = b"".join(p.read_bytes() for p in offline.rglob("*.wandb"))
    assert b"samples/av_0" in logged and b"samples/audio_1" in logged
    record = json.loads((run_dir / "evaluation.json").read_text())["results"]["model"]
    assert {"fd_per_frame", "spectral_fd", "pitch_accuracy", "av_sync"} <= set(record)

    out = tmp_path / "av.npz"
    sampled = run_cli("sample", str(run_dir), "-n", "10", "--out", str(out), cwd=tmp_path, env=env)
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    with np.load(out) as data:
        assert data["arr_0"].shape == (10, 8, 8, 16, 1) and data["audio"].shape == (10, 1, 8, 16)
        assert data["waveform"].shape == (10, 1, SAMPLE_RATE) and int(data["sample_rate"]) == SAMPLE_RATE
        assert str(data["fastgen_dataset"]) == "audio_video_digits"
    assert out.with_suffix(".gif").is_file() and len(list(tmp_path.glob("av_0*.mp4"))) == 8
    assert read_mp4_audio(tmp_path / "av_0003.mp4")[1] == SAMPLE_RATE
    evaluated: subprocess.CompletedProcess = run_cli("eval", str(out), cwd=tmp_path, env=env)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "spectral_fd" in evaluated.stdout and "av_sync" in evaluated.stdout
