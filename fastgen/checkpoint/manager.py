"""The checkpoint manager: what a training run saves, in which format, and how it comes back.

The trainer hands it a ``TrainingState`` (the method, its callbacks and data loaders, the iteration) and calls
``save`` / ``load``; the manager builds every payload. Two formats share one folder and one naming rule
(``fastgen.checkpoint.checkpointer`` finds them):

**Monolithic** (one process, DDP): ``{iteration:07d}.pth``, the full state in one ``torch.save``. Rank 0 gathers
full tensors on the host (``full_state_dict`` / ``full_optimizer_state_dict``: CPU offload, keyed by parameter
name) and writes the file atomically (temporary name, rename), so a file with the final name is complete.

**Sharded** (``trainer.fsdp``): a ``{iteration:07d}.dcp/`` folder written by every rank through
``torch.distributed.checkpoint`` (each rank writes its own shards of every saved network - EMA and fake score
included - and of every optimizer state; no rank ever holds a full network), plus the marker
``{iteration:07d}.pth``, a small file that rank 0 writes only after every rank's shards and DCP's metadata are
written. The marker holds what is not sharded: schedulers, and the state of *each* rank (random streams, data
loader positions, rank-local callback state).

**Frozen networks** (a distillation's teacher) are in neither format: both record their fingerprints
(``frozen_fingerprints``) and every start rebuilds them from their source (``rebuild_frozen``); a resume refuses
one that differs from the fingerprint.

**Validity.** A checkpoint is valid when its ``.pth`` exists; a ``.dcp`` folder without its marker (a crash
during a save) is ignored and removed by the next save. The newest valid checkpoint is resumed.
``keep_last_n`` deletes older markers and their folders, never the one being written. A rank that fails to save
makes every rank fail the save (DCP gathers each rank's result; a monolithic write's outcome is all-reduced), so
no rank waits at a barrier for a rank that is gone.

**Async saves** (``trainer.checkpointer.async_save``): the state is copied to the host (sharded: DCP's staging
into host buffers kept from one save to the next; monolithic: a clone of the full tensors) and written while
training continues; at most one save is in flight - the next save, and the end of the run, wait for it. The
marker (monolithic: the file's final name) appears as soon as the write succeeded, not at the next save, so a
crash during an async save leaves the previous checkpoint the newest valid one, and one after it loses nothing.
Asynchronous DCP runs its collectives on a dedicated gloo group so they never interleave with training's.

**Loading and world sizes.** A run resumes from a checkpoint of its own format: an FSDP run from sharded ones, any
other from monolithic ones; the other kind is a one-line error that names ``pretrained_ckpt_path`` (which starts a
new run from either format: ``load_checkpoint`` assembles full tensors from a sharded folder in one process).
Sharded checkpoints reshard through DCP, monolithic ones are full tensors that load into any layout, so both
resume at another world size: model and optimizer states are exact, the data loader continues from the global
number of samples its epoch has consumed (no sample repeated or skipped), and each new rank's random streams are
derived from ``(trainer.seed, iteration, rank)``. A resume is bit-exact only at the same world size.

**Where.** A folder (local or shared storage) or, with ``use_s3`` / an ``s3://`` ``save_dir``, an S3 prefix: the
same names and the same marker rule in both (``fastgen.checkpoint.stores``; DCP on S3 through
``fastgen.checkpoint.s3``'s storage writer / reader). ``fastgen convert-ckpt`` turns either format into the other, or into
one ``.pth`` / ``.safetensors`` file to publish.

DCP folders are read with ``weights_only`` loading of their non-tensor entries and a metadata unpickler that
accepts only DCP's own classes (``SafeFileSystemReader``), as every other checkpoint here is loaded.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fastgen.checkpoint.checkpointer import (
    FORMAT,
    VERSION,
    CorruptCheckpointError,
    dcp_errors,
)
from fastgen.checkpoint.stores import torch_save_to

# One process saving or loading a sharded checkpoint (FSDP on one rank) is intended here: DCP's warning that it
# "assumes the intent is to save in a single process" would otherwise print on every save and load.
warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized",
                        category=UserWarning)
from fastgen.distributed import group as dist_utils
from fastgen.distributed.parallelize import (
    full_optimizer_state_dict,
    full_state_dict,
    has_sharded_parameters,
    load_full_optimizer_state_dict,
    load_full_state_dict,
)
from fastgen.utils.errors import CheckpointError, first_line
from fastgen.utils.logging import get_logger
from fastgen.utils.rng import capture_rng_state, restore_rng_state, seed_everything

if TYPE_CHECKING:
    from fastgen.checkpoint.dcp_safe import ReusedHostStager

logger = get_logger(__name__)

MONOLITHIC, SHARDED = "monolithic", "sharded"


@dataclass
class TrainingState:
    """What a checkpoint captures: the method (networks incl. EMA, optimizers, schedulers), the callbacks, the
    data loaders and the number of completed iterations."""

    model: Any
    callbacks: Any
    loaders: dict[str, Any]
    iteration: int


def derived_seed(seed: int, iteration: int, rank: int) -> int:
    """A rank's random streams after a resume at another world size: a deterministic function of the run's seed,
    the iteration and the rank, so that ranks differ and the same resume draws the same numbers."""
    return (int(seed) * 1_000_003 + int(iteration) * 7_919 + int(rank) * 104_729) % (2**63 - 1)


class CheckpointManager:
    """Save and restore a run's ``TrainingState`` in the format its parallelism needs (module docstring)."""

    def __init__(self, checkpointer_config: Any, run_dir: Path, sharded: bool, seed: int = 0, run_prefix: str = "",
                 credentials_dir: str | None = None) -> None:
        from fastgen.checkpoint.stores import LocalStore, checkpoint_store

        self.store = checkpoint_store(checkpointer_config, run_dir, run_prefix, credentials_dir)
        self.location = self.store.location
        # the local folder's naming and discovery (``path_for``...), for tools and tests; None on S3
        self.files = self.store.files if isinstance(self.store, LocalStore) else None
        self.layout = SHARDED if sharded else MONOLITHIC
        self.async_save = bool(getattr(checkpointer_config, "async_save", False))
        self.pretrained = checkpointer_config.pretrained_ckpt_path
        self.seed = seed
        self._pending: _PendingSave | None = None
        self._async_group: Any = None
        self._stager: ReusedHostStager | None = None  # async sharded saves: host buffers kept between saves
        self._frozen: dict[str, str] | None = None  # fingerprints of the frozen networks (they never change)

    # ---- discovery -------------------------------------------------------------------------------------------
    def list(self) -> list[tuple[int, str]]:
        """Valid checkpoints as ``(iteration, marker)``, oldest first (a listing error raises)."""
        return self.store.list()

    def latest(self, listing: list[tuple[int, str]] | None = None) -> str | None:
        """The newest valid checkpoint (``Checkpointer.newest_valid``: an incomplete newer one is skipped with a
        warning); ``listing``: a ``list()`` the caller has just made (one listing request less on S3)."""
        return self.store.newest_valid(listing)

    def prepare(self) -> None:
        """Rank 0, before training: the folder is writable, or the bucket answers with these credentials."""
        self.store.prepare()

    def lock(self) -> None:
        """Rank 0, before training: a bucket's run lock (``S3Store.lock``); a folder is covered by the run
        directory's lock."""
        self.store.lock()

    def unlock(self) -> None:
        self.store.unlock()

    def check_layout(self, marker: str) -> None:
        """Refuse to resume from a checkpoint of the other format (the module docstring's rule)."""
        found = SHARDED if self.store.is_sharded(marker) else MONOLITHIC
        if found == MONOLITHIC and self.layout == SHARDED and _marker_layout(self.store, marker) == SHARDED:
            raise CheckpointError(
                f"checkpoint {marker} is the marker of a sharded checkpoint whose folder {self.store.folder(marker)} "
                "is missing or has no .metadata: restore that folder, or move the marker away to resume from the "
                "checkpoint before it")
        if found != self.layout:
            run = "an FSDP run" if self.layout == SHARDED else "a run without trainer.fsdp"
            raise CheckpointError(
                f"{run} cannot resume from the {found} checkpoint {marker}: start a new run directory (a new "
                f"log_config.name) from its weights with - trainer.checkpointer.pretrained_ckpt_path={marker}")

    # ---- saving ----------------------------------------------------------------------------------------------
    def save(self, state: TrainingState) -> str:
        """Save ``state`` (a collective: every rank calls it). Returns the marker's path; with ``async_save`` the
        write may still be in flight (``wait``)."""
        self.wait()
        ranks = self._gather_rank_states(state)
        extras = {
            "format": FORMAT, "version": VERSION, "iteration": state.iteration, "layout": self.layout,
            "world_size": dist_utils.get_world_size(),
            "schedulers": {name: s.state_dict() for name, s in state.model.scheduler_dict.items()},
            "frozen_fingerprints": self.frozen_fingerprints(state.model),
            **ranks,
        }
        marker = self.store.marker(state.iteration)
        if self.layout == SHARDED:
            self._save_sharded(state, extras, marker)
        else:
            self._save_monolithic(state, extras, marker)
        return marker

    def frozen_fingerprints(self, model: Any) -> dict[str, str]:
        """``{name: network_fingerprint}`` of the frozen networks the checkpoints leave out (a teacher), computed
        once per run (a collective when they are sharded: every rank calls it)."""
        if self._frozen is None:
            from fastgen.distributed.fingerprint import network_fingerprint

            self._frozen = {name: network_fingerprint(module)
                            for name, module in getattr(model, "rebuilt_modules", {}).items()}
        return self._frozen

    def check_frozen(self, model: Any, payload: dict[str, Any], marker: str) -> None:
        """Refuse to resume with a frozen network that differs from the one the checkpoint was trained with (it
        was rebuilt from its source: ``init_frozen_weights``)."""
        saved = payload.get("frozen_fingerprints") or {}
        now = self.frozen_fingerprints(model)
        for name, value in saved.items():
            if name in now and now[name] != value:
                raise CheckpointError(
                    f"checkpoint {marker} was trained with another {name} than the one rebuilt from "
                    f"{model.frozen_source(name)} (fingerprint {now[name]}, the checkpoint's {value}): point the "
                    "config back at the original, as the run's config.yaml names it, or start a new run (a new "
                    "log_config.name)")

    def wait(self) -> None:
        """Finish the save in flight, if any; raise ``CheckpointError`` (on every rank) if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()
            logger.info("saved checkpoint %s", pending.marker)

    def abandon(self) -> None:
        """Drop the save in flight without waiting for the other ranks (a failed multi-rank job): no marker is
        written, so it never becomes a valid checkpoint."""
        self._pending = None

    def _gather_rank_states(self, state: TrainingState) -> dict[str, Any]:
        """Every rank's random streams, callback state and loader positions: ``rng`` and ``per_rank`` are keyed by
        rank; ``callbacks`` and ``dataloaders`` repeat rank 0's, the view tools read."""
        own = {
            "rng": capture_rng_state(),
            "callbacks": state.callbacks.state_dict(),
            "dataloaders": {key: loader.state_dict() if hasattr(loader, "state_dict") else None
                            for key, loader in state.loaders.items()},
        }
        if dist_utils.get_world_size() == 1:
            every = [own]
        else:
            every = [None] * dist_utils.get_world_size()
            torch.distributed.all_gather_object(every, own)
        return {
            "rng": {rank: entry["rng"] for rank, entry in enumerate(every)},
            "callbacks": every[0]["callbacks"],
            "dataloaders": every[0]["dataloaders"],
            "per_rank": {key: {rank: entry[key] for rank, entry in enumerate(every)}
                         for key in ("callbacks", "dataloaders")},
        }

    def _save_monolithic(self, state: TrainingState, extras: dict[str, Any], marker: Path) -> None:
        """Only rank 0 builds the full host state, once: a monolithic (non-FSDP) run's networks are whole on
        every rank, so the other ranks have nothing to contribute (unless a network is sharded after all, when
        gathering it is a collective every rank joins). An asynchronous save builds it as copies training cannot
        change - the one copy, not a gather and then a clone of it."""
        model = state.model
        trained = model.trainable_modules
        payload: dict[str, Any] = {}
        gathers = any(has_sharded_parameters(module) for module in model.saved_modules.values())
        if dist_utils.is_rank0() or gathers:
            copy = self.async_save
            payload = {
                **(_host_copy(extras) if copy else extras),  # small: random streams, callback / loader state
                "model": {name: full_state_dict(module, copy=copy) for name, module in model.saved_modules.items()},
                "optimizers": {name: full_optimizer_state_dict(trained[name], opt, copy=copy)
                               for name, opt in model.optimizer_dict.items()},
            }
        if not dist_utils.is_rank0():
            payload = {}
        needed = _tensor_bytes(payload)
        if self.async_save:
            self._pending = _PendingSave(self, marker, writer=lambda: self.store.write(state.iteration,
                                                                                         torch_save_to(payload)),
                                         needed=needed)
            return
        self._finish_monolithic(marker, lambda: self.store.write(state.iteration, torch_save_to(payload)), needed)

    def _finish_monolithic(self, marker: str, write: Any, needed: int | None = None) -> None:
        error = None
        if dist_utils.is_rank0():
            try:
                write()
            except Exception as exc:  # noqa: BLE001 - every rank must learn that the save failed
                error = exc
        if dist_utils.any_rank(error is not None):
            raise CheckpointError(self.save_failure(marker, error, needed)) from error

    def save_failure(self, marker: str, error: BaseException | None, needed: int | None = None) -> str:
        """The one line for a failed monolithic save: a full disk names the device, the bytes needed and free, and
        the newest checkpoint left intact (saves replace files by renaming, so none was touched)."""
        if error is None:
            return f"saving checkpoint {marker} failed on rank 0"
        from fastgen.utils.io import no_space_message

        full = no_space_message(error, marker, needed)
        if full is None:
            return f"saving checkpoint {marker} failed: {first_line(error)}"
        previous = self.store.newest_valid()
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was written"
        return f"saving checkpoint failed: {full}; {kept}. Free space or set trainer.checkpointer.save_dir elsewhere"

    def _save_sharded(self, state: TrainingState, extras: dict[str, Any], marker: str) -> None:
        import torch.distributed.checkpoint as dcp

        folder = self.store.folder(marker)
        if dist_utils.is_rank0():  # folders without a marker (crashed saves; an earlier attempt at this one) go
            self.store.prepare_folder(marker)
        dist_utils.barrier()
        tensors = sharded_state(state.model)
        writer = self.store.dcp_writer(marker)
        if self.async_save:
            if self._stager is None:
                from fastgen.checkpoint.dcp_safe import ReusedHostStager

                self._stager = ReusedHostStager()
            future = dcp.async_save(tensors, storage_writer=writer, process_group=self._group_for_async(),
                                    async_stager=self._stager)
            self._pending = _PendingSave(self, marker, future=future, extras=extras)
            return
        try:
            dcp.save(tensors, storage_writer=writer)
        except dcp_errors() as exc:  # the failed rank's own error (a full disk: its "No space left on device")
            raise CheckpointError(f"saving sharded checkpoint {folder} failed: {first_line(exc)}") from None
        self._write_marker(marker, extras)

    def _write_marker(self, marker: str, extras: dict[str, Any]) -> None:
        """Rank 0 writes the marker after every rank's shards are on disk; then older checkpoints are pruned."""
        ok = True
        if dist_utils.is_rank0():
            ok = self._write_marker_on_rank0(marker, extras)
        if dist_utils.any_rank(not ok):
            raise CheckpointError(f"writing checkpoint marker {marker} failed")

    def _write_marker_on_rank0(self, marker: str, extras: dict[str, Any]) -> bool:
        try:
            self.store.write(int(extras["iteration"]), torch_save_to(extras))
            return True
        except Exception as exc:  # noqa: BLE001 - reported on every rank by the caller
            logger.error("writing checkpoint marker %s failed: %s", marker, exc)
            return False

    def _group_for_async(self) -> Any:
        """A gloo group of every rank for asynchronous DCP (its collectives run on a background thread)."""
        if self._async_group is None and dist_utils.is_initialized():
            self._async_group = torch.distributed.new_group(backend="gloo")
        return self._async_group

    # ---- loading ---------------------------------------------------------------------------------------------
    def load(self, marker: str, state: TrainingState) -> dict[str, Any]:
        """Restore ``state`` from ``marker`` (every rank) and return the marker's payload (without tensors of
        the networks), whose per-rank entries ``restore_rank_state`` applies once the loaders exist."""
        self.check_layout(marker)
        if self.layout == SHARDED:
            payload = self._read_marker(marker)
            load_sharded(self.store.dcp_reader(marker), state.model, self.store.folder(marker))
            restore_non_tensor_state(state.model, payload, marker)
        else:
            payload = self._read(self.store.read_for_resume, marker)
            restore_full_state(state.model, payload, marker)
        self.check_frozen(state.model, payload, marker)
        state.callbacks.load_state_dict(rank_entry(payload, "callbacks") or {})
        return payload

    def _read(self, read: Any, marker: str) -> dict[str, Any]:
        """``read(marker)``; a corrupt file's error names the newest complete checkpoint before it."""
        try:
            return read(marker)
        except CorruptCheckpointError as exc:
            previous = self.store.previous_complete(marker)
            raise CorruptCheckpointError(exc.path, exc.reason, None if previous is None else Path(previous)) from None

    def _read_marker(self, marker: str) -> dict[str, Any]:
        payload = self._read(lambda m: self.store.read(m, whole=False), marker)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT or payload.get("layout") != SHARDED:
            raise CheckpointError(f"{marker} is not the marker of a fastgen sharded checkpoint")
        return payload

    def restore_rank_state(self, payload: dict[str, Any], state: TrainingState) -> None:
        """This rank's loader positions and random streams. At the saving world size each rank takes its own;
        at another, loaders continue from the global position and the streams are derived (``derived_seed``)."""
        loaders = rank_entry(payload, "dataloaders") or {}
        every_rank = (payload.get("per_rank") or {}).get("dataloaders") or {}
        for key, loader in state.loaders.items():
            if hasattr(loader, "load_every_rank_state") and every_rank and all(
                    (every_rank[rank] or {}).get(key) is not None for rank in every_rank):
                # a streaming loader (WebDataset) resplits every old rank's remainder at another world size
                loader.load_every_rank_state([every_rank[rank][key] for rank in sorted(every_rank)])
            elif loaders.get(key) is not None and hasattr(loader, "load_state_dict"):
                loader.load_state_dict(loaders[key])
        saved_world = int(payload.get("world_size") or len(payload.get("rng") or {}) or 1)
        if saved_world == dist_utils.get_world_size():
            restore_rng_state(payload["rng"][dist_utils.get_rank()])
        else:
            seed_everything(derived_seed(self.seed, int(payload["iteration"]), dist_utils.get_rank()))
            logger.info("resumed a %d-rank checkpoint on %d rank(s): random streams derived from the seed",
                        saved_world, dist_utils.get_world_size())


def _tensor_bytes(tree: Any) -> int:
    """The bytes of every tensor in a nested payload: what its ``torch.save`` needs on disk, near enough."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(v) for v in tree)
    return 0


class _PendingSave:
    """A save in flight: DCP's future (sharded) or a writer thread (monolithic).

    A sharded save's marker is written by rank 0 as soon as its write is complete - rank 0's DCP future resolves
    only after every rank's shards and DCP's metadata are written (DCP gathers each rank's result) - so an async
    checkpoint becomes valid when it is on storage, not at the next save. ``finish`` then tells every rank how
    the save went (a collective)."""

    def __init__(self, manager: CheckpointManager, marker: str, future: Any = None, extras: Any = None,
                 writer: Any = None, needed: int | None = None) -> None:
        self.manager, self.marker, self.future, self.extras = manager, marker, future, extras
        self.needed = needed
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.marker_written = threading.Event()
        self.marker_ok = False
        if future is not None and dist_utils.is_rank0():
            future.add_done_callback(self._on_written)
        if writer is not None and dist_utils.is_rank0():
            def run() -> None:
                try:
                    writer()
                except BaseException as exc:  # noqa: BLE001 - reported by finish()
                    self.error = exc
            self.thread = threading.Thread(target=run, name="fastgen-checkpoint-writer", daemon=True)
            self.thread.start()

    def _on_written(self, future: Any) -> None:
        """Rank 0, on DCP's thread once the write is over: the marker, if every rank's write succeeded."""
        try:
            if future.exception() is None:
                self.marker_ok = self.manager._write_marker_on_rank0(self.marker, self.extras)
        finally:
            self.marker_written.set()

    def finish(self) -> None:
        if self.future is not None:
            try:
                self.future.result()
            except dcp_errors() as exc:
                self.error = exc
            if dist_utils.any_rank(self.error is not None):
                raise CheckpointError(f"saving sharded checkpoint {self.manager.store.folder(self.marker)} failed"
                                      + (f": {first_line(self.error)}" if self.error else " on another rank"))
            if dist_utils.is_rank0():
                self.marker_written.wait()
            if dist_utils.any_rank(dist_utils.is_rank0() and not self.marker_ok):
                raise CheckpointError(f"writing checkpoint marker {self.marker} failed")
            return
        if self.thread is not None:
            self.thread.join()
        if dist_utils.any_rank(self.error is not None):
            raise CheckpointError(self.manager.save_failure(self.marker, self.error, self.needed))


# ---- formats -------------------------------------------------------------------------------------------------------
def sharded_state(model: Any) -> dict[str, Any]:
    """Every saved network's and optimizer's state as DCP saves it: local shards (DTensors) keyed by parameter
    name (frozen networks are rebuilt from their source, not saved)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from fastgen.distributed.parallelize import _saved_part

    trained = model.trainable_modules
    return {
        "model": {name: _saved_part(module, get_model_state_dict(module))
                  for name, module in model.saved_modules.items()},
        "optimizers": {name: get_optimizer_state_dict(trained[name], opt)
                       for name, opt in model.optimizer_dict.items()},
    }


def load_sharded(reader: Any, model: Any, folder: str) -> None:
    """Read a DCP folder (through ``reader``) into the model's (sharded or plain) networks and optimizers,
    resharding as needed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from fastgen.checkpoint.dcp_safe import SafeLoadPlanner, checked_metadata

    state = sharded_state(model)
    checked_metadata(reader)
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except dcp_errors() as exc:
        raise CheckpointError(f"sharded checkpoint {folder} does not load into this model: {first_line(exc)}") from None
    trained = model.trainable_modules
    from fastgen.utils.lora_utils import is_adapted

    for name, module in model.saved_modules.items():
        set_model_state_dict(module, state["model"][name], options=StateDictOptions(strict=not is_adapted(module)))
    for name, optimizer in model.optimizer_dict.items():
        set_optimizer_state_dict(trained[name], optimizer, state["optimizers"][name],
                                 options=StateDictOptions(strict=False))


def restore_full_state(model: Any, payload: dict[str, Any], path: Path) -> None:
    """Restore a monolithic payload: every network, optimizer and scheduler; each must be present."""
    for entry, objects in (("optimizers", model.optimizer_dict), ("schedulers", model.scheduler_dict)):
        missing = [name for name in objects if name not in (payload.get(entry) or {})]
        if missing:
            raise CheckpointError(f"checkpoint {path} has no {entry} entry for {', '.join(missing)}: resuming "
                                  "from it would restart their state from scratch (was it written by a run "
                                  "configured differently?)")
    restore_modules(model, payload, path)
    trained = model.trainable_modules
    for name, optimizer in model.optimizer_dict.items():
        state = payload["optimizers"][name]
        if int(payload.get("version", 1)) < 2:  # version 1: the optimizer's own state_dict, by index
            optimizer.load_state_dict(state)
            continue
        try:
            load_full_optimizer_state_dict(trained[name], optimizer, state)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {path}: optimizer {name!r} does not fit this model ({exc})") from None
    restore_non_tensor_state(model, payload, path)


def restore_non_tensor_state(model: Any, payload: dict[str, Any], path: Path) -> None:
    missing = [name for name in model.scheduler_dict if name not in (payload.get("schedulers") or {})]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no schedulers entry for {', '.join(missing)}: resuming from "
                              "it would restart their state from scratch (was it written by a run configured "
                              "differently?)")
    for name, scheduler in model.scheduler_dict.items():
        scheduler.load_state_dict(payload["schedulers"][name])


def restore_modules(model: Any, payload: dict[str, Any], path: Any, allow_missing: bool = False) -> None:
    """Load full tensors into every network the payload holds (any layout); unknown or (unless ``allow_missing``)
    absent saved networks and shapes that do not fit are ``CheckpointError``s naming the checkpoint. A frozen
    network (a teacher) is loaded when present - checkpoints written before they left them out hold one - and
    otherwise stays as ``init_frozen_weights`` rebuilt it."""
    modules = model.model_dict
    for name, state in payload.get("model", {}).items():
        if name not in modules:
            if allow_missing:
                continue
            raise CheckpointError(f"checkpoint {path} has weights for {name!r}, which this model does not have")
        try:
            load_full_state_dict(modules[name], state)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()
            raise CheckpointError(
                f"checkpoint {path}: weights of {name!r} do not fit this model ({' '.join(first[:2])[:300]})"
            ) from None
    if not allow_missing:
        missing = [n for n in getattr(model, "saved_modules", modules) if n not in payload.get("model", {})]
        if missing:
            raise CheckpointError(f"checkpoint {path} lacks weights for {', '.join(missing)}")


def load_pretrained(model: Any, path: str | None, credentials_dir: str | None, frozen_only: bool = False) -> None:
    """``trainer.checkpointer.pretrained_ckpt_path`` (a local file or s3://, either layout) into the networks it
    holds; an EMA network it lacks starts from the loaded ``net``. Training calls it on a fresh start (and, for a
    LoRA base, on every start); rebuilding a LoRA run for sampling or export calls it the same way.
    ``frozen_only``: only into the frozen networks (a resume rebuilding a teacher that came from this file)."""
    if not path:
        return
    from fastgen.checkpoint.stores import read_whole_checkpoint

    payload = read_whole_checkpoint(path, credentials_dir)
    if frozen_only:
        frozen = getattr(model, "rebuilt_modules", {})
        restore_modules(model, {"model": {k: v for k, v in payload.get("model", {}).items() if k in frozen}}, path,
                        allow_missing=True)
        return
    restore_modules(model, payload, path, allow_missing=True)
    for name, ema in getattr(model, "ema_nets", {}).items():
        if name not in payload.get("model", {}):  # an EMA the checkpoint lacks starts from the loaded net
            ema.load_state_dict(model.net.state_dict())


def rebuild_frozen(model: Any, pretrained_ckpt_path: str | None, credentials_dir: str | None) -> None:
    """Load the networks checkpoints leave out (``model.rebuilt_modules``: a teacher) from where training took
    them - the method's own sources (``init_frozen_weights``), then ``pretrained_ckpt_path``'s entries for them -
    and nothing else: what a resume, ``select_net(run, "teacher")`` and exports need."""
    model.init_frozen_weights()
    if pretrained_ckpt_path:
        load_pretrained(model, pretrained_ckpt_path, credentials_dir, frozen_only=True)


def rank_entry(payload: dict[str, Any], key: str) -> Any:
    """This rank's ``callbacks`` or ``dataloaders`` entry (``per_rank``, version 3; older checkpoints hold rank
    0's only). A rank the checkpoint did not have (a larger world) takes rank 0's: callback state is then rank
    0's, and the loader recomputes its share from the global position."""
    every = (payload.get("per_rank") or {}).get(key)
    if not every:
        return payload.get(key)
    return every.get(dist_utils.get_rank(), every[min(every)])




# ---- helpers -------------------------------------------------------------------------------------------------------
def _marker_layout(store: Any, marker: str) -> str | None:
    """The layout a checkpoint's ``.pth`` declares (None when it cannot be read: its own error comes later)."""
    try:
        payload = store.read(marker, whole=False)
    except CheckpointError:
        return None
    return payload.get("layout") if isinstance(payload, dict) else None


def _host_copy(tree: Any) -> Any:
    """A copy of every tensor in ``tree`` that training cannot change while a background thread writes it."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: _host_copy(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_host_copy(value) for value in tree]
    if isinstance(tree, tuple):
        return tuple(_host_copy(value) for value in tree)
    return tree
