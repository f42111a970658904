"""Consistency model on digits, Easy Consistency Tuning (Geng et al. 2024): consistency training started from
the shipped digits teacher, with ECT's curriculum ``r = t (1 - 1/2^(stage+1))`` (``CTScheduleCallback``, a new
stage every 200 steps at batch 64) and ECT's log-normal time proposal.

No teacher network is kept (``mode="ct"``: the checkpoint only initialises the student). Consistency
*distillation* from the same teacher: ``- model.mode=cd``. Two-step sampling: ``- model.t_list=[80.0,0.8]``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.experiments.Digits.config_dmd2_digits import shipped_teacher
from fastgen.configs.methods.config_cm import create_config as cm_config
from fastgen.configs.net import edm_unet_8x8


def create_config() -> BaseConfig:
    config = cm_config()
    config.model.net = edm_unet_8x8(num_classes=10)
    config.model.teacher_ckpt = shipped_teacher()
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.sample_steps = 18
    config.model.mode = "ct"
    config.model.t_mean = -1.1  # ECT's proposal ln(t) ~ N(-1.1, 2.0^2)
    config.model.t_std = 2.0
    config.model.net_optimizer.lr = 1e-4
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **CT_SCHEDULE_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 12.8
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    config.log_config.name = "cm"
    return config
