"""Checkpoint files: the two formats, naming, atomic writes, discovery of the newest valid one, safe loading.

**Monolithic** (one process and DDP runs): ``<save_dir>/{iteration:07d}.pth``, one ``torch.save`` of a dict::

    {"format": "fastgen-checkpoint", "version": 3, "iteration": int, "layout": "monolithic", "world_size": int,
     "model": {module_name: state_dict}, "optimizers": {module_name: optimizer state keyed by parameter name},
     "schedulers": {...}, "callbacks": {callback_name: state}, "dataloaders": {"train": state, "val": state},
     "rng": {rank: {"torch": ByteTensor, "cuda": [ByteTensor], "numpy": {...}, "python": tuple}},
     "per_rank": {"callbacks": {rank: ...}, "dataloaders": {rank: ...}}}

(``callbacks`` / ``dataloaders`` repeat rank 0's entry of ``per_rank``.) The file is written to a temporary name
in the same folder and renamed into place (``fastgen.utils.io``), so a file with the final name is always
complete: it is its own validity marker. A crash mid-write leaves only a hidden ``.*.tmp`` file, which discovery
ignores and the next save cleans up.

**Sharded** (FSDP runs): a ``<save_dir>/{iteration:07d}.dcp/`` folder written by every rank with
``torch.distributed.checkpoint`` (``model.<network>.<parameter>`` and ``optimizers.<network>...``, each rank its
own shards) and the marker ``{iteration:07d}.pth``: the dict above without ``model`` and ``optimizers``, with
``"layout": "sharded"``, written by rank 0 after every rank's shards and DCP's metadata are on disk.

**Validity and discovery.** A checkpoint is valid when its ``.pth`` exists; the newest valid one is resumed. A
``.dcp`` folder without its marker (a crash during a save) is ignored and removed by the next save;
``keep_last_n`` removes a marker and then its folder, oldest first, and never the checkpoint just written nor the
newest valid one.

**How they load.** A run resumes only from its own format (FSDP: sharded; otherwise monolithic): the other is a
one-line error that points at ``trainer.checkpointer.pretrained_ckpt_path``, which starts a *new* run from
either format. Monolithic tensors are full and load into any layout; sharded ones are resharded by DCP. Both
resume at another world size - exactly for weights and optimizer states, with the data loader continuing from
the global sample position and random streams derived per rank - and bit-identically only at the same world
size (``fastgen.checkpoint.manager`` documents what a run saves and restores). ``load_checkpoint`` returns
the monolithic dict for either format (assembling a sharded folder's tensors in this process), for tools that
need whole networks: sampling, evaluation, teachers, ``pretrained_ckpt_path``.

**Safety.** Every pickle here - a ``.pth``'s, a DCP folder's ``.metadata`` and its non-tensor entries, locally or
on S3 - is read by one unpickler that resolves only an exact list of names (``fastgen.utils.safe_pickle``): a
checkpoint cannot execute code. A truncated
or corrupt file raises ``CheckpointError`` naming the file and what to do. A relative ``save_dir`` lives inside
the run directory, or with ``use_s3=True`` under ``s3://<s3_container>/<project>/<group>/<name>/``
(``fastgen.checkpoint.stores``: the same names there; objects appear whole, the marker last).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from fastgen.utils.errors import CheckpointError, first_line
from fastgen.utils.io import atomic_write_with
from fastgen.utils.logging import get_logger
from fastgen.utils.safe_pickle import CorruptFileError, torch_load

logger = get_logger(__name__)
_NAME = re.compile(r"^(\d{7,})\.pth$")
FORMAT = "fastgen-checkpoint"
VERSION = 3  # 3: per-rank callback / loader state; sharded checkpoints (a marker + a DCP folder)


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file that exists but cannot be read (truncated, corrupt, not a torch file)."""

    def __init__(self, path: Path, reason: str, previous: Path | None = None) -> None:
        self.path, self.reason = path, reason
        if previous is not None:
            advice = (f"the previous checkpoint {previous.name} is complete: move {path.name} away to resume from "
                      "it, or start a new run (a new log_config.name)")
        else:
            advice = "delete it to resume from the previous one, or start a new run (a new log_config.name)"
        super().__init__(f"checkpoint {path} is corrupt or truncated ({reason}); {advice}")


def looks_complete(path: Path) -> bool:
    """A cheap check that ``path`` is a whole torch checkpoint: its zip directory (at the end of the file) reads."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


class Checkpointer:
    def __init__(self, save_dir: str, run_dir: Path, keep_last_n: int | None = None) -> None:
        path = Path(os.path.expandvars(save_dir)).expanduser()
        self.save_dir = path if path.is_absolute() else Path(run_dir) / path
        self.keep_last_n = keep_last_n

    def path_for(self, iteration: int) -> Path:
        return self.save_dir / f"{iteration:07d}.pth"

    def list(self) -> list[tuple[int, Path]]:
        """Valid (complete) checkpoints as ``(iteration, path)``, oldest first."""
        if not self.save_dir.is_dir():
            return []
        found = []
        for entry in self.save_dir.iterdir():
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def previous_complete(self, before: Path) -> Path | None:
        """The newest checkpoint older than ``before`` whose file looks complete (``looks_complete``)."""
        older = [path for _, path in self.list() if path != before and path.name < before.name]
        return next((path for path in reversed(older) if looks_complete(path)), None)

    def latest(self) -> Path | None:
        found = self.list()
        return found[-1][1] if found else None

    def newest_valid(self, listing: list[tuple[int, Path]] | None = None) -> Path | None:
        """The newest checkpoint whose ``.pth`` is whole (its zip directory reads). Saves are atomic, so only
        damage from outside (a truncating copy, a full disk during a copy) makes one incomplete; it is skipped
        with a warning naming it, and the one before it is used - by training's resume and by every command
        (``fastgen.checkpoint.source``). ``listing``: this folder's ``list()``, when the caller has just made it."""
        for _, path in reversed(self.list() if listing is None else listing):
            if looks_complete(path):
                return path
            logger.warning("skipping checkpoint %s: it is truncated or not a whole torch file; using the one "
                           "before it", path)
        return None

    def save(self, payload: dict[str, Any], iteration: int) -> Path:
        return self.save_with(lambda handle: torch.save(payload, handle), iteration)

    def save_with(self, writer: Any, iteration: int) -> Path:
        """Write ``{iteration:07d}.pth`` atomically with ``writer(file)``; then apply ``keep_last_n``."""
        path = self.path_for(iteration)
        self._remove_stale_temporaries()
        atomic_write_with(path, writer)
        if self.keep_last_n is not None:
            found = dict(self.list())
            for old in iterations_to_prune(list(found), iteration, self.keep_last_n):
                found[old].unlink(missing_ok=True)  # the marker first: its folder is invalid from here on
                shutil.rmtree(found[old].with_suffix(".dcp"), ignore_errors=True)
        return path

    def _remove_stale_temporaries(self) -> None:
        if self.save_dir.is_dir():
            for entry in self.save_dir.glob(".*.pth.*.tmp"):
                entry.unlink(missing_ok=True)


def iterations_to_prune(valid: list[int], written: int, keep_last_n: int) -> list[int]:
    """The checkpoints ``keep_last_n`` removes after ``written`` was saved: the oldest beyond the newest
    ``keep_last_n``, but never ``written`` itself nor the newest valid one. (Taking "all but the last N" of the
    listing alone deleted the checkpoint just written whenever the folder held higher iterations.)"""
    ordered = sorted(valid)
    protected = {written, ordered[-1]} if ordered else {written}
    return [iteration for iteration in ordered[: max(len(ordered) - keep_last_n, 0)] if iteration not in protected]


def load_checkpoint(path: str | os.PathLike[str], mmap: bool = False) -> dict[str, Any]:
    """Load a fastgen checkpoint safely (``fastgen.utils.safe_pickle``, CPU); raise ``CheckpointError`` if unusable.

    ``mmap``: map the file instead of reading it - what a resume does, so the ranks of a node resuming from one
    file share its pages in the page cache (one read per node). The tensors then stay backed by the file: never
    write the same path in place while they are alive (fastgen's own saves replace files by renaming)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch_load(path, mmap=mmap)
    except CorruptFileError as exc:
        raise CorruptCheckpointError(path, exc.reason) from None
    if isinstance(payload, dict) and payload.get("format") == FORMAT and payload.get("layout") == "sharded":
        return {**payload, **read_sharded_as_full(dcp_folder(path))}  # whole tensors, assembled in this process
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        if isinstance(payload, dict) and "model" not in payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
            # A bare state_dict (e.g. from convert-ckpt or another tool): treat it as the weights of `net`.
            return {"format": FORMAT, "version": 1, "iteration": 0, "model": {"net": payload}}
        raise CheckpointError(f"{path} is not a fastgen checkpoint")
    return payload


def dcp_folder(marker: Path) -> Path:
    """The DCP folder of a (local) sharded checkpoint's marker."""
    return Path(marker).with_suffix(".dcp")


def dcp_errors() -> tuple[type[BaseException], ...]:
    """What a save or load may raise: any ``Exception``, and DCP's ``CheckpointException`` (a failure on any rank),
    which derives from ``BaseException``. Imported when an error is matched (DCP is loaded by then): importing
    torch.distributed.checkpoint costs half a second at start-up, which one-process runs do not need."""
    from torch.distributed.checkpoint import CheckpointException

    return (Exception, CheckpointException)


def read_sharded_as_full(folder: Path) -> dict[str, Any]:
    """The tensors of a DCP folder assembled in this process (no process group): ``{"model": {net: state},
    "optimizers": {...}}`` with full tensors. For tools that need whole networks (sampling, conversion,
    ``pretrained_ckpt_path``); a training resume reads only its own shards (``load_sharded``)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from fastgen.checkpoint.dcp_safe import SafeFileSystemReader, SafeWholeLoadPlanner, checked_metadata

    state: dict[str, Any] = {}
    reader = SafeFileSystemReader(str(folder))
    try:
        checked_metadata(reader)
    except FileNotFoundError:
        raise CheckpointError(f"sharded checkpoint {folder} has no .metadata (an incomplete or missing folder)") from None
    try:
        _load_state_dict(state, storage_reader=reader, planner=SafeWholeLoadPlanner(), no_dist=True)
    except dcp_errors() as exc:
        raise CheckpointError(f"sharded checkpoint {folder} cannot be read: {first_line(exc)}") from None
    return state
