"""Convert checkpoints between formats, one bounded piece at a time: ``fastgen convert-ckpt``.

**Formats** (``fastgen.checkpoint.manager`` documents the first two):

* ``pth`` - a monolithic ``.pth``: one ``torch.save`` dict (networks, optimizers, schedulers, per-rank state);
* ``dcp`` - a sharded checkpoint: a DCP folder ``NAME.dcp/`` plus its marker ``NAME.pth`` (the non-tensor state,
  ``"layout": "sharded"``), written after the folder is complete;
* ``safetensors`` - network weights only (no optimizer or training state; the conversion says what it dropped):
  keys ``<network>.<parameter>`` with the network names in the header's ``networks`` metadata, or, for one
  network (``only``), the bare parameter names - a plain state dict that any safetensors loader reads.

A source is a ``.pth`` (monolithic, a sharded marker, or a bare state dict, which counts as the weights of ``net``
as ``load_checkpoint`` treats it), a ``.dcp`` folder, a ``.safetensors`` file, a checkpoints folder or a run
directory (its newest valid checkpoint), locally or under ``s3://bucket/prefix`` (``fastgen.checkpoint.s3``; objects
are downloaded to a temporary folder first, and a sharded checkpoint's folder on S3 is ``NNNNNNN/`` beside
``NNNNNNN.pth``).

**``only``** extracts one network (``ema``, ``fake_score``, ...) as the network ``net`` of a one-network checkpoint
- what ``model.teacher_ckpt``, ``model.student_ckpt`` and ``trainer.checkpointer.pretrained_ckpt_path`` take (a
teacher file; this replaces ``scripts/export_teacher.py``). **``dtype``** casts the floating-point *network*
weights; optimizer states keep their precision, so a converted full checkpoint still resumes.

**Memory.** Nothing is ever held whole. The tensors of the networks and optimizers are copied in pieces of at most
``piece_bytes`` (one tensor when a tensor is larger): a monolithic source is opened with
``torch.load(mmap=True, weights_only=True)`` once per piece (only the piece's pages are read, and they are unmapped
with it), a sharded one is read with DCP's planner restricted to the piece's keys, a safetensors file tensor by
tensor. Writers stream too: the ``.pth`` writer pickles the structure first with placeholders for the tensors
and then writes each tensor's bytes as its piece arrives (the zip layout ``torch.save`` writes, loadable with
``weights_only`` and ``mmap``); the DCP writer saves each piece with ``dcp.save`` under its own file prefix and
merges the pieces' metadata into one ``.metadata``; the safetensors writer writes the header from the shapes,
then the bytes. Peak memory is about one piece, whatever the checkpoint's size (``benchmarks/convert_ckpt_memory.py``).

**Checks.** The source must be a fastgen checkpoint; ``only`` must name one of its networks (the error lists them);
EMA networks must have the keys and shapes of ``net``, and each optimizer's state keys must be parameters of its
network; every tensor read must have the shape and dtype its source's index promised; and the written output is
reopened and its keys, shapes and dtypes compared with what was meant to be written.

**Atomicity.** A destination that exists is refused (nothing is overwritten). Files are written to a hidden
temporary name beside the target and renamed; a DCP folder is written under a temporary name and renamed, and its
marker is written after it; for ``s3://`` destinations everything is staged locally and uploaded last (the marker
after the folder, DCP's ``.metadata`` after the shards; a failed upload deletes what it uploaded). Whatever
fails, nothing half-written is left at the destination.

Errors: bad input (a missing source, not a checkpoint, an unknown network, an unknown format) is a one-line
``UsageError`` (exit code 2); a corrupt or inconsistent checkpoint is a one-line ``CheckpointError`` (exit code 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import pickle
import shutil
import struct
import sys
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastgen.checkpoint.checkpointer import FORMAT, VERSION, dcp_folder
from fastgen.checkpoint.dcp_safe import SafeFileSystemReader, SafeWholeLoadPlanner
from fastgen.utils.dtypes import FLOAT_DTYPES
from fastgen.utils.errors import CheckpointError, UsageError, first_line
from fastgen.utils.io import _fsync_dir, check_can_create, give_new_file_mode
from fastgen.utils.logging import get_logger
from fastgen.utils.safe_pickle import CorruptFileError, torch_load

logger = get_logger(__name__)

FORMATS = ("pth", "dcp", "safetensors")
DTYPES = FLOAT_DTYPES  # what --dtype takes
SECTIONS = ("model", "optimizers")  # the parts of a checkpoint whose tensors are streamed
PIECE_BYTES = 64 << 20
_SUFFIX_FORMAT = {".pth": "pth", ".pt": "pth", ".safetensors": "safetensors", ".dcp": "dcp"}
_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}

TreePath = tuple[Any, ...]


# ------------------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class TensorSpec:
    """A tensor that is not loaded: its dtype and shape."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _element_size(self.dtype)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tensor.dtype, tuple(tensor.shape))


@dataclass(frozen=True)
class Leaf:
    """One tensor to copy: where it is in the source, where it goes in the output, and what it becomes."""

    source: TreePath
    target: TreePath
    spec: TensorSpec  # the source's dtype and shape
    dtype: torch.dtype  # the output's dtype

    @property
    def output_spec(self) -> TensorSpec:
        return TensorSpec(self.dtype, self.spec.shape)


@dataclass
class ConversionResult:
    """What ``convert_checkpoint`` wrote."""

    source: str
    source_kind: str  # monolithic, sharded or safetensors
    destination: str
    marker: str | None  # the marker of a DCP output
    format: str
    iteration: int
    networks: list[str]
    tensors: int
    bytes: int
    dropped: list[str]  # parts of the source the output format cannot hold


# ---------------------------------------------------------------------------------------------------- sources
class Source:
    """A checkpoint opened for streaming: ``payload`` is the whole checkpoint with every tensor under ``model`` and
    ``optimizers`` replaced by a ``TensorSpec``; ``read(paths)`` loads just those tensors."""

    kind = ""
    payload: dict[str, Any]

    def __init__(self, path: Path, description: str) -> None:
        self.path = path
        self.description = description

    def read(self, paths: list[TreePath]) -> dict[TreePath, torch.Tensor]:
        raise NotImplementedError


class MonolithicSource(Source):
    """A ``.pth`` file: opened with ``mmap`` for the structure, and again for each piece."""

    kind = "monolithic"

    def __init__(self, path: Path, description: str) -> None:
        super().__init__(path, description)
        payload = self._open()
        if isinstance(payload, dict) and payload.get("format") == FORMAT and payload.get("layout") == "sharded":
            raise CheckpointError(f"{description} is the marker of a sharded checkpoint whose folder "
                                  f"{dcp_folder(path).name} is missing or incomplete")
        if isinstance(payload, dict) and payload.get("format") == FORMAT:
            pass
        elif isinstance(payload, dict) and payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
            payload = {"format": FORMAT, "version": 1, "iteration": 0, "model": {"net": payload}}  # a bare state dict
            self._bare = True
        else:
            raise UsageError(f"{description} is not a fastgen checkpoint (a torch file, but not a checkpoint dict "
                             "or a state dict)")
        payload.pop("layout", None)  # the output's layout is the writer's to set
        self.payload = _specs_in_sections(payload)
        del payload  # no page of the file stays mapped

    _bare = False

    def _open(self) -> Any:
        try:
            return torch_load(self.path, what=self.description, mmap=True)
        except CorruptFileError as exc:
            if _looks_like_zip(self.path):
                reason = exc.reason.split(". ")[0]
                raise CheckpointError(f"checkpoint {self.description} is corrupt or truncated ({reason})") from None
            raise CheckpointError(f"{self.description} is corrupt or not a checkpoint (not a torch zip file)") from None

    def read(self, paths: list[TreePath]) -> dict[TreePath, torch.Tensor]:
        payload = self._open()
        if self._bare:
            payload = {"model": {"net": payload}}
        return {path: _get(payload, path) for path in paths}


class ShardedSource(Source):
    """A sharded checkpoint: the marker's payload plus DCP's index; pieces are read through DCP's planner
    restricted to their keys (one process, no process group)."""

    kind = "sharded"

    def __init__(self, marker: Path, description: str) -> None:
        super().__init__(marker, description)
        self.folder = dcp_folder(marker)
        try:
            payload = torch_load(marker, what=description)
        except CorruptFileError as exc:
            raise CheckpointError(f"checkpoint marker {description} is corrupt or truncated ({exc.reason})") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise UsageError(f"{description} is not a fastgen checkpoint")
        try:
            self.metadata = SafeFileSystemReader(str(self.folder)).read_metadata()
        except CheckpointError:
            raise  # the safe reader's own one-line refusal
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"sharded checkpoint {self.folder} has unreadable metadata ({first_line(exc)})") from None
        missing = sorted({info.relative_path for info in self.metadata.storage_data.values()
                          if not (self.folder / info.relative_path).is_file()})
        if missing:
            raise CheckpointError(f"sharded checkpoint {self.folder} is incomplete: {', '.join(missing[:3])} missing")
        from torch.distributed.checkpoint._traverse import set_element
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.keys: dict[TreePath, str] = {}
        byte_keys = []
        for key, entry in self.metadata.state_dict_metadata.items():
            path = tuple(self.metadata.planner_data.get(key, (key,)))
            if isinstance(entry, TensorStorageMetadata):
                self.keys[path] = key
                set_element(payload, path, TensorSpec(entry.properties.dtype, tuple(entry.size)))
            else:
                byte_keys.append(key)
        if byte_keys:  # optimizer hyper-parameters and the like: small, read now
            values = self._load(set(byte_keys))
            for key in byte_keys:
                path = tuple(self.metadata.planner_data.get(key, (key,)))
                set_element(payload, path, _get(values, path))
        payload.pop("layout", None)  # the output's layout is the writer's to set
        self.payload = payload

    def _load(self, keys: set[str]) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        state: dict[str, Any] = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _load_state_dict(state, storage_reader=SafeFileSystemReader(str(self.folder)),
                                 planner=SafeWholeLoadPlanner(keys=keys), no_dist=True)
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException derives from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise CheckpointError(f"sharded checkpoint {self.folder} cannot be read: {first_line(exc)}") from None
        return state

    def read(self, paths: list[TreePath]) -> dict[TreePath, torch.Tensor]:
        state = self._load({self.keys[path] for path in paths})
        return {path: _get(state, path) for path in paths}


class SafetensorsSource(Source):
    """A ``.safetensors`` file written by this module (several networks) or any flat state dict (``net``)."""

    kind = "safetensors"

    def __init__(self, path: Path, description: str) -> None:
        super().__init__(path, description)
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                specs = {key: TensorSpec(_dtype_of(handle.get_slice(key).get_dtype()),
                                         tuple(handle.get_slice(key).get_shape())) for key in handle.keys()}
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{description} is not a readable safetensors file ({first_line(exc)})") from None
        networks = json.loads(metadata["networks"]) if "networks" in metadata else None
        model: dict[str, dict[str, TensorSpec]] = {}
        self.keys: dict[TreePath, str] = {}
        for key, spec in specs.items():
            if networks is None:
                net, name = "net", key
            else:
                net = next((n for n in networks if key.startswith(n + ".")), None)
                if net is None:
                    raise CheckpointError(f"{description}: tensor {key!r} belongs to none of the networks {networks}")
                name = key[len(net) + 1:]
            model.setdefault(net, {})[name] = spec
            self.keys[("model", net, name)] = key
        self.payload = {"format": FORMAT, "version": VERSION, "iteration": int(metadata.get("iteration", 0)),
                        "model": model}

    def read(self, paths: list[TreePath]) -> dict[TreePath, torch.Tensor]:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return {path: handle.get_tensor(self.keys[path]) for path in paths}


def open_source(path: Path, description: str | None = None) -> Source:
    """The reader for a local checkpoint path (a ``.pth`` - monolithic or a sharded marker -, a ``.dcp`` folder or
    a ``.safetensors`` file)."""
    description = description or str(path)
    if path.is_dir() and path.suffix == ".dcp":
        marker = path.with_suffix(".pth")
        if not marker.is_file():
            raise UsageError(f"{description} has no marker {marker.name}: an incomplete save, not a valid checkpoint")
        path = marker
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {description}")
    if path.suffix == ".safetensors":
        return SafetensorsSource(path, description)
    if (dcp_folder(path) / ".metadata").is_file():
        return ShardedSource(path, description)
    return MonolithicSource(path, description)


# ----------------------------------------------------------------------------------------------- the plan
def plan_output(payload: dict[str, Any], to: str, only: str | None, dtype: torch.dtype | None,
                source_name: str) -> tuple[dict[str, Any], list[Leaf], list[str]]:
    """The output's structure (``TensorSpec`` leaves for the tensors to stream), the tensors to copy in order, and
    what the output format drops."""
    networks = payload["model"]
    dropped: list[str] = []

    def leaves_of(section: str, name: str, target_name: str, cast: bool) -> list[Leaf]:
        found = []
        for path, spec in _spec_leaves(payload[section][name], (section, name)):
            out_dtype = dtype if cast and dtype is not None and spec.dtype.is_floating_point else spec.dtype
            found.append(Leaf(path, (section, target_name, *path[2:]), spec, out_dtype))
        return found

    if only is not None:
        leaves = leaves_of("model", only, "net", True)
        tree = {"format": FORMAT, "version": VERSION, "iteration": int(payload.get("iteration", 0)),
                "model": {"net": None},
                "source": f"{source_name}:{only} (iteration {int(payload.get('iteration', 0))})"}
        dropped = [n for n in networks if n != only] + (["optimizers"] if payload.get("optimizers") else [])
    else:
        leaves = [leaf for name in networks for leaf in leaves_of("model", name, name, True)]
        tree = dict(payload)
        if to == "safetensors":
            dropped = ["optimizers"] if payload.get("optimizers") else []
            dropped += [k for k in payload if k not in ("format", "version", "iteration", "model", "optimizers")]
        else:
            leaves += [leaf for name in (payload.get("optimizers") or {})
                       for leaf in leaves_of("optimizers", name, name, False)]
    tree = _with_sections(tree, leaves, payload)
    return tree, leaves, dropped


def _with_sections(tree: dict[str, Any], leaves: list[Leaf], payload: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with its ``model`` / ``optimizers`` rebuilt from the leaves (and the non-tensor entries of the
    copied sections, e.g. optimizer hyper-parameters)."""
    from torch.distributed.checkpoint._traverse import set_element

    out = {key: value for key, value in tree.items() if key not in SECTIONS}
    copied = {leaf.target[:2]: leaf.source[:2] for leaf in leaves}
    for (section, name), (src_section, src_name) in copied.items():
        for path, value in _all_leaves(payload[src_section][src_name], (section, name)):
            if not isinstance(value, TensorSpec):
                set_element(out, path, value)
    for leaf in leaves:
        set_element(out, leaf.target, leaf.output_spec)
    for section in SECTIONS:
        if section in tree and section not in out and tree[section] is not None:
            out[section] = {}
    return out


def check_consistency(payload: dict[str, Any], description: str) -> None:
    """Key sets and shapes that must agree within a checkpoint: every EMA network has ``net``'s keys and shapes,
    and each optimizer's state is keyed by parameters of its network. ``CheckpointError`` otherwise."""
    model = payload.get("model")
    if not isinstance(model, dict) or not model or not all(isinstance(v, dict) for v in model.values()):
        raise UsageError(f"{description} is not a fastgen checkpoint (no networks under 'model')")
    net = model.get("net")
    for name, state in model.items():
        if name.startswith("ema") and net is not None:
            _same_keys_and_shapes(net, state, f"{description}: network {name!r} does not match 'net'")
    for name, optimizer in (payload.get("optimizers") or {}).items():
        state = optimizer.get("state") if isinstance(optimizer, dict) else None
        if name not in model or not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            continue  # a version-1 optimizer (keyed by index) or one without a network of its name
        unknown = sorted(set(state) - set(model[name]))
        if unknown:
            raise CheckpointError(f"{description}: optimizer {name!r} has state for {len(unknown)} parameter(s) its "
                                  f"network lacks (first: {unknown[0]}): mismatched keys")


def _same_keys_and_shapes(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    if set(a) != set(b):
        extra, missing = sorted(set(b) - set(a)), sorted(set(a) - set(b))
        detail = f"{len(missing)} key(s) missing (first: {missing[0]})" if missing else f"{len(extra)} extra key(s) (first: {extra[0]})"
        raise CheckpointError(f"{what}: {detail}; mismatched keys")
    for key in a:
        sa, sb = _shape(a[key]), _shape(b[key])
        if sa != sb:
            raise CheckpointError(f"{what}: {key} has shape {list(sb)}, expected {list(sa)}; mismatched shapes")


# ----------------------------------------------------------------------------------------------- reading
def pieces(source: Source, leaves: list[Leaf], piece_bytes: int = PIECE_BYTES) -> Iterator[list[tuple[Leaf, torch.Tensor]]]:
    """The leaves' tensors in order, read in pieces of at most ``piece_bytes`` (or one tensor), each cast to its
    output dtype, contiguous, and checked against the source's index. A piece is released before the next is read."""
    batch: list[Leaf] = []
    size = 0
    for leaf in [*leaves, None]:
        if batch and (leaf is None or size + leaf.spec.nbytes > piece_bytes):
            tensors = source.read([item.source for item in batch])
            piece = [(item, _prepare(item, tensors[item.source], source.description)) for item in batch]
            del tensors
            yield piece
            del piece
            batch, size = [], 0
        if leaf is not None:
            batch.append(leaf)
            size += leaf.spec.nbytes


def _prepare(leaf: Leaf, tensor: Any, description: str) -> torch.Tensor:
    name = ".".join(map(str, leaf.source))
    if not isinstance(tensor, torch.Tensor) or TensorSpec.of(tensor) != leaf.spec:
        found = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise CheckpointError(f"checkpoint {description}: {name} is {found}, its index says "
                              f"{leaf.spec.dtype} {list(leaf.spec.shape)}; the checkpoint is corrupt")
    tensor = tensor.detach()
    if tensor.dtype != leaf.dtype:
        tensor = tensor.to(leaf.dtype)
    return tensor.contiguous()


# ----------------------------------------------------------------------------------------------- writers
def write_pth(path: Path, tree: dict[str, Any], leaves: list[Leaf], stream: Iterator[list[tuple[Leaf, torch.Tensor]]]) -> None:
    """Write ``tree`` as ``torch.save`` would, streaming the tensors: the pickle first (each tensor a reference to
    a storage record, as ``torch.save`` pickles it), then one ``data/<key>`` record per tensor as its piece
    arrives. Small tensors outside the streamed sections (random states) are written right after the pickle."""
    from torch.serialization import _get_storage_alignment, _open_zipfile_writer

    keys = {leaf.target: str(index) for index, leaf in enumerate(leaves)}
    inline: list[tuple[str, torch.Tensor]] = []

    def place(node: Any, prefix: TreePath) -> Any:
        if isinstance(node, TensorSpec):
            return _StoredTensor(keys[prefix], node)
        if isinstance(node, torch.Tensor):
            key = f"{len(keys) + len(inline)}"
            inline.append((key, node.detach().contiguous()))
            return _StoredTensor(key, TensorSpec.of(node))
        if isinstance(node, dict):
            return {k: place(v, (*prefix, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [place(v, (*prefix, i)) for i, v in enumerate(node)]
        if isinstance(node, tuple):
            return tuple(place(v, (*prefix, i)) for i, v in enumerate(node))
        return node

    buffer = io.BytesIO()
    _StoragePickler(buffer, protocol=2).dump(place(tree, ()))
    data = buffer.getvalue()
    with open(path, "wb") as handle, _open_zipfile_writer(handle) as writer:
        writer.write_record("data.pkl", data, len(data))
        writer.write_record(".format_version", "1", 1)
        alignment = str(_get_storage_alignment())
        writer.write_record(".storage_alignment", alignment, len(alignment))
        writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        for key, tensor in inline:
            storage = _own_storage(tensor)
            writer.write_record(f"data/{key}", storage, storage.nbytes())
        for piece in stream:
            for leaf, tensor in piece:
                storage = _own_storage(tensor)
                writer.write_record(f"data/{keys[leaf.target]}", storage, storage.nbytes())
    _fsync_file(path)


@dataclass(frozen=True)
class _StorageRef:
    key: str
    spec: TensorSpec


class _StoredTensor:
    """Pickles like a contiguous CPU tensor whose storage is the record ``data/<key>`` (``_rebuild_tensor_v2``,
    as ``torch.save`` pickles a tensor)."""

    def __init__(self, key: str, spec: TensorSpec) -> None:
        self.ref = _StorageRef(key, spec)

    def __reduce_ex__(self, protocol: int) -> Any:
        shape = self.ref.spec.shape
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return (torch._utils._rebuild_tensor_v2, (self.ref, 0, shape, stride, False, OrderedDict()))


class _StoragePickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[obj.spec.dtype])
            return ("storage", storage_type, obj.key, "cpu", math.prod(obj.spec.shape))
        return None


def write_dcp(folder: Path, leaves: list[Leaf], tree: dict[str, Any],
              stream: Iterator[list[tuple[Leaf, torch.Tensor]]]) -> None:
    """Write the sections of ``tree`` as one DCP checkpoint: each piece is a ``dcp.save`` of its own subtree under
    its own file prefix (``__<piece>_0.distcp``), and the pieces' metadata are merged into one ``.metadata``, written
    last."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._traverse import set_element

    folder.mkdir(parents=True)
    extras = [(path, value) for section in SECTIONS if section in tree
              for path, value in _all_leaves(tree[section], (section,)) if not isinstance(value, TensorSpec)]
    merged: Any = None
    for index, piece in enumerate(_with_first(stream)):
        state: dict[str, Any] = {}
        for path, value in (extras if index == 0 else []):
            set_element(state, path, value)
        for leaf, tensor in piece:
            set_element(state, leaf.target, tensor)
        writer = _piece_writer(str(folder), prefix=f"__{index}_")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.save(state, storage_writer=writer, no_dist=True)
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException derives from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise CheckpointError(f"writing {folder} failed: {first_line(exc)}") from None
        del state, piece
        merged = writer.metadata if merged is None else _merge_metadata(merged, writer.metadata)
    with open(folder / ".metadata", "wb") as handle:
        pickle.dump(merged, handle)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(folder)


def _with_first(stream: Iterator[list[Any]]) -> Iterator[list[Any]]:
    """The pieces, and one empty piece when there are none (the non-tensor entries still need a save)."""
    empty = True
    for piece in stream:
        empty = False
        yield piece
    if empty:
        yield []


def _merge_metadata(into: Any, other: Any) -> Any:
    into.state_dict_metadata.update(other.state_dict_metadata)
    into.storage_data.update(other.storage_data)
    if other.planner_data:
        into.planner_data = {**(into.planner_data or {}), **other.planner_data}
    return into


def _piece_writer_class() -> type:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StoragePrefix

    class PieceWriter(FileSystemWriter):
        """A ``FileSystemWriter`` for one piece: its files get the piece's prefix, and its metadata is kept for the
        merge instead of being written."""

        def __init__(self, path: str, prefix: str) -> None:
            super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)
            self.prefix = prefix
            self.metadata: Any = None

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            return [dataclasses.replace(plan, storage_data=_StoragePrefix(self.prefix)) for plan in plans]

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            metadata.storage_data = {result.index: result.storage_data for group in results for result in group}
            metadata.storage_meta = None
            self.metadata = metadata

    return PieceWriter


def _piece_writer(path: str, prefix: str) -> Any:
    return _piece_writer_class()(path, prefix)


def write_safetensors(path: Path, leaves: list[Leaf], names: list[str], metadata: dict[str, str],
                      stream: Iterator[list[tuple[Leaf, torch.Tensor]]]) -> None:
    """The safetensors format (an 8-byte little-endian header size, a JSON header with each tensor's dtype, shape
    and byte range, then the bytes in that order), written tensor by tensor: ``safetensors.torch.save_file`` needs
    every tensor in memory at once."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for leaf, name in zip(leaves, names):
        spec = leaf.output_spec
        if spec.dtype not in _SAFETENSORS_DTYPES:
            raise UsageError(f"{'.'.join(map(str, leaf.source))} has dtype {spec.dtype}, which safetensors cannot hold")
        header[name] = {"dtype": _SAFETENSORS_DTYPES[spec.dtype], "shape": list(spec.shape),
                        "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for piece in stream:
            for _, tensor in piece:
                if tensor.numel():
                    handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
        handle.flush()
        os.fsync(handle.fileno())


def safetensors_names(leaves: list[Leaf], only: str | None) -> list[str]:
    """Tensor names in a safetensors output: ``<network>.<parameter>``, or the bare parameter for one network."""
    return [str(leaf.target[2]) if only is not None else f"{leaf.target[1]}.{leaf.target[2]}" for leaf in leaves]


# ---------------------------------------------------------------------------------------------- verification
def verify_output(path: Path, fmt: str, expected: dict[str, TensorSpec]) -> None:
    """Reopen what was written (its index only) and compare names, shapes and dtypes with ``expected``."""
    found: dict[str, TensorSpec] = {}
    if fmt == "pth":
        payload = torch_load(path, mmap=True)
        for section in SECTIONS:
            for leaf_path, tensor in _tensor_leaves(payload.get(section) or {}, (section,)):
                found[".".join(map(str, leaf_path))] = TensorSpec.of(tensor)
        del payload
    elif fmt == "dcp":
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        metadata = SafeFileSystemReader(str(path)).read_metadata()
        for key, entry in metadata.state_dict_metadata.items():
            if isinstance(entry, TensorStorageMetadata):
                leaf_path = metadata.planner_data.get(key, (key,))
                found[".".join(map(str, leaf_path))] = TensorSpec(entry.properties.dtype, tuple(entry.size))
    else:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                view = handle.get_slice(key)
                found[key] = TensorSpec(_dtype_of(view.get_dtype()), tuple(view.get_shape()))
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        wrong = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
        first = (missing or extra or wrong)[0]
        raise CheckpointError(f"the written {fmt} output does not match its source ({len(missing)} missing, "
                              f"{len(extra)} extra, {len(wrong)} different key(s); first: {first}); nothing was kept")


def expected_index(leaves: list[Leaf], fmt: str, names: list[str]) -> dict[str, TensorSpec]:
    if fmt == "safetensors":
        return {name: leaf.output_spec for leaf, name in zip(leaves, names)}
    return {".".join(map(str, leaf.target)): leaf.output_spec for leaf in leaves}


# ------------------------------------------------------------------------------------------- locations
@dataclass
class Destination:
    """Where the output goes: ``path`` (a file, or a DCP folder) and, for DCP, its marker. For S3, ``remote`` and
    ``remote_marker`` are the object locations and ``path`` / ``marker`` the local staging names."""

    path: Path
    marker: Path | None = None
    remote: Any = None
    remote_marker: Any = None

    def describe(self) -> str:
        return str(self.remote if self.remote is not None else self.path)


def format_for(dst: str, to: str | None) -> str:
    """``to``, or the format DST's suffix implies (a folder or ``.dcp`` -> dcp); ``UsageError`` for a conflict."""
    if to is not None and to not in FORMATS:
        raise UsageError(f"--to {to}: expected one of {', '.join(FORMATS)} or diffusers")
    folder_like = dst.endswith("/") or (not _is_s3(dst) and Path(dst).expanduser().is_dir())
    suffix = "" if folder_like else Path(dst.rsplit("/", 1)[-1]).suffix.lower()
    if suffix and suffix not in _SUFFIX_FORMAT:
        raise UsageError(f"cannot tell the format of {dst!r} from its suffix {suffix}: name it .pth, .safetensors or "
                         ".dcp, or give a folder (ending in /)")
    implied = _SUFFIX_FORMAT.get(suffix)
    if to is None:
        return implied or "dcp"
    if implied is not None and implied != to:
        raise UsageError(f"--to {to} does not fit {dst!r} (a {implied} name)")
    return to


def _target_names(name: str, fmt: str, iteration: int, is_folder: bool) -> tuple[str, str | None]:
    """(file or DCP folder name, marker name): ``NNNNNNN.<format>`` inside a destination folder, else the
    destination's own name; a DCP folder ``X.dcp`` has the marker ``X.pth``."""
    if is_folder:
        name = f"{iteration:07d}.{fmt}"
    return name, (str(Path(name).with_suffix(".pth")) if fmt == "dcp" else None)


def local_destination(dst: str, fmt: str, iteration: int) -> Destination:
    target = Path(dst).expanduser()
    is_folder = dst.endswith("/") or target.is_dir() or not target.suffix
    folder = target if is_folder else target.parent
    name, marker = _target_names(target.name, fmt, iteration, is_folder)
    destination = Destination(folder / name, folder / marker if marker else None)
    for existing in (destination.path, destination.marker):
        if existing is not None and (existing.exists() or existing.is_symlink()):
            raise UsageError(f"{existing} exists: convert-ckpt never overwrites; choose a new destination")
    check_can_create(destination.path, "the destination", "Choose another DST.")
    return destination


# ------------------------------------------------------------------------------------------- publishing
@contextlib.contextmanager
def staged_file(target: Path) -> Iterator[Path]:
    """A hidden temporary path beside ``target``, renamed onto it when the block succeeds, removed otherwise. It has
    the mode a new file gets under the umask (``mkstemp`` makes it 0600, and writers that truncate keep that)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    give_new_file_mode(fd, name)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        os.replace(temporary, target)
        _fsync_dir(target.parent)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A hidden temporary folder path beside ``target`` (not yet created), renamed onto it on success, removed
    otherwise."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    temporary.rmdir()
    try:
        yield temporary
        os.rename(temporary, target)
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


# ------------------------------------------------------------------------------------------- entry point
def convert_checkpoint(src: str, dst: str, to: str | None = None, only: str | None = None, dtype: str | None = None,
                       credentials_dir: str | os.PathLike[str] | None = None, piece_bytes: int = PIECE_BYTES,
                       progress: Callable[[int, int], None] | None = None) -> ConversionResult:
    """Convert checkpoint ``src`` to ``dst`` (module docstring). ``progress(done_bytes, total_bytes)`` is called
    after each piece."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    fmt = format_for(dst, to)
    src, credentials_dir = _resolve_folder_source(src, credentials_dir)
    with tempfile.TemporaryDirectory(prefix="fastgen-convert-") as scratch:
        storage = None
        if _is_s3(src) or _is_s3(dst):
            from fastgen.checkpoint.s3 import S3Storage

            storage = S3Storage.from_config(credentials_dir)
        local_src, description = (_fetch_s3_source(storage, src, Path(scratch) / "src") if _is_s3(src)
                                  else (_resolve_local_source(src), None))
        source = open_source(local_src, description or str(local_src))
        payload = source.payload
        check_consistency(payload, source.description)
        networks = list(payload["model"])
        if only is not None and only not in networks:
            raise UsageError(f"{source.description} has no network {only!r} (it has: {', '.join(networks)})")
        iteration = int(payload.get("iteration", 0))
        tree, leaves, dropped = plan_output(payload, fmt, only, DTYPES.get(dtype or ""), _source_name(src, local_src))
        names = safetensors_names(leaves, only) if fmt == "safetensors" else []
        destination = (_s3_destination(storage, dst, fmt, iteration, Path(scratch) / "out") if _is_s3(dst)
                       else local_destination(dst, fmt, iteration))
        total = sum(leaf.spec.nbytes for leaf in leaves)
        done = 0

        def stream() -> Iterator[list[tuple[Leaf, torch.Tensor]]]:
            nonlocal done
            for piece in pieces(source, leaves, piece_bytes):
                yield piece
                done += sum(leaf.spec.nbytes for leaf, _ in piece)
                if progress is not None:
                    progress(done, total)

        expected = expected_index(leaves, fmt, names)
        _write(destination, fmt, tree, leaves, names, only, iteration, expected, stream())
        if destination.remote is not None:
            _upload(storage, destination)
    logger.info("converted %s to %s (%s, %d tensors)", source.description, destination.describe(), fmt, len(leaves))
    return ConversionResult(
        source=source.description, source_kind=source.kind, destination=destination.describe(),
        marker=str(destination.remote_marker or destination.marker) if fmt == "dcp" else None, format=fmt,
        iteration=iteration, networks=["net"] if only else networks, tensors=len(leaves),
        bytes=sum(leaf.output_spec.nbytes for leaf in leaves), dropped=dropped)


def _write(destination: Destination, fmt: str, tree: dict[str, Any], leaves: list[Leaf], names: list[str],
           only: str | None, iteration: int, expected: dict[str, TensorSpec],
           stream: Iterator[list[tuple[Leaf, torch.Tensor]]]) -> None:
    if fmt == "pth":
        if only is None:
            tree = {**tree, "layout": "monolithic"}  # as the checkpoint manager writes a full .pth
        with staged_file(destination.path) as temporary:
            write_pth(temporary, tree, leaves, stream)
            verify_output(temporary, fmt, expected)
    elif fmt == "safetensors":
        metadata = {"format": FORMAT, "iteration": str(iteration)}
        if only is None:
            metadata["networks"] = json.dumps(list(tree["model"]))
        else:
            metadata["source"] = str(tree.get("source", ""))
        with staged_file(destination.path) as temporary:
            write_safetensors(temporary, leaves, names, metadata, stream)
            verify_output(temporary, fmt, expected)
    else:
        assert destination.marker is not None
        marker_payload = {key: value for key, value in tree.items() if key not in SECTIONS}
        marker_payload["layout"] = "sharded"
        with staged_folder(destination.path) as temporary:
            write_dcp(temporary, leaves, tree, stream)
            verify_output(temporary, fmt, expected)
        try:
            with staged_file(destination.marker) as temporary_marker:
                torch.save(marker_payload, temporary_marker)
        except BaseException:
            shutil.rmtree(destination.path, ignore_errors=True)  # a folder without its marker is no checkpoint
            raise


# ---------------------------------------------------------------------------------------------- sources on disk
def _resolve_folder_source(src: str, credentials_dir: Any) -> tuple[str, Any]:
    """A local checkpoints folder or run directory becomes its newest valid checkpoint - which is an ``s3://`` one
    for a run that kept its checkpoints in S3 (then with the run's ``credentials_dir`` unless one was given).
    Everything else is returned as it is."""
    if _is_s3(src):
        return src, credentials_dir
    path = Path(src).expanduser()
    if not path.is_dir() or path.suffix == ".dcp":
        return src, credentials_dir
    from fastgen.checkpoint.source import resolve_checkpoint

    resolved = resolve_checkpoint(path, None if credentials_dir is None else os.fspath(credentials_dir))
    return resolved.checkpoint, credentials_dir if credentials_dir is not None else resolved.credentials_dir


def _resolve_local_source(src: str) -> Path:
    """A checkpoint file or ``.dcp`` folder for SRC (folders were resolved by ``_resolve_folder_source``)."""
    path = Path(src).expanduser()
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path}")
    return path


def _source_name(src: str, local: Path) -> str:
    return src.rstrip("/").rsplit("/", 1)[-1] if _is_s3(src) and src.endswith((".pth", ".safetensors")) else local.name


# ---------------------------------------------------------------------------------------------- S3
def _is_s3(text: str) -> bool:
    return isinstance(text, str) and text.startswith("s3://")


def _fetch_s3_source(storage: Any, src: str, scratch: Path) -> tuple[Path, str]:
    """Download the checkpoint SRC names (an object, a ``NNNNNNN.dcp`` DCP folder or a prefix's newest valid
    checkpoint) to ``scratch``; return the local path and the URL for messages."""
    from fastgen.checkpoint.s3 import S3Location, checkpoint_folder, newest_valid_checkpoint

    location = S3Location.parse(src)
    scratch.mkdir(parents=True, exist_ok=True)
    name = location.name
    if name.endswith(".safetensors"):
        return _download(storage, location, scratch / name), location.url
    if name.endswith(".pth"):
        marker = location
        folder = S3Location(location.bucket, location.key[: -len(".pth")] + ".dcp")
    elif name.endswith(".dcp"):
        folder = location
        marker = S3Location(folder.bucket, folder.key[: -len(".dcp")] + ".pth")
    else:
        found = newest_valid_checkpoint(storage, location)
        if found is None:
            found = newest_valid_checkpoint(storage, location.child("checkpoints"))
        if found is None:
            raise UsageError(f"no valid checkpoint (NNNNNNN.pth) under {location}")
        marker, folder = found.marker, found.folder or checkpoint_folder(location, found.iteration)
    if not storage.exists(marker):
        raise UsageError(f"checkpoint not found: {marker}")
    local = _download(storage, marker, scratch / marker.name)
    keys = storage.list_keys(folder)
    if keys:  # a sharded checkpoint: its DCP folder beside the marker
        local_folder = dcp_folder(local)
        for key in keys:
            relative = key[len(folder.folder_prefix):]
            _download(storage, S3Location(folder.bucket, key), local_folder / relative)
    return local, marker.url


def _download(storage: Any, location: Any, path: Path) -> Path:
    if not storage.exists(location):
        raise UsageError(f"checkpoint not found: {location}")
    return storage.download_file(location, path)


def _s3_destination(storage: Any, dst: str, fmt: str, iteration: int, scratch: Path) -> Destination:
    """Local staging paths and the objects they become. A DCP output on S3 has the local layout: the folder
    ``NNNNNNN.dcp`` beside its marker ``NNNNNNN.pth``."""
    from fastgen.checkpoint.s3 import S3Location

    location = S3Location.parse(dst)
    name = location.name
    is_folder = dst.endswith("/") or not Path(name).suffix or not location.key
    parent = location if is_folder else S3Location(location.bucket, location.key.rsplit("/", 1)[0] if "/" in location.key else "")
    file_name, marker_name = _target_names(name, fmt, iteration, is_folder)
    scratch.mkdir(parents=True, exist_ok=True)
    if fmt == "dcp":
        assert marker_name is not None
        remote = parent.child(f"{Path(file_name).stem}.dcp")
        remote_marker = parent.child(marker_name)
        if storage.exists(remote_marker) or storage.list_keys(remote):
            raise UsageError(f"{remote_marker} or {remote}/ exists: convert-ckpt never overwrites; choose a new destination")
        return Destination(scratch / f"{Path(file_name).stem}.dcp", scratch / f"{Path(file_name).stem}.pth",
                           remote, remote_marker)
    remote = parent.child(file_name)
    if storage.exists(remote):
        raise UsageError(f"{remote} exists: convert-ckpt never overwrites; choose a new destination")
    return Destination(scratch / file_name, None, remote)


def _upload(storage: Any, destination: Destination) -> None:
    """Upload the staged output: a file as one object; a DCP folder's shards, then its ``.metadata``, then the
    marker. A failure deletes what was uploaded."""
    from fastgen.checkpoint.s3 import S3Location

    if destination.remote_marker is None:
        storage.upload_file(destination.path, destination.remote)
        return
    remote: S3Location = destination.remote
    try:
        files = sorted(destination.path.iterdir(), key=lambda f: f.name == ".metadata")
        for file in files:
            storage.upload_file(file, remote.child(file.name))
        assert destination.marker is not None
        storage.upload_file(destination.marker, destination.remote_marker)
    except BaseException:
        with contextlib.suppress(Exception):
            storage.delete(destination.remote_marker)
            storage.delete_folder(remote)
        raise


# ---------------------------------------------------------------------------------------------- tree helpers
def _tensor_leaves(tree: Any, prefix: TreePath) -> Iterator[tuple[TreePath, torch.Tensor]]:
    for path, value in _all_leaves(tree, prefix):
        if isinstance(value, torch.Tensor):
            yield path, value


def _spec_leaves(tree: Any, prefix: TreePath) -> Iterator[tuple[TreePath, TensorSpec]]:
    for path, value in _all_leaves(tree, prefix):
        if isinstance(value, TensorSpec):
            yield path, value


def _all_leaves(tree: Any, prefix: TreePath) -> Iterator[tuple[TreePath, Any]]:
    """Every leaf of nested dicts and lists with its path (tuples, strings and numbers are leaves)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _all_leaves(value, (*prefix, key))
    elif isinstance(tree, list) and tree:
        for index, value in enumerate(tree):
            yield from _all_leaves(value, (*prefix, index))
    else:
        yield prefix, tree


def _specs_in_sections(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the tensors of its sections replaced by specs and every other tensor copied (small: random
    states), so that nothing refers to the mapped file any more."""

    def swap(tree: Any, spec: bool) -> Any:
        if isinstance(tree, torch.Tensor):
            return TensorSpec.of(tree) if spec else tree.clone()
        if isinstance(tree, dict):
            return {key: swap(value, spec) for key, value in tree.items()}
        if isinstance(tree, list):
            return [swap(value, spec) for value in tree]
        if isinstance(tree, tuple):
            return tuple(swap(value, spec) for value in tree)
        return tree

    return {key: swap(value, key in SECTIONS) for key, value in payload.items()}


def _get(tree: Any, path: TreePath) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, TensorSpec):
        return value.shape
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return None


def _own_storage(tensor: torch.Tensor) -> Any:
    """The tensor's storage holding exactly its elements (a copy for views into larger storages)."""
    storage = tensor.untyped_storage()
    if tensor.storage_offset() != 0 or storage.nbytes() != tensor.numel() * tensor.element_size():
        storage = tensor.clone().untyped_storage()
    return storage


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _dtype_of(safetensors_dtype: str) -> torch.dtype:
    by_code = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}
    if safetensors_dtype not in by_code:
        raise CheckpointError(f"safetensors dtype {safetensors_dtype} is not supported")
    return by_code[safetensors_dtype]


def _looks_like_zip(path: Path) -> bool:
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"
    return False


# ------------------------------------------------------------------------------------------- LoRA export
def export_merged(src: str, dst: str, only: str | None = None) -> dict[str, Any]:
    """``convert-ckpt --merge-lora``: rebuild the run of checkpoint ``src`` (its config.yaml; the base from its
    source, the adapter from the checkpoint), merge every adapted network and write a ``.pth`` at ``dst`` with
    plain networks (``--only NAME``: that network alone, as ``net`` - a teacher / initial-weights file). Nothing
    is left at ``dst`` on failure. Returns ``{"iteration", "networks", "merged"}``."""
    from fastgen.checkpoint.run import load_run
    from fastgen.utils.io import atomic_open
    from fastgen.utils.lora_utils import is_adapted, merge_lora

    target = Path(dst).expanduser()
    if "://" in src or "://" in dst:
        raise UsageError("--merge-lora reads and writes local files: copy the run from S3 first")
    if target.suffix != ".pth" or target.exists():
        raise UsageError(f"--merge-lora writes a new .pth file: {target} " +
                         ("exists" if target.exists() else "does not end in .pth"))
    run = load_run(src)
    modules = run.model.saved_modules  # a frozen teacher is not the run's to export (nor in its checkpoints)
    adapted = [name for name, module in modules.items() if is_adapted(module)]
    if not adapted:
        raise UsageError(f"{run.checkpoint} has no LoRA adapter (model.net_adapter was not set): convert it without "
                         "--merge-lora")
    if only is not None and only not in modules:
        raise UsageError(f"--only {only}: the run has {', '.join(modules)}")
    merged = {name: merge_lora(modules[name]) for name in adapted}
    chosen = {("net" if only else name): modules[name] for name in ([only] if only else list(modules))}
    payload = {"format": FORMAT, "version": VERSION, "iteration": run.iteration,
               "model": {name: {k: v.detach().cpu() for k, v in module.state_dict().items()}
                         for name, module in chosen.items()}}
    with atomic_open(target, "wb") as handle:
        torch.save(payload, handle)
    return {"iteration": run.iteration, "networks": list(chosen), "merged": merged}
