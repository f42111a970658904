"""Quick-start: distill the shipped digits teacher into a 1-step student with DMD2.

The teacher (``fastgen/assets/digits_teacher.pth``) is the EMA network of ``Digits/config_sft_digits`` trained
for 4,000 iterations; reproduce it with::

    fastgen train --config Digits/config_sft_digits - trainer.max_iter=4000 log_config.name=teacher
    python scripts/export_teacher.py FASTGEN_OUTPUT/fastgen/digits/teacher/checkpoints/0004000.pth

The student and the fake score start as copies of the teacher. DMD2's GAN branch (a head on the fake score's
bottleneck, trained on real digits) lets the 1-step student match the 35-evaluation teacher.
This is what ``fastgen train`` runs when no ``--config`` is given.
"""

from __future__ import annotations

from importlib import resources

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
from fastgen.configs.net import edm_unet_8x8


def shipped_teacher() -> str:
    """Absolute path of the digits teacher that ships inside the package."""
    return str(resources.files("fastgen") / "assets" / "digits_teacher.pth")


def create_config() -> BaseConfig:
    config = dmd2_config()
    config.model.net = edm_unet_8x8(num_classes=10)
    config.model.teacher_ckpt = shipped_teacher()
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.sample_steps = 18  # the teacher's Heun steps (35 evaluations) for `fastgen sample --teacher`
    config.model.student_update_freq = 5
    config.model.gan_loss_weight_gen = 3e-3
    config.model.net_optimizer.lr = 5e-5
    config.model.fake_score_optimizer.lr = 5e-5
    config.model.discriminator_optimizer.lr = 5e-5
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    return config
