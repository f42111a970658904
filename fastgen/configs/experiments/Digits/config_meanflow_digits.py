"""MeanFlow on digits, from scratch (Geng et al. 2025): a class-conditional U-Net ``u(z_t, r, t)`` with the second
time input (``use_r=True``) on the rectified-flow schedule, sampled in one step ``x0 = x1 - u(x1, 0, 1)``.
No teacher; an EDM2 power-function EMA network is what samples come from.

    fastgen train --config Digits/config_meanflow_digits
    fastgen train --config Digits/config_meanflow_digits - model.t_list=[1.0,0.5]   # two sampling steps
    fastgen train --config Digits/config_meanflow_digits - model.mode=distill       # the teacher's velocity as v

**Experimental**: its student does not reach fastgen's bar for a shipped recipe (1-step FD at most 3x the
35-evaluation teacher's 0.56, 2-step at most 2x). Measured at 5,000 samples (``benchmarks/quality.py``, commit
d20d9e8, 435 s): 1-step FD 5.50, 2-step 2.13 (accuracy 0.995).
Along training (2,000 samples, so every FD reads higher than at 5,000; EMA network, 1-step / 2-step):
5.47 / 2.70 after 4,000 iterations from data, still falling (9.32 / 4.03 at 1,000, 5.65 / 2.86 at 3,000); with
the teacher's velocity in place of ``eps - x0`` (``model.mode=distill``) 7.70 / 3.32, no better. Second round
(stop 30, 5,000 samples): the learning rate from 2e-3 decaying linearly to a tenth over the run, 5.36 / 2.02, no
better in any way that matters. The Jacobian-vector
product now runs only on the quarter of the batch with ``r != t``: 100 training steps of this network take 0.83x the
wall time they took before (``farm-bench``, side by side, start-up included).
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_meanflow import create_config as meanflow_config
from fastgen.configs.net import edm_unet_8x8, flow_schedule


def meanflow_unet_8x8(num_classes: int = 10, model_channels: int = 32) -> DictConfig:
    """The digits U-Net (channels 32/64/64) with the ``r`` input, on the rectified-flow schedule."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.unet.UNet")(
            img_resolution=8, in_channels=1, model_channels=model_channels, channel_mult=[1, 2, 2], num_blocks=1,
            num_classes=num_classes, use_r=True,
        ),
        noise_scheduler=flow_schedule(),
    )


def create_config() -> BaseConfig:
    config = digits_distillation(meanflow_config(), max_iter=4000, save_ckpt_iter=1000, callbacks=EMA_CALLBACK,
                                 net=meanflow_unet_8x8(num_classes=10))
    config.model.teacher = edm_unet_8x8(num_classes=10)  # the shipped teacher's architecture, for - model.mode=distill
    config.model.use_ema = True
    config.model.ratio_r_neq_t = 0.25
    config.model.net_optimizer.lr = 1e-3
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.wandb.sample_iter = 1000
    return config
