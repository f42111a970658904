"""Helpers for the method tests: tiny toy configs, training a method on toy data and measuring its samples.

(A module with its own name: ``from conftest import ...`` would resolve to whichever ``conftest`` was imported
first - ``tests/conftest.py`` in a full run.)"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_POWER_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import edm_schedule

TOY = "eight_gaussians"
TEACHER_ITERS = 1500
REFERENCE_SEED = 12345  # the fresh data every sample set is scored against (training data: seed 0)


def small_toy_mlp(schedule: DictConfig | None = None, use_r: bool = False, hidden_dim: int = 128,
                  num_layers: int = 2) -> DictConfig:
    """An MLP denoiser small enough to train in seconds (EDM, sigma_data 0.7, unless ``schedule`` is given)."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.mlp.MLPDenoiser")(data_dim=2, hidden_dim=hidden_dim,
                                                              num_layers=num_layers, use_r=use_r),
        noise_scheduler=schedule if schedule is not None else edm_schedule(sigma_data=0.7),
    )


def toy_run_config(config: BaseConfig, name: str, max_iter: int, batch_size: int = 256) -> BaseConfig:
    """Fill in the toy data, a short schedule without checkpoints in between, and no W&B."""
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.dataloader_train = toy_loader(TOY, batch_size=batch_size, num_samples=20_000)
    config.dataloader_val = None
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = max(max_iter // 4, 1)
    config.trainer.save_ckpt_iter = max_iter
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK})
    config.log_config.name = name
    config.log_config.wandb_mode = "disabled"
    return config


def teacher_config(seed: int = 0) -> BaseConfig:
    """The toy SFT teacher of the distillation tests: ``small_toy_mlp`` (EDM), 1,500 iterations of batch 256,
    with EDM2's power EMA (sigma_rel 0.10), which is what distillation loads from its checkpoint (``teacher_ckpt_key
    = auto``). Over seeds 0-5 the EMA scored 1.85-4.01x the data's energy-distance floor, the raw network 4.1-9.6x."""
    from fastgen.configs.methods.config_sft import create_config as sft_config

    config = toy_run_config(sft_config(), "teacher", TEACHER_ITERS)
    config.model.net = small_toy_mlp()
    config.model.net_optimizer.lr = 2e-3
    config.model.use_ema = True
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_POWER_CALLBACK})
    config.trainer.seed = seed
    return config


def train_teacher(root: Any, seed: int = 0) -> Any:
    """Train the toy teacher with the real Trainer under the output root ``root``; return its final checkpoint."""
    import pytest

    from fastgen.trainer import Trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(root))
        mp.setenv("WANDB_MODE", "disabled")
        mp.setenv("FASTGEN_NO_PROGRESS", "1")
        trainer = Trainer(teacher_config(seed))
        trainer.run()
    assert trainer.last_checkpoint is not None
    return trainer.last_checkpoint


def teacher_energy(checkpoint: Any, n: int = 2000, seed: int = 0) -> float:
    """``toy_energy`` of the teacher at ``checkpoint`` - the network distillation loads from it (the EMA) - sampled
    as a diffusion model: Heun, ``sample_steps`` = 18 steps (35 network evaluations). The multi-step quality the
    students are compared with."""
    from fastgen.checkpoint.weights import load_network_state

    model = build(teacher_config())
    model.net.load_state_dict(load_network_state(str(checkpoint)))
    return toy_energy(model, n=n, seed=seed)


def data_floor(n: int = 2000, seeds: tuple[int, ...] = (1, 2, 3, 4, 5)) -> float:
    """The energy distance a perfect generator scores in ``toy_energy``: fresh draws of the data distribution
    (seeds 1-5) against the same reference draw and sample count, averaged (the V-statistic is biased upwards by
    about ``E|X - X'| / n``, so it is not 0)."""
    from fastgen.datasets.toy import toy_samples
    from fastgen.evaluation.toy import energy_distance

    reference = toy_samples(TOY, n, seed=REFERENCE_SEED)
    return sum(energy_distance(toy_samples(TOY, n, seed=s), reference) for s in seeds) / len(seeds)


def train(config: BaseConfig) -> Any:
    """Run the real Trainer on ``config``; return the trained method."""
    from fastgen.trainer import Trainer

    return Trainer(config).run()


def toy_energy(model: Any, n: int = 2000, seed: int = 0, net: Any = None) -> float:
    """Energy distance between ``n`` samples of the method's student sampler (of ``net``, default ``model.net``)
    and fresh toy data."""
    from fastgen.datasets.toy import toy_samples
    from fastgen.evaluation.toy import energy_distance

    samples, _ = model.sample(n, generator=torch.Generator().manual_seed(seed), net=net if net is not None else model.net)
    return energy_distance(samples, toy_samples(TOY, n, seed=REFERENCE_SEED))


def build(config: BaseConfig, seed: int = 0) -> Any:
    """Instantiate the method of ``config`` and run its fresh-run initialisation (teachers, copies)."""
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(seed)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.init_optimizers()
    return model


def tiny(create_config: Any, net: DictConfig | None = None, **model: Any) -> BaseConfig:
    """A method config on a ~1k-parameter toy MLP, with the given ``model.*`` fields."""
    config = create_config()
    config.model.net = net if net is not None else small_toy_mlp(hidden_dim=16, num_layers=1)
    config.model.input_shape = [2]
    for key, value in model.items():
        setattr(config.model, key, value)
    return config


def has_grad(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters())


def report(method: str, before: float, after: float) -> None:
    """Print the e2e numbers (visible with ``pytest -s``)."""
    print(f"\n[e2e] {method}: energy distance to fresh toy data {before:.4f} -> {after:.4f}")
