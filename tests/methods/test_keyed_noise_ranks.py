"""World-size invariance without processes: one step on a 1-rank loader batch of 2B against the same step on the
rank-0 and rank-1 loaders (W = 2) of batch B each. With noise keyed by global sample id
(``fastgen.distributed.keyed_rng``) every sample draws the same noise in both splits, so the two half-batch gradients
average to the full-batch gradient - what DDP computes - and a 2-rank run follows the 1-process run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader, toy_loader
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import edm_unet_8x8, toy_mlp
from fastgen.distributed.keyed_rng import GLOBAL_NOISE, KeyedNoise
from fastgen.methods.model import FastGenModel
from fastgen.methods.sft import SFTModel

SEED = 11
HALF = 4  # per-rank batch B; the 1-rank batch is 2B


def loaders(config: BaseConfig) -> tuple[Any, list[Any]]:
    """The config's training loader at W = 1 (batch 2B) and at W = 2 (rank 0 and rank 1, batch B each)."""
    node = config.dataloader_train
    single = instantiate(node, batch_size=2 * HALF, rank=0, world_size=1)
    ranks = [instantiate(node, batch_size=HALF, rank=r, world_size=2) for r in range(2)]
    return single, ranks


def build(config: BaseConfig) -> FastGenModel:
    """The method with every weight perturbed, so that nothing starts at a zero-initialised no-op (a condition
    embedding read by a zero layer, a fake score equal to the teacher) and every draw reaches the gradients."""
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.init_optimizers()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def run_step(model: FastGenModel, data: dict[str, Any], iteration: int
             ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
    """One bound step and its backward: ``(loss_dict, outputs, gradients by parameter name)``."""
    for p in model.parameters():
        p.grad = None
    with model.bind_batch(data, iteration, seed=SEED):
        loss_dict, outputs = model.single_train_step(data, iteration)
    loss_dict["total_loss"].backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss_dict, outputs, grads


def interleave(halves: list[torch.Tensor], copies: int = 1) -> torch.Tensor:
    """Rows of the two ranks' outputs in the 1-rank batch's order: the full batch's row ``j`` is rank ``j % 2``'s
    row ``j // 2`` (per copy block of a repeated batch: ``copies`` blocks of B rows each)."""
    blocks = []
    for k in range(copies):
        parts = [h[k * HALF:(k + 1) * HALF] for h in halves]
        blocks.append(torch.stack(parts, dim=1).reshape(2 * HALF, *halves[0].shape[1:]))
    return torch.cat(blocks)


NOT_BATCH_MEANS = ("dmd_grad_norm", "d_real_logit", "d_fake_logit")  # logged values that are not means over samples


def assert_world_size_invariant(config: BaseConfig, iterations: list[int],
                                noised: Callable[[int], dict[str, int]], all_losses: bool = True) -> None:
    """For each iteration: the 2B step's loss and gradients equal the mean of the two B steps', and the outputs
    ``noised(iteration)`` names (name -> copies of the batch they hold) agree row by row through the sample ids;
    then the iteration's optimizers step with the full-batch gradients (alternating GAN updates included).
    ``all_losses=False`` compares ``total_loss`` only (a method's other logged values may be ratios)."""
    model = build(config)
    single, ranks = loaders(config)
    for iteration in iterations:
        full = next(single)
        halves = [next(loader) for loader in ranks]
        assert torch.equal(full["sample_ids"], interleave([h["sample_ids"] for h in halves]))
        full_loss, full_out, full_grads = run_step(model, full, iteration)
        results = [run_step(model, half, iteration) for half in halves]
        for name, copies in noised(iteration).items():
            torch.testing.assert_close(interleave([r[1][name] for r in results], copies), full_out[name],
                                       rtol=1e-5, atol=1e-6, msg=f"{name} at iteration {iteration}")
        for key, value in full_loss.items():
            mean = (results[0][0][key] + results[1][0][key]) / 2
            if key in NOT_BATCH_MEANS or value.numel() != 1 or not (all_losses or key == "total_loss"):
                continue
            torch.testing.assert_close(mean, value, rtol=1e-5, atol=1e-6, msg=f"{key} at iteration {iteration}")
        assert full_grads, "no gradients"
        for name, grad in full_grads.items():
            halves_grad = [r[2].get(name, torch.zeros_like(grad)) for r in results]
            torch.testing.assert_close((halves_grad[0] + halves_grad[1]) / 2, grad, rtol=1e-4, atol=1e-6,
                                       msg=f"gradient of {name} at iteration {iteration}")
        for name, p in model.named_parameters():  # train on: the next iteration starts from updated weights
            p.grad = full_grads.get(name)
        for name in model.get_optimizers(iteration):
            model.optimizers[name].step()


# ---- SFT -------------------------------------------------------------------------------------------------------
def digits_sft() -> BaseConfig:
    config = sft_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.condition_dropout = 0.5  # the label-dropout draw is keyed too
    config.dataloader_train = digits_loader(batch_size=2 * HALF, seed=3)
    return config


def test_sft_step_is_world_size_invariant() -> None:
    assert_world_size_invariant(digits_sft(), iterations=[0, 1, 2], noised=lambda _: {"x_t": 1, "t": 1})


# ---- DMD2 with GAN and R1 ----------------------------------------------------------------------------------------
def toy_dmd2(**model: Any) -> BaseConfig:
    config = dmd2_config()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=2)
    config.model.input_shape = [2]
    config.model.gan_loss_weight_gen = 0.1
    config.model.r1_weight = 1.0
    config.model.student_update_freq = 2  # student at even iterations, fake score + discriminator at odd ones
    config.model.vsd_num_noise = 2  # a repeated batch: draw k of sample i at row k B + i
    config.model.t_list = [80.0, 2.0, 0.5]  # backward simulation: a per-step choice and fresh noise
    config.model.regression_loss_weight = 0.5  # pairs picked per sample
    config.model.regression_num_pairs = 64
    config.model.sample_steps = 4
    for key, value in model.items():
        setattr(config.model, key, value)
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=2 * HALF, num_samples=256, seed=5)
    config.trainer.callbacks = DictConfig({})
    return config


@pytest.mark.parametrize("r1_estimator", ["exact", "finite_difference"])
def test_dmd2_gan_r1_steps_are_world_size_invariant(r1_estimator: str) -> None:
    config = toy_dmd2(r1_estimator=r1_estimator)
    draws = config.model.vsd_num_noise  # student steps noise every sample that many times, critic steps once
    assert_world_size_invariant(config, iterations=[0, 1, 2, 3, 4, 5, 6, 7],
                                noised=lambda it: {"x_t": 1 if it % 2 else draws, "t": 1 if it % 2 else draws,
                                                   "generated": 1})


def test_dmd2_on_conditional_images_with_teacher_features_is_world_size_invariant() -> None:
    config = dmd2_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.gan_loss_weight_gen = 0.1
    config.model.discriminator_features = "teacher"
    config.model.r1_weight = 1.0
    config.model.student_update_freq = 2
    config.model.vsd_t_dist = "train"
    config.dataloader_train = digits_loader(batch_size=2 * HALF, seed=1)
    assert_world_size_invariant(config, iterations=[0, 1], noised=lambda _: {"x_t": 1, "t": 1, "generated": 1})


# ---- every method's toy recipe ------------------------------------------------------------------------------------
def toy_recipe(name: str, tmp_path: Any, **model: Any) -> BaseConfig:
    """A toy recipe at batch 2B with a random teacher (and, for KD, no pairs cache: the teacher solves each
    batch's keyed noise)."""
    from fastgen.configs.config_utils import load_config

    config = load_config(f"Toy/config_{name}_toy")
    config.model.teacher_ckpt = None
    if hasattr(config.model, "kd_data_path"):
        config.model.kd_data_path = None
    for key, value in model.items():
        setattr(config.model, key, value)
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=2 * HALF, num_samples=256, seed=2)
    return config


# f-distill is left out on purpose: it normalises its per-sample weights by their mean over the batch (Xu et al.
# 2025), so a rank's weights depend on its half of the batch - invariance needs that mean all-reduced over ranks.
# Minibatch-std discriminators (groups are cut from a rank's batch) and network dropout (torch's generator) are
# not world-size invariant either.
RECIPES = {
    "cm_ct": ("cm", {}), "cm_cd": ("cm", {"mode": "cd"}), "scm_cd": ("scm", {}), "scm_ct": ("scm", {"mode": "ct"}),
    "tcm_stage1": ("tcm", {}), "tcm_stage2": ("tcm", {"tcm_stage": 2, "boundary_prob": 0.5}),
    "meanflow": ("meanflow", {}), "kd_two_step": ("kd", {"t_list": [80.0, 1.0], "kd_teacher_steps": 4}),
    "ladd": ("ladd", {"student_update_freq": 2}), "sid": ("sid", {"student_update_freq": 2, "t_list": [80.0, 1.0]}),
    "dmd2": ("dmd2", {"student_update_freq": 2}), "pdd": ("pdd", {}),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_methods_step_is_world_size_invariant(recipe: str, tmp_path: Any) -> None:
    name, model = RECIPES[recipe]
    if model.get("tcm_stage") == 2:  # stage 2 needs a stage-1 network: any weights of the right shape
        stage1 = instantiate(load_net_config(name))
        torch.save(stage1.state_dict(), tmp_path / "stage1.pth")
        model = {**model, "stage1_ckpt": str(tmp_path / "stage1.pth")}
    assert_world_size_invariant(toy_recipe(name, tmp_path, **model), iterations=[0, 1, 2, 3], noised=lambda _: {},
                                all_losses=False)


def load_net_config(name: str) -> DictConfig:
    from fastgen.configs.config_utils import load_config

    return load_config(f"Toy/config_{name}_toy").model.net


# ---- binding ---------------------------------------------------------------------------------------------------
def test_bind_batch_scopes_the_keyed_stream_and_falls_back_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = build(digits_sft())
    batch = next(instantiate(digits_sft().dataloader_train, rank=0, world_size=1))
    assert model.rng is GLOBAL_NOISE
    with model.bind_batch(batch, 3, seed=SEED, stream="val") as noise:
        assert model.rng is noise and isinstance(noise, KeyedNoise)
        assert (noise.seed, noise.step, noise.stream) == (SEED, 3, "val")
        assert torch.equal(noise.sample_ids, batch["sample_ids"])
    assert model.rng is GLOBAL_NOISE
    FastGenModel._warned_unkeyed = False
    unkeyed = {key: value for key, value in batch.items() if key != "sample_ids"}
    with caplog.at_level("WARNING", logger="fastgen"):
        for _ in range(2):
            with model.bind_batch(unkeyed, 0, seed=SEED):
                assert model.rng is GLOBAL_NOISE
    assert sum("sample_ids" in record.getMessage() for record in caplog.records) == 1


def test_train_and_val_streams_draw_different_noise() -> None:
    model = build(digits_sft())
    batch = next(instantiate(digits_sft().dataloader_train, rank=0, world_size=1))
    outputs = {}
    for stream in ("train", "val"):
        with torch.no_grad(), model.bind_batch(batch, 0, seed=SEED, stream=stream):
            outputs[stream] = model.single_train_step(batch, 0)[1]["x_t"]
    assert not torch.isclose(outputs["train"], outputs["val"]).any()


class RecordingSFT(SFTModel):
    """SFT that records the noise source of every step it runs."""

    seen: list[tuple[str, Any, Any, Any, bool]] = []

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        rng = self.rng
        RecordingSFT.seen.append((type(rng).__name__, getattr(rng, "stream", None), getattr(rng, "step", None),
                                  getattr(rng, "seed", None), torch.is_grad_enabled()))
        return super().single_train_step(data, iteration)


def test_the_trainer_binds_train_and_validation_batches(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen_testing import tiny_toy_config

    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    config = tiny_toy_config("bound", max_iter=2, validation_iter=2, max_val_iter=1, seed=5)
    config.model_class = LazyCall(RecordingSFT)()
    RecordingSFT.seen = []
    Trainer(config).run()
    assert RecordingSFT.seen == [("KeyedNoise", "train", 0, 5, True), ("KeyedNoise", "train", 1, 5, True),
                                 ("KeyedNoise", "val", 2, 5, False)]
