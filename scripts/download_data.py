"""Download and prepare the datasets that fastgen's image recipes read.

    python scripts/download_data.py cifar10 [--root DIR] [--url URL] [--md5 MD5] [--force] [--keep-archive]

cifar10: the official binary version of CIFAR-10 (cifar-10-binary.tar.gz, 162 MiB, from the University of
Toronto), verified against its published md5 and extracted to DIR/cifar10/cifar-10-batches-bin, where
``fastgen.datasets.cifar10.CIFAR10Dataset`` and the EDM/CIFAR-10 recipes find it. DIR defaults to
$DATA_ROOT_DIR, else ./data (a .env file in the working directory may set it).

The download goes to a ``.part`` file and resumes where it stopped when run again (HTTP Range); the archive is
renamed into place only after its md5 matches, and the extracted folder replaces any old one only after every
file checks out, so an interrupted run never leaves half a dataset. Extraction refuses links, devices, absolute
paths, ``..`` components and anything outside ``cifar-10-batches-bin/``. Nothing is unpickled: the binary
version is plain bytes.

imagenet: not supported yet (the ImageNet recipes are planned); the command says so and exits with status 2.

Exit status: 0 ready, 1 download or verification failure (run again to resume), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
ARCHIVE_NAME = "cifar-10-binary.tar.gz"
CHUNK = 1 << 20


class DownloadError(Exception):
    """A failure the user fixes by running the command again (network, checksum, archive content)."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def md5_of(path: Path) -> str:
    digest = hashlib.md5()  # noqa: S324 - the checksum CIFAR-10's authors publish, not a security control
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _progress(done: int, total: int | None, started: float, last: list[float]) -> None:
    """A progress line every 10% (or every 2 s when the size is unknown); ``\\r`` updates on a terminal."""
    now = time.monotonic()
    rate = done / max(now - started, 1e-6) / 2**20
    if total:
        step = int(10 * done / total)
        if step == last[0] and done < total:
            return
        last[0] = step
        text = f"  {done / 2**20:7.1f} / {total / 2**20:.1f} MiB ({100 * done / total:3.0f}%)  {rate:.1f} MiB/s"
    else:
        if now - last[1] < 2.0:
            return
        last[1] = now
        text = f"  {done / 2**20:7.1f} MiB  {rate:.1f} MiB/s"
    if sys.stderr.isatty():
        print("\r" + text, end="" if done != total else "\n", file=sys.stderr, flush=True)
    else:
        say(text)


def download(url: str, part: Path, timeout: float = 60.0) -> None:
    """Fetch ``url`` into ``part``, continuing an existing ``part`` with a Range request when the server allows."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fastgen-download-data"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) URL from the user
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part file is already complete (or longer than the file)
            return
        raise DownloadError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"cannot reach {url}: {reason}; run the command again to retry") from None
    with response:
        resumed = have > 0 and response.status == 206
        if have and not resumed:
            say(f"the server does not resume downloads; starting {url} again")
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        say(f"downloading {url}" + (f" (resuming at {have / 2**20:.1f} MiB)" if resumed else ""))
        started, last = time.monotonic(), [-1.0, 0.0]
        done = have
        try:
            with open(part, "ab" if resumed else "wb") as handle:
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    handle.write(block)
                    done += len(block)
                    _progress(done, total, started, last)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise DownloadError(f"download of {url} stopped at {done / 2**20:.1f} MiB ({exc}); "
                                "run the command again to resume") from None
    if total is not None and done != total:
        raise DownloadError(f"download of {url} stopped at {done} of {total} bytes; run the command again to resume")


def fetch_archive(url: str, md5: str, archive: Path) -> None:
    """Make ``archive`` a verified copy of ``url``: reuse a verified one, else (resume the) download."""
    if archive.exists():
        if md5_of(archive) == md5:
            say(f"using the verified archive {archive}")
            return
        archive.unlink()
    part = archive.with_name(archive.name + ".part")
    download(url, part)
    got = md5_of(part)
    if got != md5:
        part.unlink()
        raise DownloadError(f"md5 of the download from {url} is {got}, expected {md5}; the file was deleted - "
                            "run the command again (or check --url/--md5)")
    os.replace(part, archive)


def safe_members(tar: tarfile.TarFile, top: str) -> list[tarfile.TarInfo]:
    """Every member, after refusing anything that could write outside ``top/`` or is not a file or folder."""
    members = tar.getmembers()
    for member in members:
        path = PurePosixPath(member.name)
        if path.is_absolute() or ".." in path.parts or "\\" in member.name or "\0" in member.name:
            raise DownloadError(f"refusing archive member {member.name!r}: absolute path or '..'")
        if not (member.isfile() or member.isdir()):
            raise DownloadError(f"refusing archive member {member.name!r}: not a regular file or folder "
                                "(links and devices are not extracted)")
        if not path.parts or path.parts[0] != top:
            raise DownloadError(f"refusing archive member {member.name!r}: outside {top}/")
    return members


def extract_cifar10(archive: Path, target: Path) -> dict[str, dict[str, int]]:
    """Extract into a temporary folder, check every split, then swap ``target/cifar-10-batches-bin`` in."""
    from fastgen.datasets.cifar10 import BATCHES_DIR, check_split
    from fastgen.utils.errors import UsageError

    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=target))
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = safe_members(tar, BATCHES_DIR)
                tar.extractall(staging, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise DownloadError(f"cannot extract {archive}: {exc}; delete it and run the command again") from None
        try:
            counts = {split: check_split(staging / BATCHES_DIR, split) for split in ("train", "test")}
        except UsageError as exc:
            raise DownloadError(f"the archive from {archive} is not CIFAR-10 binary data: {exc}") from None
        final = target / BATCHES_DIR
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=target))
            os.replace(final, old / BATCHES_DIR)
        os.replace(staging / BATCHES_DIR, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return counts
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prepared_counts(target: Path) -> dict[str, dict[str, int]] | None:
    """Record counts of an already prepared copy, or None if it is missing or broken."""
    from fastgen.datasets.cifar10 import BATCHES_DIR, check_split
    from fastgen.utils.errors import UsageError

    if not (target / BATCHES_DIR).is_dir():
        return None
    try:
        return {split: check_split(target / BATCHES_DIR, split) for split in ("train", "test")}
    except UsageError:
        return None


def prepare_cifar10(root: Path, url: str, md5: str, force: bool, keep_archive: bool) -> Path:
    target = root / "cifar10"
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"cannot create {target}: {exc.strerror or exc}") from None
    if not force and (counts := prepared_counts(target)) is not None:
        say(f"CIFAR-10 is already prepared in {target} ({_summary(counts)}); --force prepares it again")
        return target
    archive = target / ARCHIVE_NAME
    fetch_archive(url, md5.lower(), archive)
    say(f"extracting {archive}")
    counts = extract_cifar10(archive, target)
    if not keep_archive:
        archive.unlink()
    say(f"CIFAR-10 ready in {target} ({_summary(counts)})")
    return target


def _summary(counts: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{sum(files.values()):,} {split} images" for split, files in counts.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/download_data.py",
        description="Download and prepare a dataset for fastgen's image recipes. Supported: cifar10 (the official "
                    "binary version, md5-verified). ImageNet is not supported yet.",
        epilog="Examples:\n  python scripts/download_data.py cifar10\n"
               "  DATA_ROOT_DIR=/datasets python scripts/download_data.py cifar10\n"
               "  python scripts/download_data.py cifar10 --root /datasets --keep-archive",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", choices=["cifar10", "imagenet"],
                        help="cifar10, or imagenet (not supported yet: exits with status 2)")
    parser.add_argument("--root", default=None,
                        help="data root; the dataset goes to ROOT/cifar10 (default: $DATA_ROOT_DIR, else ./data)")
    parser.add_argument("--url", default=CIFAR10_URL, help=f"archive URL (default: {CIFAR10_URL})")
    parser.add_argument("--md5", default=CIFAR10_MD5,
                        help=f"expected md5 of the archive (default: the official {CIFAR10_MD5}; for mirrors/tests)")
    parser.add_argument("--force", action="store_true", help="prepare again even if a valid copy exists")
    parser.add_argument("--keep-archive", action="store_true", help="keep the .tar.gz after extracting")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dataset == "imagenet":
        say("error: imagenet is not supported yet (no ImageNet recipe exists yet); only cifar10 can be prepared")
        return 2
    import fastgen  # noqa: F401 - loads .env, which may set DATA_ROOT_DIR

    root = Path(args.root or os.environ.get("DATA_ROOT_DIR") or "./data")
    try:
        prepare_cifar10(root, args.url, args.md5, args.force, args.keep_archive)
    except DownloadError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("error: interrupted; run the command again to resume the download")
        return 130
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
