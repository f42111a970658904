"""The torch.distributed.checkpoint (DCP) pieces of fastgen's checkpoints, in a module of their own so that
importing the checkpoint manager does not import DCP (half a second of every process's start-up; one-process
runs never need it).

* ``SafeFileSystemReader`` / ``SafeLoadPlanner`` / ``SafeWholeLoadPlanner``: a DCP folder is read as every other
  checkpoint here is, without running code: ``.metadata`` and the non-tensor entries are pickles, read by the
  project's one unpickler (``fastgen.utils.safe_pickle``: exact names only).
* ``ReusedHostStager``: host staging buffers kept from one async save to the next.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from fastgen.utils.errors import CheckpointError
from fastgen.utils.safe_pickle import SafeUnpickler, UnsafePickleError, torch_load


def read_dcp_metadata(stream: IO[bytes], load_id: Any) -> Any:
    """DCP's ``.metadata`` (a pickle) through the project's one unpickler (``fastgen.utils.safe_pickle``), with
    the fix-up ``FileSystemReader.read_metadata`` applies; the local and the S3 reader both call this. A pickle
    naming anything but DCP's metadata classes raises ``CheckpointError``."""
    where = getattr(stream, "name", "a DCP .metadata")
    try:
        metadata = SafeUnpickler(stream).load()
    except UnsafePickleError as exc:
        raise CheckpointError(f"{where} is not DCP metadata fastgen loads: {exc}; it was not loaded") from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle raises many kinds
        raise CheckpointError(f"{where} is corrupt or truncated ({type(exc).__name__}: {str(exc)[:160]})") from None
    if type(metadata).__name__ != "Metadata" or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise CheckpointError(f"{where} is not DCP metadata (it holds a {type(metadata).__name__})")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = load_id
    return metadata


def check_metadata_bounds(metadata: Any, file_sizes: dict[str, int], where: str) -> None:
    """Refuse metadata that points outside its folder or declares more data than the folder holds.

    Every entry's storage is a byte range of a file *in the folder* (a bare name: no ``/``, no ``..``) that exists
    and is long enough, and every tensor's chunks hold at least the tensor's bytes. Loading allocates each tensor
    from its declared size before any byte is read, so without this a 100-byte ``.metadata`` declaring a
    10^12-element tensor would ask for terabytes; with it, what a load allocates is bounded by the folder's size."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ranges: dict[tuple[str, tuple[int, ...]], int] = {}
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        name = str(getattr(info, "relative_path", ""))
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise CheckpointError(f"{where} names the file {name!r} outside its folder; it was not loaded")
        offset, length = int(info.offset), int(info.length)
        if name not in file_sizes:
            raise CheckpointError(f"{where} names {name}, which is not in the checkpoint folder")
        if offset < 0 or length < 0 or offset + length > file_sizes[name]:
            raise CheckpointError(f"{where} declares bytes {offset}..{offset + length} of {name}, which holds "
                                  f"{file_sizes[name]}: the folder is incomplete or the metadata was altered")
        key = (str(index.fqn), tuple(int(v) for v in (index.offset or ())))
        ranges[key] = ranges.get(key, 0) + length
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        itemsize = torch.empty((), dtype=entry.properties.dtype).element_size()
        size = [int(n) for n in entry.size]
        covered = 0
        for chunk in entry.chunks:
            offsets, sizes = [int(v) for v in chunk.offsets], [int(v) for v in chunk.sizes]
            if len(offsets) != len(size) or any(o < 0 or n < 0 or o + n > d for o, n, d in zip(offsets, sizes, size)):
                raise CheckpointError(f"{where}: a chunk of {fqn} lies outside the tensor's declared size {size}")
            numel = math.prod(sizes)
            if numel * itemsize > ranges.get((fqn, tuple(offsets)), 0):
                raise CheckpointError(f"{where}: {fqn} declares {numel * itemsize} bytes at {offsets}, more than its "
                                      "storage holds; it was not loaded")
            covered += numel
        if any(n < 0 for n in size) or covered < math.prod(size):
            raise CheckpointError(f"{where}: the chunks of {fqn} do not cover its declared size {size}; it was not "
                                  "loaded")


class SafeDcpReading:
    """What the local and the S3 DCP readers share so that a DCP folder is read as every other checkpoint here is.

    * ``.metadata`` is read by the safe unpickler and checked against the folder (``check_metadata_bounds``), once
      per checkpoint and kept: fastgen calls ``read_metadata`` itself before ``dcp.load`` (``checked_metadata``),
      because DCP swallows a failure there and goes looking for per-rank metadata, which buries the reason ("names
      os.system") under a missing-file error; DCP's own call then gets the same object without a second read (or,
      on S3, a second download).
    * ``read_data`` is DCP's ``FileSystemReader.read_data`` with each stored tensor unpickled by the same safe
      unpickler (DCP's own uses torch's weights-only unpickler, a second rule set)."""

    path: Any
    fs: Any
    storage_data: Any
    transforms: Any
    load_id: Any
    _metadata_cache: dict[Any, Any]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        cache = self.__dict__.setdefault("_metadata_cache", {})
        rank = kwargs.get("rank")
        if rank not in cache:
            stream = self._metadata_stream(rank)
            metadata = read_dcp_metadata(stream, self.load_id)
            check_metadata_bounds(metadata, self._file_sizes(), str(getattr(stream, "name", self.path)))
            cache[rank] = metadata
        return cache[rank]

    def reset(self, checkpoint_id: Any = None) -> None:
        self.__dict__.pop("_metadata_cache", None)
        super().reset(checkpoint_id)  # type: ignore[misc]

    def _metadata_stream(self, rank: int | None) -> IO[bytes]:
        raise NotImplementedError

    def _file_sizes(self) -> dict[str, int]:
        raise NotImplementedError

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.planner import LoadItemType
        from torch.futures import Future

        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative_path, items in per_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                for item in items:
                    info = self.storage_data[item.storage_index]
                    raw = self.transforms.transform_load_stream(item, info.transform_descriptors or (),
                                                                self._slice_file(stream, info))
                    data = io.BytesIO(raw.read(-1))
                    if item.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(item, data)
                        continue
                    tensor = torch_load(data, what=f"{relative_path} (entry {item.storage_index.fqn})")
                    tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != tensor.size():
                        raise CheckpointError(f"{relative_path}: {item.storage_index.fqn} holds a tensor of shape "
                                              f"{tuple(tensor.size())} where {tuple(target.size())} was declared")
                    target.copy_(tensor)
                    planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done


def checked_metadata(reader: Any) -> Any:
    """Read (and so check) a reader's metadata before handing the reader to DCP (``SafeDcpReading``)."""
    return reader.read_metadata()


class SafeFileSystemReader(SafeDcpReading, FileSystemReader):
    """``FileSystemReader`` that reads a local DCP folder as ``SafeDcpReading`` describes."""

    def _metadata_stream(self, rank: int | None) -> IO[bytes]:
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as stream:
            data = io.BytesIO(stream.read())
        data.name = str(path)  # type: ignore[attr-defined] - names the file in errors
        return data

    def _file_sizes(self) -> dict[str, int]:
        folder = Path(self.path)
        return {entry.name: entry.stat().st_size for entry in folder.iterdir() if entry.is_file()}


class _WeightsOnlyBytes:
    """Non-tensor entries (e.g. optimizer hyper-parameters) load through the safe unpickler."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch_load(value, what=f"the entry {read_item.dest_index.fqn} of a DCP checkpoint")
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class SafeLoadPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default planner with weights-only loading of non-tensor entries."""


class SafeWholeLoadPlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """Rebuilds the whole state from the metadata (one process), weights-only."""


class ReusedHostStager(BlockingAsyncStager):
    """DCP's host staging for async saves with buffers kept from one save to the next.

    The default (the storage writer's own ``stage``, one writer per checkpoint) allocates a fresh host copy of
    every shard at each save, which is most of the time training waits for (``benchmarks/checkpoint_save.py``).
    Reusing the buffers is safe because at most one save is in flight: the next save waits for the previous one
    before staging into the same buffers. The cost is one host copy of this rank's shards kept for the run
    (pinned where CUDA is present, so device-to-host copies are fast). torch's ``BlockingAsyncStager`` with
    ``cache_staged_state_dict`` pins unconditionally, which fails on a CPU-only build, hence this subclass."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed._state_dict_utils import (
            _copy_state_dict,
            _create_cpu_state_dict,
        )

        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        return _copy_state_dict(state_dict, self.state_dict_cache, type_check=False)
