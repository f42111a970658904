"""Decisions that change control flow are taken by all ranks together, on real gloo process groups: the global
gradient norm over FSDP2 shards, CarryCallback's reject, the stop flag; EMA and forced weight normalisation work on
local shards."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from fastgen_testing import finish_rank, gloo_results
from torch import nn


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    _join(rank, world, port)
    result: dict[str, object] = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from fastgen.callbacks.carry import CarryCallback
        from fastgen.callbacks.ema import EMACallback
        from fastgen.callbacks.grad_clip import clip_global_norm_
        from fastgen.distributed import group as dist_utils
        from fastgen.networks.edm2 import MPConv, forced_weight_norm_

        mesh = init_device_mesh("cpu", (world,))
        # Grad clip: the norm of gradients sharded over the ranks (7 rows: uneven shards) equals the norm of the
        # whole gradients, and clipping scales every shard by the same factor.
        torch.manual_seed(0)
        full = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3))
        x = torch.randn(6, 5)
        full(x).square().sum().backward()
        whole = [p.grad.clone() for p in full.parameters()]
        expected = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in whole])))
        torch.manual_seed(0)
        sharded = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3))
        for layer in sharded:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        sharded(x).square().sum().backward()
        grads = [p.grad for p in sharded.parameters()]
        result["norm"] = clip_global_norm_(grads, max_norm=expected / 2)
        result["expected_norm"] = expected
        clipped = [g.full_tensor() for g in grads]
        result["clipped_match"] = all(torch.allclose(c, w * (expected / 2) / (expected + 1e-6), atol=1e-6)
                                      for c, w in zip(clipped, whole))

        # EMA on local shards of a network sharded like its EMA copy: equal to the EMA of the whole tensors.
        torch.manual_seed(1)
        net, ema = nn.Linear(5, 7), nn.Linear(5, 7)
        ema.load_state_dict(net.state_dict())
        with torch.no_grad():
            net.weight.add_(1.0)
        expected_ema = torch.lerp(ema.weight.detach(), net.weight.detach(), 0.1)
        fully_shard(net, mesh=mesh)
        fully_shard(ema, mesh=mesh)
        callback = EMACallback(type="constant", beta=0.9)
        callback.update(SimpleNamespace(net=net, ema_nets={"ema": ema}), 0.9)  # the callback's own update
        result["ema_match"] = bool(torch.allclose(ema.weight.full_tensor(), expected_ema, atol=1e-6))

        # Forced weight normalisation of a sharded MPConv (rows are whole on each rank).
        torch.manual_seed(2)
        conv = MPConv(4, 7, kernel=(3, 3))
        with torch.no_grad():
            conv.weight.mul_(3.0)
        reference = conv.weight.detach().clone()
        fully_shard(conv, mesh=mesh)
        forced_weight_norm_([conv.weight])
        rows = conv.weight.full_tensor().reshape(7, -1)
        norms = torch.linalg.vector_norm(rows, dim=1) / (rows.shape[1] ** 0.5)
        result["fwn_unit"] = bool(torch.allclose(norms, torch.ones(7), atol=1e-3))
        result["fwn_direction"] = bool(torch.allclose(rows / rows.norm(dim=1, keepdim=True),
                                                      reference.reshape(7, -1) / reference.reshape(7, -1).norm(dim=1, keepdim=True),
                                                      atol=1e-5))

        # CarryCallback: a non-finite proposal on rank 1 only is rejected on both ranks.
        model = SimpleNamespace(carry_state={"scale": torch.tensor(1.0)})
        carry = CarryCallback()
        carry._model = model
        carry.trainer = SimpleNamespace(log_scalar=lambda *a: None)
        value = float("nan") if rank == 1 else 2.0
        carry._commit({"scale": torch.tensor(value)}, "iteration 1")
        result["carry_scale"] = float(model.carry_state["scale"])
        result["carry_rejected"] = carry.rejected

        # The stop flag: raised on rank 0 only, seen by both.
        result["stop"] = dist_utils.any_rank(rank == 0)
        result["no_stop"] = dist_utils.any_rank(False)
    finally:
        finish_rank(out_dir, rank, result)


def test_collective_decisions_and_local_shard_updates(tmp_path: Path) -> None:
    results = gloo_results(_rank_main, tmp_path, timeout=120)
    for result in results:
        assert abs(result["norm"] - result["expected_norm"]) <= 1e-5 * result["expected_norm"], result
        assert result["clipped_match"] and result["ema_match"], result
        assert result["fwn_unit"] and result["fwn_direction"], result
        assert result["carry_scale"] == 1.0 and result["carry_rejected"] == 1, result
        assert result["stop"] is True and result["no_stop"] is False
