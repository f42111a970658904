"""sCM on digits: continuous-time consistency distillation (sCD, Lu & Song 2024) of the shipped digits teacher
into a 1-step student. TrigFlow time runs on the teacher's own EDM parameterisation (no weight conversion); the
tangent ``d/dt F`` comes from forward-mode AD (``torch.func.jvp``), warmed up over the first 200 steps.

Training without a teacher network (sCT, the teacher checkpoint only initialises the student):
``- model.mode=ct``. Finite-difference tangents: ``- model.jvp=finite_difference``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.experiments.Digits.config_dmd2_digits import shipped_teacher
from fastgen.configs.methods.config_scm import create_config as scm_config
from fastgen.configs.net import edm_unet_8x8


def create_config() -> BaseConfig:
    config = scm_config()
    config.model.net = edm_unet_8x8(num_classes=10)
    config.model.teacher_ckpt = shipped_teacher()
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.sample_steps = 18
    config.model.mode = "cd"
    config.model.tangent_warmup_iters = 200
    config.model.net_optimizer.lr = 5e-5
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    config.log_config.name = "scm"
    return config
