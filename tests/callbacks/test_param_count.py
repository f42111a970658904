"""ParamCountCallback: global and local counts, plain modules in one process and DTensor shards on two gloo ranks."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fastgen_testing import finish_rank, gloo_results

from fastgen.callbacks.param_count import ParamCountCallback, count_parameters, format_table


class FakeTrainer:
    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}

    def log_scalar(self, key: str, value: float) -> None:
        self.scalars[key] = value


def _tiny() -> SimpleNamespace:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # 40 + 18 = 58 parameters
    net[2].bias.requires_grad_(False)  # 2 frozen
    shared = nn.Linear(3, 3)  # 12, used twice: counted once
    tied = nn.Sequential(shared, shared)
    ema = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).requires_grad_(False)
    return SimpleNamespace(model_dict={"net": net, "tied": tied, "ema": ema})


def test_counts_of_a_tiny_model_in_one_process(caplog: pytest.LogCaptureFixture) -> None:
    callback = ParamCountCallback()
    callback.trainer = FakeTrainer()  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="fastgen"):
        callback.on_train_begin(_tiny(), iteration=0)
    assert callback.counts == {
        "net": {"total": 58, "trainable": 56, "total_local": 58, "trainable_local": 56},
        "tied": {"total": 12, "trainable": 12, "total_local": 12, "trainable_local": 12},
        "ema": {"total": 58, "trainable": 0, "total_local": 58, "trainable_local": 0},
    }
    assert callback.trainer.scalars == {  # type: ignore[attr-defined]
        "params/net/total": 58.0, "params/net/trainable": 56.0, "params/tied/total": 12.0,
        "params/tied/trainable": 12.0, "params/ema/total": 58.0, "params/ema/trainable": 0.0,
    }
    table = caplog.text
    assert "module" in table and "local total" in table and "(all)" in table and "128" in table


def test_table_has_one_row_per_module() -> None:
    table = format_table({"net": dict(total=1234567, trainable=1, total_local=2, trainable_local=3)})
    lines = table.splitlines()
    assert len(lines) == 3 and "1,234,567" in lines[2] and "(all)" not in table


# ---- DTensor-sharded parameters on two gloo ranks ------------------------------------------------------------------
def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))

        def shard_rows(name: str, module: nn.Module, device_mesh: object) -> None:
            for pname, param in list(module.named_parameters(recurse=False)):
                sharded = nn.Parameter(distribute_tensor(param.detach(), device_mesh, [Shard(0)]),
                                       requires_grad=param.requires_grad)
                module.register_parameter(pname, sharded)

        torch.manual_seed(0)
        linear = distribute_module(nn.Linear(16, 8), mesh, shard_rows)  # weight 8x16 + bias 8 = 136
        frozen = nn.Linear(4, 4)  # 20, replicated DTensors: local == global
        for pname, param in list(frozen.named_parameters()):
            frozen.register_parameter(pname, nn.Parameter(distribute_tensor(param.detach(), mesh, [Replicate()]),
                                                          requires_grad=False))
        model = SimpleNamespace(model_dict={"net": nn.Sequential(linear, frozen)})
        callback = ParamCountCallback()
        callback.trainer = FakeTrainer()  # type: ignore[assignment]
        callback.on_train_begin(model)
        result = {"counts": callback.counts, "scalars": callback.trainer.scalars,  # type: ignore[attr-defined]
                  "plain": count_parameters(nn.Linear(16, 8))}
    finally:
        finish_rank(out_dir, rank, result)


def test_dtensor_sharded_linear_on_two_gloo_ranks(tmp_path: Path) -> None:
    for result in gloo_results(_rank_main, tmp_path, timeout=90):
        full = result["plain"]["total"]
        assert full == 136
        counts = result["counts"]["net"]
        assert counts["total"] == full + 20 and counts["trainable"] == full  # global: the whole Linear
        assert counts["total_local"] == full // 2 + 20 and counts["trainable_local"] == full // 2  # half on each rank
        assert result["scalars"] == {
            "params/net/total": 156.0, "params/net/trainable": 136.0,
            "params/net/total_local": 88.0, "params/net/trainable_local": 68.0,
        }
