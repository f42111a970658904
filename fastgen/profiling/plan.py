"""Per-rank parameter, gradient and optimizer-state bytes from the *real* sharding plan, without weights or ranks.

``plan_state(config, world_size)`` answers "what will each of N ranks hold?" the way the trainer would build it,
not by dividing totals by N:

1. the method is built on the meta device (``estimate.build_meta_model``: shapes and dtypes, no storage);
2. under ``trainer.fsdp`` with N > 1, a *fake* process group of N ranks stands in for the job
   (``torch.distributed.init_process_group(backend="fake", rank=0, world_size=N)``: torch's FakeProcessGroup,
   which answers every collective without communicating), the device mesh is built as ``init_distributed`` builds
   it (``distributed.build_mesh``: 1-D, or 2-D ``replicate x shard`` for HSDP with ``trainer.fsdp_shard_size``),
   and the trainer's own ``parallelize`` shards every network with FSDP2 ``fully_shard``, shard units first;
3. the optimizers are built over the sharded parameters and stepped once on the meta device
   (``estimate.estimate_unsharded``, so an optimizer that cannot step there gets that module's rule, the same as
   unsharded);
4. every tensor a rank holds is listed with its global shape, dtype and DTensor placements: parameters and
   buffers, one gradient per parameter an optimizer steps, and the optimizer state. Each rank's local size then
   follows from DTensor's own layout rule (``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``
   at that rank's mesh coordinate), so the plan knows every rank, not only the one the fake group pretends to be.
   A tensor without placements (a buffer, Adam's step counter) is whole on every rank.

The fake group is destroyed before ``plan_state`` returns: a dry run leaves no process group behind. Inside a
running job (a process group already exists, e.g. ``MemTrackerCallback`` under torchrun) that group is used
instead - every rank must then call ``plan_state`` - and left as it was.

Layout per mode:

* FSDP2 (Zhao et al. 2023, "PyTorch FSDP", Sec. 3.2.1; ZeRO stage 3, Rajbhandari et al. 2020, Fig. 1): each
  parameter is split along dim 0 with ``torch.chunk`` semantics over the shard group, so rank ``r`` holds rows
  ``[r * ceil(d0 / S), (r + 1) * ceil(d0 / S))`` clipped to ``d0``. Uneven shards make ranks differ; rank 0 always
  has the largest chunks. FSDP2 pads every rank's parameter and gradient storage to rank 0's chunk size, so rank
  0's local bytes are also what every rank *allocates* for parameters and gradients; optimizer state
  (``zeros_like`` of the local shard) is unpadded. The report uses the busiest rank (the largest total, i.e.
  rank 0), and ``ranks`` holds every rank's local bytes - what ``fastgen.profiling.state_bytes`` measures on it.
* HSDP: the same within each group of ``fsdp_shard_size`` ranks; the groups replicate each other.
* DDP (``trainer.ddp``) and one rank: every rank holds the whole state (replication), the unsharded estimate.
  DDP's gradient buckets (a flat copy of the gradients inside its reducer) are not counted.

``gradients`` counts a gradient for every parameter any optimizer steps: the bound for a method whose optimizers
all step together. Alternating methods (DMD2, SiD, LADD, ...) zero their gradients every iteration and so hold
only the stepping optimizers' at a time; ``RankState.gradients_by_optimizer`` gives each optimizer's share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

ROLES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state")


@dataclass(frozen=True)
class RankState:
    """Bytes one rank holds."""

    rank: int
    parameters: int
    gradients: int
    optimizer_state: int
    gradients_by_optimizer: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state


@dataclass(frozen=True)
class StatePlan:
    """What every rank of an N-rank job holds (``ranks[r]``), and how it was laid out."""

    world_size: int
    layout: str
    sharded: bool
    mesh_shape: tuple[int, ...]
    ranks: tuple[RankState, ...]
    method: str

    @property
    def busiest(self) -> RankState:
        """The rank that holds the most (the lowest such rank): the one that runs out of memory first."""
        return max(self.ranks, key=lambda r: (r.total, -r.rank))

    @property
    def lightest(self) -> RankState:
        return min(self.ranks, key=lambda r: (r.total, r.rank))

    def as_estimate(self) -> dict[str, Any]:
        """The busiest rank in ``estimate_memory``'s format."""
        rank = self.busiest
        values = {role: getattr(rank, role) for role in ROLES}
        return {**values, "total": rank.total, "world_size": self.world_size, "sharded": self.sharded,
                "method": self.method, "rank": rank.rank, "layout": self.layout}


@dataclass(frozen=True)
class _Entry:
    """One tensor a rank holds: its global shape and element size, and its DTensor placements (``None``: whole on
    every rank). ``scale`` weights an entry that stands for a rule of thumb proportional to parameter bytes."""

    role: str
    shape: tuple[int, ...]
    itemsize: int
    placements: tuple[Any, ...] | None
    optimizer: str | None = None
    scale: float = 1.0


def check_world_size(trainer_config: Any, world_size: int) -> None:
    """The checks ``init_distributed`` makes at launch: at least one rank, and an HSDP shard size that divides the
    world size. Raises ``UsageError`` / ``ConfigError`` (exit 2)."""
    from fastgen.utils.errors import ConfigError, UsageError

    if world_size < 1:
        raise UsageError(f"the number of ranks must be at least 1, got {world_size}")
    shard_size = getattr(trainer_config, "fsdp_shard_size", None)
    if shard_size is not None and (shard_size < 1 or world_size % shard_size):
        raise ConfigError(f"trainer.fsdp_shard_size={shard_size} must divide the world size {world_size}")


def plan_state(config: Any, world_size: int, model: Any = None) -> StatePlan:
    """Every rank's parameter, gradient and optimizer-state bytes for ``config`` on ``world_size`` ranks (see the
    module docstring). ``model``: the method already built on the meta device, used when nothing is sharded (a
    sharded plan builds its own). Raises ``ConfigError`` for a shard size that does not divide ``world_size`` and
    for a config that ``parallelize`` refuses."""
    from fastgen.distributed.parallelize import distributed_mode

    check_world_size(config.trainer, world_size)
    mode = distributed_mode(config.trainer)
    if mode == "fsdp" and world_size > 1:
        shard_size = config.trainer.fsdp_shard_size
        with sharded_meta_model(config, world_size) as (model, mesh):
            entries, method = _inventory(config, model)
            mesh_shape = tuple(int(s) for s in mesh.mesh.shape)
            coordinates = [_coordinate(mesh, r) for r in range(world_size)]
        if shard_size is None or shard_size == world_size:
            layout = f"sharded over {world_size} ranks (FSDP2)"
        else:
            layout = f"sharded over {shard_size} ranks, replicated {world_size // shard_size}x (HSDP)"
        ranks = _rank_states(entries, mesh_shape, coordinates)
        return StatePlan(world_size, layout, True, mesh_shape, ranks, method)
    from fastgen.profiling.estimate import build_meta_model

    entries, method = _inventory(config, model if model is not None else build_meta_model(config))
    layout = "1 rank" if world_size == 1 else f"replicated on {world_size} ranks" + (" (DDP)" if mode == "ddp" else "")
    ranks = _rank_states(entries, (world_size,), [(r,) for r in range(world_size)])  # no placements: all alike
    return StatePlan(world_size, layout, False, (world_size,), ranks, method)


@contextlib.contextmanager
def sharded_meta_model(config: Any, world_size: int, rank: int = 0) -> Iterator[tuple[Any, Any]]:
    """``(model, mesh)``: the method on the meta device, sharded by the trainer's ``parallelize`` on the mesh
    ``init_distributed`` would build, as rank ``rank`` of a fake ``world_size``-rank group (or this job's group,
    when one exists). The fake group is destroyed on exit."""
    from fastgen.distributed.group import build_mesh
    from fastgen.distributed.parallelize import parallelize
    from fastgen.profiling.estimate import build_meta_model

    check_world_size(config.trainer, world_size)
    with _process_group(world_size, rank) as device_type:
        mesh = build_mesh(device_type, world_size, config.trainer.fsdp_shard_size)
        model = build_meta_model(config)
        parallelize(model, config.trainer, mesh)
        yield model, mesh


@contextlib.contextmanager
def _process_group(world_size: int, rank: int) -> Iterator[str]:
    """A fake process group of ``world_size`` ranks for the duration of the block, destroyed afterwards; or, when
    this process already belongs to a group (a running job), that group, left as it is. Yields the device type
    of the mesh to build."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from fastgen.distributed.group import collective_device

        if dist.get_world_size() != world_size:
            raise ValueError(f"cannot plan {world_size} ranks inside a running job of {dist.get_world_size()}")
        yield collective_device().type
        return
    # torch's FakeProcessGroup (backend "fake", built in since torch 2.1; init_process_group supplies its
    # FakeStore): every collective returns at once without communicating, so one process can play any rank.
    dist.init_process_group(backend=dist.Backend.FAKE, rank=rank, world_size=world_size)
    try:
        yield "cpu"
    finally:
        dist.destroy_process_group()


def _coordinate(mesh: Any, rank: int) -> tuple[int, ...]:
    """Rank ``rank``'s coordinate in the device mesh (``mesh.mesh`` holds the global rank at each position)."""
    found = (mesh.mesh == rank).nonzero()
    return tuple(int(i) for i in found[0].tolist())


def _entry(role: str, tensor: Any, optimizer: str | None = None, scale: float = 1.0) -> _Entry:
    from torch.distributed.tensor import DTensor

    placements = tuple(tensor.placements) if isinstance(tensor, DTensor) else None
    return _Entry(role, tuple(int(s) for s in tensor.shape), int(tensor.element_size()), placements, optimizer, scale)


def _inventory(config: Any, model: Any) -> tuple[list[_Entry], str]:
    """Every tensor of ``model`` by role, after one optimizer step on the meta device (``estimate_memory`` takes
    it, with its fallback for an optimizer that cannot step there)."""
    import torch

    from fastgen.profiling.estimate import estimate_unsharded
    from fastgen.profiling.state_bytes import _unique

    estimate = estimate_unsharded(config, world_size=1, model=model)  # builds and steps the optimizers on meta
    entries = [_entry("parameters", t) for t in _unique([*model.parameters(), *model.buffers()])]
    stepped: set[int] = set()
    stateless: list[Any] = []
    counted_state = 0
    for name, optimizer in model.optimizer_dict.items():
        params = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in stepped]
        stepped.update(id(p) for p in params)
        entries.extend(_entry("gradients", p, name) for p in params)
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        if state:
            entries.extend(_entry("optimizer_state", v, name) for v in state)
            counted_state += sum(int(v.numel()) * int(v.element_size()) for v in state)
        else:
            stateless.extend((name, p) for p in params)
    # An optimizer that could not step on the meta device (or keeps no tensors) is counted by estimate_memory's
    # rule, proportional to its parameter bytes: that rule holds for each rank's local share of them.
    remainder = int(estimate["optimizer_state"]) - counted_state
    rule_params = sum(int(p.numel()) * int(p.element_size()) for _, p in stateless)
    if remainder > 0 and rule_params > 0:
        entries.extend(_entry("optimizer_state", p, name, scale=remainder / rule_params) for name, p in stateless)
    return entries, str(estimate["method"])


def _local_numel(shape: tuple[int, ...], placements: tuple[Any, ...] | None, mesh_shape: tuple[int, ...],
                 coordinate: tuple[int, ...]) -> int:
    """Elements of a tensor that the rank at ``coordinate`` holds (DTensor's rule; uneven shards included)."""
    import math

    if placements is None:
        return math.prod(shape)
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    local_shape, _ = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate), placements)
    return math.prod(local_shape)


_Layout = tuple[tuple[int, ...], "tuple[Any, ...] | None"]


def _by_layout(entries: list[_Entry]) -> dict[_Layout, dict[tuple[str, str | None], float]]:
    """Entries grouped by (shape, placements): bytes per element for each (role, optimizer). A network's tensors
    share a few dozen layouts (a parameter, its gradient and its moments have one), so each rank needs only one
    layout computation per group."""
    groups: dict[_Layout, dict[tuple[str, str | None], float]] = {}
    for entry in entries:
        weights = groups.setdefault((entry.shape, entry.placements), {})
        key = (entry.role, entry.optimizer)
        weights[key] = weights.get(key, 0.0) + entry.itemsize * entry.scale
    return groups


def _rank_states(entries: list[_Entry], mesh_shape: tuple[int, ...],
                 coordinates: list[tuple[int, ...]]) -> tuple[RankState, ...]:
    """Every rank's state; ranks whose coordinates differ only along replicated mesh dimensions (HSDP's replicas)
    hold the same and are computed once."""
    groups = _by_layout(entries)
    shard_dims = sorted({i for shape, placements in groups if placements
                         for i, placement in enumerate(placements) if placement.is_shard()})
    done: dict[tuple[int, ...], RankState] = {}
    states = []
    for rank, coordinate in enumerate(coordinates):
        key = tuple(coordinate[i] for i in shard_dims)
        if key not in done:
            done[key] = _rank_state(rank, groups, mesh_shape, coordinate)
        known = done[key]
        states.append(RankState(rank, known.parameters, known.gradients, known.optimizer_state,
                                dict(known.gradients_by_optimizer)))
    return tuple(states)


def _rank_state(rank: int, groups: dict[_Layout, dict[tuple[str, str | None], float]], mesh_shape: tuple[int, ...],
                coordinate: tuple[int, ...]) -> RankState:
    totals = dict.fromkeys(ROLES, 0.0)
    by_optimizer: dict[str, float] = {}
    for (shape, placements), weights in groups.items():
        numel = _local_numel(shape, placements, mesh_shape, coordinate)
        for (role, optimizer), per_element in weights.items():
            totals[role] += numel * per_element
            if role == "gradients" and optimizer is not None:
                by_optimizer[optimizer] = by_optimizer.get(optimizer, 0.0) + numel * per_element
    return RankState(rank, *(round(totals[role]) for role in ROLES),
                     gradients_by_optimizer={name: round(value) for name, value in by_optimizer.items()})


def estimate_memory(config: Any, world_size: int = 1, model: Any = None) -> dict[str, Any]:
    """Bytes per rank of parameters, gradients and optimizer state: under FSDP at more than one rank the busiest
    rank of the real sharding plan (``plan_state``), else whole networks on every rank (``estimate_unsharded``)."""
    if bool(getattr(config.trainer, "fsdp", False)) and int(world_size) > 1:
        return plan_state(config, int(world_size)).as_estimate()
    from fastgen.profiling.estimate import estimate_unsharded

    return estimate_unsharded(config, world_size=world_size, model=model)
