"""Callback presets. Compose them as dictionaries; callbacks run in dictionary order::

    from fastgen.configs.callbacks import WANDB_CALLBACK, GradClip_CALLBACK, EMA_CALLBACK
    from omegaconf import DictConfig
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})

Each preset is ``{name: LazyCall(CallbackClass)(...)}``; the name is the key under which the callback's state
is saved in checkpoints. Place EMA callbacks before ``wandb`` so that logged samples use the updated EMA.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall

EMA_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="constant", beta=0.999, start_iter=0),
}
EMA_POWER_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="power", gamma=6.94),
}
EMA_HALFLIFE_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="halflife", halflife_kimg=500.0, rampup_ratio=0.05),
}
GradClip_CALLBACK: dict[str, DictConfig] = {
    "grad_clip": LazyCall("fastgen.callbacks.grad_clip.GradClipCallback")(grad_norm=1.0, max_consecutive_nonfinite=20),
}
WANDB_CALLBACK: dict[str, DictConfig] = {
    "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=1000, num_samples=64),
}
# The callbacks every recipe starts from; EMA presets go before these (see the module docstring).
BASE_CALLBACKS: dict[str, DictConfig] = {
    **GradClip_CALLBACK,
    **WANDB_CALLBACK,
}
