"""What ``fastgen download-data`` prepares: the table of datasets (files, checksums, outputs) and the steps.

Each dataset ends as EDM-style image zips (``fastgen.datasets.image_zip``) in ``<output dir>/<dataset>/``; the
output dir defaults to the data root, ``$DATA_ROOT_DIR`` (``fastgen.utils.env.data_root``), where the recipes
look (``fastgen.configs.data``).

=================  ====================================================  ==========================================
dataset            source                                                writes (in ``<output dir>/<dataset>/``)
=================  ====================================================  ==========================================
``cifar10``        ``cifar-10-binary.tar.gz`` (Krizhevsky 2009)          ``cifar10-32x32.zip`` (50,000, the name
                                                                         EDM's README uses), ``cifar10-32x32-test.zip``
``mnist``          the four IDX ``.gz`` files (LeCun et al.)             ``mnist-32x32.zip`` (60,000, padded to 32x32
                                                                         as EDM's tool does), ``mnist-32x32-test.zip``
``fashion-mnist``  the four IDX ``.gz`` files (Xiao et al. 2017)         ``fashion-mnist-32x32.zip``, ``...-test.zip``
``imagenet64``     a local ImageNet folder (``--source``)                ``imagenet-64x64.zip`` (EDM's center-crop)
``digits``         scikit-learn's bundled digits (nothing downloaded)    ``digits-8x8.zip``, ``digits-8x8-val.zip``
=================  ====================================================  ==========================================

**Checksums** are the ones the datasets' authors publish (CIFAR-10's md5 is on its web page; MNIST's and
Fashion-MNIST's are the md5s torchvision pins). A mirror (``--mirror``) must serve byte-identical files. For a
mirror that repackages and for tests, ``FASTGEN_DATA_CHECKSUMS`` may name a JSON file (or hold the JSON itself)
mapping file names to ``md5:<hex>`` / ``sha256:<hex>``; entries there replace the table's. Library callers pass
``checksums=`` instead.

**Atomicity.** Downloads and conversions happen in ``<output dir>/.downloads/<dataset>/`` (``.part`` files stay
there between runs, so a second run resumes); the finished zips are renamed into ``<output dir>/<dataset>/`` only
once all of them are written, followed by ``manifest.json`` (the sources' checksums, each zip's image count and
size: what ``--list`` verifies against), and ``.downloads/<dataset>`` is removed after a success. A failure leaves nothing in
``<output dir>/<dataset>/`` that was not there before (an archive that verified but cannot be read is deleted, so
the next run downloads it again).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fastgen.datasets.download import Checksum, DownloadError, Progress, fetch
from fastgen.datasets.image_files import inspect_image_set, write_image_zip
from fastgen.utils.errors import FastGenRuntimeError, UsageError
from fastgen.utils.io import atomic_write_text
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

CHECKSUMS_VARIABLE = "FASTGEN_DATA_CHECKSUMS"
STAGING = ".downloads"
MANIFEST = "manifest.json"  # beside the zips: their sources' checksums, image counts and sizes (for --list)
IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC-2012 train: what --list quotes for imagenet64 (the source decides)


Converted = dict[str, tuple[Iterable[tuple[bytes, "int | None"]], int]]  # file -> ((png, label) items, count)


@dataclass(frozen=True)
class RemoteFile:
    name: str
    base_url: str
    checksum: str
    size: int  # bytes, as published


@dataclass(frozen=True)
class Output:
    file: str
    split: str
    images: int | None  # the expected count; None when the source decides (imagenet64)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    outputs: tuple[Output, ...]
    files: tuple[RemoteFile, ...] = ()
    needs_source: bool = False
    convert: Callable[..., Converted] = field(default=lambda **_: {}, repr=False)


# ----------------------------------------------------------------------------------------------- converters
# Each returns {output file: ((png bytes, label) items, count)} from the verified raw files in `raw` (or from
# `source`); the readers check the raw formats eagerly, the PNG encoding runs while the zip is written.
def _in_memory(images_and_labels: tuple) -> tuple[Iterable[tuple[bytes, int | None]], int]:
    from fastgen.datasets.sources import encoded

    return encoded(*images_and_labels), len(images_and_labels[1])


def _convert_cifar10(raw: Path, **_: object) -> Converted:
    from fastgen.datasets.sources import read_cifar10_archive

    splits = read_cifar10_archive(raw / "cifar-10-binary.tar.gz")
    return {"cifar10-32x32.zip": _in_memory(splits["train"]), "cifar10-32x32-test.zip": _in_memory(splits["test"])}


def _idx_converter(prefix: str) -> Callable[..., Converted]:
    def convert(raw: Path, **_: object) -> Converted:
        from fastgen.datasets.sources import read_idx

        train = read_idx(raw / "train-images-idx3-ubyte.gz", raw / "train-labels-idx1-ubyte.gz")
        test = read_idx(raw / "t10k-images-idx3-ubyte.gz", raw / "t10k-labels-idx1-ubyte.gz")
        return {f"{prefix}-32x32.zip": _in_memory(train), f"{prefix}-32x32-test.zip": _in_memory(test)}

    return convert


def _convert_digits(**_: object) -> Converted:
    from fastgen.datasets.sources import digits_split

    return {"digits-8x8.zip": _in_memory(digits_split("train")), "digits-8x8-val.zip": _in_memory(digits_split("val"))}


def _convert_imagenet64(source: Path, workers: int | None = None, **_: object) -> Converted:
    from fastgen.datasets.sources import imagenet_files, imagenet_png

    files, synsets = imagenet_files(source)
    if len(synsets) != 1000:
        logger.warning("%s has %d synset folders (ImageNet-1k has 1,000); labels are their sorted order",
                       source, len(synsets))
    return {"imagenet-64x64.zip": (_ordered_map(imagenet_png, files, workers), len(files))}


def _ordered_map(function: Callable, items: list, workers: int | None, window: int = 4096) -> Iterator:
    """``map(function, items)`` on a process pool, in order, at most ``window`` items in flight (1.28M ImageNet
    files decode in ~1 h on 32 cores instead of a day on one). Few items or ``workers <= 1``: in this process."""
    workers = min(32, os.cpu_count() or 1) if workers is None else workers
    if workers <= 1 or len(items) < 64:
        yield from map(function, items)
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(items), window):
            yield from pool.map(function, items[start:start + window], chunksize=32)


# ---------------------------------------------------------------------------------------------------- table
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/"
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in (
        DatasetSpec(
            "cifar10", "CIFAR-10, 32x32 RGB, 10 classes (the official binary version)",
            outputs=(Output("cifar10-32x32.zip", "train", 50_000), Output("cifar10-32x32-test.zip", "test", 10_000)),
            files=(RemoteFile("cifar-10-binary.tar.gz", CIFAR10_URL, "md5:c32a1d4ab5d03f1284b67883e8d87530",
                              170_052_171),),
            convert=_convert_cifar10,
        ),
        DatasetSpec(
            "mnist", "MNIST handwritten digits, 28x28 padded to 32x32, 10 classes",
            outputs=(Output("mnist-32x32.zip", "train", 60_000), Output("mnist-32x32-test.zip", "test", 10_000)),
            files=(
                RemoteFile("train-images-idx3-ubyte.gz", MNIST_URL, "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873", 9_912_422),
                RemoteFile("train-labels-idx1-ubyte.gz", MNIST_URL, "md5:d53e105ee54ea40749a09fcbcd1e9432", 28_881),
                RemoteFile("t10k-images-idx3-ubyte.gz", MNIST_URL, "md5:9fb629c4189551a2d022fa330f9573f3", 1_648_877),
                RemoteFile("t10k-labels-idx1-ubyte.gz", MNIST_URL, "md5:ec29112dd5afa0611ce80d1b7f02629c", 4_542),
            ),
            convert=_idx_converter("mnist"),
        ),
        DatasetSpec(
            "fashion-mnist", "Fashion-MNIST, 28x28 padded to 32x32, 10 classes",
            outputs=(Output("fashion-mnist-32x32.zip", "train", 60_000),
                     Output("fashion-mnist-32x32-test.zip", "test", 10_000)),
            files=(
                RemoteFile("train-images-idx3-ubyte.gz", FASHION_MNIST_URL, "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                           26_421_880),
                RemoteFile("train-labels-idx1-ubyte.gz", FASHION_MNIST_URL, "md5:25c81989df183df01b3e8a0aad5dffbe",
                           29_515),
                RemoteFile("t10k-images-idx3-ubyte.gz", FASHION_MNIST_URL, "md5:bef4ecab320f06d8554ea6380940ec79",
                           4_422_102),
                RemoteFile("t10k-labels-idx1-ubyte.gz", FASHION_MNIST_URL, "md5:bb300cfdad3c16e7a12a480ee83cd310",
                           5_148),
            ),
            convert=_idx_converter("fashion-mnist"),
        ),
        DatasetSpec(
            "imagenet64", "ImageNet-1k train at 64x64 (EDM's center crop + Lanczos), from a local copy (--source)",
            outputs=(Output("imagenet-64x64.zip", "train", None),),
            needs_source=True, convert=_convert_imagenet64,
        ),
        DatasetSpec(
            "digits", "scikit-learn's bundled 8x8 digits (train/val as DigitsDataset), for parity checks",
            outputs=(Output("digits-8x8.zip", "train", 1_617), Output("digits-8x8-val.zip", "val", 180)),
            convert=_convert_digits,
        ),
    )
}
ALL = "all"


# ------------------------------------------------------------------------------------------------ requests
def resolve_names(names: Iterable[str], has_source: bool) -> list[str]:
    """Dataset names in table order, ``all`` expanded (imagenet64 only with a source); UsageError if unknown."""
    wanted: list[str] = []
    for name in names:
        key = name.strip().lower()
        if key == ALL:
            wanted += [n for n, spec in DATASETS.items() if has_source or not spec.needs_source]
        elif key in DATASETS:
            wanted.append(key)
        else:
            from fastgen.configs.schema import did_you_mean

            raise UsageError(f"unknown dataset {name!r}; {did_you_mean(key, [*DATASETS, ALL], noun='datasets')}")
    if not wanted:
        raise UsageError(f"name a dataset to prepare ({', '.join(DATASETS)} or {ALL}), or use --list")
    return [n for n in DATASETS if n in wanted]


def checksum_overrides(explicit: Mapping[str, str] | None = None) -> dict[str, Checksum]:
    """``{file name: Checksum}`` from ``FASTGEN_DATA_CHECKSUMS`` (a JSON file or JSON text) and ``explicit``."""
    table: dict[str, str] = {}
    text = os.environ.get(CHECKSUMS_VARIABLE, "").strip()
    if text:
        if not text.startswith("{"):
            try:
                text = Path(text).expanduser().read_text()
            except OSError as exc:
                raise UsageError(f"{CHECKSUMS_VARIABLE}={text}: cannot read it ({exc.strerror or exc})") from None
        try:
            loaded = json.loads(text)
        except ValueError:
            raise UsageError(f"{CHECKSUMS_VARIABLE} must be a JSON object {{file name: 'md5:<hex>'}}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"{CHECKSUMS_VARIABLE} must be a JSON object {{file name: 'md5:<hex>'}}")
        table.update({str(k): str(v) for k, v in loaded.items()})
    table.update(explicit or {})
    return {name: Checksum.parse(value) for name, value in table.items()}


def file_url(remote: RemoteFile, dataset: str, mirror: str | None) -> str:
    """The official URL, or ``mirror/<file>`` (``{dataset}`` in the mirror is replaced by the dataset's name)."""
    if not mirror:
        return remote.base_url + remote.name
    return mirror.replace("{dataset}", dataset).rstrip("/") + "/" + remote.name


def check_mirror(names: list[str], mirror: str | None) -> None:
    """Two datasets that share file names (mnist, fashion-mnist) cannot come from one flat mirror folder."""
    if not mirror or "{dataset}" in mirror:
        return
    seen: dict[str, str] = {}
    for name in names:
        for remote in DATASETS[name].files:
            if remote.name in seen:
                raise UsageError(f"{seen[remote.name]} and {name} both have a file {remote.name}: give one dataset "
                                 "per --mirror, or put {dataset} in the mirror URL (e.g. https://host/data/{dataset})")
            seen[remote.name] = name


# ------------------------------------------------------------------------------------------------- prepare
@dataclass(frozen=True)
class Prepared:
    name: str
    folder: Path
    images: dict[str, int]  # output file -> images
    already: bool = False  # found ready; nothing was done


def prepare(name: str, output_dir: Path, *, force: bool = False, mirror: str | None = None,
            source: Path | None = None, checksums: Mapping[str, str] | None = None,
            progress: Progress | None = None, workers: int | None = None) -> Prepared:
    """Download (or read from ``source``), verify and convert one dataset into ``output_dir/name/``."""
    spec = DATASETS[name]
    output_dir = Path(output_dir).expanduser()
    folder = output_dir / name
    if spec.needs_source and source is None:
        raise UsageError(f"{name} is made from a local ImageNet download: give --source DIR (the folder holding "
                         "ILSVRC/Data/CLS-LOC/train or train/)")
    if not force:
        status = dataset_status(name, output_dir)
        if status.ready:
            logger.debug("%s is already prepared in %s; --force prepares it again", name, folder)
            return Prepared(name, folder, status.images, already=True)
    overrides = checksum_overrides(checksums)
    created_root = not output_dir.exists()
    try:
        raw = output_dir / STAGING / name
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {output_dir}: {exc.strerror or exc}") from None
    try:
        for remote in spec.files:
            checksum = overrides.get(remote.name) or Checksum.parse(remote.checksum)
            fetch(file_url(remote, name, mirror), raw / remote.name, checksum, progress)
        sources = {remote.name: str(overrides.get(remote.name) or Checksum.parse(remote.checksum))
                   for remote in spec.files}
        images = _convert(spec, raw, folder, source, workers, progress, sources)
        shutil.rmtree(raw, ignore_errors=True)
    finally:
        _remove_if_empty(raw)  # a failed first download leaves no empty folders behind
        _remove_if_empty(output_dir / STAGING)
        if created_root:
            _remove_if_empty(output_dir)
    return Prepared(name, folder, images)


def _convert(spec: DatasetSpec, raw: Path, folder: Path, source: Path | None, workers: int | None,
             progress: Progress | None, sources: dict[str, str]) -> dict[str, int]:
    """Write every output into a staging folder beside the raw files, rename them all into ``folder``, then write
    the manifest (last: a crash before it leaves the dataset unverified, and the next run prepares it again)."""
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=raw))
    try:
        images = {}
        try:
            for file, (items, count) in spec.convert(raw=raw, source=source, workers=workers).items():
                images[file] = write_image_zip(staging / file, items, count, progress)
        except DownloadError:
            for remote in spec.files:  # verified, yet unreadable: make the next run download it again
                (raw / remote.name).unlink(missing_ok=True)
            raise
        except OSError as exc:
            raise FastGenRuntimeError(f"cannot write {staging}: {exc.strerror or exc}") from None
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)
        for file in images:
            os.replace(staging / file, folder / file)
        manifest = {"dataset": spec.name, "sources": sources if spec.files else {"local": str(source or "bundled")},
                    "outputs": {file: {"images": n, "bytes": (folder / file).stat().st_size}
                                for file, n in images.items()}}
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        return images
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


# -------------------------------------------------------------------------------------------------- status
@dataclass(frozen=True)
class Status:
    name: str
    download_bytes: int | None  # None: made from a local source
    disk_bytes: int
    state: str  # "ready", "missing", "partial download", "incomplete", "unverified", "corrupt"
    detail: str
    images: dict[str, int]

    @property
    def ready(self) -> bool:
        return self.state == "ready"


def dataset_status(name: str, output_dir: Path) -> Status:
    """Whether ``output_dir/name`` holds every output as ``prepare`` wrote it: each a readable image zip whose size
    and image count match the manifest, with labels for every image (the zips' directories and ``dataset.json``
    are read, images are not decoded); made from the official files, the counts must also be the published ones."""
    spec = DATASETS[name]
    root = Path(output_dir).expanduser()
    folder = root / name
    download = sum(f.size for f in spec.files) if not spec.needs_source else None
    present = [o for o in spec.outputs if (folder / o.file).is_file()]
    disk = sum((folder / o.file).stat().st_size for o in present)
    if not present:
        raw = root / STAGING / name
        partial = sum(p.stat().st_size for p in raw.glob("*") if p.is_file()) if raw.is_dir() else 0
        if partial and download:
            return Status(name, download, disk, "partial download",
                          f"{partial / download:.0%} downloaded; run download-data {name} to resume", {})
        return Status(name, download, disk, "missing", "", {})

    def status(state: str, detail: str, images: dict[str, int] | None = None) -> Status:
        return Status(name, download, disk, state, detail, images or {})

    missing = [o.file for o in spec.outputs if o not in present]
    if missing:
        return status("incomplete", f"missing {', '.join(missing)}; run download-data {name} --force")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        recorded = manifest["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return status("unverified", f"no readable {MANIFEST} (not written by download-data); --force prepares it")
    official = manifest.get("sources") == {f.name: f.checksum for f in spec.files} and bool(spec.files)
    images: dict[str, int] = {}
    for output in spec.outputs:
        entry = recorded.get(output.file) or {}
        size = (folder / output.file).stat().st_size
        if entry.get("bytes") != size:
            return status("corrupt", f"{output.file} has {size:,} bytes, {MANIFEST} says {entry.get('bytes')}")
        try:
            summary = inspect_image_set(folder / output.file)
        except FastGenRuntimeError as exc:
            return status("corrupt", str(exc))
        expected = output.images if official and output.images is not None else entry.get("images")
        if summary.images != expected:
            return status("corrupt", f"{output.file} has {summary.images:,} images, expected {expected:,}")
        if not summary.labelled:
            return status("corrupt", f"{output.file} has no labels")
        images[output.file] = summary.images
    return status("ready", "", images)


# ---------------------------------------------------------------------------------------------------- hints
def prepare_hint(path: Path) -> str | None:
    """The ``fastgen download-data`` command that writes ``path``, or None if no dataset writes that file name."""
    from fastgen.utils.env import data_root

    path = Path(path).expanduser()
    for name, spec in DATASETS.items():
        if any(path.name == o.file for o in spec.outputs) and path.parent.name == name:
            command = f"fastgen download-data {name}"
            root = path.parent.parent
            if root.resolve() != Path(data_root()).expanduser().resolve():
                command += f" --output-dir {root}"
            if spec.needs_source:
                command += " --source IMAGENET_DIR"
            return command
    return None


__all__ = ["ALL", "DATASETS", "DatasetSpec", "Output", "Prepared", "RemoteFile", "Status", "check_mirror",
           "checksum_overrides", "dataset_status", "file_url", "prepare", "prepare_hint", "resolve_names"]
