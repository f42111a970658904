"""The torch.distributed.checkpoint (DCP) pieces of fastgen's checkpoints, in a module of their own so that
importing the checkpoint manager does not import DCP (half a second of every process's start-up; one-process
runs never need it).

* ``SafeFileSystemReader`` / ``SafeLoadPlanner`` / ``SafeWholeLoadPlanner``: a DCP folder is read as every other
  checkpoint here is, without running code: ``.metadata`` is a pickle, unpickled with an allowlist of DCP's own
  classes, and non-tensor entries load with ``weights_only=True``.
* ``ReusedHostStager``: host staging buffers kept from one async save to the next.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.staging import BlockingAsyncStager


class _DcpUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle: accept only the classes its metadata is made of."""

    _TORCH_NAMES: ClassVar[set[str]] = {"Size", "device", "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
                    "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "strided",
                    "sparse_coo", "contiguous_format", "preserve_format", "channels_last"}

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module.startswith("torch.distributed.checkpoint.")
            or (module == "torch" and name in self._TORCH_NAMES)
            or (module == "collections" and name == "OrderedDict")
            or (module == "builtins" and name in {"set", "frozenset", "slice"})
            or (module == "torch.serialization" and name == "_get_layout")  # a layout by its name
            or (module == "pathlib" and name in {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"})
        )
        if not allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint's metadata")
        return super().find_class(module, name)


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled with an allowlist (``_DcpUnpickler``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _DcpUnpickler(stream).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyBytes:
    """Non-tensor entries (e.g. optimizer hyper-parameters) load with ``weights_only=True``."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
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
