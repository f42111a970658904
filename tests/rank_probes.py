"""Callbacks that multi-rank tests add to real runs (importable by the workers: the tests folder is on their
PYTHONPATH). They observe; they change nothing a run computes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils


class LossLog(Callback):
    """Rank 0 appends ``iteration mean-loss-over-ranks`` (full precision) to ``path`` after every step."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        value = dist_utils.all_reduce_mean(loss_dict["total_loss"].detach().double().clone())
        if dist_utils.is_rank0():
            with self.path.open("a") as handle:
                handle.write(f"{iteration} {float(value)!r}\n")


class StateBytes(Callback):
    """Each rank writes ``<prefix>.rank<r>.json`` with what it holds (``fastgen.profiling.state_bytes``):
    parameters and gradients just before the optimizer step of iteration ``at``, optimizer state just after."""

    def __init__(self, prefix: str, at: int = 1) -> None:
        self.prefix, self.at = prefix, at
        self.measured: dict[str, int] = {}

    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None:
        if iteration == self.at:
            from fastgen.profiling.state_bytes import state_bytes

            self.measured = state_bytes(model)

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        if iteration == self.at + 1:  # iteration counts completed steps here
            from fastgen.profiling.state_bytes import state_bytes

            self.measured["optimizer_state"] = state_bytes(model)["optimizer_state"]
            Path(f"{self.prefix}.rank{dist_utils.get_rank()}.json").write_text(json.dumps(self.measured))


class PidFile(Callback):
    """Each rank writes its pid to ``<folder>/pid<rank>`` and sleeps ``pause_s`` after every step (so a test can
    kill one rank mid-run)."""

    def __init__(self, folder: str, pause_s: float = 0.2) -> None:
        self.folder = Path(folder)
        self.pause_s = pause_s

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        (self.folder / f"pid{dist_utils.get_rank()}").write_text(str(os.getpid()))
        time.sleep(self.pause_s)


class FailOn(Callback):
    """Raise ``ValueError`` on ``rank`` at ``iteration`` (``error="dist"``: ``torch.distributed.DistError``, as a
    collective that fails on that rank for a reason of its own would). ``linger_s``: the failed rank then spends
    that long in ``on_app_end`` (its clean-up, its process group still alive), as a slow clean-up would - the other
    ranks, already in the next step's collective, learn of the failure only through the failure watch."""

    def __init__(self, rank: int = 1, iteration: int = 3, error: str = "value", linger_s: float = 0.0) -> None:
        self.rank, self.iteration, self.error, self.linger_s = rank, iteration, error, linger_s
        self.raised = False

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        if iteration == self.iteration and dist_utils.get_rank() == self.rank:
            self.raised = True
            if self.error == "dist":
                import torch.distributed

                raise torch.distributed.DistError(f"boom on rank {self.rank}")
            raise ValueError(f"boom on rank {self.rank}")

    def on_app_end(self) -> None:
        if self.raised and self.linger_s:
            time.sleep(self.linger_s)


class FailDuringAsyncSave(Callback):
    """Raise ``ValueError`` on ``rank`` right after the save of ``iteration`` was started (``on_save_checkpoint_end``:
    with ``trainer.checkpointer.async_save`` its write is still in flight on every rank)."""

    def __init__(self, rank: int = 1, iteration: int = 4, slow_write_s: float = 0.0) -> None:
        self.rank, self.iteration, self.slow_write_s = rank, iteration, slow_write_s

    def on_save_checkpoint_start(self, model: Any, iteration: int = 0) -> None:
        """``slow_write_s``: every rank's write of this save takes that long (the shards of a large model), so the
        failure surely comes while it is in flight."""
        if iteration == self.iteration and self.slow_write_s:
            from torch.distributed.checkpoint import FileSystemWriter

            original, pause = FileSystemWriter.write_data, self.slow_write_s

            def slow_write_data(writer: Any, plan: Any, planner: Any) -> Any:
                time.sleep(pause)
                return original(writer, plan, planner)

            FileSystemWriter.write_data = slow_write_data  # this process only, for the rest of the run

    def on_save_checkpoint_end(self, model: Any, iteration: int = 0) -> None:
        if iteration == self.iteration and dist_utils.get_rank() == self.rank:
            raise ValueError(f"boom on rank {self.rank} during the async save of iteration {iteration}")


class FailAtStartUp(Callback):
    """At start-up (``on_model_init_start``, after the run directory exists) raise ``ConfigError`` on ``rank``
    (``rank=-2``: on every rank); every other rank writes ``<folder>/starting<rank>`` and sleeps ``pause_s`` there
    (still starting when the failure stops the run). ``rank=-1``: no rank fails (a test stops the sleeping process
    itself). ``swallow``: the sleep is wrapped in ``except Exception: pass``, as library code sometimes is.
    ``linger_s``: rank 0 spends that long in ``on_app_end`` (its clean-up, before the run directory is removed)."""

    def __init__(self, folder: str, rank: int = 1, pause_s: float = 30.0, swallow: bool = False,
                 linger_s: float = 0.0) -> None:
        self.folder, self.rank, self.pause_s, self.swallow = Path(folder), rank, pause_s, swallow
        self.linger_s = linger_s

    def on_model_init_start(self) -> None:
        from fastgen.utils.errors import ConfigError

        if self.rank in (dist_utils.get_rank(), -2):
            raise ConfigError(f"probe: rank {dist_utils.get_rank()} refuses to start")
        (self.folder / f"starting{dist_utils.get_rank()}").write_text(str(os.getpid()))
        try:
            time.sleep(self.pause_s)
        except Exception:  # noqa: BLE001 - on purpose (swallow=True)
            if not self.swallow:
                raise

    def on_app_end(self) -> None:
        if dist_utils.get_rank() == 0 and self.linger_s:
            (self.folder / "cleaning0").write_text(str(os.getpid()))
            time.sleep(self.linger_s)


class PeakRSS(Callback):
    """Each rank writes ``<prefix>.rank<r>.json``: its peak resident memory (``ru_maxrss``) once the model is built,
    loaded and sharded (``on_model_init_end``), and the bytes of the method's full and local weights. Run with
    ``MALLOC_MMAP_THRESHOLD_`` set low, so freed tensors go back to the system and the peak tracks live memory."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_model_init_end(self, model: Any) -> None:
        import resource

        from fastgen.profiling.state_bytes import state_bytes

        full = sum(p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()])
        record = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "full_weight_bytes": full, "local_weight_bytes": state_bytes(model)["parameters"]}
        Path(f"{self.prefix}.rank{dist_utils.get_rank()}.json").write_text(json.dumps(record))


class SampleLog(Callback):
    """Each rank appends the global sample ids of every training batch to ``<prefix>.rank<r>`` (one line per step)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        ids = " ".join(str(int(i)) for i in data_batch["sample_ids"])
        with open(f"{self.prefix}.rank{dist_utils.get_rank()}", "a") as handle:
            handle.write(f"{iteration} {ids}\n")


class StallSave(Callback):
    """While the checkpoint of iteration ``at`` is written, rank 0 writes ``<flag>`` after its shards are on disk
    and then waits ``pause_s`` before DCP's metadata (a test kills the job in that window: a ``.dcp`` folder
    without its marker). Observes only: the save itself is unchanged."""

    def __init__(self, flag: str, at: int, pause_s: float = 30.0) -> None:
        self.flag, self.at, self.pause_s = Path(flag), at, pause_s
        self.saving = 0

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        from torch.distributed.checkpoint import FileSystemWriter

        probe, original = self, FileSystemWriter.finish

        def finish(writer: Any, *args: Any, **kwargs: Any) -> Any:
            if probe.saving == probe.at:
                probe.flag.write_text(str(os.getpid()))
                time.sleep(probe.pause_s)
            return original(writer, *args, **kwargs)

        FileSystemWriter.finish = finish

    def on_save_checkpoint_start(self, model: Any, iteration: int = 0) -> None:
        self.saving = iteration


class FailSave(Callback):
    """Make rank ``rank``'s write of the checkpoint of iteration ``at`` fail (an ``OSError``, as a full disk
    would): sharded saves fail in DCP's ``write_data``, monolithic ones in the atomic file write."""

    def __init__(self, rank: int, at: int) -> None:
        self.rank, self.at = rank, at
        self.saving = 0

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        if dist_utils.get_rank() != self.rank:
            return
        from torch.distributed.checkpoint import FileSystemWriter

        import fastgen.checkpoint.checkpointer as files

        probe, write_data, atomic = self, FileSystemWriter.write_data, files.atomic_write_with

        def failing_write_data(writer: Any, *args: Any, **kwargs: Any) -> Any:
            if probe.saving == probe.at:
                raise OSError(28, "No space left on device (injected by the test)")
            return write_data(writer, *args, **kwargs)

        def failing_atomic(path: Any, writer: Any) -> None:
            if probe.saving == probe.at:
                raise OSError(28, "No space left on device (injected by the test)")
            atomic(path, writer)

        FileSystemWriter.write_data = failing_write_data
        files.atomic_write_with = failing_atomic

    def on_save_checkpoint_start(self, model: Any, iteration: int = 0) -> None:
        self.saving = iteration


class MarkerSeen(Callback):
    """Rank 0, one step after each save: waits (up to ``wait_s``) for that save's marker in ``folder`` and appends
    ``iteration seen`` to ``path``. An async save must become valid on its own, before the next save."""

    def __init__(self, folder: str, path: str, every: int, wait_s: float = 60.0) -> None:
        self.folder, self.path, self.every, self.wait_s = Path(folder), Path(path), every, wait_s

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        saved = iteration - 1
        if not dist_utils.is_rank0() or saved <= 0 or saved % self.every:
            return
        marker = self.folder / f"{saved:07d}.pth"
        deadline = time.monotonic() + self.wait_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with self.path.open("a") as handle:
            handle.write(f"{saved} {marker.exists()}\n")


class CompileStats(Callback):
    """Each rank writes ``<prefix>.rank<r>.json`` at the end of training: how many graphs dynamo compiled in this
    process (``unique_graphs``) - zero means every compiled block fell back to eager."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_train_end(self, model: Any, iteration: int = 0) -> None:
        from torch._dynamo.utils import counters

        record = {"unique_graphs": int(counters["stats"]["unique_graphs"])}
        Path(f"{self.prefix}.rank{dist_utils.get_rank()}.json").write_text(json.dumps(record))


class CountHostCopies(Callback):
    """Each rank appends a line to ``<folder>/copies<rank>`` for every full host copy of a network or optimizer
    state it builds (``full_state_dict``, ``full_optimizer_state_dict``: at saves and EMA snapshots) and for every
    checkpoint object it downloads from S3 (``S3Storage.download_file``), from the start of the run."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_app_begin(self) -> None:
        import fastgen.checkpoint.manager as manager
        import fastgen.distributed.parallelize as parallelize
        from fastgen.checkpoint.s3 import S3Storage

        out = self.folder / f"copies{dist_utils.get_rank()}"

        def counted(name: str, function: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with out.open("a") as handle:
                    handle.write(f"{name} {args[0] if name == 'download' else ''}\n")
                return function(*args, **kwargs)
            return wrapper

        for module in (manager, parallelize):
            for name in ("full_state_dict", "full_optimizer_state_dict"):
                if hasattr(module, name):
                    setattr(module, name, counted(name, getattr(module, name)))
        download = S3Storage.download_file
        S3Storage.download_file = lambda storage, location, path: counted("download", lambda *a: download(
            storage, location, path))(location)


class ExitStepLog(Callback):
    """Each rank appends ``iteration exit steps`` of a Self-Forcing student step to ``<prefix>.rank<r>``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        exits = getattr(model, "last_exit_steps", None)
        if exits is not None and "vsd_loss" in loss_dict:
            with open(f"{self.prefix}.rank{dist_utils.get_rank()}", "a") as handle:
                handle.write(f"{iteration} {' '.join(str(e) for e in exits)}\n")
