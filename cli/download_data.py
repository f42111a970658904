"""``fastgen download-data``: download, verify and convert datasets into the image zips the recipes read.

The work is done by ``fastgen.datasets.prepare`` (library code, no terminal output); this module parses the
command line, draws the progress (Rich bars on a terminal, one line per step otherwise) and prints the results.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import typer

from fastgen.cli.common import console, interactive, out, setup_logging

EPILOG = """\b
Examples:

\b
  # CIFAR-10 into $DATA_ROOT_DIR/cifar10 (default ./data), where the EDM/CIFAR-10 recipes read it
  fastgen download-data cifar10
\b
  # several at once, somewhere else; an interrupted download resumes when run again
  fastgen download-data mnist fashion-mnist --output-dir /datasets
\b
  # ImageNet-64 from a local ImageNet download (Kaggle's ILSVRC/Data/CLS-LOC/train or ILSVRC-2012's train/)
  fastgen download-data imagenet64 --source /datasets/imagenet
\b
  # what is there, and whether it verifies
  fastgen download-data --list
\b
  # from a mirror: files are fetched from URL/<file name> ({dataset} in URL becomes the dataset's name)
  fastgen download-data mnist --mirror https://mirror.example.org/mnist
  fastgen download-data all --mirror 'https://mirror.example.org/{dataset}'

\b
Datasets: cifar10, mnist, fashion-mnist, imagenet64 (needs --source), digits (scikit-learn's bundled set,
exported for parity checks), all (imagenet64 only with --source). Each becomes EDM-style image zips (PNG files
+ dataset.json labels) in OUTPUT_DIR/<dataset>/. Downloads are checked against the md5s their authors publish;
a mirror that repackages (or a test) may give its own in FASTGEN_DATA_CHECKSUMS: a JSON file, or JSON text,
mapping file names to "md5:<hex>" or "sha256:<hex>".

\b
Exit status: 0 ready, 1 download/verification failure (run again to resume), 2 bad usage.
"""


class BarProgress:
    """Rich progress bars: bytes, rate and ETA for downloads; images and ETA for conversions."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._task: Any = None

    def start(self, description: str, total: int | None, completed: int = 0, unit: str = "bytes") -> None:
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        if unit == "bytes":
            columns = (DownloadColumn(), TransferSpeedColumn())
        else:
            columns = (MofNCompleteColumn(), TextColumn(unit))
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), *columns, TextColumn("ETA"),
                                  TimeRemainingColumn(), console=console())
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, completed=completed)

    def advance(self, amount: int) -> None:
        self._progress.advance(self._task, amount)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class LineProgress:
    """One line when a step starts and one when it ends (logs, pipes, CI)."""

    def __init__(self) -> None:
        self._started = 0.0
        self._done = 0
        self._unit = "bytes"
        self._description = ""

    def start(self, description: str, total: int | None, completed: int = 0, unit: str = "bytes") -> None:
        self._started, self._done, self._unit, self._description = time.monotonic(), completed, unit, description
        size = f" ({_amount(total, unit)})" if total else ""
        resumed = f", resuming at {_amount(completed, unit)}" if completed else ""
        console().print(f"{description}{size}{resumed}", soft_wrap=True, highlight=False, markup=False)

    def advance(self, amount: int) -> None:
        self._done += amount

    def finish(self) -> None:
        seconds = max(time.monotonic() - self._started, 1e-6)
        rate = f", {self._done / seconds / 2**20:.1f} MiB/s" if self._unit == "bytes" else ""
        console().print(f"  {self._description}: {_amount(self._done, self._unit)} in {seconds:.1f} s{rate}",
                        soft_wrap=True, highlight=False, markup=False)


def _amount(value: int | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit == "bytes":
        return f"{value / 2**20:,.1f} MiB"
    return f"{value:,} {unit}"


def download_data(
    datasets: Optional[List[str]] = typer.Argument(
        None, metavar="DATASET...", show_default=False,
        help="cifar10, mnist, fashion-mnist, imagenet64, digits or all."),
    output_dir: Optional[str] = typer.Option(
        None, "--output-dir", "-o", show_default=False,
        help="Where <dataset>/ folders go. Default: the data root, $DATA_ROOT_DIR (./data when unset)."),
    force: bool = typer.Option(False, "--force", help="Prepare again even if a verified copy is there."),
    mirror: Optional[str] = typer.Option(
        None, "--mirror", metavar="URL", show_default=False,
        help="Fetch files from URL/<file name> instead of the official servers ({dataset} in URL is replaced)."),
    source: Optional[str] = typer.Option(
        None, "--source", metavar="DIR", show_default=False,
        help="imagenet64: the local ImageNet download (the folder holding ILSVRC/Data/CLS-LOC/train or train/)."),
    list_: bool = typer.Option(False, "--list", help="Show each dataset, its size, and whether it is present and "
                                                     "verified; download nothing."),
) -> None:
    """Download, verify and convert datasets into the image zips the recipes read."""
    from pathlib import Path

    from fastgen.datasets import prepare as prep
    from fastgen.utils.env import data_root
    from fastgen.utils.errors import UsageError

    setup_logging("INFO")
    root = Path(output_dir or data_root()).expanduser()
    if list_:
        names = prep.resolve_names(datasets, has_source=True) if datasets else list(prep.DATASETS)
        _print_list(names, root)
        return
    names = prep.resolve_names(datasets or [], has_source=source is not None)
    if source is not None and "imagenet64" not in names:
        raise UsageError("--source is the local ImageNet download for imagenet64; the other datasets are downloaded")
    if mirror is not None and not mirror.startswith(("http://", "https://", "file://")):
        raise UsageError(f"--mirror {mirror!r} must be an http://, https:// or file:// URL")
    prep.check_mirror(names, mirror)
    if datasets and any(d.lower() == prep.ALL for d in datasets) and source is None:
        console().print("imagenet64 skipped: it is made from a local ImageNet download (--source DIR)")
    for name in names:
        progress = BarProgress() if interactive() else LineProgress()
        done = prep.prepare(name, root, force=force, mirror=mirror, source=Path(source) if source else None,
                            progress=progress)
        counts = ", ".join(f"{file} ({n:,} images)" for file, n in done.images.items())
        verb = "already prepared (--force prepares it again)" if done.already else "ready"
        out().print(f"{name} {verb} in {done.folder}: {counts}", soft_wrap=True, highlight=False, markup=False)


def _print_list(names: list[str], root: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fastgen.datasets import prepare as prep

    table = Table(title=f"datasets in {escape(str(root.resolve()))}", title_justify="left")
    for column in ("dataset", "download", "on disk", "status", "images"):
        table.add_column(column, justify="right" if column in ("download", "on disk") else "left")
    for name in names:
        status = prep.dataset_status(name, root)
        spec = prep.DATASETS[name]
        download = ("local (--source)" if spec.needs_source else "bundled" if not spec.files
                    else _amount(status.download_bytes, "bytes"))
        disk = _amount(status.disk_bytes, "bytes") if status.disk_bytes else "-"
        state = {"ready": "present, verified"}.get(status.state, status.state)
        if status.detail:
            state += f": {status.detail}"
        images = ", ".join(f"{n:,}" for n in status.images.values()) or "-"
        table.add_row(name, download, disk, escape(state), images)
    out().print(table)


def register(app: typer.Typer) -> None:
    app.command("download-data", epilog=EPILOG)(download_data)


__all__ = ["register", "download_data"]
