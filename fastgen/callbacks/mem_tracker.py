"""MemTrackerCallback: record what uses the memory during a window of iterations, and write an HTML report.

From the ``on_training_step_begin`` of iteration ``start_iter`` until ``num_iters`` steps later (or the end of
training, or a crash), each rank records every allocation and free of its device:

* on CUDA, the caching allocator's memory history (``torch.cuda.memory._record_memory_history``; at the end
  ``_dump_snapshot`` writes the pickle PyTorch's own viewer opens);
* on CPU, the profiler's memory events (``torch.profiler.profile(profile_memory=True, record_shapes=True,
  with_stack=True)``) - so the whole path runs and is tested without a GPU.

At the trainer's hooks it notes the phase that begins (``data`` at ``on_training_step_begin``; ``forward`` at
``on_training_accum_step_begin``; ``backward`` at ``on_backward_begin``; at ``on_training_accum_step_end``
``data`` for the next accumulation round, or ``optimizer`` after the last one - the optimizer phase goes on
through ``on_optimizer_step_begin``, the step and ``zero_grad``; ``callbacks`` at ``on_training_step_end``,
which runs until the next step and includes validation and checkpoints). Phase boundaries fall where this
callback runs in each hook, so put it first in ``trainer.callbacks`` (``fastgen profile-memory`` does). It also
notes the storages of the tensors whose role is known: the model's parameters and buffers, their gradients and
the optimizer state (at the start, before the optimizer step and after it). ``fastgen.profiling.analysis`` uses those to put each block in a category.

When the window closes, each rank saves its snapshot beside the report - ``<stem>_rank<r>.json.gz`` (format:
``fastgen.profiling.snapshot``) and, on CUDA, ``<stem>_rank<r>.pickle`` - and rank 0 renders the report
(``<stem>.html``, default ``<run dir>/memory/memory_report.html``) with one tab per rank, after a barrier, from
the snapshots found beside it (ranks on other hosts without a shared file system are listed as missing).

Logged keys: none - it writes files (snapshot and report), and logs their paths.

If training raises inside the window (an out-of-memory error included), ``on_app_end`` still stops the recording,
marks the crash on the timeline and writes the snapshot and a report - every rank its own (rank 0:
``<stem>.html``; rank r: ``<stem>_rank<r>.html``), since the other ranks may never reach a barrier. A crash
outside the window leaves nothing: put the window where the crash happens (usually the first iterations).

The report shows the estimate of ``fastgen dryrun`` (parameters, gradients and optimizer state on the meta device)
beside the measured peak; turn it off with ``estimate=False``. Nothing is kept in checkpoints: a resumed run
past the window records nothing. Recording costs time (the profiler's Python tracing on CPU): keep the window
short.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class MemTrackerCallback(Callback):
    def __init__(self, start_iter: int = 0, num_iters: int = 2, output: str | None = None, estimate: bool = True,
                 max_entries: int = 1_000_000) -> None:
        if int(start_iter) < 0 or int(num_iters) < 1:
            raise ValueError(f"MemTrackerCallback(start_iter={start_iter}, num_iters={num_iters}): "
                             "start_iter must be >= 0 and num_iters >= 1")
        self.start_iter = int(start_iter)
        self.num_iters = int(num_iters)
        self.output = output
        self.estimate = bool(estimate)
        self.max_entries = int(max_entries)
        self.report_path: Path | None = None
        self.snapshot_path: Path | None = None
        self.raw_path: Path | None = None
        self.finished = False
        self._recorder: Any = None
        self._model: Any = None
        self._device = torch.device("cpu")
        self._markers: list[list[Any]] = []  # [t_ns (Unix), phase, iteration, accum]
        self._roles: list[list[Any]] = []  # [marker index, role, ptr, nbytes]
        self._iteration = 0
        self._started_unix = 0.0
        self._config_summary: dict[str, str] = {}
        self._config_yaml: str | None = None
        self._estimate: dict[str, Any] | None = None
        self._notes: list[str] = []

    @property
    def end_iter(self) -> int:
        return self.start_iter + self.num_iters

    @property
    def active(self) -> bool:
        return self._recorder is not None

    # ---- paths ---------------------------------------------------------------------------------------------
    def report_file(self) -> Path:
        if self.output:
            path = Path(self.output)
            return path if path.suffix == ".html" else path.with_suffix(".html")
        return Path(self.trainer.run_dir) / "memory" / "memory_report.html"

    def snapshot_file(self, rank: int) -> Path:
        report = self.report_file()
        return report.with_name(f"{report.stem}_rank{rank}.json.gz")

    # ---- hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        self._model = model
        self._device = torch.device(self.trainer.device)
        self.finished = False
        if iteration >= self.end_iter:
            logger.info("memory tracker: the window (iterations %d-%d) is already past; nothing will be recorded",
                        self.start_iter, self.end_iter - 1)
            self.finished = True
            return
        self._notes = []
        try:
            self._config_summary, self._config_yaml = _summarise_config(self.config, self._device)
        except Exception as exc:  # noqa: BLE001 - a config without the usual fields: report without its summary
            self._config_summary, self._config_yaml = {}, None
            self._notes.append(f"no config summary ({type(exc).__name__}: {exc})")
        if self.estimate:
            try:
                from fastgen.profiling.plan import estimate_memory

                # Building the model, even on the meta device, must not move the random streams of the run.
                with torch.random.fork_rng(devices=[]):
                    self._estimate = estimate_memory(self.config, world_size=dist_utils.get_world_size())
            except Exception as exc:  # noqa: BLE001 - an estimate is a nice-to-have; never fail training for it
                self._estimate = None
                self._notes.append(f"no estimate: building the model on the meta device failed ({type(exc).__name__}: {exc})")
                logger.warning("memory tracker: no estimate (%s: %s)", type(exc).__name__, exc)

    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        if self.active and iteration >= self.end_iter:
            self._finish()
        if not self.active and not self.finished and self.start_iter <= iteration < self.end_iter:
            self._begin(model)
        if self.active:
            self._iteration = iteration
            self._mark("data", iteration, 0, roles=("parameters", "gradients", "optimizer_state"))

    def on_training_accum_step_begin(self, model: Any, data_batch: dict, iteration: int = 0, accum_iter: int = 0) -> None:
        if self.active:
            self._mark("forward", iteration, accum_iter)

    def on_backward_begin(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0,
                          accum_iter: int = 0) -> None:
        if self.active:
            self._mark("backward", iteration, accum_iter)

    def on_training_accum_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                                   iteration: int = 0, accum_iter: int = 0) -> None:
        if self.active:  # next: the next round's batch, or (after the last round) the optimizer step
            last = accum_iter + 1 >= int(getattr(self.trainer, "accum_rounds", 1) or 1)
            self._mark("optimizer" if last else "data", iteration, 0 if last else accum_iter + 1)

    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None:
        if self.active:
            self._mark("optimizer", iteration, 0, roles=("parameters", "gradients", "optimizer_state"))

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        if self.active:  # ``iteration`` counts completed steps: this step was iteration - 1
            self._mark("callbacks", iteration - 1, 0, roles=("parameters", "optimizer_state"))

    def on_train_end(self, model: Any, iteration: int = 0) -> None:
        if self.active:
            self._finish()
        elif not self.finished:
            logger.warning("memory tracker: training stopped at iteration %d, before the window began (iteration %d); "
                           "nothing was recorded", iteration, self.start_iter)

    def on_app_end(self) -> None:
        if not self.active:
            return
        exc = getattr(self.trainer, "exception", None)
        try:
            self._finish(crash=exc, collective=False)
        except Exception as error:  # noqa: BLE001 - never hide the exception that ended training
            logger.error("memory tracker: could not write the report after the crash (%s: %s)",
                         type(error).__name__, error, extra={"all_ranks": True})

    # ---- recording -----------------------------------------------------------------------------------------
    def _begin(self, model: Any) -> None:
        from fastgen.profiling.capture import CpuRecorder, CudaRecorder

        self._model = model
        self._markers, self._roles = [], []
        self._started_unix = time.time()
        if self._device.type == "cuda":
            recorder: Any = CudaRecorder(self._device, self.max_entries)
        else:
            recorder = CpuRecorder()
        try:
            recorder.start()
        except Exception as exc:  # noqa: BLE001 - e.g. another profiler is running: train on, say why
            logger.warning("memory tracker: cannot start recording (%s: %s); no memory report for this run",
                           type(exc).__name__, exc)
            self.finished = True
            return
        self._recorder = recorder
        logger.info("memory tracker: recording iterations %d-%d on %s", self.start_iter, self.end_iter - 1, self._device)

    def _mark(self, phase: str, iteration: int, accum: int, roles: tuple[str, ...] = ()) -> None:
        index = len(self._markers)
        self._markers.append([time.time_ns(), phase, int(iteration), int(accum)])
        self._recorder.mark(index)
        if roles:
            self._record_roles(index, roles)

    def _record_roles(self, index: int, roles: tuple[str, ...]) -> None:
        model = self._model
        seen: set[tuple[str, int]] = set()

        def add(role: str, tensor: Any) -> None:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != self._device.type:
                return
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor: this rank's shard
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return
            ptr = int(storage.data_ptr())
            if ptr and (role, ptr) not in seen:
                seen.add((role, ptr))
                self._roles.append([index, role, ptr, int(storage.nbytes())])

        if "parameters" in roles:
            for p in model.parameters():
                add("parameters", p)
            for b in model.buffers():
                add("parameters", b)
        if "gradients" in roles:
            for p in model.parameters():
                if p.grad is not None:
                    add("gradients", p.grad)
        if "optimizer_state" in roles:
            for optimizer in getattr(model, "optimizer_dict", {}).values():
                for state in optimizer.state.values():
                    for value in state.values():
                        add("optimizer_state", value)

    def _finish(self, crash: BaseException | None = None, collective: bool = True) -> None:
        """Stop recording, save this rank's snapshot and render the report. ``collective=False`` (after an
        exception): no barrier, each rank renders its own report. A failure to write is logged, never raised
        into the training loop (a long run must not die for its memory report); every rank still reaches the
        barrier before rank 0 renders."""
        crashed = crash is not None or not collective
        rank, world = dist_utils.get_rank(), dist_utils.get_world_size()
        try:
            self._save(crash)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if crashed:
                raise
            logger.error("memory tracker: could not save the snapshot (%s: %s)", type(exc).__name__, exc,
                         extra={"all_ranks": True})
        finally:
            self._recorder = None
            self.finished = True
        try:
            self._render(rank, world, crashed=crashed)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if crashed:
                raise
            logger.error("memory tracker: could not write the report (%s: %s)", type(exc).__name__, exc)

    def _save(self, crash: BaseException | None) -> None:
        from fastgen.profiling.snapshot import UNKNOWN_SITE, new_snapshot, save_snapshot, snapshot_from_cuda

        recorder = self._recorder
        rank, world = dist_utils.get_rank(), dist_utils.get_world_size()
        if crash is not None:
            oom = isinstance(crash, torch.cuda.OutOfMemoryError) or "out of memory" in str(crash).lower()
            self._mark("oom" if oom else "crash", self._iteration, 0)
        else:
            self._mark("end", self._iteration, 0)
        snapshot_path = self.snapshot_file(rank)
        snapshot = new_snapshot(backend=recorder.backend, device=str(self._device), rank=rank, world_size=world)
        snapshot["window"] = {"start_iter": self.start_iter, "end_iter": min(self._iteration + 1, self.end_iter)}
        snapshot["config"] = dict(self._config_summary)
        snapshot["config_yaml"] = self._config_yaml
        snapshot["estimate"] = self._estimate
        snapshot["notes"] = list(self._notes)
        if crash is not None:
            snapshot["crash"] = {"type": type(crash).__name__, "message": str(crash)[:2000], "iteration": self._iteration,
                                 "oom": self._markers[-1][1] == "oom"}
        if recorder.backend == "cpu_profiler":
            events, sites, marks = recorder.stop()
            self._recorder = None
            for i, t in marks.items():  # the profiler's own time of each hook: one clock for everything
                if i < len(self._markers):
                    self._markers[i][0] = t
            t0 = min([m[0] for m in self._markers] + [e[0] for e in events[:1]])
            snapshot["t0_ns"] = t0
            snapshot["events"] = [[e[0] - t0, e[1], e[2], e[3]] for e in events]
            snapshot["sites"] = sites
            snapshot["markers"] = [[m[0] - t0, m[1], m[2], m[3]] for m in self._markers]
            snapshot["roles"] = [[self._markers[i][0] - t0, role, ptr, n] for i, role, ptr, n in self._roles]
            first = {(ptr, n) for i, _, ptr, n in self._roles if i == 0}
            snapshot["initial"] = [[ptr, n, UNKNOWN_SITE] for ptr, n in sorted(first)]
            snapshot["notes"].append("CPU: memory allocated before the window is counted only when it is a parameter, "
                                     "buffer, gradient or optimizer state (the profiler sees no other earlier blocks).")
        else:
            raw_path = snapshot_path.with_name(snapshot_path.name.replace(".json.gz", ".pickle"))
            t0 = self._markers[0][0]
            snapshot["t0_ns"] = t0
            snapshot["markers"] = [[m[0] - t0, m[1], m[2], m[3]] for m in self._markers]
            snapshot["roles"] = [[self._markers[i][0] - t0, role, ptr, n] for i, role, ptr, n in self._roles]
            snapshot["raw"] = raw_path.name
            raw = recorder.stop(raw_path)
            self._recorder = None
            self.raw_path = raw_path
            index = self._device.index if self._device.index is not None else torch.cuda.current_device()
            snapshot = snapshot_from_cuda(raw, base=snapshot, device_index=index, raw_name=raw_path.name)
        save_snapshot(snapshot, snapshot_path)
        self.snapshot_path = snapshot_path

    def _render(self, rank: int, world: int, crashed: bool) -> None:
        from fastgen.profiling.report import write_report
        from fastgen.profiling.snapshot import load_snapshot

        report = self.report_file()
        if crashed:  # no collectives after a crash: each rank reports what it can see
            target = report if rank == 0 else report.with_name(f"{report.stem}_rank{rank}.html")
            ranks = range(world) if rank == 0 else [rank]
        else:
            if world > 1:
                dist_utils.barrier()
            if rank != 0:
                return
            target, ranks = report, range(world)
        snapshots, sources, missing = [], [], []
        for r in ranks:
            path = self.snapshot_file(r)
            if path.is_file():
                snap = load_snapshot(path)
                if snap.get("created_unix", 0) >= self._started_unix - 1 or r == rank:  # this run's, not a stale one
                    snapshots.append(snap)
                    sources.append(path.name)
                    continue
            missing.append(r)
        if not snapshots:
            logger.error("memory tracker: no snapshot to render into %s", target)
            return
        if missing:
            snapshots[0].setdefault("notes", []).append(
                f"no snapshot from rank(s) {', '.join(map(str, missing))} beside the report (another host, or it crashed "
                "before writing one)")
        write_report(snapshots, target, sources)
        self.report_path = target
        logger.info("memory report: %s", target, extra={"all_ranks": crashed})


def _summarise_config(config: Any, device: torch.device) -> tuple[dict[str, str], str | None]:
    """A few lines that identify the run in the report, and the full config as YAML (secrets redacted)."""
    from fastgen.configs.config_utils import config_to_yaml

    def target(node: Any) -> str:
        return str(node.get("_target_", "")) if node is not None and hasattr(node, "get") else ""

    model = config.model
    loader = config.dataloader_train
    optimizer = model.net_optimizer
    summary = {
        "run": f"{config.log_config.project}/{config.log_config.group}/{config.log_config.name}",
        "method": target(config.model_class),
        "network": target(model.net),
        "precision": str(model.precision),
        "batch size per rank": str(loader.get("batch_size", "") if loader is not None else ""),
        "global batch": str(config.trainer.batch_size_global),
        "optimizer": f"{target(optimizer)} (lr {optimizer.get('lr', '')})" if optimizer is not None else "",
        "EMA": str(model.use_ema),
        "device": str(device),
        "world size": str(dist_utils.get_world_size()),
        "DDP / FSDP": f"{config.trainer.ddp} / {config.trainer.fsdp}",
        "callbacks": ", ".join(str(k) for k in config.trainer.callbacks.keys()),
        "torch": torch.__version__,
    }
    try:
        yaml_text: str | None = config_to_yaml(config)
    except Exception:  # noqa: BLE001 - the summary above is enough
        yaml_text = None
    return summary, yaml_text
