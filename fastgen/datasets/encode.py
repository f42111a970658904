"""``fastgen encode-data``: captioned images -> WebDataset shards of latents and text embeddings, through a family's
codec (``fastgen.networks.codecs``), ready for the latent recipes' loaders (``fields={"real": "latent.npy",
"condition": "text.npy"}``).

**Source.** A folder of images (``png jpg jpeg webp bmp``, found recursively, sorted by relative path) each with a
same-name ``.txt`` caption beside it. Input ``i`` (in that order) belongs to shard ``i // shard_size``, whatever
happens to the inputs before it - so shards are stable across re-runs and ranks. An image that cannot be read, or
has no caption, is skipped and counted (``strict``: an error naming it).

**Shards** (``DST/shard-NNNNNN.tar``; the WebDataset convention: members ``KEY.FIELD``, ``KEY`` the input's index
as 9 digits):

* ``latent.npy`` - float32 ``(C, h, w)`` (Wan: ``(C, 1, h, w)``): the codec's normalised latent of the image,
  centre-cropped to a square and resized to ``resolution`` with Lanczos (EDM's ``center-crop`` transform);
* ``text.npy`` - float32: the network's ``condition`` (``Codec.condition``: the text embeddings; Flux's packs the
  pooled vector in row 0); extras by family: ``pooled.npy`` (Flux), ``text_mask.npy`` (Wan; int64);
* ``txt`` - the caption; ``json`` - ``{"source": relative path, "size": [w, h], "crop": [left, top, side]}``.

Beside them: ``shard-NNNNNN.json`` (written after its tar: the shard is complete; ``samples`` and ``skipped`` with
reasons), ``empty_prompt.npz`` (the empty prompt's fields once, for guidance and condition dropout) and
``index.json`` (the format, the weights folder, the family, the latent normalisation, the fields, every shard's
count and the totals). **Resume:** a shard whose ``.json`` exists is kept; the others are written again (each tar
atomically), so a killed run re-run ends with every sample exactly once. **Ranks:** rank ``r`` of ``W`` writes shards
``r, r + W, ...`` (never interleaved); rank 0 writes the index after every rank is done.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgen.utils.errors import UsageError
from fastgen.utils.io import atomic_open, atomic_write_text
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

FORMAT = "fastgen-latents"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class Source:
    index: int
    image: Path
    relative: str


def captioned_images(folder: Path) -> list[Source]:
    """Every image below ``folder``, sorted by relative path, with its index (captions are checked when read)."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder (encode-data reads a folder of images with .txt captions)")
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise UsageError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return [Source(i, path, path.relative_to(folder).as_posix()) for i, path in enumerate(images)]


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}"


def _read(source: Source, resolution: int) -> tuple[np.ndarray, str, dict[str, Any]]:
    """``(uint8 (R, R, 3) pixels, caption, json)``; ``ValueError`` saying why when the input cannot be used."""
    import PIL.Image

    from fastgen.datasets.download import DownloadError
    from fastgen.datasets.sources import center_crop_resize

    caption_file = source.image.with_suffix(".txt")
    if not caption_file.is_file():
        raise ValueError(f"{source.relative}: no caption ({caption_file.name})")
    try:
        with PIL.Image.open(source.image) as image:
            width, height = image.size
        pixels = center_crop_resize(source.image, resolution)
    except (OSError, DownloadError, PIL.UnidentifiedImageError) as exc:
        raise ValueError(f"{source.relative}: cannot read the image ({str(exc).splitlines()[0]})") from None
    side = min(width, height)
    meta = {"source": source.relative, "size": [width, height], "crop": [(width - side) // 2, (height - side) // 2, side]}
    return pixels, caption_file.read_text(encoding="utf-8").strip(), meta


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _fields(codec: Any, encoded: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The text fields of a batch: ``text`` (the network's condition) and the family's extras, as numpy."""
    fields = {"text": codec.condition(encoded).float().cpu().numpy()}
    if "pooled" in encoded:
        fields["pooled"] = encoded["pooled"].float().cpu().numpy()
    if "text_mask" in encoded:
        fields["text_mask"] = encoded["text_mask"].long().cpu().numpy()
    return fields


def encode_shard(codec: Any, sources: list[Source], path: Path, resolution: int, batch_size: int,
                 strict: bool = False, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write one shard (atomically) and return its summary ``{"samples", "skipped"}``."""
    readable, skipped = [], []
    for source in sources:
        try:
            readable.append((source, *_read(source, resolution)))
        except ValueError as exc:
            if strict:
                raise UsageError(f"encode-data --strict: {exc}") from None
            skipped.append(str(exc))
            if progress is not None:
                progress(1)
    with atomic_open(path, "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
        for start in range(0, len(readable), batch_size):
            batch = readable[start:start + batch_size]
            pixels = torch.from_numpy(np.stack([b[1] for b in batch])).permute(0, 3, 1, 2).float() / 127.5 - 1
            latents = codec.encode_images(pixels).float().cpu().numpy()
            texts = _fields(codec, codec.encode_prompts([b[2] for b in batch]))
            for row, (source, _, caption, meta) in enumerate(batch):
                key = f"{source.index:09d}"
                _add(tar, f"{key}.latent.npy", _npy(latents[row]))
                for field, values in texts.items():
                    _add(tar, f"{key}.{field}.npy", _npy(values[row]))
                _add(tar, f"{key}.txt", caption.encode("utf-8"))
                _add(tar, f"{key}.json", json.dumps(meta).encode("utf-8"))
            if progress is not None:
                progress(len(batch))
    return {"samples": len(readable), "skipped": skipped}


def check_sizes(resolution: int, shard_size: int, batch_size: int) -> None:
    if resolution < 8 or shard_size < 1 or batch_size < 1:
        raise UsageError("--resolution must be at least 8, --shard-size and --batch-size at least 1")


def encode_folder(codec: Any, sources: list[Source], dst: Path, resolution: int, shard_size: int = 1000,
                  batch_size: int = 8, rank: int = 0, world: int = 1, strict: bool = False,
                  progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """This rank's shards of ``sources`` (``captioned_images(src)``) into ``dst`` (module docstring); the ones
    already complete are kept. Returns ``{"shards", "written", "kept"}`` for this rank."""
    check_sizes(resolution, shard_size, batch_size)
    dst.mkdir(parents=True, exist_ok=True)
    shards = range(rank, -(-len(sources) // shard_size), world)
    written = kept = 0
    for shard in shards:
        summary_file = dst / f"{shard_name(shard)}.json"
        members = sources[shard * shard_size:(shard + 1) * shard_size]
        if summary_file.is_file():
            kept += 1
            if progress is not None:
                progress(len(members))
            continue
        summary = encode_shard(codec, members, dst / f"{shard_name(shard)}.tar", resolution, batch_size, strict,
                               progress)
        atomic_write_text(summary_file, json.dumps(summary, indent=1))
        written += 1
    return {"shards": len(shards), "written": written, "kept": kept}


def write_index(codec: Any, dst: Path, weights: Path, resolution: int, total_inputs: int, shard_size: int) -> dict[str, Any]:
    """``empty_prompt.npz`` and ``index.json`` (rank 0, after every shard is complete)."""
    shards = []
    for shard in range(-(-total_inputs // shard_size)):
        summary = json.loads((dst / f"{shard_name(shard)}.json").read_text())
        shards.append({"name": f"{shard_name(shard)}.tar", "samples": summary["samples"],
                       "skipped": len(summary["skipped"])})
    empty = _fields(codec, codec.encode_prompts([""]))
    with atomic_open(dst / "empty_prompt.npz", "wb") as handle:
        np.savez(handle, **{name: values[0] for name, values in empty.items()})
    vae = codec.vae.config
    normalisation = {key: vae[key] for key in ("scaling_factor", "shift_factor", "latents_mean", "latents_std")
                     if key in vae and vae[key] is not None}
    index = {"format": FORMAT, "version": 1, "family": codec.family, "weights": str(weights),
             "resolution": resolution, "normalisation": normalisation, "fields": ["latent", *empty, "txt", "json"],
             "samples": sum(s["samples"] for s in shards), "skipped": sum(s["skipped"] for s in shards),
             "shards": shards}
    atomic_write_text(dst / "index.json", json.dumps(index, indent=1))
    return index


__all__ = ["FORMAT", "Source", "captioned_images", "check_sizes", "encode_folder", "encode_shard", "shard_name",
           "write_index"]
