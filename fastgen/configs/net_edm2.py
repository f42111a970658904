"""Network configs for the EDM2 magnitude-preserving U-Net (``fastgen.networks.edm2``).

An EDM2 network needs forced weight normalisation before every training step (Karras et al. 2024, Sec. 2.3);
add ``FORCED_WEIGHT_NORM_CALLBACK`` to ``config.trainer.callbacks`` with it::

    from fastgen.configs.callbacks import FORCED_WEIGHT_NORM_CALLBACK
    from fastgen.configs.net_edm2 import edm2_unet_8x8
    config.model.net = edm2_unet_8x8(num_classes=10)
    config.trainer.callbacks = DictConfig({**FORCED_WEIGHT_NORM_CALLBACK, **config.trainer.callbacks})
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import edm_schedule



def edm2_unet(img_resolution: int = 8, in_channels: int = 1, num_classes: int = 10, model_channels: int = 32,
              channel_mult: list[int] | None = None, num_blocks: int = 1, attn_resolutions: list[int] | None = None,
              dropout: float = 0.0, sigma_data: float = 0.5, use_r: bool = False) -> DictConfig:
    """An EDM2 U-Net with EDM preconditioning (``c_noise = ln(sigma) / 4``, as EDM2's ``Precond``)."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.edm2.EDM2UNet")(
            img_resolution=img_resolution, in_channels=in_channels, model_channels=model_channels,
            channel_mult=channel_mult or [1, 2, 2], num_blocks=num_blocks, num_classes=num_classes,
            attn_resolutions=attn_resolutions if attn_resolutions is not None else [], dropout=dropout, use_r=use_r,
        ),
        noise_scheduler=edm_schedule(sigma_data=sigma_data),
    )


def edm2_unet_8x8(num_classes: int = 10, model_channels: int = 32) -> DictConfig:
    """A small EDM2 U-Net for 8x8 single-channel images (levels 8, 4, 2; attention at the 2x2 bottleneck)."""
    return edm2_unet(img_resolution=8, in_channels=1, num_classes=num_classes, model_channels=model_channels)
