"""EMACallback's flat layout: bit-identical to the fused ``_foreach_lerp_`` reference, through updates, mixed dtypes,
checkpoint round trips, several EMA networks, re-layout after storage changes, and whole training runs."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fastgen.callbacks.ema import EMACallback, flatten_parameters_
from fastgen.trainer import Trainer
from fastgen_testing import assert_same_weights, tiny_toy_config

BETAS = [0.0, 0.3, 0.5, 0.9, 0.999, 0.9999]  # beta < 0.5 and >= 0.5 take different branches inside lerp


class Mixed(nn.Module):
    """Odd-sized float32 tensors (vector bodies and scalar tails), float64 and bfloat16 groups, a channels-last
    weight that cannot be a flat view, and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(37, 29)
        self.b = nn.Linear(29, 1001, bias=True)
        self.c = nn.Parameter(torch.randn(5, dtype=torch.float64))
        self.d = nn.Parameter(torch.randn(3, 67).to(torch.bfloat16))
        self.conv = nn.Conv2d(3, 8, 3)
        self.conv.weight.data = self.conv.weight.data.to(memory_format=torch.channels_last)
        self.register_buffer("stat", torch.randn(7))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _pair(seed: int = 0) -> tuple[SimpleNamespace, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(seed)
    net = Mixed()
    model = SimpleNamespace(net=net, ema_nets=nn.ModuleDict({"ema": copy.deepcopy(net).requires_grad_(False)}))
    ref_net = [t.detach().clone() for t in [*net.parameters(), *net.buffers()]]
    ref_ema = [t.detach().clone() for t in [*model.ema_nets["ema"].parameters(), *model.ema_nets["ema"].buffers()]]
    return model, ref_net, ref_ema


def _train_step(model: SimpleNamespace, ref_net: list[torch.Tensor], step: int) -> None:
    """Change the online network (and its reference copy) the same way, as an optimizer step would."""
    gen = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for p, r in zip([*model.net.parameters(), *model.net.buffers()], ref_net):
            delta = torch.randn(p.shape, generator=gen).to(p.dtype)
            p.add_(delta)
            r.add_(delta)


def _reference_update(ref_ema: list[torch.Tensor], ref_net: list[torch.Tensor], n_params: int, beta: float) -> None:
    dst, src = ref_ema[:n_params], ref_net[:n_params]
    if beta == 0.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_lerp_(dst, src, 1.0 - beta)
    torch._foreach_copy_(ref_ema[n_params:], ref_net[n_params:])


def _assert_equal(module: nn.Module, ref: list[torch.Tensor]) -> None:
    tensors = [*module.parameters(), *module.buffers()]
    assert len(tensors) == len(ref)
    for i, (t, r) in enumerate(zip(tensors, ref)):
        assert t.dtype == r.dtype and torch.equal(t.detach(), r), f"tensor {i} differs"


def test_parameters_become_views_into_one_buffer_per_dtype() -> None:
    model, _, _ = _pair()
    net, ema = model.net, model.ema_nets["ema"]
    before = {name: p for name, p in net.named_parameters()}
    values = {name: p.detach().clone() for name, p in before.items()}
    callback = EMACallback(beta=0.9)
    callback.on_model_init_end(model)
    plan = callback._plan
    assert {g.src.dtype for g in plan.groups} == {torch.float32, torch.float64, torch.bfloat16}
    for name, p in net.named_parameters():
        assert p is before[name]  # the same Parameter objects, values kept
        assert torch.equal(p.detach(), values[name])
    f32 = [p for n, p in net.named_parameters() if p.dtype == torch.float32 and n != "conv.weight"]
    assert len({_storage(p) for p in f32}) == 1
    # Segments start 512 bytes apart from the buffer's start (the CUDA allocator's rounding), and at least as
    # aligned as the CPU allocator's own 64 bytes.
    base = next(g.src for g in plan.groups if g.src.dtype == torch.float32).data_ptr()
    assert all((p.data_ptr() - base) % 512 == 0 and p.data_ptr() % 64 == 0 for p in f32)
    assert len({_storage(p) for p in ema.parameters() if p.dtype == torch.float32 and p.dim() != 4}) == 1
    # The channels-last weight is not a flat view: it stays as it is and goes through _foreach_lerp_.
    assert net.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert any(t is net.conv.weight for t in plan.rest_src)
    assert _storage(net.conv.weight) not in {_storage(p) for p in f32}


@pytest.mark.parametrize("flat", [True, False])
def test_updates_are_bit_identical_to_the_foreach_reference(flat: bool) -> None:
    model, ref_net, ref_ema = _pair()
    n_params = len(list(model.net.parameters()))
    callback = EMACallback(flat=flat)
    callback.on_model_init_end(model)
    for step, beta in enumerate(BETAS * 2):
        _train_step(model, ref_net, step)
        callback.update(model, beta)
        _reference_update(ref_ema, ref_net, n_params, beta)
        _assert_equal(model.ema_nets["ema"], ref_ema)
        _assert_equal(model.net, ref_net)
    assert callback.relayouts == 0


def test_flat_views_survive_a_checkpoint_round_trip(tmp_path: Path) -> None:
    model, ref_net, ref_ema = _pair()
    n_params = len(list(model.net.parameters()))
    callback = EMACallback()
    callback.on_model_init_end(model)
    for step in range(3):
        _train_step(model, ref_net, step)
        callback.update(model, 0.9)
        _reference_update(ref_ema, ref_net, n_params, 0.9)
    path = tmp_path / "ckpt.pth"
    torch.save({"net": model.net.state_dict(), "ema": model.ema_nets["ema"].state_dict()}, path)

    fresh, _, _ = _pair(seed=1)  # different initial values, overwritten by the load
    resumed = EMACallback()
    resumed.on_model_init_end(fresh)
    pointers = [p.data_ptr() for p in [*fresh.net.parameters(), *fresh.ema_nets["ema"].parameters()]]
    payload = torch.load(path, weights_only=True)
    fresh.net.load_state_dict(payload["net"])
    fresh.ema_nets["ema"].load_state_dict(payload["ema"])
    # load_state_dict copies in place: the parameters are still views into the callback's buffers.
    assert [p.data_ptr() for p in [*fresh.net.parameters(), *fresh.ema_nets["ema"].parameters()]] == pointers
    _assert_equal(fresh.ema_nets["ema"], ref_ema)
    for step in range(3, 6):
        _train_step(fresh, ref_net, step)
        resumed.update(fresh, 0.99)
        _reference_update(ref_ema, ref_net, n_params, 0.99)
        _assert_equal(fresh.ema_nets["ema"], ref_ema)
    assert resumed.relayouts == 0


def test_replaced_storage_is_laid_out_again() -> None:
    model, ref_net, ref_ema = _pair()
    n_params = len(list(model.net.parameters()))
    callback = EMACallback()
    callback.on_model_init_end(model)
    ema = model.ema_nets["ema"]

    # load_state_dict(assign=True) swaps in new tensors: without a re-layout the update would go to the old buffer.
    ema.load_state_dict({k: v.clone() for k, v in ema.state_dict().items()}, assign=True)
    _train_step(model, ref_net, 0)
    callback.update(model, 0.9)
    _reference_update(ref_ema, ref_net, n_params, 0.9)
    _assert_equal(ema, ref_ema)
    assert callback.relayouts == 1
    assert len({_storage(p) for p in ema.parameters() if p.dtype == torch.float32 and p.dim() != 4}) == 1

    # .to() replaces every parameter's storage on both networks.
    model.net.to(torch.float64)
    ema.to(torch.float64)
    ref_net = [t.to(torch.float64) for t in ref_net]
    ref_ema = [t.to(torch.float64) for t in ref_ema]
    _train_step(model, ref_net, 1)
    callback.update(model, 0.9)
    _reference_update(ref_ema, ref_net, n_params, 0.9)
    _assert_equal(ema, ref_ema)
    assert callback.relayouts == 2


def test_a_replaced_online_network_is_followed() -> None:
    model, ref_net, ref_ema = _pair()
    n_params = len(list(model.net.parameters()))
    callback = EMACallback()
    callback.on_model_init_end(model)
    model.net = copy.deepcopy(model.net)  # e.g. a method swapping in a student built from its teacher
    _train_step(model, ref_net, 0)  # changes only the new network
    callback.update(model, 0.5)
    _reference_update(ref_ema, ref_net, n_params, 0.5)
    _assert_equal(model.ema_nets["ema"], ref_ema)
    assert callback.relayouts == 1


def test_storage_replaced_over_and_over_falls_back_to_foreach() -> None:
    model, ref_net, ref_ema = _pair()
    n_params = len(list(model.net.parameters()))
    callback = EMACallback()
    callback.on_model_init_end(model)
    for step in range(6):
        with torch.no_grad():
            for p in model.net.parameters():
                p.data = p.data.clone()
        _train_step(model, ref_net, step)
        callback.update(model, 0.9)
        _reference_update(ref_ema, ref_net, n_params, 0.9)
        _assert_equal(model.ema_nets["ema"], ref_ema)
    assert not callback.flat and callback._plan.groups == []


def test_flatten_is_idempotent_and_keeps_values() -> None:
    params = [nn.Parameter(torch.randn(n)) for n in (1, 130, 17)]
    values = [p.detach().clone() for p in params]
    flat = flatten_parameters_(params)
    assert flat.numel() == 3 * 128 + 128  # 512-byte segments: 128 float32 each, 130 elements take two
    again = flatten_parameters_(params)
    assert again.data_ptr() == flat.data_ptr() and again.numel() == flat.numel()
    for p, v in zip(params, values):
        assert torch.equal(p.detach(), v)
    # A buffer that holds anything else is not reused.
    params[0].data = torch.randn(1)
    assert flatten_parameters_(params).data_ptr() != flat.data_ptr()


def _run(name: str, max_iter: int, flat: bool, two_emas: bool = False) -> Trainer:
    config = tiny_toy_config(name, max_iter=max_iter, save_ckpt_iter=2)
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.ema.start_iter = 1
    config.trainer.callbacks.ema.flat = flat
    if two_emas:
        config.model.use_ema = ["ema", "ema_slow"]
        config.trainer.callbacks["ema_slow"] = copy.deepcopy(config.trainer.callbacks.ema)
        config.trainer.callbacks.ema_slow.update({"ema_name": "ema_slow", "type": "constant", "beta": 0.99})
    trainer = Trainer(config)
    trainer.run()
    return trainer


def test_training_with_the_flat_layout_is_bit_identical_to_foreach() -> None:
    flat, foreach = _run("flat", 5, True, two_emas=True), _run("foreach", 5, False, two_emas=True)
    assert_same_weights(flat.checkpointer.path_for(5), foreach.checkpointer.path_for(5))
    # Both EMA callbacks share the online network's buffer; each EMA network has its own.
    plans = [flat.callbacks[name]._plan for name in ("ema", "ema_slow")]
    assert plans[0].groups[0].src.data_ptr() == plans[1].groups[0].src.data_ptr()
    assert plans[0].groups[0].dst.data_ptr() != plans[1].groups[0].dst.data_ptr()


def test_flat_run_resumes_bit_identically() -> None:
    straight = _run("straight", 6, True)
    _run("resumed", 4, True)
    resumed = _run("resumed", 6, True)
    assert resumed.start_iteration == 4
    assert_same_weights(straight.checkpointer.path_for(6), resumed.checkpointer.path_for(6))
