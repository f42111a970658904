"""Atomic file writes: a reader (or a resumed run) sees the old file or the complete new one, never half.

The data goes to a temporary file in the same folder, is flushed and fsynced, then ``os.replace``d over the
target (atomic on POSIX within one filesystem); the folder is fsynced so the rename survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Yield a file object whose content replaces ``path`` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_with(path: Path, writer: Callable[[IO], None]) -> None:
    """Atomically write ``path`` with ``writer(file_object)`` (e.g. ``torch.save``)."""
    with atomic_open(path, "wb") as handle:
        writer(handle)


def outermost_missing_folder(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (None if ``path`` exists): removing it
    undoes exactly what ``path.mkdir(parents=True)`` is about to create."""
    missing = None
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            break
        missing = folder
    return missing


def check_writable_dir(folder: Path) -> None:
    """Create ``folder`` if needed and prove it is writable, raising ``UsageError`` with the reason."""
    from fastgen.utils.errors import UsageError

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".fastgen-write-test-", delete=True)
        probe.close()
    except OSError as exc:
        raise UsageError(
            f"cannot write to output directory {folder}: {exc.strerror or exc}. "
            "Set FASTGEN_OUTPUT_ROOT to a writable folder."
        ) from None
