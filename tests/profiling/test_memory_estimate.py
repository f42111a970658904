"""The meta-device memory estimate equals what the real model, gradients and optimizer state occupy."""

from __future__ import annotations

import math

import pytest
import torch
from fastgen_testing import tiny_toy_config

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.profiling.estimate import build_meta_model
from fastgen.profiling.plan import estimate_memory


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
    config.model.net_optimizer = LazyCall("torch.optim.SparseAdam")(lr=1e-3)  # refuses the dense zero gradients
    estimate = estimate_memory(config)
    grads = real_bytes(tiny_toy_config())["gradients"]
    assert estimate["method"] == "rule of thumb for SparseAdam (2 x parameters)"
    assert estimate["gradients"] == grads and estimate["optimizer_state"] == 2 * grads


def _tensor_bytes(node: object) -> int:
    if isinstance(node, torch.Tensor):
        return node.numel() * node.element_size()
    if isinstance(node, (list, tuple)):
        return sum(_tensor_bytes(v) for v in node)
    return 0


@pytest.mark.parametrize("history_size", [3, 100])
def test_lbfgs_state_is_estimated_from_its_history(history_size: int) -> None:
    """LBFGS cannot step on the meta device (its step needs a closure), but its state is known: at a full history
    ``2 * history_size + 2`` flat copies of the parameters (``d``, ``prev_flat_grad``, ``old_dirs``, ``old_stps``)
    and ``2 * history_size + 1`` scalars (``ro``, ``al``, ``H_diag``). Checked against a real LBFGS run on the same
    network once its history has filled."""
    config = tiny_toy_config()
    config.model.net_optimizer = LazyCall("torch.optim.LBFGS")(lr=1.0, history_size=history_size)
    estimate = estimate_memory(config)
    assert estimate["method"] == f"LBFGS's state at a full history of {history_size} pairs"
    param_bytes = real_bytes(tiny_toy_config())["gradients"]
    assert estimate["optimizer_state"] == (2 * history_size + 2) * param_bytes + (2 * history_size + 1) * 4

    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_optimizers()
    optimizer = model.optimizer_dict["net"]
    x0 = torch.randn(256, 2)
    sigma = torch.full((256,), 0.5)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (model.net(x0 + sigma[:, None] * torch.randn(256, 2, generator=torch.Generator().manual_seed(1)),
                          sigma, fwd_pred_type="x0") - x0).square().mean()
        loss.backward()
        return loss

    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    for _ in range(50):
        optimizer.step(closure)
        if len(state.get("old_dirs", [])) == history_size:
            break
    assert len(state["old_dirs"]) == history_size, "the history did not fill"
    real = sum(_tensor_bytes(v) for s in optimizer.state.values() for v in s.values())
    assert estimate["optimizer_state"] == real
