"""SFT of a small LTX-2 (diffusers' ``LTX2VideoTransformer3DModel`` from ``LTX2_AV_DIGITS``; HaCohen et al.
2026) on the audio-visual digits (``fastgen.datasets.audio_video_digits``): 8-frame 8x16 videos of a moving digit
with a 16-bin spectrogram whose pitch says the digit, in pixel space - the LTX-2 family's CPU check of the
multimodal path (``model.modality_shapes``: both streams denoised together, each at its own time with
``model.modality_times = "independent"``, as LTX-2 conditions one stream on the other).

Labels through a fixed bank of 10 random prompt embeddings (video and audio text side by side), 10% label dropout
for guidance; rectified flow with LTX-2's sampling shift for its 256 video tokens (2x2 patches of 8 frames x 8x16);
Adam at 1e-3, batch 16, an EMA, 16 Heun steps for samples. 4 blocks, video 64 wide, audio 32 wide.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, WANDB_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import audio_video_digits_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_ltx2 import LTX2_AV_DIGITS, ltx2_transformer

SHAPES = {"video": [1, 8, 8, 16], "audio": [1, 8, 16]}


def create_config() -> BaseConfig:
    config = sft_config()
    config.model.net = ltx2_transformer(LTX2_AV_DIGITS, fps=8.0, num_prompts=10, prompt_tokens=4,
                                        video_seq_len=256)
    config.model.modality_shapes = dict(SHAPES)
    config.model.modality_times = "independent"
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.net_optimizer.lr = 1e-3
    config.model.sample_steps = 16
    config.model.condition_dropout = 0.1
    config.dataloader_train = audio_video_digits_loader(split="train", batch_size=16)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = 1000
    config.trainer.callbacks.wandb.num_samples = 8
    config.log_config.group = "audio_video_digits"
    return config
