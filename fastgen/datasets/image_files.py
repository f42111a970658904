"""The files of the EDM-style image dataset (``fastgen.datasets.image_zip`` describes the format): listing a zip
or folder of images and its ``dataset.json`` labels, summarising it (``inspect_image_set``), and writing one
(``encode_png``, ``write_image_zip``). Shared by the dataset that reads such sets and by ``download-data``, which
writes them - below both, so neither imports the other to get at them."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastgen.utils.errors import FastGenRuntimeError

if TYPE_CHECKING:
    import numpy as np

    from fastgen.datasets.download import Progress

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
METADATA = "dataset.json"


def archive_name(index: int) -> str:
    """EDM's name for image ``index``: ``00012/img00012345.png``."""
    digits = f"{index:08d}"
    return f"{digits[:5]}/img{digits}.png"


def encode_png(image: np.ndarray) -> bytes:
    """``(H, W)`` or ``(H, W, 1|3)`` uint8 as an uncompressed PNG (EDM's ``compress_level=0``)."""
    import PIL.Image

    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    mode = "L" if image.ndim == 2 else "RGB"
    buffer = io.BytesIO()
    PIL.Image.fromarray(image, mode).save(buffer, format="png", compress_level=0, optimize=False)
    return buffer.getvalue()


def write_image_zip(path: Path, items: Iterable[tuple[bytes, int | None]], total: int | None = None,
                    progress: Progress | None = None) -> int:
    """Write PNG-encoded ``items`` (``(png bytes, label or None)``, in order) as an EDM image zip at ``path``.

    The caller writes to a staging path and renames it into place: a zip is only valid once ``dataset.json`` and
    the central directory are written, at the very end. Returns the number of images.
    """
    from fastgen.datasets.download import NoProgress

    progress = progress or NoProgress()
    labels: list[list[Any] | None] = []
    progress.start(f"writing {Path(path).name}", total, unit="images")
    try:
        with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED) as archive:
            for index, (png, label) in enumerate(items):
                name = archive_name(index)
                archive.writestr(name, png)
                labels.append([name, int(label)] if label is not None else None)
                progress.advance(1)
            labelled = bool(labels) and all(entry is not None for entry in labels)
            archive.writestr(METADATA, json.dumps({"labels": labels if labelled else None}))
    finally:
        progress.finish()
    return len(labels)


@dataclass(frozen=True)
class ImageSetSummary:
    """What ``inspect_image_set`` found: the image count and whether every image has an integer label."""

    images: int
    labelled: bool


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _read_labels(raw: bytes | None, where: str, names: list[str]) -> list[int] | None:
    """Labels in ``names`` order from ``dataset.json`` bytes, or None when there are none."""
    if raw is None:
        return None
    try:
        entries = json.loads(raw).get("labels")
    except (ValueError, AttributeError):
        raise FastGenRuntimeError(f"{where}: {METADATA} is not a JSON object with a 'labels' list") from None
    if entries is None:
        return None
    try:
        by_name = {str(name).replace("\\", "/"): label for name, label in entries}
    except (TypeError, ValueError):
        raise FastGenRuntimeError(f"{where}: {METADATA} 'labels' must be a list of [file name, label] pairs") from None
    labels = []
    for name in names:
        label = by_name.get(name)
        if isinstance(label, bool) or not isinstance(label, int) or label < 0:
            raise FastGenRuntimeError(f"{where}: {METADATA} has no non-negative integer label for {name}")
        labels.append(label)
    return labels


def _listing(path: Path) -> tuple[list[str], bytes | None]:
    """Sorted image names and the ``dataset.json`` bytes (None if absent) of a zip or folder."""
    if path.is_dir():
        names = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and _is_image(p.name))
        meta = path / METADATA
        return names, meta.read_bytes() if meta.is_file() else None
    try:
        with zipfile.ZipFile(path) as archive:
            all_names = archive.namelist()
            names = sorted(n for n in all_names if _is_image(n))
            return names, archive.read(METADATA) if METADATA in all_names else None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as exc:
        raise FastGenRuntimeError(f"{path} is not a readable zip ({exc}); prepare it again") from None


def inspect_image_set(path: Path) -> ImageSetSummary:
    """Check that ``path`` is a readable image zip/folder whose labels (if any) cover every image; no decoding."""
    names, meta = _listing(Path(path))
    labels = _read_labels(meta, str(path), names)
    return ImageSetSummary(images=len(names), labelled=labels is not None)
