"""The training loop.

``Trainer(config).run()`` builds the method, its optimizers and data, restores the newest checkpoint when
``trainer.resume`` is set, and trains until ``trainer.max_iter`` optimizer steps have been taken in total
(restored steps included). Every lifecycle hook of ``fastgen.callbacks.callback`` fires in this order::

    on_app_begin
    on_model_init_start -> (build model) -> on_model_init_end
    on_optimizer_init_start -> (build optimizers, schedulers) -> on_optimizer_init_end
    on_load_checkpoint_start -> (restore newest checkpoint, if any) -> on_load_checkpoint_end
    on_dataloader_init_start -> (build data loaders, restore their position) -> on_dataloader_init_end
    on_train_begin
    repeat until iteration == max_iter:
        on_training_step_begin
        for each of the R accumulation rounds:
            on_training_accum_step_begin -> forward -> on_backward_begin -> backward -> on_training_accum_step_end
        on_optimizer_step_begin -> optimizer / scheduler steps (unless a callback skipped the step)
        iteration += 1
        on_training_step_end                                    (receives the completed-step count)
        if validation is due:  on_validation_begin,
                               (on_validation_step_begin, on_validation_step_end) x max_val_iter,
                               on_validation_end
        if a checkpoint is due: on_save_checkpoint_start -> (write) -> on_save_checkpoint_success
                               -> on_save_checkpoint_end
    on_train_end
    on_app_end                                                  (also after an exception)

Resume is exact: a checkpoint holds the model (EMA included), optimizers, schedulers, every random stream (per
rank), the data loaders' positions and each callback's ``state_dict``; it is written after validation, so a
run killed at any point and started again with the same command ends with bit-identical weights.

Gradient accumulation: ``R = trainer.batch_size_global / (per-rank batch * world size)``; each round's loss is
divided by ``R`` so the accumulated gradient is the mean over the global batch.

SIGTERM (a cluster pre-empting the job) or Ctrl-C stops training cleanly: the current step finishes, a
checkpoint is saved, and ``TrainingInterrupted`` is raised (exit code 128 + signal); a second Ctrl-C aborts at
once. Starting the same command again resumes exactly. Before the first step, either signal raises at once
(``StartUpInterrupted`` for SIGTERM) and the run directory the run made is removed.

Nothing here assumes one process: ranks, the device and all-reduces go through ``fastgen.distributed.group``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fastgen.callbacks.callback import Callback, CallbackDict
from fastgen.callbacks.loss_scale import LossScaleCallback
from fastgen.checkpoint.manager import CheckpointManager, TrainingState, load_pretrained, rebuild_frozen
from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import instantiate
from fastgen.distributed.launch import LAUNCHED_ENV
from fastgen.distributed import group as dist_utils
from fastgen.distributed.parallelize import apply_compile, parallelize, set_gradient_sync
from fastgen.utils.amp import autocast
from fastgen.utils.errors import (
    CheckpointError,
    ConfigError,
    FastGenRuntimeError,
    StartUpInterrupted,
    TrainingInterrupted,
    UsageError,
    one_line,
)
from fastgen.utils.logging import get_logger
from fastgen.utils.rng import seed_everything
from fastgen.utils.schedules import warn_on_schedule_length_mismatches

logger = get_logger(__name__)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _adapted(model: Any) -> bool:
    """Whether the method's trained network carries a LoRA adapter (``model.net_adapter``)."""
    from fastgen.utils.lora_utils import is_adapted

    return is_adapted(model.net)


@contextlib.contextmanager
def _compile_errors_named(mode: str | None) -> Any:
    """A ``torch.compile`` failure (raised at the first call of a compiled module) as one line naming the field."""
    if mode is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        from torch._dynamo.exc import TorchDynamoException

        if not isinstance(exc, TorchDynamoException):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FastGenRuntimeError(f"model.torch_compile_mode={mode}: torch.compile failed ({type(exc).__name__}: "
                                  f"{first[:300]}); set model.torch_compile_mode=null to train eagerly") from None


def _loss_scale_first(callbacks: CallbackDict, precision_amp: str | None) -> LossScaleCallback | None:
    """float16 autocast needs loss scaling: the configured ``LossScaleCallback`` or a default one, moved to the front
    (it unscales the gradients before any other callback reads them). Refused without float16."""
    scalers = [name for name, callback in callbacks.items() if isinstance(callback, LossScaleCallback)]
    if precision_amp != "float16":
        if scalers:
            raise ConfigError(f"trainer.callbacks.{scalers[0]}: loss scaling is for model.precision_amp=float16 "
                              f"(it is {precision_amp}); remove the callback")
        return None
    if len(scalers) > 1:
        raise ConfigError(f"trainer.callbacks: one loss scale callback, not {len(scalers)} ({', '.join(scalers)})")
    name = scalers[0] if scalers else "loss_scale"
    if not scalers:
        callbacks.add(name, LossScaleCallback())
    callbacks.move_to_front(name)
    return callbacks[name]


def _build_loader(node: Any, key: str) -> Any:
    """Instantiate a data loader config; a batch that does not fit the data set on this many ranks is a config
    error naming the key."""
    if node is None:
        return None
    try:
        return instantiate(node)
    except ValueError as exc:
        if "too small for batch_size" in str(exc):
            raise ConfigError(f"{key}: {exc}; lower {key}.batch_size") from None
        raise


class _SigtermOutsideTraining:
    """SIGTERM around a run, except its training loop (``Trainer._stop_on_signals`` handles it there). Senders: a
    scheduler, ``kill``, and torch's agent, which stops every rank still running once one has failed - often
    while that rank is cleaning up after the same error. Python's default ends the process on the spot, which
    would leave the run directory of a run that never started (and the corrected command would resume it):

    * during start-up it raises ``StartUpInterrupted``, so ``Trainer.run``'s clean-up removes that directory;
      if code that was running swallows the exception, ``started()`` raises it again;
    * while a run that never started cleans up, it is ignored: the process is on its way out already;
    * otherwise (a run that trained, on its way out) the previous handler gets it, as before.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.starting = True
        self.received: list[int] = []
        self.previous: Any = None  # the handler to restore; None: not installed (not the main thread)

    def __enter__(self) -> _SigtermOutsideTraining:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.previous = signal.SIG_DFL if previous is None else previous  # None: set outside Python
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def started(self) -> None:
        """Start-up is over; a SIGTERM it received but did not end with ends the run now."""
        self.starting = False
        if self.received:
            raise _start_up_interrupted(self.received[0])

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self.trainer.exception is None and self.starting:
            raise _start_up_interrupted(signum)
        if self.trainer.run_dir_is_unused():
            return
        signal.signal(signal.SIGTERM, self.previous)
        signal.raise_signal(signum)


def _start_up_interrupted(signum: int) -> StartUpInterrupted:
    return StartUpInterrupted(f"stopped by {signal.Signals(signum).name} during start-up, before the first step: "
                              "nothing was saved", signum)


def _log_modules(model: Any) -> None:
    """DEBUG: every network the method built - parameters, trainable, device, dtype."""
    if not logger.isEnabledFor(10):
        return
    for name, module in model.named_modules():
        if name.count(".") > (1 if name.startswith("ema_nets.") else 0) or not name or name == "ema_nets":
            continue
        params = list(module.parameters())
        if not params:
            continue
        trainable = sum(p.numel() for p in params if p.requires_grad)
        logger.debug("module %s: %s, %s parameters (%s trainable), %s, %s", name, type(module).__name__,
                     f"{sum(p.numel() for p in params):,}", f"{trainable:,}", params[0].device, params[0].dtype)


def _log_optimizers(model: Any) -> None:
    """DEBUG: each optimizer's type and parameter groups, and its scheduler."""
    if not logger.isEnabledFor(10):
        return
    for name, optimizer in model.optimizer_dict.items():
        groups = "; ".join(
            f"group {i}: {sum(p.numel() for p in g['params']):,} parameters, lr {g.get('lr')}"
            for i, g in enumerate(optimizer.param_groups))
        scheduler = model.scheduler_dict.get(name)
        logger.debug("optimizer %s: %s (%s)%s", name, type(optimizer).__name__, groups,
                     f", scheduler {type(scheduler).__name__}" if scheduler is not None else "")


class Trainer:
    def __init__(self, config: BaseConfig, extra_callbacks: dict[str, Callback] | None = None) -> None:
        self.config = config
        self.run_dir = Path(config.log_config.save_path)
        self.device = dist_utils.select_device(config.trainer.device)
        self.iteration = 0
        self.start_iteration = 0
        self.global_batch_size = 0
        self.accum_rounds = 1
        self.stepping: list[str] = []
        self.exception: BaseException | None = None
        self.last_checkpoint: str | None = None
        self._created_output_dir: Path | None = None  # set on rank 0 by prepare_run_dir
        self._run_lock: Any = None  # rank 0's RunLock, held from prepare_run_dir to the end of run
        self.last_sample_path: Path | None = None
        self.dataloader_train: Any = None
        self.dataloader_val: Any = None
        self._skip_reason: str | None = None
        self._stop_signal: int | None = None
        self._scalars: dict[str, Any] = {}
        log = config.log_config
        self.checkpoints = CheckpointManager(config.trainer.checkpointer, self.run_dir,
                                             sharded=bool(config.trainer.fsdp), seed=config.trainer.seed,
                                             run_prefix=f"{log.project}/{log.group}/{log.name or 'unnamed'}",
                                             credentials_dir=config.credentials_dir)
        self.checkpointer = self.checkpoints.files  # local naming and discovery (``path_for``...); None on S3
        self.callbacks = CallbackDict()
        for name, node in config.trainer.callbacks.items():
            try:
                callback = instantiate(node)
            except (ImportError, TypeError) as exc:
                raise ConfigError(f"trainer.callbacks.{name}: {exc}") from None
            self.callbacks.add(str(name), callback)
        for name, callback in (extra_callbacks or {}).items():
            self.callbacks.add(name, callback)
        self._loss_scale = _loss_scale_first(self.callbacks, config.model.precision_amp)
        self.callbacks.bind(config, self)
        for name, callback in self.callbacks.items():
            logger.debug("callback %s: %s.%s", name, type(callback).__module__, type(callback).__qualname__)

    def _autocast(self) -> Any:
        """``model.precision_amp``: the training and validation steps' autocast (a no-op context when off)."""
        return autocast(self.device.type, self.config.model.precision_amp)

    # ---- API for callbacks -------------------------------------------------------------------------------
    def skip_step(self, reason: str) -> None:
        """Ask the trainer not to apply this iteration's optimizer step (gradients are discarded)."""
        self._skip_reason = reason

    @property
    def step_skipped(self) -> bool:
        return self._skip_reason is not None

    def log_scalar(self, key: str, value: Any) -> None:
        """Report a scalar for the next logging window (the W&B callback picks these up)."""
        self._scalars[key] = value

    def pop_scalars(self) -> dict[str, Any]:
        scalars, self._scalars = self._scalars, {}
        return scalars

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self) -> Any:
        """Train; return the model. ``on_app_end`` runs even when training raises.

        Under a multi-rank launch the process group is joined first (``init_distributed``) and left at the end.
        Rank 0 decides whether this is a fresh run or a resume (and from which checkpoint) and tells the others;
        networks are built with the shared seed, so every rank starts from the same weights; data and noise
        streams then differ per rank (noise is keyed by each sample's global index, see ``bind_batch``).
        """
        cb = self.callbacks
        owns_group = not dist_utils.is_initialized()
        self.mesh = dist_utils.init_distributed(self.config.trainer)
        watch = dist_utils.FailureWatch(self._on_peer_failure).start()
        with _SigtermOutsideTraining(self) as sigterm:
            try:
                model = self._start(cb)
                sigterm.started()
                with self._stop_on_signals(), _compile_errors_named(self.config.model.torch_compile_mode):
                    self._train(model)
                self.checkpoints.wait()
                return model
            except BaseException as exc:
                self.exception = exc
                if dist_utils.get_world_size() > 1:
                    dist_utils.report_failure(one_line(exc), secondary=dist_utils.is_peer_failure(exc),
                                              exit_code=getattr(exc, "exit_code", 1))
                raise
            finally:
                self._finish_pending_save()
                watch.stop()
                cb.on_app_end()
                self._discard_unused_run_dir()
                self._unlock_run_dir()
                if owns_group:
                    dist_utils.teardown()

    def _start(self, cb: Any) -> Any:
        """Everything before the first step: the run directory, the models (fresh or from the checkpoint rank 0
        chose), optimizers, data, then ``config.yaml``; return the model."""
        self.prepare_run_dir()
        seed_everything(self.config.trainer.seed)
        cb.on_app_begin()
        resume_from = self._choose_checkpoint()
        cb.on_model_init_start()
        model = self._build_model(fresh=resume_from is None)
        cb.on_model_init_end(model)
        cb.on_optimizer_init_start(model)
        model.init_optimizers()
        _log_optimizers(model)
        warn_on_schedule_length_mismatches(model, self.config.trainer.max_iter)
        cb.on_optimizer_init_end(model)
        cb.on_load_checkpoint_start(model)
        checkpoint_path, payload = self._load_checkpoint(model, resume_from)
        cb.on_load_checkpoint_end(model, iteration=self.iteration, checkpoint_path=checkpoint_path)
        model.prepare_training_data()
        cb.on_dataloader_init_start(model)
        self._build_dataloaders()
        cb.on_dataloader_init_end(model, dataloader_train=self.dataloader_train, dataloader_val=self.dataloader_val)
        if payload is not None:
            self.checkpoints.restore_rank_state(payload, self._training_state(model))
        elif dist_utils.get_world_size() > 1:
            seed_everything(self.config.trainer.seed + dist_utils.get_rank())  # rank-local streams from here
        cb.on_train_begin(model, iteration=self.iteration)
        self._write_config_yaml()
        self._log_banner(model, checkpoint_path if payload is not None else None)
        return model

    def _log_banner(self, model: Any, checkpoint_path: str | None) -> None:
        """One block on rank 0 before the first step: where the run is, on what, how big, and where it started."""
        world = dist_utils.get_world_size()
        device = str(self.device)
        if self.device.type == "cuda":
            device += f" ({torch.cuda.get_device_name(self.device)})"
        trainable = set(getattr(model, "trainable_modules", {}))
        sizes = []
        for name, module in model.model_dict.items():
            count = sum(p.numel() for p in module.parameters())
            sizes.append(f"{name} {_count(count)}{'' if name in trainable else ' frozen'}")
        per_rank = int(getattr(self.dataloader_train, "batch_size", 0) or 0)
        batch = (f"global batch {self.global_batch_size} ({per_rank} per rank x {world} rank(s)"
                 + (f" x {self.accum_rounds} accumulation rounds" if self.accum_rounds > 1 else "") + ")")
        pretrained = self.config.trainer.checkpointer.pretrained_ckpt_path
        start = (f"resumed from {checkpoint_path} at iteration {self.iteration}" if checkpoint_path
                 else f"a fresh start from {pretrained}" if pretrained else "a fresh start")
        logger.info("run %s: %d rank(s) on %s; parameters %s; %s; %s; trainer.max_iter=%d", self.run_dir, world,
                    device + (" each" if world > 1 else ""), ", ".join(sizes), batch, start,
                    self.config.trainer.max_iter)

    def _on_peer_failure(self, message: str) -> None:
        """Another rank failed (``FailureWatch``) and this one is still running - most likely blocked in a
        collective that will never complete - so it ends at once with one line naming that rank. A run that had
        not finished its first iteration leaves no run directory (as in ``run``); checkpoints are kept."""
        if self.exception is None:
            self.exception = RuntimeError(message)
        self._discard_unused_run_dir()
        dist_utils.exit_on_peer_failure(message)

    def prepare_run_dir(self) -> None:
        """Create the run and checkpoint folders and prove they are writable (rank 0). ``config.yaml`` is written
        later, once start-up has succeeded (``_write_config_yaml``)."""
        from fastgen.utils.env import load_credentials
        from fastgen.utils.io import check_writable_dir, outermost_missing_folder

        load_credentials(self.config.credentials_dir)
        if dist_utils.is_rank0():
            self._created_output_dir = outermost_missing_folder(self.run_dir)
            check_writable_dir(self.run_dir)
            self._lock_run_dir()
            self.checkpoints.prepare()
            self.checkpoints.lock()
            logger.debug("run directory %s (%s); checkpoints in %s", self.run_dir.resolve(),
                         "new" if self._created_output_dir is not None else "exists", self.checkpoints.location)
        dist_utils.barrier()

    def _lock_run_dir(self) -> None:
        """Rank 0 takes the run directory's lock before anything is written there (``fastgen.checkpoint.run_lock``). A
        run refused because another holds it never removes the directory: it is the other run's, even when both
        started at once and each believed it was creating it."""
        from fastgen.checkpoint.run_lock import RunDirectoryBusy, RunLock

        lock = RunLock(self.run_dir)
        try:
            lock.acquire()
        except RunDirectoryBusy:
            self._created_output_dir = None
            raise
        self._run_lock = lock

    def _unlock_run_dir(self) -> None:
        """Rank 0, at the end of the run (after a directory of a run that never started is gone, if it went)."""
        self.checkpoints.unlock()
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _write_config_yaml(self) -> None:
        """Write the resolved ``config.yaml`` (secrets redacted) once start-up has succeeded: a run that fails to
        start - a resume whose checkpoint does not load, a W&B login that fails - leaves the existing run's
        ``config.yaml`` as it was."""
        if dist_utils.is_rank0():
            from fastgen.configs.config_utils import save_config_yaml

            save_config_yaml(self.config, self.run_dir / "config.yaml")

    def _discard_unused_run_dir(self) -> None:
        """A run that fails before its first iteration - bad input, a failed W&B login, Ctrl-C during start-up,
        any exception - leaves no run directory behind, if this call created it: its half-made folders would
        describe a run that never happened, and the corrected command would "resume" it. The project and group
        folders this call created for it go too, so a typo leaves no empty folders in the output root. A run
        directory that existed before (a resume) is never removed."""
        if not self.run_dir_is_unused():
            return
        import shutil

        shutil.rmtree(self._created_output_dir, ignore_errors=True)  # type: ignore[arg-type]

    def run_dir_is_unused(self) -> bool:
        """This run made the run directory and failed before its first iteration: the directory goes."""
        return (self._created_output_dir is not None and self.exception is not None
                and self.iteration == self.start_iteration == 0 and self.last_checkpoint is None)

    @contextlib.contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """While training, SIGTERM and SIGINT ask for a clean stop at the end of the current step."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, frame: Any) -> None:
            if self._stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            self._stop_signal = signum
            name = signal.Signals(signum).name
            if signum == signal.SIGTERM and os.environ.get(LAUNCHED_ENV) == "1":
                # torchrun's agent passes a Ctrl-C (or a scheduler's SIGTERM) on to its workers as SIGTERM
                name = "SIGTERM from the launcher (Ctrl-C, or the job being stopped)"
            logger.warning("received %s: stopping after this step and saving a checkpoint", name)

        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _adopt_data_latent_shape(self) -> None:
        """A latent model (a diffusers-backed network) trained on ``encode-data`` shards samples at the shards'
        latent shape (their ``index.json``), not the recipe's default; ``config.yaml`` records it. A multimodal one
        (``model.modality_shapes``) takes each modality's from the member its loader reads it from (``real.video``:
        ``latent.npy``, ``real.audio``: ``audio_latent.npy``)."""
        from fastgen.datasets.encode import member_shapes_of
        from fastgen.networks.diffusers_nets import diffusers_backbone_class

        model_config = self.config.model
        loader = self.config.dataloader_train
        if diffusers_backbone_class(model_config.net) is None or loader is None:
            return
        recorded = member_shapes_of(getattr(loader, "datatags", None))
        modalities = getattr(model_config, "modality_shapes", None)
        if modalities:
            fields = dict(getattr(loader, "fields", None) or {})
            found = {key.removeprefix("real."): recorded[member] for key, member in fields.items()
                     if key.startswith("real.") and member in recorded}
            if set(found) == set(modalities) and any(list(modalities[k]) != v for k, v in found.items()):
                logger.info("model.modality_shapes: %s, the shapes in the training data (the config said %s)", found,
                            {k: list(v) for k, v in modalities.items()})
                model_config.modality_shapes = found
                model_config.input_shape = found.get("video", list(model_config.input_shape))
            return
        shape = recorded.get("latent.npy")
        if shape is not None and list(model_config.input_shape) != shape:
            logger.info("model.input_shape: %s, the latents' shape in the training data (the config said %s)", shape,
                        list(model_config.input_shape))
            model_config.input_shape = shape

    def _build_model(self, fresh: bool) -> Any:
        """Build the method with the shared seed; on a fresh run load its initial weights (teacher, student init,
        ``pretrained_ckpt_path``) while the networks are still whole; then replicate or shard them
        (``fastgen.distributed.parallelize``). With ``model.meta_init`` see ``_build_on_meta``."""
        self._adopt_data_latent_shape()
        if self.config.model.meta_init:
            model = self._build_on_meta(fresh)
        else:
            model = instantiate(self.config.model_class, config=self.config.model)
            model.to(self.device)
            self._init_weights(model, fresh)
            parallelize(model, self.config.trainer, self.mesh)
        apply_compile(model)
        model.train()
        for ema in getattr(model, "ema_nets", {}).values():
            ema.eval()
        _log_modules(model)
        return model

    def _build_on_meta(self, fresh: bool) -> Any:
        """``model.meta_init``: every rank builds the networks on the meta device (shapes, no memory) and shards
        them there (FSDP) before any storage exists; then each rank allocates only its shards (``to_empty``).
        Rank 0 alone builds the method for real on the host - with the shared seed, and on a fresh run its
        teacher, student initialisation and ``pretrained_ckpt_path`` - and its weights are broadcast into every
        rank's shards (``set_model_state_dict(..., broadcast_from_rank0=True)``). So a multi-rank run holds one
        full copy of the weights on the host, rank 0's, instead of one per rank. Replicated (DDP) networks are
        allocated whole and replicated after the weights arrive. On a resume the real build skips the initial
        weights (the checkpoint then overwrites every network it holds)."""
        from fastgen.distributed.parallelize import broadcast_full_weights

        with torch.device("meta"):
            model = instantiate(self.config.model_class, config=self.config.model)
        sharded_first = bool(self.config.trainer.fsdp)
        if sharded_first:
            parallelize(model, self.config.trainer, self.mesh)
        model.to_empty(device=self.device)
        source = None
        if dist_utils.is_rank0():
            with dist_utils.local_only():  # the real build is rank 0's alone: no collectives inside it
                seed_everything(self.config.trainer.seed)
                source = instantiate(self.config.model_class, config=self.config.model)
                self._init_weights(source, fresh)
        broadcast_full_weights(model, source)
        del source
        if not sharded_first:
            parallelize(model, self.config.trainer, self.mesh)
        return model

    def _init_weights(self, model: Any, fresh: bool) -> None:
        """A fresh run's initial weights; on a resume only what checkpoints leave out, rebuilt from its source:
        the frozen networks (a teacher; the checkpoint's fingerprint then checks it) and a LoRA base."""
        if fresh or _adapted(model):  # a LoRA base is never in the checkpoint: rebuilt from its source
            model.init_weights()
            self._load_pretrained(model)
        elif getattr(model, "rebuilt_modules", None):
            rebuild_frozen(model, self.config.trainer.checkpointer.pretrained_ckpt_path, self.config.credentials_dir)

    def _load_pretrained(self, model: Any) -> None:
        path = self.config.trainer.checkpointer.pretrained_ckpt_path
        if path:
            load_pretrained(model, path, self.config.credentials_dir)
            logger.info("initialised weights from %s", path)

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def _choose_checkpoint(self) -> str | None:
        """The checkpoint to resume from (``None``: a fresh run). Rank 0 looks and every rank gets its answer, so
        all ranks resume from the same file even while another run writes into the folder. A listing that fails
        (an unreachable bucket) raises: a run never starts fresh because it could not see its checkpoints."""
        choice: str | None = None
        if dist_utils.is_rank0():
            existing = self.checkpoints.list()
            if not self.config.trainer.resume and existing:
                raise UsageError(
                    f"trainer.resume=False, but {self.checkpoints.location} already holds another run's checkpoints "
                    f"(newest {Path(existing[-1][1]).name}): a run directory holds one run, so give this one its "
                    "own log_config.name, or resume that run with trainer.resume=True")
            latest = self.checkpoints.latest(existing) if existing else None
            if existing and latest is None:  # never start over because no checkpoint could be read
                raise CheckpointError(
                    f"every checkpoint in {self.checkpoints.location} is corrupt or truncated (newest "
                    f"{Path(existing[-1][1]).name}): restore one, or start a new run (a new log_config.name)")
            if latest is None:
                logger.debug("no valid checkpoint in %s: starting fresh", self.checkpoints.location)
            else:
                logger.debug("resuming from %s: the newest of %d valid checkpoint(s) in %s", Path(latest).name,
                             len(existing), self.checkpoints.location)
            choice = latest
        chosen = dist_utils.broadcast_object(choice)
        return None if chosen is None else str(chosen)

    def _load_checkpoint(self, model: Any, latest: str | None) -> tuple[str | None, dict[str, Any] | None]:
        if latest is not None:
            payload = self.checkpoints.load(latest, self._training_state(model))
            self.iteration = self.start_iteration = int(payload["iteration"])
            logger.info("resumed from %s (iteration %d)", latest, self.iteration)
            return str(latest), payload
        path = self.config.trainer.checkpointer.pretrained_ckpt_path
        return (path or None), None

    def _training_state(self, model: Any) -> TrainingState:
        return TrainingState(model=model, callbacks=self.callbacks, iteration=self.iteration,
                             loaders={"train": self.dataloader_train, "val": self.dataloader_val})

    def save_checkpoint(self, model: Any) -> Path:
        cb = self.callbacks
        cb.on_save_checkpoint_start(model, iteration=self.iteration)
        path = self.checkpoints.save(self._training_state(model))
        self.last_checkpoint = path
        if dist_utils.is_rank0():
            logger.info("%s checkpoint %s", "saving" if self.checkpoints.async_save else "saved", path)
        cb.on_save_checkpoint_success(model, iteration=self.iteration, checkpoint_path=str(path))
        cb.on_save_checkpoint_end(model, iteration=self.iteration)
        return path

    def _finish_pending_save(self) -> None:
        """After a failure, an asynchronous save still in flight: one process lets it complete (its marker then
        makes it the newest valid checkpoint); ranks of a failed multi-rank job abandon it - finishing it needs
        every rank - so the previous checkpoint stays the newest valid one. Its own failure is logged, not raised
        over the first error."""
        if dist_utils.get_world_size() > 1:
            self.checkpoints.abandon()
            return
        try:
            self.checkpoints.wait()
        except Exception as exc:  # noqa: BLE001
            logger.error("%s", exc)

    # ---- data --------------------------------------------------------------------------------------------------
    def _build_dataloaders(self) -> None:
        self.dataloader_train = _build_loader(self.config.dataloader_train, "dataloader_train")
        self.dataloader_val = _build_loader(self.config.dataloader_val, "dataloader_val")
        per_rank = int(getattr(self.dataloader_train, "batch_size", 0) or 0)
        world = dist_utils.get_world_size()
        target = self.config.trainer.batch_size_global
        if target is None or per_rank == 0:
            self.accum_rounds = 1
            self.global_batch_size = per_rank * world
        else:
            if target % (per_rank * world) != 0:
                raise ConfigError(
                    f"trainer.batch_size_global={target} is not a multiple of per-rank batch {per_rank} x "
                    f"{world} rank(s); set it to a multiple of {per_rank * world} or change dataloader_train.batch_size"
                )
            self.accum_rounds = target // (per_rank * world)
            self.global_batch_size = target

    # ---- the loop ----------------------------------------------------------------------------------------------
    def _train(self, model: Any) -> None:
        cfg = self.config.trainer
        cb = self.callbacks
        if self.iteration >= cfg.max_iter:
            logger.info("nothing to do: the run already has %d of trainer.max_iter=%d iterations",
                        self.iteration, cfg.max_iter)
        rounds = self.accum_rounds
        device = self.device
        loader = self.dataloader_train
        optimizers = model.optimizer_dict
        schedulers = model.scheduler_dict
        window_start, window_iter = time.perf_counter(), self.iteration
        distributed = dist_utils.get_world_size() > 1
        while self.iteration < cfg.max_iter:
            iteration = self.iteration
            cb.on_training_step_begin(model, iteration=iteration)
            self.stepping = model.get_optimizers(iteration)
            loss_sums: dict[str, torch.Tensor] | None = {} if rounds > 1 else None
            for accum_iter in range(rounds):
                if distributed:  # reduce gradients once per step, of the modules that step
                    set_gradient_sync(model, self.stepping, final_round=accum_iter == rounds - 1)
                data = model.encode_batch(_to_device(next(loader), device))
                cb.on_training_accum_step_begin(model, data, iteration=iteration, accum_iter=accum_iter)
                with model.bind_batch(data, iteration, seed=cfg.seed), self._autocast():
                    loss_dict, outputs = model.single_train_step(data, iteration)
                cb.on_backward_begin(model, data, outputs, loss_dict, iteration=iteration, accum_iter=accum_iter)
                loss = loss_dict["total_loss"]
                if self._loss_scale is not None:
                    loss = self._loss_scale.scale_loss(loss)
                (loss / rounds if rounds > 1 else loss).backward()
                cb.on_training_accum_step_end(model, data, outputs, loss_dict, iteration=iteration, accum_iter=accum_iter)
                if loss_sums is not None:
                    for key, value in loss_dict.items():
                        if isinstance(value, torch.Tensor) and value.numel() == 1:
                            value = value.detach()
                            loss_sums[key] = loss_sums[key] + value if key in loss_sums else value
            if loss_sums is not None:
                loss_dict = {key: value / rounds for key, value in loss_sums.items()}
            self._skip_reason = None
            cb.on_optimizer_step_begin(model, iteration=iteration)
            if self._skip_reason is None:
                for name in self.stepping:
                    optimizers[name].step()
                    if name in schedulers:
                        schedulers[name].step()
            for optimizer in optimizers.values():
                optimizer.zero_grad(set_to_none=True)
            self.iteration = iteration + 1
            cb.on_training_step_end(model, data, outputs, loss_dict, iteration=self.iteration)
            if self.iteration % cfg.logging_iter == 0 or self.iteration == cfg.max_iter:
                now = time.perf_counter()
                rate = (self.iteration - window_iter) / max(now - window_start, 1e-9)
                loss_value = float(dist_utils.all_reduce_mean(loss_dict["total_loss"].detach().float().clone()))
                if not math.isfinite(loss_value):
                    logger.warning("iteration %d: total_loss is %s", self.iteration, loss_value)
                logger.info("iteration %d/%d  loss %.4f  %.1f it/s  %.0f samples/s", self.iteration, cfg.max_iter,
                            loss_value, rate, rate * self.global_batch_size)
                window_start, window_iter = now, self.iteration
            if cfg.validation_iter and self.dataloader_val is not None and self.iteration % cfg.validation_iter == 0:
                self.validate(model)
            saved = self.iteration % cfg.save_ckpt_iter == 0 or self.iteration == cfg.max_iter
            if saved:
                self.save_checkpoint(model)
            stop = self._stop_signal is not None
            if distributed:  # every rank stops at the same step, also when the signal reached only some
                stop = dist_utils.any_rank(stop)
                if stop and self._stop_signal is None:
                    self._stop_signal = signal.SIGTERM
            if stop and self.iteration < cfg.max_iter:
                if not saved:
                    self.save_checkpoint(model)
                self.checkpoints.wait()
                name = signal.Signals(self._stop_signal).name
                raise TrainingInterrupted(
                    f"stopped by {name} at iteration {self.iteration}; checkpoint saved to {self.last_checkpoint} "
                    "- run the same command again to resume",
                    self._stop_signal,
                )
        cb.on_train_end(model, iteration=self.iteration)

    @torch.no_grad()
    def validate(self, model: Any) -> dict[str, float]:
        """Run ``max_val_iter`` validation batches with every network in eval mode; return mean losses."""
        cb = self.callbacks
        cb.on_validation_begin(model, iteration=self.iteration)
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        steps = self.config.trainer.max_val_iter
        try:
            for _ in range(steps):
                data = model.encode_batch(_to_device(next(self.dataloader_val), self.device))
                cb.on_validation_step_begin(model, data, iteration=self.iteration)
                with model.bind_batch(data, self.iteration, seed=self.config.trainer.seed, stream="val"), self._autocast():
                    loss_dict = model.validation_step(data, self.iteration)
                cb.on_validation_step_end(model, data, {}, loss_dict, iteration=self.iteration)
                for key, value in loss_dict.items():
                    value = value.detach().float()
                    sums[key] = sums[key] + value if key in sums else value
        finally:
            model.train()
            for ema in getattr(model, "ema_nets", {}).values():
                ema.eval()
        means = {}
        for key in sorted(sums):
            means[key] = float(dist_utils.all_reduce_mean(sums[key] / steps))
        logger.info("validation at iteration %d: %s", self.iteration,
                    "  ".join(f"{k} {v:.4f}" for k, v in means.items()))
        cb.on_validation_end(model, loss_dict=means, iteration=self.iteration)
        return means


def _count(number: int) -> str:
    """``1234567`` -> ``"1.2M"``."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if number >= size:
            return f"{number / size:.1f}{unit}"
    return str(number)
