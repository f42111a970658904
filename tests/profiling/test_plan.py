"""The per-rank memory plan (``fastgen.profiling.plan``): the trainer's own ``parallelize`` on the meta device under
torch's fake process group, every rank's local bytes from the DTensor layout, and nothing left behind."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fastgen_testing import tiny_toy_config

from fastgen.configs.config_utils import apply_overrides, load_config
from fastgen.configs.instantiate import LazyCall
from fastgen.profiling.estimate import build_meta_model
from fastgen.profiling.plan import estimate_memory, plan_state, sharded_meta_model
from fastgen.profiling.state_bytes import state_bytes
from fastgen.utils.errors import ConfigError, UsageError

# DMD2 on a small digits U-Net: student, EMA, frozen teacher, fake score and discriminator, three optimizers.
DMD2_SMALL = ["model.teacher_ckpt=null", "model.net.backbone.model_channels=8", "trainer.fsdp=True"]


def dmd2_config():  # noqa: ANN201
    config = load_config("Digits/config_dmd2_digits")
    apply_overrides(config, DMD2_SMALL)
    return config


def measured_on_rank(config, world_size: int, rank: int) -> dict[str, int]:  # noqa: ANN001
    """What rank ``rank`` holds when the trainer's code shards the meta model as that rank of a fake group: its
    local shards (``state_bytes``, as the real-run probe measures), a gradient for every stepped parameter and the
    state of one real optimizer step."""
    with sharded_meta_model(config, world_size, rank) as (model, _):
        with torch.device("meta"):
            model.init_optimizers()
        for optimizer in model.optimizer_dict.values():
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                p.grad = torch.zeros_like(p)
            optimizer.step()
        return state_bytes(model)


def as_dict(rank) -> dict[str, int]:  # noqa: ANN001
    return {"parameters": rank.parameters, "gradients": rank.gradients, "optimizer_state": rank.optimizer_state}


@pytest.mark.parametrize("case", ["fsdp3_dmd2", "hsdp4_toy"])
def test_every_rank_of_the_plan_is_what_that_rank_holds(case: str) -> None:
    """Uneven shards (3 ranks; dims not divisible by 3) and HSDP (2 x 2 mesh): the plan computes every rank from
    rank 0's sharded model and the DTensor layout; each must equal that rank sharded for real."""
    if case == "fsdp3_dmd2":
        config, world = dmd2_config(), 3
    else:
        config, world = tiny_toy_config(fsdp=True, fsdp_shard_size=2), 4
        config.model.net.backbone.hidden_dim = 33  # odd rows: the two shards differ
    plan = plan_state(config, world)
    assert plan.sharded and len(plan.ranks) == world
    totals = {r.total for r in plan.ranks}
    assert len(totals) > 1, "the case must have uneven shards"
    for rank in range(world):
        assert as_dict(plan.ranks[rank]) == measured_on_rank(config, world, rank), rank
    assert plan.busiest.rank == 0  # torch.chunk gives rank 0 the largest pieces
    if case == "hsdp4_toy":
        assert plan.mesh_shape == (2, 2) and "HSDP" in plan.layout
        assert as_dict(plan.ranks[0]) == as_dict(plan.ranks[2]) and as_dict(plan.ranks[1]) == as_dict(plan.ranks[3])
    assert not dist.is_initialized()


def test_the_plan_is_not_the_total_divided_by_the_ranks() -> None:
    config = tiny_toy_config(fsdp=True)
    whole = estimate_memory(tiny_toy_config())
    plan = plan_state(config, 4)
    # buffers stay whole and uneven dims leave rank 0 more than a quarter
    assert plan.busiest.parameters > whole["parameters"] / 4
    # Adam's moments are split; its 4-byte step counters (one per parameter tensor) are kept whole by every rank
    n_tensors = len(list(build_meta_model(config).net.parameters()))
    assert sum(r.optimizer_state for r in plan.ranks) == whole["optimizer_state"] + 3 * 4 * n_tensors
    assert sum(r.gradients for r in plan.ranks) == whole["gradients"]  # every element on exactly one rank


def test_estimate_memory_reports_the_busiest_rank_of_the_plan() -> None:
    config = tiny_toy_config(fsdp=True)
    estimate = estimate_memory(config, world_size=3)
    plan = plan_state(config, 3)
    assert estimate["sharded"] and estimate["world_size"] == 3 and estimate["rank"] == plan.busiest.rank
    assert {k: estimate[k] for k in ("parameters", "gradients", "optimizer_state", "total")} == \
        {**as_dict(plan.busiest), "total": plan.busiest.total}


@pytest.mark.parametrize("overrides, world", [([], 1), (["trainer.ddp=True"], 4), (["trainer.fsdp=True"], 1)])
def test_replicated_and_single_rank_plans_hold_everything(overrides: list[str], world: int) -> None:
    config = load_config("Digits/config_sft_digits")
    whole = estimate_memory(config)
    apply_overrides(config, overrides)
    plan = plan_state(config, world)
    assert not plan.sharded and len(plan.ranks) == world
    for rank in plan.ranks:
        assert {**as_dict(rank), "total": rank.total} == {k: whole[k] for k in ("parameters", "gradients",
                                                                                 "optimizer_state", "total")}


def test_an_optimizer_that_cannot_step_on_meta_gets_the_rule_on_its_local_shard() -> None:
    """SparseAdam refuses dense gradients: estimate_memory's rule (Adam-like: 2 x parameters) then applies to each
    rank's own shard of the parameters it steps."""
    config = tiny_toy_config(fsdp=True)
    config.model.net_optimizer = LazyCall("torch.optim.SparseAdam")(lr=1e-3)
    plan = plan_state(config, 3)
    assert plan.method.startswith("rule of thumb for SparseAdam")
    for rank in plan.ranks:
        assert rank.optimizer_state == 2 * rank.gradients > 0
    assert len({r.gradients for r in plan.ranks}) > 1


def test_per_optimizer_gradients_add_up() -> None:
    plan = plan_state(dmd2_config(), 2)
    for rank in plan.ranks:
        assert set(rank.gradients_by_optimizer) == {"net", "fake_score", "discriminator"}
        assert sum(rank.gradients_by_optimizer.values()) == rank.gradients


def test_no_process_group_is_left_behind_even_when_parallelize_refuses() -> None:
    plan_state(tiny_toy_config(fsdp=True), 2)
    assert not dist.is_initialized()
    config = dmd2_config()
    apply_overrides(config, ["model.r1_weight=1.0", "model.r1_estimator=exact"])
    with pytest.raises(ConfigError, match="r1_estimator=finite_difference"):
        plan_state(config, 2)
    assert not dist.is_initialized()
    plan_state(tiny_toy_config(fsdp=True), 2)  # and the next plan starts cleanly


@pytest.mark.parametrize("world, shard_size, error", [(0, None, UsageError), (3, 2, ConfigError), (4, 0, ConfigError)])
def test_bad_world_sizes_are_refused(world: int, shard_size: int | None, error: type) -> None:
    with pytest.raises(error):
        plan_state(tiny_toy_config(fsdp=True, fsdp_shard_size=shard_size), world)
    assert not dist.is_initialized()
