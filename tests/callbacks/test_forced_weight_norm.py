"""ForcedWeightNormCallback in real Trainer runs of a tiny EDM2 U-Net on the 8x8 digits."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.forced_weight_norm import ForcedWeightNormCallback
from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK
from fastgen.configs.data import digits_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.callbacks import FORCED_WEIGHT_NORM_CALLBACK
from fastgen.configs.net_edm2 import edm2_unet
from fastgen.networks.edm2 import mpconv_weights
from fastgen.trainer import Trainer
from fastgen_testing import assert_same_weights, tiny_toy_config


def edm2_digits_config(name: str, max_iter: int = 4, fwn: dict[str, DictConfig] | None = None, **trainer: Any):
    """``tiny_toy_config`` with a ~30k-parameter EDM2 U-Net on 8x8 digits (10 classes)."""
    config = tiny_toy_config(name, max_iter=max_iter, **trainer)
    config.model.net = edm2_unet(img_resolution=8, in_channels=1, num_classes=10, model_channels=8,
                                 channel_mult=[1, 2], attn_resolutions=[4])
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.net_optimizer.lr = 1e-2  # large steps, so the weights visibly leave the sphere between steps
    config.dataloader_train = digits_loader("train", batch_size=16)
    config.dataloader_val = digits_loader("val", batch_size=16, seed=1)
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK,
                                           **(FORCED_WEIGHT_NORM_CALLBACK if fwn is None else fwn)})
    return config


def _deviation(weights: list[torch.Tensor]) -> float:
    """Largest relative gap between a row norm and sqrt(fan_in)."""
    worst = 0.0
    for w in weights:
        norms = w.detach().reshape(w.shape[0], -1).norm(dim=1)
        worst = max(worst, float((norms / math.sqrt(w[0].numel()) - 1).abs().max()))
    return worst


class NormProbe(Callback):
    """Records, at the first forward of each step, how far the net's MPConv weights are from the sphere, the
    same for the EMA network, and which scalars were logged during each step."""

    def __init__(self) -> None:
        self.net: list[float] = []
        self.ema: list[float] = []
        self.scalars: list[dict[str, Any]] = []

    def on_training_accum_step_begin(self, model, data_batch, iteration=0, accum_iter=0):
        if accum_iter == 0:
            self.net.append(_deviation(mpconv_weights(model.net)))
            self.ema.append(_deviation(mpconv_weights(model.ema_nets["ema"])))

    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
        self.scalars.append(self.trainer.pop_scalars())


def test_weights_are_on_the_sphere_before_every_forward_in_a_real_run() -> None:
    probe = NormProbe()
    trainer = Trainer(edm2_digits_config("fwn_run", max_iter=5), extra_callbacks={"probe": probe})
    model = trainer.run()
    assert len(probe.net) == 5
    # EDM2's target is sqrt(fan_in) up to eps = 1e-4 (relative offset eps / element RMS, ~1e-4 here).
    assert max(probe.net) < 1e-3, probe.net
    # The optimizer step moves them off the sphere again (so the callback has work to do each step) ...
    assert _deviation(mpconv_weights(model.net)) > 1e-3
    # ... and the EMA copy (not a trainable module) is left alone.
    assert max(probe.ema) > 1e-3
    n = len(mpconv_weights(model.net))
    assert probe.scalars[0]["fwn/num_weights"] == n
    assert all("fwn/num_weights" not in s for s in probe.scalars[1:])  # logged once
    assert all(math.isfinite(s["grad_norm"]) for s in probe.scalars)


def test_without_the_callback_weights_drift_off_the_sphere() -> None:
    probe = NormProbe()
    Trainer(edm2_digits_config("fwn_off", max_iter=3, fwn={}), extra_callbacks={"probe": probe}).run()
    assert min(probe.net[1:]) > 1e-2


def test_modules_selects_from_model_dict_and_unknown_names_fail() -> None:
    probe = NormProbe()
    fwn = {"fwn": LazyCall(ForcedWeightNormCallback)(modules=["ema"])}
    Trainer(edm2_digits_config("fwn_ema", max_iter=3, fwn=fwn), extra_callbacks={"probe": probe}).run()
    assert max(probe.ema) < 1e-3 and min(probe.net[1:]) > 1e-2

    bad = {"fwn": LazyCall(ForcedWeightNormCallback)(modules=["teacher"])}
    with pytest.raises(ValueError, match="teacher"):
        Trainer(edm2_digits_config("fwn_bad", max_iter=1, fwn=bad)).run()


def test_a_net_without_mpconv_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_toy_config("fwn_mlp", max_iter=2)
    config.trainer.callbacks = DictConfig({**config.trainer.callbacks, **FORCED_WEIGHT_NORM_CALLBACK})
    trainer = Trainer(config)
    with caplog.at_level("WARNING"):
        trainer.run()
    assert "no MPConv" in caplog.text
    assert trainer.pop_scalars()["fwn/num_weights"] == 0


def test_stopped_and_resumed_run_is_bit_identical() -> None:
    straight = Trainer(edm2_digits_config("fwn_straight", max_iter=4, save_ckpt_iter=2))
    straight.run()
    Trainer(edm2_digits_config("fwn_resumed", max_iter=2, save_ckpt_iter=2)).run()
    resumed = Trainer(edm2_digits_config("fwn_resumed", max_iter=4, save_ckpt_iter=2))
    resumed.run()
    assert resumed.start_iteration == 2
    assert_same_weights(straight.checkpointer.path_for(4), resumed.checkpointer.path_for(4))
