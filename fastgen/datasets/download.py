"""Fetch one file over HTTP(S): streamed, resumed after an interruption (HTTP Range), verified, placed atomically.

``fetch(url, destination, checksum)`` makes ``destination`` a verified copy of ``url``:

* a ``destination`` that already matches ``checksum`` is reused (nothing is downloaded);
* otherwise the bytes stream into ``destination.part``. A ``.part`` left by an interrupted run is continued with
  ``Range: bytes=N-``; a server that answers ``200`` instead of ``206`` gets the whole file again (logged), and
  ``416`` means the ``.part`` already holds everything;
* the finished ``.part`` is hashed; on a match it is renamed to ``destination`` (``os.replace``, atomic on one
  file system), on a mismatch it is deleted and ``DownloadError`` names both digests. So ``destination`` is either
  absent or verified - never half-written - whatever happens (network error, Ctrl-C, full disk).

**Why not pooch.** pooch (``pooch.HTTPDownloader``) downloads with ``requests`` into a file opened ``"w+b"``: an
interrupted 170 MB download starts again from byte 0, and its progress hook is tqdm-shaped. What this module
needs - Range resume, an atomic rename only after the digest matches, a progress callback the command line
draws with Rich - is ~100 lines of the standard library (``urllib``), so fastgen adds no dependency for it.

Library code: nothing here prints. Progress goes to a ``Progress`` object (the command line passes a Rich bar);
messages go to the ``fastgen`` logger.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastgen.utils.errors import FastGenRuntimeError, UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

CHUNK = 1 << 20
ALGORITHMS = {"md5": 32, "sha256": 64}  # name -> hex digest length


class DownloadError(FastGenRuntimeError):
    """A download or verification failure (exit code 1); running the command again retries or resumes."""


class Progress(Protocol):
    """What the download and conversion steps report; the command line draws it, tests may record it."""

    def start(self, description: str, total: int | None, completed: int = 0, unit: str = "bytes") -> None: ...

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    """A ``Progress`` that reports nothing (the library default)."""

    def start(self, description: str, total: int | None, completed: int = 0, unit: str = "bytes") -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass(frozen=True)
class Checksum:
    """An expected digest, written ``md5:<hex>`` or ``sha256:<hex>`` (a bare hex string: told apart by length)."""

    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, text: str) -> Checksum:
        text = text.strip().lower()
        algorithm, _, digest = text.rpartition(":")
        if not algorithm:
            algorithm = next((name for name, length in ALGORITHMS.items() if len(digest) == length), "")
        if ALGORITHMS.get(algorithm) != len(digest) or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(f"checksum {text!r} is not md5:<32 hex digits> or sha256:<64 hex digits>")
        return cls(algorithm, digest)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def matches(path: Path, checksum: Checksum) -> bool:
    return path.is_file() and file_digest(path, checksum.algorithm) == checksum.hexdigest


def part_path(destination: Path) -> Path:
    """Where the bytes of an unfinished download of ``destination`` are kept between runs."""
    return destination.with_name(destination.name + ".part")


def fetch(url: str, destination: Path, checksum: Checksum, progress: Progress | None = None,
          timeout: float = 60.0) -> Path:
    """Make ``destination`` a verified copy of ``url`` (see the module docstring); return it."""
    progress = progress or NoProgress()
    destination = Path(destination)
    if destination.exists():
        if matches(destination, checksum):
            logger.info("using the verified %s", destination)
            return destination
        destination.unlink()
    part = part_path(destination)
    _stream(url, part, progress, timeout)
    got = file_digest(part, checksum.algorithm)
    if got != checksum.hexdigest:
        part.unlink()
        raise DownloadError(f"{checksum.algorithm} of {url} is {got}, expected {checksum.hexdigest}; the download "
                            "was deleted - run the command again (or check --mirror)")
    os.replace(part, destination)
    return destination


def _stream(url: str, part: Path, progress: Progress, timeout: float) -> None:
    """Append ``url``'s bytes to ``part``, asking for the rest only when ``part`` already holds a prefix."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fastgen-download-data"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - an http(s) URL from the table
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the .part already holds the whole file
            return
        raise DownloadError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"cannot reach {url}: {reason}; run the command again to retry") from None
    with response:
        resumed = have > 0 and response.status == 206 and _range_start(response) == have
        if have and not resumed:
            logger.info("the server does not resume downloads; downloading %s from the start", url)
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        if resumed:
            logger.info("resuming %s at %.1f MiB", url, have / 2**20)
        progress.start(Path(part.name).stem, total, completed=have, unit="bytes")
        done = have
        try:
            with open(part, "ab" if resumed else "wb") as handle:
                while block := response.read(CHUNK):
                    handle.write(block)
                    done += len(block)
                    progress.advance(len(block))
                handle.flush()
                os.fsync(handle.fileno())
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadError(f"download of {url} stopped at {done:,} bytes ({exc}); run the command again to "
                                "resume") from None
        finally:
            progress.finish()
    if total is not None and done != total:
        raise DownloadError(f"download of {url} stopped at {done:,} of {total:,} bytes; run the command again to "
                            "resume")


def _range_start(response: http.client.HTTPResponse) -> int | None:
    """First byte of a ``206`` answer (``Content-Range: bytes START-END/TOTAL``), or None if it does not say."""
    value = response.headers.get("Content-Range", "")
    unit, _, spec = value.partition(" ")
    if unit != "bytes" or "-" not in spec:
        return None
    start = spec.split("-", 1)[0]
    return int(start) if start.isdigit() else None


__all__ = ["Checksum", "DownloadError", "NoProgress", "Progress", "fetch", "file_digest", "matches", "part_path"]
