"""Self-Forcing (Huang et al. 2025) on moving digits: a 2-step block-causal student (4 chunks of 2 frames, KV
cache) trained on its own chunk-by-chunk rollouts with DMD2 against the bidirectional teacher of
``Digits/config_sft_video_dit_moving_digits`` (teacher and fake score bidirectional; the student starts as the
teacher's copy, its attention made block-causal). Make the teacher first (commands in that recipe's docstring),
then::

    fastgen train --config Digits/config_self_forcing_moving_digits - model.teacher_ckpt=video_teacher.pth

Student times ``[1.0, 0.5]`` (rectified flow): each chunk is x0 at t = 1, re-noised to 0.5, x0 again; the
finished chunk enters the cache clean. DMD2 settings of the digits recipe (``student_update_freq`` 5, fake score
and student at 1e-4 after the teacher's copy; no GAN). Measured in ``docs/experiments/moving-digits.md``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, WANDB_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import moving_digits_loader
from fastgen.configs.methods.config_self_forcing import create_config as self_forcing_config
from fastgen.configs.net_dit import causal_video_dit


def create_config() -> BaseConfig:
    config = self_forcing_config()
    config.model.net = causal_video_dit(causal=True)
    config.model.teacher = causal_video_dit(causal=False)
    config.model.fake_score = causal_video_dit(causal=False)
    config.model.teacher_ckpt = "video_teacher.pth"
    config.model.input_shape = [1, 8, 8, 16]
    config.model.num_classes = 10
    config.model.t_list = [1.0, 0.5]
    config.model.sample_steps = 25
    config.model.student_update_freq = 5
    config.model.net_optimizer.lr = 1e-4
    config.model.fake_score_optimizer.lr = 1e-4
    config.model.use_ema = True
    config.dataloader_train = moving_digits_loader(split="train", batch_size=32)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.beta = 0.95
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 20
    config.log_config.group = "moving_digits"
    return config
