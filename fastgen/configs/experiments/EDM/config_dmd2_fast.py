"""CIFAR-10: distill a class-conditional EDM teacher into a 1-step generator with DMD2.

Networks: the teacher, the student and the fake score are all ``edm_unet_cifar10`` - fastgen's U-Net at the size
of EDM's DDPM++ CIFAR-10 network (128 channels, multipliers 2/2/2 over 32/16/8, four blocks per level, attention
at 16x16) with EDM preconditioning (``sigma_data = 0.5``): **55,055,107 parameters each** (``fastgen dryrun
--config EDM/config_dmd2_fast``; EDM's own: 55.7M). The student and the fake score start as copies of the teacher;
the student generates in one step from ``sigma_max = 80``. The GAN branch is on: a discriminator head on the fake
score's 8x8 bottleneck (another 590,849 parameters), trained on real CIFAR-10 images; ``model.gan_loss_weight_gen=0.``
turns it off (no discriminator is built).

Teacher: ``model.teacher_ckpt`` is ``$DATA_ROOT_DIR/cifar10/edm_teacher.pth`` (``DATA_ROOT_DIR`` defaults
to ``./data``; it is read when the config is created, so ``config.yaml`` keeps the resolved path). Produce it by
training the matching teacher recipe and exporting its EMA network::

    fastgen train --config EDM/config_sft_cifar10
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/cifar10/config_sft_cifar10 \\
        "${DATA_ROOT_DIR:-./data}/cifar10/edm_teacher.pth" --only ema

(``model.teacher_ckpt`` may also point straight at a fastgen checkpoint: its first EMA network is used.) Any
teacher with this architecture and EDM preconditioning works. ``model.teacher_ckpt=null`` distills a randomly
initialised teacher - only useful to test the pipeline; the method warns.

Data: the CIFAR-10 training set, ``$DATA_ROOT_DIR/cifar10/cifar10-32x32.zip`` - run ``fastgen download-data
cifar10`` first. Real images feed only the GAN branch.

Hyper-parameters follow DMD2's pixel-space class-conditional recipe (ImageNet-64 with an EDM teacher, Yin et al.
2024, Sec. 5 and App.): Adam at lr 2e-6 for all three trained networks, one student update per five fake-score/
discriminator updates (two-time-scale rule, Sec. 4.2), GAN weights 3e-3 (generator) and 1e-2 (discriminator), no
classifier-free guidance (EDM's conditional CIFAR-10 teacher is trained without label dropout). Batch 128 per
rank; callbacks: gradient clipping, an EMA of the student (constant 0.999; W&B samples come from it) and W&B.
Memory per rank, an **estimate** (``fastgen dryrun --config EDM/config_dmd2_fast`` with a CIFAR-10-shaped zip; no
GPU was lent to this project, so neither memory nor throughput is measured): 2.06 GiB of state (three networks,
the discriminator head, Adam) and a traced training peak of 23.2 GiB at batch 128 per rank (7.05 GiB at the
``_small`` recipe's 32); lower ``dataloader_train.batch_size`` if a GPU runs out of memory.

``create_config()`` touches no file, so ``fastgen dryrun`` works before the data or the teacher exist.
"""

from __future__ import annotations

import os

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import cifar10_loader, data_root
from fastgen.configs.experiments.EDM.common import cifar10_setting
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config


def teacher_path() -> str:
    """Where the recipe expects the teacher: ``$DATA_ROOT_DIR/cifar10/edm_teacher.pth`` (not checked here)."""
    return os.path.join(data_root(), "cifar10", "edm_teacher.pth")


def create_config() -> BaseConfig:
    config = cifar10_setting(dmd2_config(), EMA_CALLBACK, sample_iter=5000)
    config.model.teacher_ckpt = teacher_path()
    config.model.guidance_scale = None
    config.model.student_update_freq = 5
    config.model.gan_loss_weight_gen = 3e-3
    config.model.gan_loss_weight_disc = 1e-2
    config.model.net_optimizer.lr = 2e-6
    config.model.fake_score_optimizer.lr = 2e-6
    config.model.discriminator_optimizer.lr = 2e-6
    config.dataloader_train = cifar10_loader(split="train", batch_size=128)
    config.trainer.max_iter = 200_000
    return config
