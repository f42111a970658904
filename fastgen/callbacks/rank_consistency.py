"""RankConsistencyCallback: catch buffers (and optionally parameters) that silently drift apart across ranks.

Data-parallel training assumes every rank holds the same replicated tensors. A buffer updated from rank-local
data (a running statistic, a step counter, a cached RNG state), an EMA fed from different weights, or a
non-deterministic kernel can make ranks diverge without any error: the job trains on, and the checkpoint that
rank 0 writes is not what the other ranks used. Every ``every_n`` optimizer steps this callback computes a
64-bit fingerprint of each tensor on every rank, all-gathers the fingerprints (one ``int64`` tensor, so it
works with gloo on CPU and NCCL on GPU) and raises ``FastGenRuntimeError`` naming each differing tensor
(``<module>.<name>`` within ``model.model_dict``) and which ranks agree with which. With one process it still
computes the fingerprints (cheap) and compares nothing. DTensor-sharded tensors (FSDP2) are skipped: their
shards are meant to differ; replicated DTensors are checked through their local tensor. Logged key:
``rank_consistency/checked_tensors``.

The fingerprint (its exact formula and properties) and the comparison across ranks live in
``fastgen.distributed.fingerprint``, shared with ``fastgen check-ranks``, which runs the same comparison - and checks
sharded tensors against the checkpoint each rank read - before a job trains.
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils
from fastgen.distributed.fingerprint import (  # noqa: F401 - tensor_fingerprint: re-exported for existing imports
    disagreements,
    fingerprint_tensors,
    gather_fingerprints,
    is_sharded,
    tensor_fingerprint,
)
from fastgen.utils.errors import FastGenRuntimeError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class RankConsistencyCallback(Callback):
    def __init__(self, every_n: int = 100, check_params: bool = False, modules: list[str] | None = None) -> None:
        if every_n < 1:
            raise ValueError(f"RankConsistencyCallback(every_n={every_n}): every_n must be >= 1")
        self.every_n = int(every_n)
        self.check_params = bool(check_params)
        self.modules = list(modules) if modules else None
        self.last_checked = 0

    def named_tensors(self, model: Any) -> list[tuple[str, torch.Tensor]]:
        """``(module.name, tensor)`` for every buffer (and replicated parameter) checked, in a fixed order."""
        modules = model.model_dict
        names = list(modules) if self.modules is None else self.modules
        unknown = [n for n in names if n not in modules]
        if unknown:
            raise ValueError(f"RankConsistencyCallback(modules=...): {unknown} not in model.model_dict "
                             f"(it has {list(modules)})")
        out: list[tuple[str, torch.Tensor]] = []
        for module_name in names:
            module = modules[module_name]
            found = list(module.named_buffers())
            if self.check_params:
                found += list(module.named_parameters())
            out += [(f"{module_name}.{name}", t) for name, t in found
                    if t is not None and not t.is_meta and not is_sharded(t)]
        return out

    def check(self, model: Any, iteration: int = 0) -> int:
        """Fingerprint, compare across ranks, raise on a mismatch; return how many tensors were checked."""
        named = self.named_tensors(model)
        fingerprints = fingerprint_tensors(t for _, t in named)
        self.last_checked = len(named)
        if dist_utils.is_initialized() and dist_utils.get_world_size() > 1:
            self._compare(named, fingerprints, iteration)
        return len(named)

    def _compare(self, named: list[tuple[str, torch.Tensor]], fingerprints: torch.Tensor, iteration: int) -> None:
        per_rank = gather_fingerprints([name for name, _ in named], fingerprints)
        found = disagreements(per_rank)
        if not found:
            return
        if any(d.missing for d in found):
            lacking = [d for d in found if d.missing][:3]
            ranks = ", ".join(f"rank {r}: {len(values)} tensors" for r, values in enumerate(per_rank))
            examples = "; ".join(f"{d.name} on ranks {list(d.reference_ranks)}, not on {list(d.missing)}"
                                 for d in lacking)
            raise FastGenRuntimeError(
                f"rank consistency check at iteration {iteration}: ranks hold different sets of buffers/parameters "
                f"({ranks}; e.g. {examples}); the model was built differently on some ranks"
            )
        lines = [f"{d.name}: {d.describe()}" for d in found[:10]]
        more = f" (and {len(found) - 10} more)" if len(found) > 10 else ""
        raise FastGenRuntimeError(
            f"rank consistency check at iteration {iteration}: {len(found)} replicated tensor(s) differ across "
            f"ranks{more} - " + " | ".join(lines) + ". A rank-local update (buffer statistics, EMA, RNG) or a "
            "non-deterministic op let the ranks drift; fix it and resume from a checkpoint taken before the drift"
        )

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        if iteration % self.every_n != 0:
            return
        checked = self.check(model, iteration)
        self.trainer.log_scalar("rank_consistency/checked_tensors", float(checked))
