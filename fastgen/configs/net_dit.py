"""Network configs for DiT (Peebles & Xie 2023) and SiT (Ma et al. 2024): ``fastgen.networks.dit.DiT``.

``DiT_S_2`` ... ``DiT_XL_2`` are the paper's sizes (Table 1: hidden 384 / 768 / 1024 / 1152, depth 12 / 12 / 24 /
28, heads 6 / 12 / 16 / 16) with patch 2 on 256x256 ImageNet's 32x32x4 VAE latents and 1,000 classes, under EDM
preconditioning (the paper's DDPM schedule is not in this library; EDM is its continuous-time equivalent up to
the parameterisation). SiT is the same network on the rectified-flow (linear interpolant, velocity-prediction)
schedule: ``SiT_XL_2()`` = ``DiT_XL_2(schedule=flow_schedule())``. DiT-XL/2 has 674,816,529 parameters here, the
paper's 675,129,632 less its frozen position embedding (counted as a parameter there, a buffer here), less the
learned-variance output channels, plus the one-linear uncertainty head (``tests/networks/test_dit.py``).

``fastgen dryrun`` sizes any of them in a recipe (built on the meta device)::

    config.model.net = DiT_XL_2()
    config.model.input_shape = [4, 32, 32]
    config.model.num_classes = 1000
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import edm_schedule, flow_schedule


def dit(input_size: int = 32, in_channels: int = 4, num_classes: int = 1000, hidden_size: int = 1152,
        depth: int = 28, num_heads: int = 16, patch_size: int = 2, mlp_ratio: float = 4.0,
        schedule: DictConfig | None = None, use_r: bool = False, text_dim: int = 0) -> DictConfig:
    """A DiT backbone with ``schedule`` (default: EDM, ``sigma_data = 0.5``; ``flow_schedule()`` makes it a SiT);
    ``text_dim > 0`` conditions it on text token embeddings of that width instead of class labels."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.dit.DiT")(
            input_size=input_size, patch_size=patch_size, in_channels=in_channels, hidden_size=hidden_size,
            depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, num_classes=num_classes, use_r=use_r,
            text_dim=text_dim,
        ),
        noise_scheduler=schedule if schedule is not None else edm_schedule(sigma_data=0.5),
    )


def DiT_S_2(schedule: DictConfig | None = None, num_classes: int = 1000) -> DictConfig:
    """DiT-S/2 (33M parameters in the paper)."""
    return dit(hidden_size=384, depth=12, num_heads=6, num_classes=num_classes, schedule=schedule)


def DiT_B_2(schedule: DictConfig | None = None, num_classes: int = 1000) -> DictConfig:
    """DiT-B/2 (130M)."""
    return dit(hidden_size=768, depth=12, num_heads=12, num_classes=num_classes, schedule=schedule)


def DiT_L_2(schedule: DictConfig | None = None, num_classes: int = 1000) -> DictConfig:
    """DiT-L/2 (458M)."""
    return dit(hidden_size=1024, depth=24, num_heads=16, num_classes=num_classes, schedule=schedule)


def DiT_XL_2(schedule: DictConfig | None = None, num_classes: int = 1000) -> DictConfig:
    """DiT-XL/2 (675M)."""
    return dit(hidden_size=1152, depth=28, num_heads=16, num_classes=num_classes, schedule=schedule)


def SiT_S_2(num_classes: int = 1000) -> DictConfig:
    """SiT-S/2: DiT-S/2 on the rectified-flow schedule (Ma et al. 2024's linear interpolant, velocity target)."""
    return DiT_S_2(schedule=flow_schedule(), num_classes=num_classes)


def SiT_B_2(num_classes: int = 1000) -> DictConfig:
    """SiT-B/2."""
    return DiT_B_2(schedule=flow_schedule(), num_classes=num_classes)


def SiT_L_2(num_classes: int = 1000) -> DictConfig:
    """SiT-L/2."""
    return DiT_L_2(schedule=flow_schedule(), num_classes=num_classes)


def SiT_XL_2(num_classes: int = 1000) -> DictConfig:
    """SiT-XL/2."""
    return DiT_XL_2(schedule=flow_schedule(), num_classes=num_classes)


def dit_digits(num_classes: int = 10, hidden_size: int = 96, depth: int = 4, num_heads: int = 4,
               schedule: DictConfig | None = None) -> DictConfig:
    """A tiny DiT for 8x8 single-channel digits: patch 2 (16 tokens), EDM preconditioning unless ``schedule``."""
    return dit(input_size=8, in_channels=1, num_classes=num_classes, hidden_size=hidden_size, depth=depth,
               num_heads=num_heads, patch_size=2, schedule=schedule)


def causal_video_dit(frames: int = 8, height: int = 8, width: int = 16, in_channels: int = 1, num_classes: int = 10,
                     hidden_size: int = 96, depth: int = 4, num_heads: int = 4, patch_size: int = 2,
                     chunk_frames: int = 2, causal: bool = True, schedule: DictConfig | None = None,
                     attention_backend: str = "auto") -> DictConfig:
    """``fastgen.networks.causal_dit.CausalVideoDiT`` (block-causal over chunks of ``chunk_frames`` frames, or
    bidirectional with ``causal=False``) on rectified flow by default; sized for moving digits (8 frames of 8x16)."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.causal_dit.CausalVideoDiT")(
            frames=frames, height=height, width=width, in_channels=in_channels, patch_size=patch_size,
            hidden_size=hidden_size, depth=depth, num_heads=num_heads, num_classes=num_classes,
            chunk_frames=chunk_frames, causal=causal, attention_backend=attention_backend,
        ),
        noise_scheduler=schedule if schedule is not None else flow_schedule(),
    )
