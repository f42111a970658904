"""Where checkpoints live: a folder (local disk or a shared filesystem) or an S3 prefix, behind one interface.

The checkpoint manager (``fastgen.checkpoint.manager``) decides *what* to save; a store knows *where*: the
names (``{iteration:07d}.pth``, and ``{iteration:07d}.dcp/`` for a sharded checkpoint, the same in both stores),
how to write an object so that it appears whole or not at all, how to list the valid checkpoints, and which DCP
storage writer / reader to use. A checkpoint is referred to by its marker as a string: a path, or an
``s3://bucket/key`` URL.

``checkpoint_store(checkpointer_config, run_dir, run_prefix, credentials_dir)`` picks one:

* ``use_s3=True``: ``s3://<s3_container>/<project>/<group>/<name>/<save_dir>`` (the seed: a relative ``save_dir``
  goes "under s3_container if use_s3=True"; an ``s3://`` ``save_dir`` is used as it is). Credentials come from
  ``credentials_dir/s3.json`` or the environment (``fastgen.checkpoint.s3.resolve_credentials``). Objects are atomic
  (S3 has no partial PUT), so a monolithic ``.pth`` and a marker are uploaded whole, the marker last; a listing
  error raises - a resume never silently starts at iteration 0 because the bucket could not be read.
* otherwise the folder ``save_dir`` (relative: inside the run directory): atomic renames (``fastgen.utils.io``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from fastgen.checkpoint.checkpointer import (
    Checkpointer,
    CorruptCheckpointError,
    iterations_to_prune,
    load_checkpoint,
)
from fastgen.utils.errors import CheckpointError, ConfigError, FastGenError, first_line
from fastgen.utils.io import check_writable_dir
from fastgen.utils.logging import get_logger
from fastgen.utils.safe_pickle import CorruptFileError, torch_load

logger = get_logger(__name__)


class LocalStore:
    """Checkpoints in a folder."""

    def __init__(self, save_dir: str, run_dir: Path, keep_last_n: int | None) -> None:
        self.files = Checkpointer(save_dir, run_dir, keep_last_n)
        self.location = str(self.files.save_dir)

    def prepare(self) -> None:
        check_writable_dir(self.files.save_dir)

    def lock(self) -> None:
        """Nothing: the run directory's lock (``fastgen.checkpoint.run_lock``) covers a local checkpoints folder."""

    def unlock(self) -> None:
        """Nothing (``lock``)."""

    def list(self) -> list[tuple[int, str]]:
        return [(iteration, str(path)) for iteration, path in self.files.list()]

    def newest_valid(self, listing: list[tuple[int, str]] | None = None) -> str | None:
        found = self.files.newest_valid(None if listing is None else [(i, Path(p)) for i, p in listing])
        return None if found is None else str(found)

    def marker(self, iteration: int) -> str:
        return str(self.files.path_for(iteration))

    def folder(self, marker: str) -> str:
        return str(Path(marker).with_suffix(".dcp"))

    def is_sharded(self, marker: str) -> bool:
        return (Path(self.folder(marker)) / ".metadata").is_file()

    def write(self, iteration: int, writer: Callable[[IO[bytes]], None]) -> str:
        """Write the ``.pth`` of ``iteration`` atomically, then apply ``keep_last_n``."""
        return str(self.files.save_with(writer, iteration))

    def read(self, marker: str, whole: bool) -> dict[str, Any]:
        """``whole``: ``load_checkpoint`` (a monolithic checkpoint, or a sharded one assembled); else the marker's
        own dict."""
        if whole:
            return load_checkpoint(marker)
        return _load_marker_file(Path(marker), marker)

    def read_for_resume(self, marker: str) -> dict[str, Any]:
        """A monolithic checkpoint for every rank's resume (a collective): mapped, so the ranks of a node share
        one read of the file through the page cache (``load_checkpoint(mmap=True)``)."""
        return load_checkpoint(marker, mmap=True)

    def previous_complete(self, marker: str) -> str | None:
        found = self.files.previous_complete(Path(marker))
        return None if found is None else str(found)

    def prepare_folder(self, marker: str) -> None:
        """Before a sharded save: remove the folders without a marker (crashed saves, an earlier attempt at this
        one); a valid checkpoint's folder is never touched."""
        if self.files.save_dir.is_dir():
            for entry in self.files.save_dir.glob("*.dcp"):
                if entry.is_dir() and not entry.with_suffix(".pth").exists():
                    shutil.rmtree(entry, ignore_errors=True)

    def dcp_writer(self, marker: str) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(self.folder(marker), single_file_per_rank=True, sync_files=True)

    def dcp_reader(self, marker: str) -> Any:
        from fastgen.checkpoint.dcp_safe import SafeFileSystemReader

        return SafeFileSystemReader(self.folder(marker))


class S3Store:
    """Checkpoints under an S3 prefix (``fastgen.checkpoint.s3``)."""

    def __init__(self, url: str, keep_last_n: int | None, credentials_dir: str | None) -> None:
        from fastgen.checkpoint import s3

        self.s3 = s3
        self.prefix = s3.S3Location.parse(url)
        self.location = self.prefix.url
        self.keep_last_n = keep_last_n
        self.storage = s3.S3Storage.from_config(credentials_dir)

    def prepare(self) -> None:
        self.s3.scan_checkpoints(self.storage, self.prefix)  # the bucket exists and the credentials work

    def lock(self) -> None:
        """A lock object beside the checkpoints (``fastgen.checkpoint.run_lock.S3RunLock``): runs on machines that share
        no disk but write one prefix meet it."""
        from fastgen.checkpoint.run_lock import S3RunLock

        self._lock = S3RunLock(self.storage, self.prefix.child(".fastgen.lock"))
        self._lock.acquire()

    def unlock(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()
            self._lock = None

    def list(self) -> list[tuple[int, str]]:
        return [(found.iteration, found.marker.url) for found in self.s3.scan_checkpoints(self.storage, self.prefix).valid]

    def newest_valid(self, listing: list[tuple[int, str]] | None = None) -> str | None:
        """The newest marker: objects appear whole or not at all (``listing``: a ``list()`` just made)."""
        found = self.list() if listing is None else listing
        return found[-1][1] if found else None

    def marker(self, iteration: int) -> str:
        return self.s3.checkpoint_marker(self.prefix, iteration).url

    def folder(self, marker: str) -> str:
        return marker[: -len(".pth")] + ".dcp"

    def is_sharded(self, marker: str) -> bool:
        return self.storage.exists(self.s3.S3Location.parse(self.folder(marker)).child(".metadata"))

    def write(self, iteration: int, writer: Callable[[IO[bytes]], None]) -> str:
        """Stage the ``.pth`` in a local temporary file, upload it (multipart when large: it appears whole or not
        at all), then apply ``keep_last_n``."""
        target = self.s3.checkpoint_marker(self.prefix, iteration)
        with tempfile.TemporaryDirectory(prefix="fastgen-ckpt-") as scratch:
            staged = Path(scratch) / target.name
            with staged.open("wb") as handle:
                writer(handle)
            self.storage.upload_file(staged, target)
        if self.keep_last_n is not None:
            self._prune(iteration)
        return target.url

    def _prune(self, written: int) -> None:
        """``keep_last_n`` after a successful upload. A listing or deletion error here costs only disk space, so
        it is a warning and training goes on (the checkpoint just written is safe either way)."""
        try:
            valid = [found.iteration for found in self.s3.scan_checkpoints(self.storage, self.prefix).valid]
            for old in iterations_to_prune(valid, written, int(self.keep_last_n or 0)):
                self.s3.delete_checkpoint(self.storage, self.prefix, old)
        except Exception as exc:  # noqa: BLE001 - a storage error of any kind: the save itself succeeded
            logger.warning("checkpoint %s is saved, but removing older ones under %s (keep_last_n=%s) failed: %s; "
                           "training goes on", self.s3.checkpoint_marker(self.prefix, written).url, self.location,
                           self.keep_last_n, first_line(exc))

    def read(self, marker: str, whole: bool) -> dict[str, Any]:
        location = self.s3.S3Location.parse(marker)
        with tempfile.TemporaryDirectory(prefix="fastgen-ckpt-") as scratch:
            staged = Path(scratch) / location.name
            self.storage.download_file(location, staged)
            if not whole:
                return _load_marker_file(staged, marker)
            if self.is_sharded(marker):
                from fastgen.checkpoint.checkpointer import read_sharded_as_full

                payload = _load_marker_file(staged, marker)
                folder = Path(scratch) / "whole.dcp"
                for key in self.storage.list_keys(self.s3.S3Location.parse(self.folder(marker))):
                    relative = key[len(self.s3.S3Location.parse(self.folder(marker)).folder_prefix):]
                    self.storage.download_file(self.s3.S3Location(location.bucket, key), folder / relative)
                return {**payload, **read_sharded_as_full(folder)}
            try:
                return load_checkpoint(staged)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(Path(marker), exc.reason) from None

    def read_for_resume(self, marker: str) -> dict[str, Any]:
        """A monolithic checkpoint for every rank's resume (a collective): one download per node, not per rank.
        Local rank 0 of each node downloads it into a private folder of the node's temporary directory; every
        rank of the node then maps that one file (its pages shared through the page cache) and the folder is
        removed once all have mapped it (a mapped file outlives its name). A failed download ends every rank."""
        import secrets

        from fastgen.distributed import group as dist_utils

        location = self.s3.S3Location.parse(marker)
        token = dist_utils.broadcast_object(secrets.token_hex(8) if dist_utils.is_rank0() else None)
        node = os.environ.get("GROUP_RANK", "0")  # torchrun's node index: two "nodes" may share one /tmp
        folder = Path(tempfile.gettempdir()) / f"fastgen-resume-{token}-node{node}"
        staged = folder / location.name
        downloader = dist_utils.get_local_rank() == 0
        error: BaseException | None = None
        if downloader:
            try:
                folder.mkdir(mode=0o700)
                self.storage.download_file(location, staged)
            except Exception as exc:  # noqa: BLE001 - every rank must learn of it
                error = exc
        try:
            if dist_utils.any_rank(error is not None):
                if isinstance(error, FastGenError):  # already one line naming the object
                    raise error
                raise CheckpointError(f"downloading checkpoint {marker} failed"
                                      + (f": {first_line(error)}" if error is not None else " on another node"))
            try:
                return load_checkpoint(staged, mmap=True)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(Path(marker), exc.reason) from None
        finally:
            dist_utils.barrier()  # every rank of the node has mapped (or given up on) the file
            if downloader:
                shutil.rmtree(folder, ignore_errors=True)

    def previous_complete(self, marker: str) -> str | None:
        return None  # an object is never half-written on S3: a corrupt one is not a crash's leftover

    def prepare_folder(self, marker: str) -> None:
        """Before a sharded save: delete the folders without a marker (as ``LocalStore.prepare_folder``)."""
        for iteration in self.s3.scan_checkpoints(self.storage, self.prefix).unmarked:
            self.storage.delete_folder(self.s3.checkpoint_folder(self.prefix, iteration))

    def dcp_writer(self, marker: str) -> Any:
        return self.s3.S3StorageWriter(self.s3.S3Location.parse(self.folder(marker)), self.storage)

    def dcp_reader(self, marker: str) -> Any:
        return self.s3.S3StorageReader(self.s3.S3Location.parse(self.folder(marker)), self.storage)


def checkpoint_store(checkpointer_config: Any, run_dir: Path, run_prefix: str,
                     credentials_dir: str | None) -> LocalStore | S3Store:
    """The store a run's ``trainer.checkpointer`` describes (module docstring)."""
    save_dir = str(checkpointer_config.save_dir)
    keep = checkpointer_config.keep_last_n
    if keep is not None and (isinstance(keep, bool) or int(keep) < 1):
        raise ConfigError(f"trainer.checkpointer.keep_last_n={keep} would keep no checkpoint: give N >= 1 (the "
                          "newest N are kept), or null to keep them all")
    if save_dir.startswith("s3://"):
        return S3Store(save_dir.rstrip("/"), keep, credentials_dir)
    if not checkpointer_config.use_s3:
        return LocalStore(save_dir, run_dir, keep)
    container = checkpointer_config.s3_container
    if not container:
        raise ConfigError("trainer.checkpointer.use_s3=True needs trainer.checkpointer.s3_container=BUCKET/PREFIX")
    from fastgen.checkpoint.s3 import S3Location

    if os.path.isabs(save_dir):
        raise ConfigError(f"trainer.checkpointer.save_dir={save_dir} is an absolute path, but use_s3=True keeps "
                          "checkpoints under s3_container: give a relative save_dir (or an s3:// one)")
    base = S3Location.from_container(container)
    parts = [part for part in (*run_prefix.split("/"), *save_dir.split("/")) if part and part != "."]
    return S3Store(base.child(*parts).url, keep, credentials_dir)


def read_whole_checkpoint(path: str, credentials_dir: str | None) -> dict[str, Any]:
    """``load_checkpoint`` of a local file or an ``s3://`` checkpoint (its ``.pth``; a sharded one is assembled
    into whole tensors in this process): what ``pretrained_ckpt_path`` starts a run from."""
    if str(path).startswith("s3://"):
        return S3Store(str(path).rsplit("/", 1)[0], None, credentials_dir).read(str(path), whole=True)
    return load_checkpoint(path)


def _load_marker_file(path: Path, name: str) -> dict[str, Any]:
    try:
        return torch_load(path, what=name)
    except CorruptFileError as exc:
        raise CorruptCheckpointError(Path(name), exc.reason) from None


def torch_save_to(payload: dict[str, Any]) -> Callable[[IO[bytes]], None]:
    """A ``writer`` for ``write`` that ``torch.save``s ``payload``."""
    return lambda handle: torch.save(payload, handle)

