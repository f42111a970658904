"""``model.precision_amp`` / ``precision_amp_infer`` and float16 loss scaling (``fastgen.callbacks.loss_scale``), on CPU:
bfloat16 autocast follows the float32 loss curve, float16 skips overflowing steps and backs its scale off, the
scale survives a checkpoint, and the sampling autocast runs the network in the asked dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.callbacks.loss_scale import LossScaleCallback
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer
from fastgen.utils.errors import ConfigError
from rank_probes import LossLog


def _config(tmp_path: Path, name: str, amp: str | None, max_iter: int = 30):
    from fastgen.configs.experiments.Digits.config_sft_digits import create_config

    config = create_config()
    config.model.net.backbone.model_channels = 8
    config.model.precision_amp = amp
    config.dataloader_train.batch_size = 32
    config.dataloader_val = None
    config.trainer.max_iter = max_iter
    config.trainer.save_ckpt_iter = max_iter
    config.trainer.callbacks = {"losses": LazyCall(LossLog)(path=str(tmp_path / f"{name}.losses"))}
    config.log_config.wandb_mode = "disabled"
    config.log_config.name = name
    return config


def _losses(tmp_path: Path, name: str) -> list[float]:
    return [float(line.split()[1]) for line in (tmp_path / f"{name}.losses").read_text().splitlines()]


BF16_RTOL = 0.05  # per iteration, |bf16 - fp32| / fp32; measured at most 0.009 over 30 iterations


def test_bfloat16_autocast_on_cpu_follows_the_float32_loss_curve(tmp_path: Path) -> None:
    Trainer(_config(tmp_path, "fp32", None)).run()
    model = Trainer(_config(tmp_path, "bf16", "bfloat16")).run()
    full, mixed = _losses(tmp_path, "fp32"), _losses(tmp_path, "bf16")
    assert len(full) == len(mixed) == 30
    worst = max(abs(m - f) / f for f, m in zip(full, mixed))
    assert 0 < worst <= BF16_RTOL, worst  # not identical (autocast ran), yet close
    assert all(p.dtype == torch.float32 for p in model.net.parameters())  # master weights stay float32


def test_float16_skips_overflowing_steps_and_backs_the_scale_off(tmp_path: Path) -> None:
    config = _config(tmp_path, "fp16", "float16", max_iter=16)
    config.trainer.callbacks["grad_clip"] = LazyCall("fastgen.callbacks.grad_clip.GradClipCallback")(
        grad_norm=10.0, max_consecutive_nonfinite=2)
    config.trainer.callbacks["loss_scale"] = LazyCall(LossScaleCallback)(init_scale=2.0**24, growth_interval=4)
    trainer = Trainer(config)
    assert list(trainer.callbacks)[0] == "loss_scale"  # moved before the clipping callback
    model = trainer.run()
    scaler, clip = trainer.callbacks["loss_scale"], trainer.callbacks["grad_clip"]
    assert scaler.overflow_skips >= 3  # 2^24 overflows float16 (max 65504) until backed off enough
    assert clip.nonfinite_total == 0  # overflow skips are the scaler's, not divergence
    steps = {int(s["step"]) for s in model.optimizer_dict["net"].state_dict()["state"].values()}
    assert steps == {16 - scaler.overflow_skips}
    assert scaler.scale < 2.0**24 and all(torch.isfinite(p).all() for p in model.net.parameters())
    losses = _losses(tmp_path, "fp16")
    assert losses[-1] < losses[scaler.overflow_skips]  # it trains once the scale fits
    resumed = Trainer(_config(tmp_path, "fp16", "float16", max_iter=17))
    resumed.run()
    assert resumed.callbacks["loss_scale"].state_dict()["scale"] in (scaler.scale, scaler.scale * 2)


def test_the_default_float16_scaler_is_added_and_misuse_is_refused(tmp_path: Path) -> None:
    from fastgen.configs.config_utils import validate_config

    trainer = Trainer(_config(tmp_path, "fp16_default", "float16", max_iter=1))
    assert isinstance(trainer.callbacks["loss_scale"], LossScaleCallback) and trainer.callbacks["loss_scale"].scale == 2.0**16
    config = _config(tmp_path, "bf16_scaler", "bfloat16")
    config.trainer.callbacks["loss_scale"] = LazyCall(LossScaleCallback)()
    with pytest.raises(ConfigError, match="loss scaling is for model.precision_amp=float16"):
        Trainer(config)
    config = _config(tmp_path, "half_weights", "float16")
    config.model.precision = "float16"
    with pytest.raises(ConfigError, match="set model.precision=float32"):
        validate_config(config)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sampling_runs_the_network_in_precision_amp_infer(tmp_path: Path, dtype: str) -> None:
    from fastgen.configs.instantiate import instantiate

    config = _config(tmp_path, "infer", None)
    config.model.precision_amp_infer = dtype
    model = instantiate(config.model_class, config=config.model)
    seen: list[torch.dtype] = []
    model.sampling_net().backbone.conv_in.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    samples, _ = model.sample(4, generator=torch.Generator().manual_seed(0), steps=2)
    assert seen and set(seen) == {getattr(torch, dtype)} and samples.dtype == torch.float32
