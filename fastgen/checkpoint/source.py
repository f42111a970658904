"""What a command's checkpoint argument names: one resolver for ``sample``, ``convert-ckpt``, ``check-ranks
--checkpoint``, ``model.student_ckpt`` and the trainer's resume, so that they take the same things and mean the same
by "newest valid".

A source is, locally or as ``s3://bucket/prefix``:

* a checkpoint: a ``.pth`` (monolithic, or a sharded checkpoint's marker), a ``.dcp`` folder or a ``.safetensors``;
* a checkpoints folder: its newest valid checkpoint;
* a run directory: its ``config.yaml`` says where the run kept its checkpoints - the folder ``save_dir``, or S3
  (``use_s3`` / an ``s3://`` ``save_dir``), so the local run directory of a run whose checkpoints are in a bucket
  works as any other; on S3, a run prefix is the prefix holding ``checkpoints/``.

**Newest valid.** The checkpoint with the highest iteration whose ``.pth`` is whole. Saves are atomic (a temporary
name, then a rename), so a ``.pth`` with its final name is complete unless something else damaged it; one whose zip
directory does not read (truncated by a copy, a full disk elsewhere) is skipped with a warning naming it, and the
one before it is used - the README's rule, the same for training's resume. S3 objects appear whole or not at all,
so there the newest marker is the newest valid one.

``config.yaml`` is read with OmegaConf alone (no config classes are imported: this module sits below them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastgen.checkpoint.checkpointer import Checkpointer
from fastgen.utils.errors import UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)
CHECKPOINT_SUFFIXES = (".pth", ".dcp", ".safetensors")


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The checkpoint a source names (a local path or an ``s3://`` URL) and its run's ``config.yaml`` (local; None
    when there is none, e.g. a bare S3 prefix)."""

    checkpoint: str
    config_yaml: Path | None
    credentials_dir: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.checkpoint.startswith("s3://")


def resolve_checkpoint(source: str | os.PathLike[str], credentials_dir: str | None = None) -> ResolvedCheckpoint:
    """Resolve ``source`` (module docstring); ``UsageError`` when it names nothing usable."""
    text = os.fspath(source)
    if text.startswith("s3://"):
        return _resolve_s3(text.rstrip("/"), credentials_dir)
    if text.startswith("s3:/"):
        raise UsageError(f"{text}: an S3 URL starts with s3:// (two slashes)")
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path}")
    if path.is_file() or path.suffix == ".dcp":
        candidates = (path.parent / "config.yaml", path.parent.parent / "config.yaml")
        return ResolvedCheckpoint(str(path), next((c for c in candidates if c.is_file()), None), credentials_dir)
    config_yaml = path / "config.yaml"
    if config_yaml.is_file():
        return _resolve_run_dir(path, config_yaml, credentials_dir)
    found = Checkpointer(str(path.resolve()), path).newest_valid()
    if found is None:
        raise UsageError(f"no valid checkpoint (NNNNNNN.pth) in {path}")
    parent_yaml = path.parent / "config.yaml"
    return ResolvedCheckpoint(str(found), parent_yaml if parent_yaml.is_file() else None, credentials_dir)


def _resolve_run_dir(run_dir: Path, config_yaml: Path, credentials_dir: str | None) -> ResolvedCheckpoint:
    """A run directory: where its config says its checkpoints are (a folder, or S3), newest valid."""
    from omegaconf import OmegaConf

    from fastgen.checkpoint.stores import S3Store, checkpoint_store

    config = OmegaConf.load(config_yaml)
    checkpointer = OmegaConf.select(config, "trainer.checkpointer")
    if checkpointer is None:
        raise UsageError(f"{config_yaml} has no trainer.checkpointer: not a fastgen run's config.yaml")
    log = OmegaConf.select(config, "log_config") or {}
    run_prefix = f"{log.get('project', '')}/{log.get('group', '')}/{log.get('name') or 'unnamed'}"
    credentials = credentials_dir or OmegaConf.select(config, "credentials_dir")
    store = checkpoint_store(checkpointer, run_dir, run_prefix, credentials)
    if isinstance(store, S3Store):
        newest = store.list()
        if not newest:
            raise UsageError(f"no valid checkpoint (NNNNNNN.pth) under {store.location}, where run directory "
                             f"{run_dir} keeps its checkpoints")
        return ResolvedCheckpoint(newest[-1][1], config_yaml, credentials)
    found = store.files.newest_valid() or Checkpointer(str(run_dir.resolve()), run_dir).newest_valid()
    if found is None:
        raise UsageError(f"no valid checkpoint (NNNNNNN.pth) in run directory {run_dir}")
    return ResolvedCheckpoint(str(found), config_yaml, credentials)


def _resolve_s3(url: str, credentials_dir: str | None) -> ResolvedCheckpoint:
    """An object or ``.dcp`` folder as it is; a prefix: its newest checkpoint, or that of ``prefix/checkpoints``
    (a run prefix)."""
    if url.endswith(CHECKPOINT_SUFFIXES):
        return ResolvedCheckpoint(url, None, credentials_dir)
    from fastgen.checkpoint.stores import S3Store

    for prefix in (url, f"{url}/checkpoints"):
        found = S3Store(prefix, None, credentials_dir).list()
        if found:
            return ResolvedCheckpoint(found[-1][1], None, credentials_dir)
    raise UsageError(f"no valid checkpoint (NNNNNNN.pth) under {url} or {url}/checkpoints")


def read_resolved(resolved: ResolvedCheckpoint) -> dict[str, Any]:
    """The whole checkpoint (a sharded one assembled into full tensors in this process), local or S3; a local
    ``.dcp`` folder is read through the marker beside it."""
    from fastgen.checkpoint.stores import read_whole_checkpoint

    checkpoint = resolved.checkpoint
    if not resolved.is_s3 and checkpoint.endswith(".dcp"):
        marker = Path(checkpoint).with_suffix(".pth")
        if not marker.is_file():
            raise UsageError(f"{checkpoint} has no marker {marker.name} beside it: give the marker, or convert the "
                             "folder with fastgen convert-ckpt")
        checkpoint = str(marker)
    return read_whole_checkpoint(checkpoint, resolved.credentials_dir)
