"""WandbCallback media in real offline W&B runs: the scalars' window means, scatter plots for toy points, GIF
videos for video models (no moviepy), WAV audio (stdlib ``wave``, no soundfile)."""

from __future__ import annotations

import math
import wave
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from PIL import Image

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.log_modules.media import frame_indices, save_wav
from fastgen.callbacks.wandb import media_kind
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer
from fastgen_testing import read_wandb_history, tiny_toy_config, tiny_video_config


class LossRecorder(Callback):
    """The step-averaged ``loss_dict`` the trainer hands to ``on_training_step_end``, by iteration."""

    def __init__(self) -> None:
        self.losses: dict[int, dict[str, float]] = {}

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        self.losses[iteration] = {k: float(v.detach()) for k, v in loss_dict.items()}


class TinyAudioDataset:
    """Sine waves ``(1, 64)`` of a few frequencies (a stand-in audio data set)."""

    def __len__(self) -> int:
        return 64

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        t = torch.arange(64) / 64.0
        freqs = (indices % 4 + 1).float().unsqueeze(1)
        return {"real": (0.8 * torch.sin(2 * math.pi * freqs * t)).unsqueeze(1)}


@pytest.mark.parametrize(("shape", "kind"), [
    ((4, 3, 5, 8, 8), "video"), ((4, 1, 8, 8), "image"), ((4, 2), "points"), ((4, 1, 64), "audio"), ((4, 64), "audio"),
])
def test_media_kind_from_the_sample_shape(shape: tuple[int, ...], kind: str) -> None:
    assert media_kind(torch.zeros(shape)) == kind
    assert media_kind(torch.zeros(shape), media="image") == "image"  # forced


def test_frame_indices_are_uniform_and_include_the_ends() -> None:
    assert frame_indices(9, 4) == [0, 3, 5, 8]
    assert frame_indices(16, 4) == [0, 5, 10, 15]
    assert frame_indices(3, 8) == [0, 1, 2]
    assert frame_indices(5, 1) == [2]


def test_wav_writer_round_trips(tmp_path: Path) -> None:
    wave_in = torch.stack([torch.linspace(-1, 1, 100), torch.linspace(1, -1, 100)])
    path = save_wav(wave_in, 8000, tmp_path / "x.wav")
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (2, 2, 8000, 100)
        pcm = torch.frombuffer(bytearray(wav.readframes(100)), dtype=torch.int16).view(100, 2).t()
    assert torch.equal(pcm, (wave_in * 32767).round().to(torch.int16))


def _offline(config: Any, sample_iter: int = 2, **wandb_args: Any) -> Any:
    config.log_config.wandb_mode = "offline"
    config.trainer.callbacks.update({"wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(
        sample_iter=sample_iter, num_samples=wandb_args.pop("num_samples", 8), **wandb_args)})
    return config


def _offline_dir(trainer: Trainer) -> Path:
    (run,) = (trainer.run_dir / "wandb").glob("offline-run-*")
    return run


def test_offline_run_holds_scalars_an_image_and_a_video(monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance run: a tiny video model with camera-pose batches, the seed's VIPE preset, W&B offline."""
    from fastgen.configs.callbacks import VIPE_CALLBACK

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = tiny_video_config("wandb_video", max_iter=4)
    config.log_config.wandb_mode = "offline"
    config.trainer.callbacks.update(VIPE_CALLBACK)
    config.trainer.callbacks.wandb.sample_iter = 2
    recorder = LossRecorder()
    trainer = Trainer(config, extra_callbacks={"losses": recorder})
    trainer.run()

    rows = read_wandb_history(trainer.run_dir)
    by_step = {row["_step"]: row for row in rows if "total_loss" in row}
    assert sorted(by_step) == [2, 4]
    for step in (2, 4):  # the window mean over the two steps of each logging window (logging_iter = 2)
        want = (recorder.losses[step - 1]["total_loss"] + recorder.losses[step]["total_loss"]) / 2
        assert by_step[step]["total_loss"] == pytest.approx(want, rel=1e-6)
        assert by_step[step]["lr/net"] == 1e-3 and "grad_norm" in by_step[step] and "ema/ema_beta" in by_step[step]
        assert by_step[step]["vipe/posed_samples"] == 4.0 and by_step[step]["vipe/path_length"] > 0
    media = {key: row[key] for row in rows for key in row if key.endswith("/_type")}
    assert media["samples/_type"] == "video-file"
    assert media["vipe/trajectory/_type"] == "image-file"
    assert media["vipe/action_frames/_type"] == "images/separated"

    files = _offline_dir(trainer) / "files" / "media"
    videos = sorted((files / "videos").glob("samples_*.gif"))
    assert len(videos) == 2  # iterations 2 and 4
    with Image.open(videos[-1]) as gif:
        assert gif.n_frames == 4  # T = 4 frames of the 8-sample grid
        assert gif.size == ((3 * (8 + 1) + 1) * 8,) * 2  # 8 samples of 8x8, 3 per row, 1 px padding, upscaled x8
    images = sorted((files / "images" / "vipe").glob("trajectory_*.png"))
    assert len(images) == 2
    with Image.open(images[0]) as png:
        assert png.size == (640, 320) and png.getextrema() != ((255, 255),) * 3
    assert (trainer.run_dir / "samples" / "iter_0000004.gif").is_file()
    assert trainer.last_sample_path == trainer.run_dir / "samples" / "iter_0000004.gif"


def test_toy_points_are_a_scatter_plot_image() -> None:
    config = _offline(tiny_toy_config("wandb_points", max_iter=2), sample_iter=2, num_samples=32)
    trainer = Trainer(config)
    trainer.run()
    rows = read_wandb_history(trainer.run_dir)
    (row,) = [r for r in rows if "samples/_type" in r]
    assert row["samples/_type"] == "image-file" and row["_step"] == 2
    (png,) = (_offline_dir(trainer) / "files" / "media" / "images").glob("samples_*.png")
    with Image.open(png) as image:
        assert image.size == (256, 256) and image.getextrema() == (0, 255)  # black points on white


def test_audio_samples_are_wav_files_logged_without_soundfile() -> None:
    from fastgen_testing import FlatMLPDenoiser  # noqa: F401 - the backbone the config names
    from fastgen.configs.net import edm_schedule

    config = tiny_toy_config("wandb_audio", max_iter=2)
    config.model.input_shape = [1, 64]
    config.model.sample_steps = 2
    config.model.net = LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen_testing.FlatMLPDenoiser")(shape=[1, 64]), noise_scheduler=edm_schedule(sigma_data=0.5))
    config.dataloader_train = LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall(TinyAudioDataset)(), batch_size=8, shuffle=True, seed=0)
    config.dataloader_val = None
    config = _offline(config, sample_iter=2, num_samples=5, sample_rate=8000, max_audio=3)
    trainer = Trainer(config)
    trainer.run()
    local = sorted((trainer.run_dir / "samples").glob("iter_0000002_*.wav"))
    assert [p.name for p in local] == [f"iter_0000002_{k}.wav" for k in range(3)]
    with wave.open(str(local[0]), "rb") as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (1, 8000, 64)
    rows = read_wandb_history(trainer.run_dir)
    (row,) = [r for r in rows if "samples/0/_type" in r]
    assert [row[f"samples/{k}/_type"] for k in range(3)] == ["audio-file"] * 3 and "samples/3/_type" not in row
    assert len(list((_offline_dir(trainer) / "files" / "media" / "audio").rglob("*.wav"))) == 3


def test_disabled_wandb_still_saves_local_samples() -> None:
    config = tiny_toy_config("wandb_disabled", max_iter=3)
    config.trainer.callbacks = DictConfig({**config.trainer.callbacks,
                                           "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=2, num_samples=16)})
    trainer = Trainer(config)
    trainer.run()
    assert sorted(p.name for p in (trainer.run_dir / "samples").iterdir()) == ["iter_0000002.png", "iter_0000003.png"]
    assert not (trainer.run_dir / "wandb").exists()


def test_history_reader_waits_out_a_record_caught_half_written(tmp_path: Path) -> None:
    """The W&B service can still be flushing when ``finish()`` returns (a CI run once read a torn record): the
    reader must re-read until the exit record is whole instead of failing on the partial bytes."""
    import struct
    import threading
    import zlib

    from wandb.proto import wandb_internal_pb2

    def framed(record: Any) -> bytes:
        payload = record.SerializeToString()
        return struct.pack("<IHB", zlib.crc32(payload), len(payload), 1) + payload

    history = wandb_internal_pb2.Record()
    item = history.history.item.add()
    item.key, item.value_json = "loss", "0.5"
    exit_record = wandb_internal_pb2.Record()
    exit_record.exit.exit_code = 0
    whole = b":W&B\xe1\xbe\x00" + framed(history) + framed(exit_record)
    log = tmp_path / "wandb" / "offline-run-1" / "run-1.wandb"
    log.parent.mkdir(parents=True)
    log.write_bytes(whole[:7 + 7 + 5])  # the history record's header and 5 of its bytes: nothing after it yet
    finisher = threading.Timer(0.5, log.write_bytes, args=(whole,))
    finisher.start()
    try:
        assert read_wandb_history(tmp_path, timeout=10.0) == [{"loss": 0.5}]
    finally:
        finisher.join()
