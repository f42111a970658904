"""KD: knowledge distillation of the teacher's deterministic sampler into a 1-, 2- or 4-step student
(Luhman & Luhman 2021, "Knowledge Distillation in Iterative Generative Models for Improved Sampling Speed").

The teacher's probability-flow ODE (Heun, ``kd_teacher_steps`` or ``sample_steps`` steps, classifier-free guidance
when ``guidance_scale`` is set) defines a deterministic map ``z -> x = ODE(z)``; the student regresses it
(Luhman & Luhman 2021, Eq. 5, ``L = E_z ||G(z) - ODE(z)||^2``).

**Multi-step students** (``t_list = [t_0 = T, t_1, ..., t_{k-1}]``, then 0) follow the teacher's *trajectory*: the
teacher's solve records its state ``x^T_{t_i}`` at every student time (the student times are inserted into the
teacher's grid), and student step ``i`` starts from the teacher's state ``x^T_{t_i}`` and is a DDIM step
(Song et al. 2021, Eq. 12 with ``eta = 0``) built from its estimate ``x0_i = G(x^T_{t_i}, t_i)``::

    x_{t_{i+1}} = alpha_{i+1} x0_i + sigma_{i+1} (x^T_{t_i} - alpha_i x0_i) / sigma_i

Regressing that onto the teacher's ``x^T_{t_{i+1}}`` is regressing ``x0_i`` onto the ``x0`` it implies,
``(x^T_{t_{i+1}} - (sigma_{i+1} / sigma_i) x^T_{t_i}) / (alpha_{i+1} - sigma_{i+1} alpha_i / sigma_i)``
(Salimans & Ho 2022, "Progressive distillation", Algorithm 2's target); for the last step (``t = 0``:
``alpha = 1``, ``sigma = 0``) it is the teacher's sample itself. The loss averages the ``k`` steps.
Sampling (``generate``) runs the same deterministic DDIM steps from noise.

**Teacher pairs.** ``build_kd_dataset(model, path, ...)`` solves ``kd_num_samples`` noises (and balanced random
labels for conditional models) and writes ``noise``, ``trajectory`` (the states at ``t_1 .. t_{k-1}`` and the
final sample), ``labels`` and the student ``times`` to one ``.pt`` file (atomically); ``KDPairsDataset`` reads it.
A run whose ``kd_data_path`` does not exist builds it in ``prepare_training_data`` once its networks are on their
devices, before the trainer builds its data loaders: split across the ranks (rank ``r`` solves batches
``r, r + W, ...``; under FSDP every rank runs the same number of teacher calls, the sharded forward being a
collective), then rank 0 joins the parts into the one file - the same bytes as a one-process build. Without
``kd_data_path`` the teacher solves fresh noise for every batch.

Logged keys (``loss_dict``): ``total_loss``, ``kd_loss`` (mean over the student's steps) and, for ``k > 1``,
``kd_loss_step{i}`` for each step ``i``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.distributed import group as dist_utils
from fastgen.distributed.keyed_rng import RandomSource
from fastgen.methods.cm_utils import consistency_distance, teacher_velocity
from fastgen.methods.distill import DistillationModel
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger
from fastgen.utils.safe_pickle import torch_load

logger = get_logger(__name__)

KD_FORMAT = "fastgen-kd-pairs-v1"


def _merge_times(grid: list[float], student: list[float]) -> list[float]:
    """The teacher's grid below ``student[0]`` with the student's times inserted, from ``student[0]`` to 0."""
    points = sorted({*[g for g in grid if g < student[0]], *student, 0.0}, reverse=True)
    merged: list[float] = []
    for p in points:  # drop grid points that coincide with a student time (float32 grids)
        if merged and abs(merged[-1] - p) <= 1e-6 * max(abs(p), 1.0):
            if p in student:
                merged[-1] = p
            continue
        merged.append(p)
    return merged


class KDModel(DistillationModel):
    student_sampler = "ode"

    # ---- the teacher's trajectories ----------------------------------------------------------------------------
    def teacher_steps(self) -> int:
        return int(self.config.kd_teacher_steps or self.config.sample_steps)

    @torch.no_grad()
    def teacher_trajectory(self, noise: torch.Tensor, condition: torch.Tensor | None,
                           times: list[float] | None = None) -> torch.Tensor:
        """``(B, k, ...)``: the teacher's Heun states at the student times ``t_1 .. t_{k-1}`` and its sample."""
        times = times or self.student_times()
        grid = self.noise_scheduler.sampling_times(self.teacher_steps()).tolist()
        points = _merge_times(grid, times)
        record = set(times[1:])
        x = self.start_state(noise, times[0])
        batch = x.shape[0]
        states = []
        for cur, nxt in zip(points[:-1], points[1:]):
            t_cur = torch.full((batch,), cur, device=x.device, dtype=x.dtype)
            d_cur = teacher_velocity(self, x, t_cur, condition)
            x_next = x + (nxt - cur) * d_cur
            if nxt > 0:  # Heun's correction (EDM Algorithm 1), except on the last step into t = 0
                t_next = torch.full((batch,), nxt, device=x.device, dtype=x.dtype)
                x_next = x + (nxt - cur) * 0.5 * (d_cur + teacher_velocity(self, x_next, t_next, condition))
            x = x_next
            if nxt in record:
                states.append(x)
        states.append(x)
        return torch.stack(states, dim=1)

    # ---- the student --------------------------------------------------------------------------------------------
    def ddim_coefficients(self, t: float, t_next: float, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)`` with ``x_{t_next} = a x0 + b x_t`` for the deterministic DDIM step (``eta = 0``)."""
        a, b = self.noise_scheduler.ddim_coefficients(t, t_next)
        return a.to(like.dtype).to(like.device), b.to(like.dtype).to(like.device)

    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        """Deterministic few-step sampling: ``x0_i = G(x_{t_i}, t_i)`` and a DDIM step to ``t_{i+1}``."""
        times = times or self.student_times()
        x = self.start_state(noise, times[0])
        x0 = x
        for i, t in enumerate(times):
            t_vec = torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype)
            x0 = net(x, t_vec, condition=condition, fwd_pred_type="x0")
            if i + 1 < len(times):
                a, b = self.ddim_coefficients(t, times[i + 1], x)
                x = a * x0 + b * x
        return x0

    # ---- the cache ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare_training_data(self) -> None:
        """Build ``kd_data_path`` when it does not exist (every rank solves its share), then check it fits."""
        super().prepare_training_data()
        path = self.config.kd_data_path
        if not path:
            return
        exists = Path(path).is_file() if dist_utils.is_rank0() else None
        if not dist_utils.broadcast_object(exists):  # every rank takes the same branch
            build_kd_dataset(self, path, self.config.kd_num_samples, self.config.kd_build_batch_size,
                             self.config.kd_seed, rank=dist_utils.get_rank(), world=dist_utils.get_world_size())
        check_cache(path, self.student_times(), self.config.teacher_ckpt)

    # ---- the step -----------------------------------------------------------------------------------------------
    def pairs_of(self, data: dict[str, Any], condition: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(noise, trajectory)`` of a batch: read from the pairs file's batch, or solved now by the teacher."""
        times = self.student_times()
        if "trajectory" in data:
            trajectory = data["trajectory"].to(self.precision)
            if trajectory.shape[1] != len(times):
                raise ConfigError(f"the KD pairs hold {trajectory.shape[1]} trajectory points but model.t_list has "
                                  f"{len(times)} steps; rebuild the cache for this t_list")
            return data["noise"].to(self.precision), trajectory
        noise = self.sample_noise(data["real"].shape[0], data["real"])
        return noise, self.teacher_trajectory(noise, condition, times)

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        times = self.student_times()
        condition = self.condition_of(data)
        noise, trajectory = self.pairs_of(data, condition)
        x = self.start_state(noise, times[0])
        losses = []
        x0 = x
        for i, t in enumerate(times):
            t_vec = torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype)
            x0 = self.net(x, t_vec, condition=condition, fwd_pred_type="x0")
            t_next = times[i + 1] if i + 1 < len(times) else 0.0
            a, b = self.ddim_coefficients(t, t_next, x)
            target = (trajectory[:, i] - b * x) / a  # the x0 the teacher's next state implies
            losses.append(consistency_distance(x0 - target, self.config.distance, self.config.huber_c).mean())
            x = trajectory[:, i]  # the next step starts on the teacher's trajectory
        loss = torch.stack(losses).mean()
        loss_dict = {"total_loss": loss, "kd_loss": loss.detach()}
        if len(times) > 1:
            loss_dict.update({f"kd_loss_step{i}": value.detach() for i, value in enumerate(losses)})
        return loss_dict, {"generated": x0.detach(), "target": trajectory[:, -1]}


# ---- building and reading the cache -------------------------------------------------------------------------------
@torch.no_grad()
def _batches(model: KDModel, num_samples: int, batch_size: int, seed: int, rank: int, world: int
             ) -> list[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """``(batch index, noise, labels)`` of this rank's batches (``index % world == rank``). Every rank draws
    every batch from the one seeded generator, in order, and keeps its own: noise is cheap next to a teacher
    solve, and so any world size writes the file a single process writes."""
    generator = torch.Generator().manual_seed(seed)
    mine = []
    for index, start in enumerate(range(0, num_samples, batch_size)):
        n = min(batch_size, num_samples - start)
        noise = model.noise_scheduler.prior_sample((n, *model.config.input_shape), generator=generator)
        label = torch.randint(model.num_classes, (n,), generator=generator) if model.num_classes > 0 else None
        if index % world == rank:
            mine.append((index, noise, label))
    return mine


def _part_path(path: Path, rank: int, world: int) -> Path:
    return path.with_name(f".{path.name}.part{rank}-of-{world}")


def build_kd_dataset(model: KDModel, path: str | Path, num_samples: int, batch_size: int = 500,
                     seed: int = 0, rank: int = 0, world: int = 1) -> Path:
    """Solve ``num_samples`` noises with ``model``'s teacher and write the pairs to ``path`` (atomically).

    Noise (and, for a conditional model, balanced random labels) come from a generator seeded with ``seed``, so
    the same call writes the same file. With ``world > 1`` every rank calls it (a collective): rank ``rank``
    solves every ``world``-th batch and writes its part beside ``path``; rank 0 joins them. ``path`` must then be
    on storage every rank sees (as the data loaders that read it need anyway). Returns ``path``."""
    from fastgen.distributed.parallelize import has_sharded_parameters
    from fastgen.utils.io import atomic_open

    if num_samples < 1 or batch_size < 1:
        raise ValueError("num_samples and batch_size must be positive")
    path = Path(path)
    times = model.student_times()
    device = next(model.teacher.parameters()).device
    was_training = model.teacher.training
    model.teacher.eval()
    mine = _batches(model, num_samples, batch_size, seed, rank, world)
    total = -(-num_samples // batch_size)
    calls = len(mine)
    if world > 1 and has_sharded_parameters(model.teacher):
        # A sharded teacher's forward is a collective: every rank makes the same number of solves (a rank short of
        # a batch solves a stand-in and drops it).
        calls = -(-total // world)
    logger.info("building %d KD pairs with %d teacher Heun steps into %s (this rank: %d of %d batches)",
                num_samples, model.teacher_steps(), path, len(mine), total)
    solved: dict[int, torch.Tensor] = {}
    for call in range(calls):
        index, noise, label = mine[call] if call < len(mine) else (-1, *_batches(model, 1, 1, seed, 0, 1)[0][1:])
        trajectory = model.teacher_trajectory(noise.to(device, model.precision),
                                              None if label is None else label.to(device), times)
        if index >= 0:
            solved[index] = trajectory.float().cpu()
    model.teacher.train(was_training)
    part = {"index": torch.tensor([index for index, _, _ in mine], dtype=torch.int64),
            "noise": [noise for _, noise, _ in mine], "trajectory": [solved[index] for index, _, _ in mine],
            "labels": [label for _, _, label in mine if label is not None]}
    if world > 1:
        with atomic_open(_part_path(path, rank, world), "wb") as handle:
            torch.save(part, handle)
        dist_utils.barrier()
        if rank == 0:
            _write_pairs(model, path, times, [_read_part(_part_path(path, r, world)) for r in range(world)])
            for r in range(world):
                _part_path(path, r, world).unlink(missing_ok=True)
        dist_utils.barrier()
    else:
        _write_pairs(model, path, times, [part])
    return path


def _read_part(path: Path) -> dict[str, Any]:
    return torch_load(path, what="KD pairs part")


def _write_pairs(model: KDModel, path: Path, times: list[float], parts: list[dict[str, Any]]) -> None:
    """Join the ranks' parts in batch order and write the pairs file (atomically)."""
    from fastgen.utils.io import atomic_open

    order = sorted((int(index), p, i) for p, part in enumerate(parts) for i, index in enumerate(part["index"]))
    noises = [parts[p]["noise"][i] for _, p, i in order]
    trajectories = [parts[p]["trajectory"][i] for _, p, i in order]
    labels = [parts[p]["labels"][i] for _, p, i in order if parts[p]["labels"]]
    payload: dict[str, Any] = {
        "format": KD_FORMAT,
        "noise": torch.cat(noises),
        "trajectory": torch.cat(trajectories),
        "times": torch.tensor(times, dtype=torch.float64),
        "teacher_steps": model.teacher_steps(),
        "guidance_scale": float(model.config.guidance_scale) if model.config.guidance_scale is not None else -1.0,
        "teacher_ckpt": _teacher_id(model.config.teacher_ckpt),
    }
    if labels:
        payload["labels"] = torch.cat(labels)
    with atomic_open(path, "wb") as handle:
        torch.save(payload, handle)


def _load_pairs(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"KD pairs file {path} does not exist: start a fresh run with model.kd_data_path={path} "
                          "(it is built then) or call fastgen.methods.kd.build_kd_dataset")
    payload = torch_load(path)
    if not isinstance(payload, dict) or payload.get("format") != KD_FORMAT:
        raise ConfigError(f"{path} is not a KD pairs file (written by fastgen.methods.kd.build_kd_dataset)")
    return payload


def _teacher_id(teacher_ckpt: str | None) -> str:
    return str(Path(teacher_ckpt).resolve()) if teacher_ckpt else ""


def check_cache(path: str | Path, times: list[float], teacher_ckpt: str | None) -> None:
    """Fail early when a cache was built for other student times than the run's ``t_list``, or by another
    teacher checkpoint (stale pairs would silently distill the wrong model)."""
    payload = _load_pairs(path)
    built_by = str(payload.get("teacher_ckpt", ""))
    if built_by != _teacher_id(teacher_ckpt):
        raise ConfigError(f"KD pairs in {path} were built from the teacher {built_by or '(random weights)'}, not "
                          f"{_teacher_id(teacher_ckpt) or '(random weights)'}; use another model.kd_data_path (and "
                          "dataloader path) or delete the file to rebuild it")
    stored = [float(t) for t in payload["times"]]
    if len(stored) != len(times) or any(abs(a - b) > 1e-6 * max(abs(b), 1.0) for a, b in zip(stored, times)):
        raise ConfigError(f"KD pairs in {path} were built for student times {stored}, but model.t_list gives {times}; "
                          "use another model.kd_data_path (and dataloader path) or delete the file to rebuild it")


class KDPairsDataset:
    """The pairs of a KD cache; items are ``{"noise", "trajectory", "real" (the teacher's sample)[, "condition"]}``."""

    def __init__(self, path: str) -> None:
        payload = _load_pairs(path)
        self.noise: torch.Tensor = payload["noise"]
        self.trajectory: torch.Tensor = payload["trajectory"]
        self.labels: torch.Tensor | None = payload.get("labels")
        self.times = [float(t) for t in payload["times"]]

    def __len__(self) -> int:
        return self.noise.shape[0]

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = {"noise": self.noise[indices], "trajectory": self.trajectory[indices],
                 "real": self.trajectory[indices, -1]}
        if self.labels is not None:
            batch["condition"] = self.labels[indices]
        return batch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self.get_batch(torch.tensor([index])).items()}


__all__ = ["KDModel", "KDPairsDataset", "build_kd_dataset", "check_cache"]
