"""sCM on 2-D toy data: continuous-time consistency distillation (sCD, Lu & Song 2024) of an SFT toy teacher
into a 1-step MLP, in TrigFlow time on the teacher's own EDM parameterisation.

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_scm_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth

``model.mode=ct`` trains without a teacher network (sCT, the checkpoint only initialises the student);
``model.jvp=finite_difference`` replaces forward-mode AD by finite differences.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_scm import create_config as scm_config
from fastgen.configs.net import toy_mlp


def create_config() -> BaseConfig:
    config = scm_config()
    config.model.net = toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.model.mode = "cd"
    config.model.tangent_warmup_iters = 500
    config.model.net_optimizer.lr = 1e-4
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
