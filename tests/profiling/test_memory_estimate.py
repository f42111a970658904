"""The meta-device memory estimate equals what the real model, gradients and optimizer state occupy."""

from __future__ import annotations

import math

import pytest
import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.profiling.estimate import build_meta_model, estimate_memory
from fastgen_testing import tiny_toy_config


def real_bytes(config) -> dict[str, int]:  # noqa: ANN001
    """Build the model for real on the CPU, take one real optimizer step, and add up the storages."""
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_optimizers()
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    stepped = [p for opt in model.optimizer_dict.values() for g in opt.param_groups for p in g["params"]]
    for p in stepped:
        p.grad = torch.zeros_like(p)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in stepped)
    for opt in model.optimizer_dict.values():
        opt.step()
    state = sum(v.numel() * v.element_size() for opt in model.optimizer_dict.values() for s in opt.state.values()
                for v in s.values() if isinstance(v, torch.Tensor))
    return {"parameters": params, "gradients": grads, "optimizer_state": state}


@pytest.mark.parametrize("recipe", ["tiny", "Digits/config_sft_digits"])
def test_estimate_matches_the_real_model(recipe: str) -> None:
    config = tiny_toy_config() if recipe == "tiny" else load_config(recipe)
    estimate = estimate_memory(config)
    real = real_bytes(config)
    assert {k: estimate[k] for k in real} == real
    assert estimate["total"] == sum(real.values())
    assert estimate["method"] == "one optimizer step on the meta device" and not estimate["sharded"]
    if recipe != "tiny":  # Adam: two moments per parameter plus a 4-byte step counter per tensor
        n_tensors = len(list(build_meta_model(config).net.parameters()))
        assert estimate["optimizer_state"] == 2 * estimate["gradients"] + 4 * n_tensors


def test_estimate_meta_build_allocates_no_weights() -> None:
    model = build_meta_model(load_config("Digits/config_sft_digits"))
    assert all(p.device.type == "meta" for p in model.parameters())


def test_fsdp_shards_the_estimate_over_ranks() -> None:
    config = tiny_toy_config()
    whole = estimate_memory(config, world_size=4)  # DDP: every rank holds everything
    assert not whole["sharded"] and whole["world_size"] == 4
    config.trainer.fsdp = True
    shard = estimate_memory(config, world_size=4)
    assert shard["sharded"]
    for key in ("parameters", "gradients", "optimizer_state"):
        # the busiest rank of the real sharding plan (exact figures: tests/profiling/test_plan.py)
        assert math.ceil(whole[key] / 4) <= shard[key] < whole[key] / 2


def test_an_optimizer_that_cannot_step_on_meta_falls_back_to_the_rule() -> None:
    config = tiny_toy_config()
    config.model.net_optimizer = LazyCall("torch.optim.LBFGS")(lr=1.0)  # step() needs a closure: it cannot run here
    estimate = estimate_memory(config)
    assert estimate["method"].startswith("rule of thumb for LBFGS") and estimate["optimizer_state"] == 0
    assert estimate["gradients"] == real_bytes(tiny_toy_config())["gradients"]
