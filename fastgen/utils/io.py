"""Atomic file writes: a reader (or a resumed run) sees the old file or the complete new one, never half.

The data goes to a temporary file in the same folder, is flushed and fsynced, then ``os.replace``d over the
target (atomic on POSIX within one filesystem); the folder is fsynced so the rename survives a power cut.

File modes: ``tempfile.mkstemp`` creates its file 0600 (private, whatever the umask), and the rename keeps that
mode, so without care every checkpoint, ``config.yaml`` and sample grid would be unreadable to the teammates a
shared disk is shared with. The temporary file is therefore given the mode ``open(path, "w")`` would create a file
with, ``0o666 & ~umask`` (``new_file_mode``), before anything is written to it.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """This process's umask, read without changing it where the kernel allows.

    Why not ``os.umask``: it can only be read by setting it, and between setting and restoring it another thread
    (the asynchronous checkpoint writer) could create a file with the wrong mode. Linux reports the umask in
    ``/proc/self/status`` (4.7 and later); elsewhere the set-and-restore fallback runs under a lock, which at
    least keeps this module's own writers from racing each other.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # set to the private 0o077 meanwhile: a racing file comes out too private, never too open
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def new_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file: ``0o666`` less the umask."""
    return 0o666 & ~current_umask()


def give_new_file_mode(fd: int, path: Path | str) -> None:
    """Give a file made by ``tempfile.mkstemp`` (always 0600) the mode an ordinary new file would get, so the file
    it is renamed to is as readable as the user's umask intends. A filesystem that refuses ``chmod`` (some network
    mounts) keeps the private mode: the write itself matters more."""
    try:
        os.fchmod(fd, new_file_mode())
    except OSError as exc:
        logger.debug("could not set the mode of %s: %s", path, exc)


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Yield a file object whose content replaces ``path`` only if the block finishes without error. The new
    file's mode follows the umask (``new_file_mode``), as a file written with ``open`` would."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        give_new_file_mode(fd, tmp)
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


def check_writable_dir(folder: Path, what: str = "output directory",
                       hint: str = "Set FASTGEN_OUTPUT_ROOT to a writable folder.") -> None:
    """Create ``folder`` if needed and prove it is writable, raising ``UsageError`` that names ``what`` the folder is
    for, the reason (a parent that is a file is named) and ``hint``: what the user changes."""
    from fastgen.utils.errors import UsageError

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".fastgen-write-test-", delete=True)
        probe.close()
    except OSError as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a folder" if blocker is not None else (exc.strerror or str(exc))
        raise UsageError(f"cannot write to {what} {folder}: {reason}. {hint}") from None


def check_can_create(path: Path, what: str, hint: str) -> None:
    """Prove ``path`` can be created without creating anything that stays: its nearest existing ancestor is a folder
    this process can write in (a probe file there is made and removed). ``UsageError`` names ``what`` the path is,
    the reason and ``hint``. For outputs written late (after minutes of work), checked before the work."""
    from fastgen.utils.errors import UsageError

    path = Path(path).expanduser().absolute()
    ancestor = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if ancestor is None:
        return
    if not ancestor.is_dir():
        raise UsageError(f"cannot write {what} {path}: {ancestor} is a file, not a folder. {hint}")
    try:
        probe = tempfile.NamedTemporaryFile(dir=ancestor, prefix=".fastgen-write-test-", delete=True)
        probe.close()
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc} in {ancestor}. {hint}") from None


# What torch's zip writer says when a write comes back short (the disk filled up under it): it hides the OS error.
_SHORT_WRITE_MARKERS = ("unexpected pos", "PytorchStreamWriter failed writing")


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def mount_point(path: Path) -> Path:
    """The mount point (file system) ``path`` is on: its nearest existing ancestor, walked up to a mount."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def no_space_message(exc: BaseException, path: str | Path, needed: int | None = None) -> str | None:
    """``"No space left on device MOUNT writing PATH (N needed, M free)"`` when ``exc`` is a full disk, else ``None``.

    A full disk is an ``ENOSPC`` anywhere in the exception's chain, or torch's zip writer's short-write error
    ("unexpected pos") while the file system has less room than the write needed (or under 1 MiB when the size
    is unknown): torch raises that instead of the OS error."""
    import errno
    import shutil

    if str(path).startswith("s3://"):
        return None
    chain = list(_chain(exc))
    full = any(getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e) for e in chain)
    target = Path(path)
    try:
        free = shutil.disk_usage(mount_point(target)).free
    except OSError:
        free = None
    if not full and free is not None and any(m in str(e) for e in chain for m in _SHORT_WRITE_MARKERS):
        full = free < (needed if needed else 1 << 20)
    if not full:
        return None
    sizes = []
    if needed:
        sizes.append(f"{_human_bytes(needed)} needed")
    if free is not None:
        sizes.append(f"{_human_bytes(free)} free")
    detail = f" ({', '.join(sizes)})" if sizes else ""
    return f"No space left on device {mount_point(target)} writing {target}{detail}"


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


_MALFORMED_S3 = re.compile(r"^[sS]3:(?!//)|^S3://")


def check_url_form(text: str, what: str) -> None:
    """Refuse an S3 URL that is almost one (``s3:/bucket/key``, ``s3:bucket``, ``S3://...``): taken as a local path
    it would write a ``./s3:`` folder. ``what`` names the option or config key."""
    from fastgen.utils.errors import UsageError

    if isinstance(text, str) and _MALFORMED_S3.match(text):
        raise UsageError(f"{what}: {text!r} is not an S3 URL; write s3://bucket/key (lowercase, two slashes)")
