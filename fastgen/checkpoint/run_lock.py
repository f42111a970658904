"""One run per run directory: a lock that a second ``fastgen train`` on the same directory meets, and that a killed
run cannot leave stuck.

Two runs writing one run directory share a W&B run id and overwrite each other's checkpoints, and both end with
exit 0: nothing tells the user until the numbers make no sense. So rank 0 of a run takes ``<run dir>/.fastgen.lock``
before it writes anything there, and holds it until the run ends.

**Mechanism.** ``flock`` on the lock file: the kernel releases it when the holding process dies (SIGKILL, an out-of-
memory kill, a node reboot), so a lock is never stale while it is *held*. On NFS, Linux implements ``flock`` with
the server's byte-range locks, so runs on two machines of a shared disk see each other too. The file's content -
host, pid, start time - is what the refusal names; content found in a file nobody holds is a crashed run's, and is
taken over with a warning. After ``flock`` succeeds the path must still be the file locked (a run that just ended
unlinks it; locking a file that is no longer the path's would let two runs in), else it tries again.

**S3.** Checkpoints in a bucket may be shared by runs on machines that share no disk: ``S3RunLock`` keeps a lock
object beside them (``fastgen.checkpoint.stores``) with the same content and a heartbeat the holder renews;
one whose heartbeat is older than ``S3_STALE_S`` is a crashed run's.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastgen.utils.errors import UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)
LOCK_NAME = ".fastgen.lock"
S3_HEARTBEAT_S = 30.0
S3_STALE_S = 300.0  # ten missed heartbeats: a run that stopped renewing has ended without releasing


class RunDirectoryBusy(UsageError):
    """Another live run holds the run directory (exit 2: give this run its own ``log_config.name``)."""


def _holder() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "token": uuid.uuid4().hex}


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host node7 since 2026-12-04T10:00:00+00:00`` (what is known of it)."""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} "
            f"since {holder.get('since', 'an unknown time')}")


def _busy(where: str, holder: dict[str, Any]) -> RunDirectoryBusy:
    return RunDirectoryBusy(f"{where} is in use by another run ({describe(holder)}): a run directory holds one run; "
                            "give this run its own log_config.name, or wait for that one to end")


def _parse(text: str) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        found = json.loads(text)
        if isinstance(found, dict):
            return found
    return {}


class RunLock:
    """The lock of one local run directory (module docstring). ``acquire`` raises ``RunDirectoryBusy`` when a live
    run holds it; ``release`` removes it. Use on global rank 0 only."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                text = os.pread(fd, 4096, 0).decode(errors="replace")
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _busy(str(self.path.parent), _parse(text)) from None
                raise
            if not self._still_the_path(fd):
                os.close(fd)  # the previous holder removed it between our open and our lock: take the new one
                continue
            left = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            if left:
                logger.warning("%s was left by a run that is no longer running (%s): taking it over",
                               self.path, describe(_parse(left)))
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_holder()).encode(), 0)
            os.fsync(fd)
            self._fd = fd
            return

    def _still_the_path(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file, then let go (in that order: a run waiting on this file then finds it gone and
        tries again, instead of holding a file no longer at the path). A run directory removed already is fine."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if self._still_the_path(self._fd):
                self.path.unlink()
        os.close(self._fd)
        self._fd = None


class S3RunLock:
    """The lock object of a run's checkpoints in S3 (module docstring). ``storage`` is a ``fastgen.checkpoint.s3``
    ``S3Storage``, ``location`` the lock object's ``S3Location``."""

    def __init__(self, storage: Any, location: Any) -> None:
        self.storage, self.location = storage, location
        self.holder = _holder()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        existing = self._read()
        if existing is not None:
            age = time.time() - float(existing.get("heartbeat", 0))
            if age < S3_STALE_S:
                raise _busy(self.location.url.rsplit("/", 1)[0], existing)
            logger.warning("%s was left by a run that stopped renewing it %.0f s ago (%s): taking it over",
                           self.location.url, age, describe(existing))
        self._write()
        # S3 has no create-if-absent everywhere: two runs starting together both write, the last write wins, and
        # the one that reads back another token has lost.
        time.sleep(0.5)
        found = self._read()
        if found is not None and found.get("token") != self.holder["token"]:
            raise _busy(self.location.url.rsplit("/", 1)[0], found)
        self._thread = threading.Thread(target=self._renew, name="fastgen-s3-run-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            with contextlib.suppress(Exception):  # noqa: BLE001 - a lock left behind turns stale by itself
                found = self._read()
                if found is not None and found.get("token") == self.holder["token"]:
                    self.storage.delete(self.location)

    def _renew(self) -> None:
        while not self._stop.wait(S3_HEARTBEAT_S):
            try:
                self._write()
            except Exception as exc:  # noqa: BLE001 - a missed heartbeat is not a failure of the run
                logger.warning("renewing the run lock %s failed: %s", self.location.url, exc)

    def _write(self) -> None:
        self.storage.upload_bytes(json.dumps({**self.holder, "heartbeat": time.time()}).encode(), self.location)

    def _read(self) -> dict[str, Any] | None:
        from fastgen.checkpoint.s3 import S3NotFoundError

        try:
            return _parse(self.storage.read_bytes(self.location).decode(errors="replace"))
        except S3NotFoundError:
            return None
