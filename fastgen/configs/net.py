"""Network configs: LazyCall builders for the backbones and their noise schedules."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall


def edm_schedule(sigma_data: float = 0.5, sigma_min: float = 0.002, sigma_max: float = 80.0,
                 P_mean: float = -1.2, P_std: float = 1.2, rho: float = 7.0) -> DictConfig:  # noqa: N803
    return LazyCall("fastgen.networks.noise_schedules.EDMNoiseScheduler")(
        sigma_min=sigma_min, sigma_max=sigma_max, sigma_data=sigma_data, P_mean=P_mean, P_std=P_std, rho=rho
    )


def flow_schedule(logit_mean: float = 0.0, logit_std: float = 1.0, shift: float = 1.0) -> DictConfig:
    return LazyCall("fastgen.networks.noise_schedules.RectifiedFlowScheduler")(
        logit_mean=logit_mean, logit_std=logit_std, shift=shift
    )


def edm_unet_8x8(num_classes: int = 10, model_channels: int = 32, channel_mult: list[int] | None = None,
                 num_blocks: int = 1) -> DictConfig:
    """A small U-Net for 8x8 single-channel images with EDM preconditioning."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.unet.UNet")(
            img_resolution=8, in_channels=1, model_channels=model_channels,
            channel_mult=channel_mult or [1, 2, 2], num_blocks=num_blocks, num_classes=num_classes,
        ),
        noise_scheduler=edm_schedule(sigma_data=0.5),
    )


def toy_mlp(schedule: DictConfig | None = None, hidden_dim: int = 256, num_layers: int = 3) -> DictConfig:
    """An MLP denoiser for 2-D toy data (EDM schedule unless ``schedule`` is given)."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.mlp.MLPDenoiser")(data_dim=2, hidden_dim=hidden_dim, num_layers=num_layers),
        noise_scheduler=schedule if schedule is not None else edm_schedule(sigma_data=0.7),
    )
