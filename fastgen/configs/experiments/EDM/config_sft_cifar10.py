"""CIFAR-10 teacher: a class-conditional EDM model of CIFAR-10 32x32, trained with SFT (denoising score matching).

This recipe produces the teacher that ``EDM/config_dmd2_fast`` distills. It follows EDM's conditional CIFAR-10
setup (Karras et al. 2022, Table 7 and App. F.2) where fastgen has the pieces:

* network: ``edm_unet_cifar10`` - fastgen's U-Net at DDPM++ size (128 channels, multipliers 2/2/2, four blocks
  per level, attention at 16x16), **55,055,107 parameters** (``fastgen dryrun``; EDM's: 55.7M), dropout 0.13,
  EDM preconditioning with ``sigma_data = 0.5``;
* optimisation: Adam (0.9, 0.999, eps 1e-8) at lr 1e-3, linear warm-up over EDM's 10 Mimg (19,531 steps at
  batch 512), global batch 512 (``trainer.batch_size_global``: per-rank batch 128, so four accumulation rounds on
  one GPU, one round on four ranks with ``trainer.ddp=True``), 390,625 steps = EDM's 200 Mimg;
* EMA: EDM's half-life schedule (500 kimg, ramp-up ratio 0.05);
* data: the CIFAR-10 training set, ``$DATA_ROOT_DIR/cifar10/cifar10-32x32.zip`` (default ``./data``; prepare it
  with ``fastgen download-data cifar10``) with horizontal flips. EDM's non-leaky augmentation pipeline
  (``--augment=0.12``) is not implemented in fastgen, so FID will trail EDM's 1.79 somewhat;
* samples: 18 Heun steps (35 network evaluations), as EDM samples CIFAR-10. No label dropout, as in EDM: the
  teacher is distilled without classifier-free guidance.

Memory per rank, an **estimate** (``fastgen dryrun --config EDM/config_sft_cifar10`` with a CIFAR-10-shaped zip;
no GPU was lent to this project, so neither memory nor throughput is measured): 1.03 GiB of state (network, EMA,
Adam) and a traced training peak of 18.1 GiB at the per-rank batch of 128.

Train it and export its EMA network as the distillation teacher::

    fastgen train --config EDM/config_sft_cifar10
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/cifar10/config_sft_cifar10 \\
        "${DATA_ROOT_DIR:-./data}/cifar10/edm_teacher.pth" --only ema
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_HALFLIFE_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import cifar10_loader
from fastgen.configs.experiments.EDM.common import cifar10_setting
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import edm_unet_cifar10

GLOBAL_BATCH = 512
RAMPUP_STEPS = 10_000_000 // GLOBAL_BATCH  # EDM's lr ramp-up: 10 Mimg


def create_config() -> BaseConfig:
    config = cifar10_setting(sft_config(), EMA_HALFLIFE_CALLBACK, sample_iter=10_000,
                             net=edm_unet_cifar10(num_classes=10, dropout=0.13))
    config.model.net_optimizer.lr = 1e-3
    # EDM scales the lr by min(images seen / 10 Mimg, 1); LinearLR from 1/RAMPUP_STEPS reproduces it per step.
    config.model.net_scheduler = LazyCall("torch.optim.lr_scheduler.LinearLR")(
        start_factor=1.0 / RAMPUP_STEPS, end_factor=1.0, total_iters=RAMPUP_STEPS,
    )
    config.dataloader_train = cifar10_loader(split="train", batch_size=128, xflip=True)
    config.dataloader_val = cifar10_loader(split="test", batch_size=128)
    config.trainer.batch_size_global = GLOBAL_BATCH
    config.trainer.max_iter = 200_000_000 // GLOBAL_BATCH
    config.trainer.validation_iter = 5000
    return config
