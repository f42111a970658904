"""The one unpickler of the project: every pickle fastgen reads goes through it, and it never runs code.

A checkpoint is a pickle (``torch.save``'s ``data.pkl`` inside a ``.pth`` zip, DCP's ``.metadata``, DCP's
non-tensor entries), and a pickle is a program: its ``GLOBAL`` / ``STACK_GLOBAL`` opcodes import any name and its
``REDUCE`` opcode calls it. Reading a file from a shared disk or a bucket must not run whatever it names, so
``SafeUnpickler.find_class`` resolves only the exact ``(module, name)`` pairs of ``ALLOWED`` - no prefix rule and no
dotted name (``pickle`` resolves ``name="os.system"`` under any allowed module that imported ``os``, which is how a
prefix rule on ``torch.distributed.checkpoint.*`` let a 100-byte ``.metadata`` run a shell command). Every
callable in ``ALLOWED`` only builds a value: containers, torch's dtypes / sizes / devices, tensors rebuilt from a
storage the file itself holds (whose size torch checks against the stored record), and DCP's metadata
dataclasses.

Nothing is unpickled "to check it" and then unpickled again by something laxer: readers use this class to produce
the object they return (``torch.load(pickle_module=...)`` for ``.pth`` files, ``read_dcp_metadata`` for DCP).
Errors never suggest loading with fewer checks: they say which name the file asked for and that a checkpoint
never holds it.
"""

from __future__ import annotations

import _compat_pickle
import io
import os
import pickle
import sys
import zipfile
from typing import IO, Any

from fastgen.utils.errors import CheckpointError, first_line

# torch's dtypes as pickles name them (``torch.float32``...): DCP's metadata records each tensor's dtype.
_DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
           "uint32", "uint64", "bool", "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
           "float8_e4m3fnuz", "float8_e5m2fnuz")
_DCP_METADATA = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")

#: The exact ``(module, name)`` pairs any fastgen pickle may name (module docstring). ``torch.save`` names its
#: storage classes (``torch.FloatStorage``...) too; ``torch.load`` maps those to dtype tags before this class
#: sees them, and they rebuild nothing.
ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("_codecs", "encode"),  # protocol 2 (torch.save's) pickles ``bytes`` as _codecs.encode(text, "latin1")
    ("torch", "Size"),
    ("torch", "device"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (DCP's TensorProperties)
    ("pathlib", "PosixPath"),  # a local FileSystemWriter records its folder as the checkpoint id
    ("pathlib", "PurePosixPath"),
    *(("torch", dtype) for dtype in _DTYPES),
    *(("torch.distributed.checkpoint.metadata", name) for name in _DCP_METADATA),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
})


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle named something outside ``ALLOWED`` (or used a persistent id where none belongs)."""


class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the exact pairs of ``allowed`` (default ``ALLOWED``; the memory
    profiler's snapshot reader passes an empty set: plain data only)."""

    def __init__(self, file: IO[bytes], *, allowed: frozenset[tuple[str, str]] = ALLOWED, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._allowed = allowed
        # An instance attribute, not a method: torch.load assigns its own storage loader the same way, and a
        # method defined on the class would take precedence over that assignment.
        self.persistent_load = _no_persistent_ids

    def find_class(self, module: str, name: str) -> Any:
        # Protocol 2 (torch.save's) writes Python 2 names (``__builtin__.set``); map them as pickle's own
        # find_class does, then check the Python 3 name.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) not in self._allowed:
            raise UnsafePickleError(f"it names {module}.{name}, which a file fastgen reads never holds")
        # Imported only now (every allowed module is part of torch or the standard library), and looked up by
        # exactly one attribute: never a dotted walk through the module's own imports.
        __import__(module)
        return getattr(sys.modules[module], name)


def _no_persistent_ids(pid: Any) -> Any:
    """Outside ``torch.load`` (which installs its storage loader) a persistent id has no meaning."""
    raise UnsafePickleError("it refers to external storage (a persistent id) where none belongs")


def load(file: IO[bytes], **kwargs: Any) -> Any:
    """``pickle.load`` through ``SafeUnpickler`` (the ``pickle_module`` interface ``torch.load`` calls)."""
    return SafeUnpickler(file, **kwargs).load()


def loads(data: bytes, **kwargs: Any) -> Any:
    """``pickle.loads`` through ``SafeUnpickler``."""
    return SafeUnpickler(io.BytesIO(data), **kwargs).load()


class _PickleModule:
    """What ``torch.load(pickle_module=...)`` needs of a pickle module: ``Unpickler``, ``load`` and a name.
    ``torch.load`` subclasses ``Unpickler`` to map storage names and installs its own ``persistent_load``; every
    other global still reaches ``SafeUnpickler.find_class``."""

    __name__ = "fastgen.utils.safe_pickle"
    Unpickler = SafeUnpickler
    UnpicklingError = pickle.UnpicklingError
    load = staticmethod(load)
    loads = staticmethod(loads)


pickle_module = _PickleModule()


def torch_load(source: str | os.PathLike[str] | IO[bytes], *, what: str | None = None, mmap: bool = False) -> Any:
    """``torch.load`` of a ``.pth`` file (or stream) through ``SafeUnpickler``, on the CPU.

    ``what`` names the file in errors (default: its path). A pickle that names anything outside ``ALLOWED``
    raises ``CheckpointError`` saying which name it asked for; a file that is not a torch archive at all (or a
    damaged one) raises ``CorruptFileError`` with torch's reason, first line only. ``mmap``: map the file instead
    of reading it (only the pages of the tensors used are read)."""
    import torch

    label = what if what is not None else str(source)
    if isinstance(source, (str, os.PathLike)) and not os.path.isfile(source):
        raise CheckpointError(f"{label}: no such file")
    if isinstance(source, (str, os.PathLike)) and not zipfile.is_zipfile(source):
        # torch.save has written zip archives since torch 1.6; anything else (a truncated file has no zip
        # directory at its end) would reach torch's legacy reader and fail with an opcode-level message.
        reason = "empty file" if os.path.getsize(source) == 0 else "no zip directory at its end"
        raise CorruptFileError(label, reason)
    try:
        # An explicit pickle_module is torch's documented hook for a restricted unpickler; torch's own
        # weights-only unpickler has a second, different allowlist that other libraries extend at import.
        return torch.load(source, map_location="cpu", mmap=mmap, pickle_module=pickle_module)
    except UnsafePickleError as exc:
        raise CheckpointError(f"{label} is not a checkpoint fastgen loads: {exc}; it was not loaded") from None
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, zipfile errors, ...
        raise CorruptFileError(label, first_line(exc).rstrip(".")[:300]) from None


class CorruptFileError(CheckpointError):
    """A file that exists but is not a whole torch archive (truncated, corrupt, something else)."""

    def __init__(self, label: str, reason: str) -> None:
        self.label, self.reason = label, reason
        super().__init__(f"{label} is corrupt, truncated or not a torch file ({reason})")

