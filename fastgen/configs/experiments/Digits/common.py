"""What every digits distillation recipe shares: the shipped teacher, the class-conditional 8x8 U-Net, the data,
the schedule and the callbacks. Recipes call ``digits_distillation(method_config)`` and then set only what is
particular to their method."""

from __future__ import annotations

from importlib import resources
from typing import Any

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import edm_unet_8x8


def shipped_teacher() -> str:
    """Absolute path of the digits teacher that ships inside the package (``fastgen/assets/digits_teacher.pth``:
    the EMA network of ``Digits/config_sft_digits`` after 4,000 iterations; see ``config_dmd2_digits``)."""
    return str(resources.files("fastgen") / "assets" / "digits_teacher.pth")


def digits_distillation(config: BaseConfig, max_iter: int = 1000, save_ckpt_iter: int = 500,
                        callbacks: dict[str, Any] | None = None, net: DictConfig | None = None) -> BaseConfig:
    """Fill in the digits setting: ``net`` (default: the teacher's architecture), the shipped teacher (for methods
    whose config has ``teacher_ckpt``), 18 Heun steps for the teacher (35 evaluations), the train split at batch
    64, ``max_iter`` iterations, and GradClip + ``callbacks`` + W&B (100-sample grids every 500 iterations)."""
    config.model.net = net if net is not None else edm_unet_8x8(num_classes=10)
    if hasattr(config.model, "teacher_ckpt"):
        config.model.teacher_ckpt = shipped_teacher()
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.sample_steps = 18
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = save_ckpt_iter
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **(callbacks or {}), **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    return config


def decay_learning_rates(config: BaseConfig, max_iter: int, final_factor: float = 0.1) -> BaseConfig:
    """Every learning rate of a student/critic recipe (DMD2 and the methods built on it: student, fake score,
    discriminator) decays linearly to ``final_factor`` of its start over ``max_iter`` iterations (``LinearLR``).
    Each schedule counts the updates of its own module: the student is stepped in one iteration of every
    ``student_update_freq``, the fake score and the discriminator in the others. So the decay ends with the run
    only when ``trainer.max_iter`` is ``max_iter`` (the trainer warns otherwise, naming each schedule's length)."""
    student_updates = max_iter // config.model.student_update_freq

    def linear_decay(updates: int) -> DictConfig:
        return LazyCall("torch.optim.lr_scheduler.LinearLR")(start_factor=1.0, end_factor=final_factor,
                                                             total_iters=updates)

    config.model.net_scheduler = linear_decay(student_updates)
    config.model.fake_score_scheduler = linear_decay(max_iter - student_updates)
    config.model.discriminator_scheduler = linear_decay(max_iter - student_updates)
    return config


def moving_digits_teacher(config: BaseConfig, net: DictConfig, condition_dropout: float = 0.1) -> BaseConfig:
    """Fill in what the video networks trained from scratch on moving digits share (the bidirectional and causal
    teachers, the small Wan, the video-to-world Cosmos Predict2): ``net`` on ``(1, 8, 8, 16)`` videos with the
    10 labels (dropped with ``condition_dropout`` for guidance), Adam at 1e-3, 25 sampling steps, the train split at
    batch 32 for 2,000 iterations, gradient clipping, an EDM2 power EMA and W&B (20-video grids every 1,000)."""
    from fastgen.configs.callbacks import EMA_CALLBACK
    from fastgen.configs.data import moving_digits_loader

    config.model.net = net
    config.model.input_shape = [1, 8, 8, 16]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.net_optimizer.lr = 1e-3
    config.model.sample_steps = 25
    config.model.condition_dropout = condition_dropout
    config.dataloader_train = moving_digits_loader(split="train", batch_size=32)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.wandb.sample_iter = 1000
    config.trainer.callbacks.wandb.num_samples = 20
    config.log_config.group = "moving_digits"
    return config


def moving_digits_student(config: BaseConfig, max_iter: int = 1000, lr: float = 1e-4) -> BaseConfig:
    """Fill in the setting of the causal video students on moving digits (CausalKD, CausVid, Self-Forcing): a
    block-causal ``causal_video_dit`` student of 4 chunks of 2 frames, the bidirectional teacher (and fake score,
    for methods that have one) of ``Digits/config_sft_video_dit_moving_digits`` read from ``video_teacher.pth``,
    student times ``[1.0, 0.5]``, 25 Heun steps for the teacher, the train split at batch 32, an EMA (0.95) and
    W&B (20-video grids every 500 iterations)."""
    from fastgen.configs.callbacks import EMA_CALLBACK
    from fastgen.configs.data import moving_digits_loader
    from fastgen.configs.net_dit import causal_video_dit

    config.model.net = causal_video_dit(causal=True)
    config.model.teacher = causal_video_dit(causal=False)
    if hasattr(config.model, "fake_score"):
        config.model.fake_score = causal_video_dit(causal=False)
    config.model.teacher_ckpt = "video_teacher.pth"
    config.model.input_shape = [1, 8, 8, 16]
    config.model.num_classes = 10
    config.model.t_list = [1.0, 0.5]
    config.model.sample_steps = 25
    config.model.net_optimizer.lr = lr
    config.model.use_ema = True
    config.dataloader_train = moving_digits_loader(split="train", batch_size=32)
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.beta = 0.95
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 20
    config.log_config.group = "moving_digits"
    return config
