"""``fastgen encode-data``: captioned images or videos -> WebDataset shards of latents and text embeddings, through
a family's codec (``fastgen.networks.codecs``), ready for the latent recipes' loaders (``fields={"real":
"latent.npy", "condition": "text.npy"}``).

**Sources.** (a) A folder of images (``png jpg jpeg webp bmp``) or videos (``mp4 webm mov mkv``), found
recursively and sorted by relative path, each with a same-name ``.txt`` caption beside it: input ``i`` belongs to
output shard ``i // shard_size``, whatever happens to the inputs before it. (b) WebDataset shards - a local folder
of ``.tar`` files or an ``s3://`` prefix - whose samples hold a ``png jpg jpeg webp mp4 webm`` member and a ``txt``
caption: input shard ``k`` (sorted) becomes output shard ``k``. Either way shards are stable across re-runs and
ranks. An input that cannot be read, has no caption, is a video for an image family's codec, or is shorter than
the frames asked for is skipped and counted (``strict``: an error naming it).

**Pictures.** Each image, and each frame of a video, is centre-cropped to a square and resized to ``resolution``
with Lanczos (EDM's ``center-crop`` transform); a ``(width, height)`` resolution crops the largest centred region of
that aspect ratio instead (``fastgen.datasets.sources.crop_box``). A video gives ``Frames.count`` frames, every
``stride``-th from the first (Wan's and CogVideoX's VAEs want ``4 k + 1``: CogVideoX-5b was trained on 49; LTX-2's
``8 k + 1``).

**Sound** (a family that trains on it: LTX-2, and Cosmos 3 with a ``sound_tokenizer``; ``Frames.sound_rate``): the
clip's audio track over the span of the frames taken, at the rate the family's audio encoder takes, stereo
(``fastgen.datasets.sound``), through the codec's ``encode_waveforms`` (LTX-2: its log-mel front end and audio VAE;
Cosmos 3: its sound tokenizer, clip by clip). A video without an audio track, and an image, are skipped.

**Shards** (``DST/shard-NNNNNN.tar``; the WebDataset convention: members ``KEY.FIELD``, ``KEY`` the input's index as
9 digits, or ``KKKKKK_JJJJJJ`` - input shard and position - for WebDataset sources):

* ``latent.npy`` - float32 ``(C, h, w)`` (Wan, CogVideoX: ``(C, f, h, w)``; an image is one frame): the codec's normalised
  latent;
* ``text.npy`` - float32: the network's ``condition`` (``Codec.condition``: the text embeddings; Flux's packs the
  pooled vector in row 0, SDXL's also its size-and-crop time ids; Wan's and Qwen-Image's are zero past the
  prompt's own tokens); extras by family: ``pooled.npy`` (Flux, SDXL), ``time_ids.npy`` (SDXL: original height,
  width, crop top, left, target height, width), ``text_mask.npy`` (Wan, Qwen-Image; int64). Not written for a
  family whose codec has ``text_in_shards = False`` (Cosmos Predict 2.5: 512 x 100,352 values a caption), nor its
  ``empty_prompt.npz``: its recipes encode the captions (``txt``) on the fly (``model.encode_batches``);
* ``audio_latent.npy`` - float32, with sound: LTX-2's normalised ``(C, T_a, M / 4)`` audio latents, Cosmos 3's
  ``(sound_dim, T)`` sound latents - as many latent frames as the family's pipeline samples for the clip;
* ``txt`` - the caption; ``json`` - ``{"source", "size": [w, h], "crop": [left, top, side]}`` (``[left, top,
  width, height]`` for a non-square resolution; videos also
  ``"frames": [first, stride, count]`` and ``"fps"``; with sound ``"sound": {"start", "rate", "samples"}``).

Beside them: ``shard-NNNNNN.json`` (written after its tar: the shard is complete; ``samples`` and ``skipped`` with
reasons), ``empty_prompt.npz`` (the empty prompt's fields once, for guidance and condition dropout) and
``index.json`` (the format, the weights folder, the family, the resolution, the latent shape, the frames, the latent
normalisation, the fields, every shard's count and the totals; with sound ``audio_shape`` and ``sound_rate``). **Resume:** a shard whose ``.json`` exists is kept;
the others are written again (each tar atomically), so a killed run re-run ends with every sample exactly once.
**S3:** DST may be an ``s3://`` prefix: each file is written locally, uploaded (a tar before its sidecar) and
removed. **Ranks:** rank ``r`` of ``W`` writes shards ``r, r + W, ...`` (never interleaved); rank 0 writes the index after
every rank is done.
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

from fastgen.datasets.sources import Resolution
from fastgen.utils.errors import UsageError
from fastgen.utils.io import atomic_open, atomic_write_text
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

FORMAT = "fastgen-latents"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv")
# WebDataset members an input sample's picture or video may be in, in the order they are looked for
MEDIA_EXTENSIONS = ("png", "jpg", "jpeg", "webp", "mp4", "webm")


@dataclass(frozen=True)
class Source:
    """One input: a local file (``image``; its caption in the same-name ``.txt``) or a WebDataset member's bytes
    (``data`` with its ``suffix``; the caption from the sample's ``txt``). ``key``: its shard member key."""

    index: int
    image: Path | None
    relative: str
    data: bytes | None = None
    suffix: str = ""
    caption: str | None = None
    key: str = ""

    @property
    def media_suffix(self) -> str:
        return (self.image.suffix if self.image is not None else self.suffix).lower()

    @property
    def member_key(self) -> str:
        return self.key or f"{self.index:09d}"


@dataclass(frozen=True)
class Frames:
    """How a video input becomes a clip: ``count`` frames, every ``stride``-th from the first; with a
    ``sound_rate`` (a family that trains on sound: ``Codec.waveform_rate``) also the audio track over their span
    (``fastgen.datasets.sound``) at that rate."""

    count: int = 17
    stride: int = 1
    sound_rate: int = 0


@dataclass
class ShardInput:
    """What output shard ``number`` is made of: ``load()`` gives its sources; ``size`` their count when known
    before reading (a folder's slice), else None (a WebDataset shard)."""

    number: int
    load: Callable[[], list[Source]]
    size: int | None


def captioned_images(folder: Path) -> list[Source]:
    """Every image or video below ``folder``, sorted by relative path, with its index (captions are checked when
    read)."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder (encode-data reads a folder of images or videos with .txt "
                         "captions, or WebDataset shards)")
    suffixes = IMAGE_SUFFIXES + VIDEO_SUFFIXES
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes and p.is_file())
    if not images:
        raise UsageError(f"{folder} holds no images or videos ({', '.join(suffixes)})")
    return [Source(i, path, path.relative_to(folder).as_posix()) for i, path in enumerate(images)]


def folder_shards(sources: list[Source], shard_size: int) -> list[ShardInput]:
    """Input ``i`` of a folder belongs to output shard ``i // shard_size``: stable across re-runs and ranks."""
    return [ShardInput(k, (lambda k=k: sources[k * shard_size:(k + 1) * shard_size]),
                       len(sources[k * shard_size:(k + 1) * shard_size]))
            for k in range(-(-len(sources) // shard_size))]


def is_webdataset_source(src: str) -> bool:
    """``s3://...`` or a local ``.tar`` file or folder holding ``.tar`` shards (and no loose images)."""
    if "://" in src:
        return True
    path = Path(src).expanduser()
    if path.is_file():
        return path.suffix == ".tar"
    return path.is_dir() and any(path.glob("*.tar"))


def webdataset_shards(src: str) -> list[ShardInput]:
    """Input shard ``k`` of WebDataset shards ``src`` (local or ``s3://``; sorted) becomes output shard ``k``;
    its samples keep their order, keyed ``KKKKKK_JJJJJJ`` (shard, position)."""
    from fastgen.datasets.webdataset import list_shards

    urls = list_shards([src])

    def load(k: int, url: str) -> list[Source]:
        from fastgen.datasets.webdataset import read_samples

        sources = []
        for j, sample in enumerate(read_samples(url)):
            media = next((e for e in MEDIA_EXTENSIONS if e in sample.fields), None)
            caption = sample.fields.get("txt")
            sources.append(Source(
                index=j, image=None, relative=f"{url.rsplit('/', 1)[-1]}:{sample.key}",
                data=None if media is None else sample.fields[media], suffix="" if media is None else f".{media}",
                caption=None if caption is None else caption.decode("utf-8", errors="replace"),
                key=f"{k:06d}_{j:06d}"))
        return sources

    return [ShardInput(k, (lambda k=k, url=url: load(k, url)), None) for k, url in enumerate(urls)]


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}"


def _video_frames(source: Source, resolution: Resolution,
                  frames: Frames) -> tuple[np.ndarray, dict[str, Any], np.ndarray | None]:
    """``(F, R, R, 3)`` uint8: ``frames.count`` frames, every ``frames.stride``-th, each centre-cropped and resized;
    their json; with ``frames.sound_rate`` the sound over their span (``(2, N)`` float32)."""
    import av

    from fastgen.datasets.sound import read_sound, span_samples
    from fastgen.datasets.sources import center_crop_resize_array

    wanted = (frames.count - 1) * frames.stride + 1
    picked: list[np.ndarray] = []
    start = 0.0
    opened = av.open(str(source.image) if source.image is not None else io.BytesIO(source.data or b""))
    with opened as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else None
        size = [stream.codec_context.width, stream.codec_context.height]
        for n, frame in enumerate(container.decode(video=0)):
            if n >= wanted:
                break
            if n == 0 and frame.time is not None:
                start = float(frame.time)
            if n % frames.stride == 0:
                picked.append(center_crop_resize_array(frame.to_ndarray(format="rgb24"), resolution))
    if len(picked) < frames.count:
        raise ValueError(f"{source.relative}: {len(picked)} frames at stride {frames.stride}; --frames asks for "
                         f"{frames.count}")
    meta = {"source": source.relative, "size": size, "crop": _crop(size[0], size[1], resolution),
            "frames": [0, frames.stride, frames.count], "fps": fps}
    if not frames.sound_rate:
        return np.stack(picked), meta, None
    if not fps:
        raise ValueError(f"{source.relative}: no frame rate, so the span of its sound is unknown")
    samples = span_samples(frames.count, frames.stride, fps, frames.sound_rate)
    sound = read_sound(source.image if source.image is not None else source.data or b"", start, samples,
                       frames.sound_rate)
    if sound is None:
        raise ValueError(f"{source.relative}: no audio track (these shards hold each clip's sound; Cosmos 3 video "
                         "alone: --no-sound)")
    meta["sound"] = {"start": start, "rate": frames.sound_rate, "samples": samples}
    return np.stack(picked), meta, sound


def _read(source: Source, resolution: Resolution, frames: Frames | None = None,
          video: bool = False) -> tuple[np.ndarray, str, dict[str, Any], np.ndarray | None]:
    """``(uint8 (R, R, 3) pixels or (F, R, R, 3) frames, caption, json, (2, N) sound or None)``; ``ValueError``
    saying why when the input cannot be used. ``video``: whether the codec encodes videos (an image family's codec
    skips them); ``frames.sound_rate``: the clip's sound is read too (an image, or a video without sound, is
    skipped)."""
    import PIL.Image

    from fastgen.datasets.download import DownloadError
    from fastgen.datasets.sources import center_crop_resize

    if source.image is not None:
        caption_file = source.image.with_suffix(".txt")
        if not caption_file.is_file():
            raise ValueError(f"{source.relative}: no caption ({caption_file.name})")
        caption = caption_file.read_text(encoding="utf-8").strip()
    else:
        if source.data is None:
            raise ValueError(f"{source.relative}: no image or video member ({', '.join(MEDIA_EXTENSIONS)})")
        if source.caption is None:
            raise ValueError(f"{source.relative}: no caption (txt member)")
        caption = source.caption.strip()
    if source.media_suffix in VIDEO_SUFFIXES:
        if not video:
            raise ValueError(f"{source.relative}: a video; this family's codec encodes images")
        try:
            pixels, meta, sound = _video_frames(source, resolution, frames or Frames())
        except (OSError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith(f"{source.relative}: "):
                raise
            raise ValueError(f"{source.relative}: cannot read the video ({str(exc).splitlines()[0]})") from None
        return pixels, caption, meta, sound
    if frames is not None and frames.sound_rate:
        raise ValueError(f"{source.relative}: an image; this family trains on clips with sound")
    where = source.image if source.image is not None else io.BytesIO(source.data or b"")
    try:
        with PIL.Image.open(where) as image:
            width, height = image.size
        if not isinstance(where, Path):
            where.seek(0)
        pixels = center_crop_resize(where, resolution)
    except (OSError, DownloadError, PIL.UnidentifiedImageError) as exc:
        raise ValueError(f"{source.relative}: cannot read the image ({str(exc).splitlines()[0]})") from None
    meta = {"source": source.relative, "size": [width, height], "crop": _crop(width, height, resolution)}
    return pixels, caption, meta, None


def _crop(width: int, height: int, resolution: Resolution) -> list[int]:
    """The json's ``crop``: ``[left, top, side]`` for a square target, ``[left, top, width, height]`` otherwise."""
    from fastgen.datasets.sources import crop_box

    left, top, crop_w, crop_h = crop_box(width, height, resolution)
    return [left, top, crop_w] if isinstance(resolution, int) else [left, top, crop_w, crop_h]


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
    if "time_ids" in encoded:
        fields["time_ids"] = encoded["time_ids"].float().cpu().numpy()
    return fields


def encode_shard(codec: Any, sources: list[Source], path: Path, resolution: Resolution, batch_size: int,
                 strict: bool = False, progress: Callable[[int], None] | None = None,
                 frames: Frames | None = None) -> dict[str, Any]:
    """Write one shard (atomically) and return its summary ``{"samples", "skipped"}``. Consecutive inputs of the
    same shape (images; videos of ``frames``) are encoded together, up to ``batch_size``."""
    video = bool(getattr(codec, "video", False))  # Wan's and CogVideoX's codecs encode videos
    readable, skipped = [], []
    for source in sources:
        try:
            readable.append((source, *_read(source, resolution, frames, video)))
        except ValueError as exc:
            if strict:
                raise UsageError(f"encode-data --strict: {exc}") from None
            skipped.append(str(exc))
            if progress is not None:
                progress(1)
    batches: list[list[Any]] = []
    for item in readable:  # (source, pixels, caption, meta, sound or None)
        if batches and len(batches[-1]) < batch_size and _shapes(batches[-1][0]) == _shapes(item):
            batches[-1].append(item)
        else:
            batches.append([item])
    shape_seen: list[int] | None = None
    audio_shape: list[int] | None = None
    with atomic_open(path, "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
        for batch in batches:
            pixels = torch.from_numpy(np.stack([b[1] for b in batch])).float() / 127.5 - 1
            # (B, R, R, 3) images -> (B, 3, R, R); (B, F, R, R, 3) videos -> (B, 3, F, R, R)
            pixels = pixels.permute(0, 3, 1, 2) if pixels.dim() == 4 else pixels.permute(0, 4, 1, 2, 3)
            latents = codec.encode_images(pixels).float().cpu().numpy()
            shape_seen = shape_seen or list(latents.shape[1:])
            sound = None
            if batch[0][4] is not None:  # (B, 2, N) waveforms -> the family's sound latents
                sound = codec.encode_waveforms(torch.from_numpy(np.stack([b[4] for b in batch]))).float().cpu().numpy()
                audio_shape = audio_shape or list(sound.shape[1:])
            if hasattr(codec, "fit_latent_shape"):  # Cosmos 3: the templates name the frame count and resolution
                codec.fit_latent_shape(list(latents.shape[1:]))
            # a family whose condition is too wide to store (Cosmos Predict 2.5) writes latents and captions only
            text_in_shards = getattr(codec, "text_in_shards", True)
            encoded = codec.encode_prompts([b[2] for b in batch]) if text_in_shards else {}
            if hasattr(codec, "time_ids") and text_in_shards:  # SDXL: each image's size and crop (micro-conditioning)
                encoded["time_ids"] = torch.tensor([codec.time_ids(b[3]["size"], b[3]["crop"], resolution)
                                                    for b in batch])
            texts = _fields(codec, encoded) if text_in_shards else {}
            for row, (source, _, caption, meta, _) in enumerate(batch):
                key = source.member_key
                _add(tar, f"{key}.latent.npy", _npy(latents[row]))
                if sound is not None:
                    _add(tar, f"{key}.audio_latent.npy", _npy(sound[row]))
                for field, values in texts.items():
                    _add(tar, f"{key}.{field}.npy", _npy(values[row]))
                _add(tar, f"{key}.txt", caption.encode("utf-8"))
                _add(tar, f"{key}.json", json.dumps(meta).encode("utf-8"))
            if progress is not None:
                progress(len(batch))
    summary = {"samples": len(readable), "skipped": skipped, "latent_shape": shape_seen}
    if audio_shape is not None:
        summary["audio_shape"] = audio_shape
    return summary


def _shapes(item: tuple[Any, ...]) -> tuple[Any, ...]:
    """What inputs encoded in one batch must share: the pixels' shape and the sound's."""
    return item[1].shape, None if item[4] is None else item[4].shape


def check_sizes(resolution: Resolution, shard_size: int, batch_size: int) -> None:
    from fastgen.datasets.sources import target_size

    if min(target_size(resolution)) < 8 or shard_size < 1 or batch_size < 1:
        raise UsageError("--resolution must be at least 8, --shard-size and --batch-size at least 1")


class Destination:
    """Where the shards go: a local folder, or an ``s3://`` prefix - each file is then written in a local scratch
    folder, uploaded (a tar before its ``.json``, so a sidecar in S3 still means a complete shard) and removed."""

    def __init__(self, dst: str | Path, scratch: Path | None = None) -> None:
        from fastgen.checkpoint.s3 import S3Location, is_s3_url

        self.s3 = S3Location.parse(str(dst)) if is_s3_url(str(dst)) else None
        if self.s3 is None:
            self.local = Path(dst).expanduser()
        else:
            import tempfile

            self.local = scratch if scratch is not None else Path(tempfile.mkdtemp(prefix="fastgen-encode-"))
        self.local.mkdir(parents=True, exist_ok=True)
        self.description = str(dst)

    def _storage(self) -> Any:
        from fastgen.datasets.webdataset import _storage

        return _storage()

    def has(self, name: str) -> bool:
        if self.s3 is None:
            return (self.local / name).is_file()
        return self._storage().exists(self.s3.child(name))

    def read_text(self, name: str) -> str:
        if self.s3 is None:
            return (self.local / name).read_text()
        return self._storage().read_bytes(self.s3.child(name)).decode()

    def publish(self, name: str) -> None:
        """The local file ``name`` is final: S3 gets it and the scratch copy goes."""
        if self.s3 is not None:
            self._storage().upload_file(self.local / name, self.s3.child(name))
            (self.local / name).unlink()


def encode_shards(codec: Any, shards: list[ShardInput], dst: Path | Destination, resolution: Resolution,
                  batch_size: int = 8, rank: int = 0, world: int = 1, strict: bool = False, progress: Callable[[int], None] | None = None,
                  frames: Frames | None = None) -> dict[str, int]:
    """This rank's output shards (``r, r + W, ...`` of ``shards``) into ``dst`` (module docstring); the ones already
    complete are kept. ``progress`` counts inputs. Returns ``{"shards", "written", "kept"}`` for this rank."""
    where = dst if isinstance(dst, Destination) else Destination(dst)
    mine = shards[rank::world]
    written = kept = 0
    for shard in mine:
        name = shard_name(shard.number)
        if where.has(f"{name}.json"):
            kept += 1
            if progress is not None:
                progress(shard.size if shard.size is not None else json.loads(where.read_text(f"{name}.json"))["samples"])
            continue
        summary = encode_shard(codec, shard.load(), where.local / f"{name}.tar", resolution, batch_size, strict,
                               progress, frames)
        where.publish(f"{name}.tar")
        atomic_write_text(where.local / f"{name}.json", json.dumps(summary, indent=1))
        where.publish(f"{name}.json")
        written += 1
    return {"shards": len(mine), "written": written, "kept": kept}


def encode_folder(codec: Any, sources: list[Source], dst: Path, resolution: Resolution, shard_size: int = 1000,
                  batch_size: int = 8, rank: int = 0, world: int = 1, strict: bool = False,
                  progress: Callable[[int], None] | None = None, frames: Frames | None = None) -> dict[str, int]:
    """``encode_shards`` of a folder's ``sources`` (``captioned_images(src)``), ``shard_size`` inputs a shard."""
    check_sizes(resolution, shard_size, batch_size)
    return encode_shards(codec, folder_shards(sources, shard_size), dst, resolution, batch_size, rank, world, strict,
                         progress, frames)


def _first_latent_shape(dst: Path, shards: list[dict[str, Any]]) -> list[int] | None:
    """The shape of the first sample's ``latent.npy`` (every sample of a data set has the same)."""
    for shard in shards:
        if shard["samples"]:
            with tarfile.open(dst / shard["name"]) as tar:
                for member in tar:
                    if member.name.endswith(".latent.npy"):
                        handle = tar.extractfile(member)
                        assert handle is not None
                        return list(np.load(io.BytesIO(handle.read()), allow_pickle=False).shape)
    return None


#: the shard members whose shapes ``index.json`` records, and under which key
_RECORDED_SHAPES = {"latent.npy": "latent_shape", "audio_latent.npy": "audio_shape"}


def member_shapes_of(datatags: Any) -> dict[str, list[int]]:
    """The shapes ``encode-data`` recorded in the ``index.json`` of a loader's local ``WDS:`` folders, by shard
    member (``{"latent.npy": [...], "audio_latent.npy": [...]}``; empty when no folder has an index; S3 folders are
    not read here). Folders that disagree are a one-line error."""
    shapes: dict[str, dict[str, list[int]]] = {}
    for tag in [datatags] if isinstance(datatags, str) else list(datatags or []):
        folder = str(tag).removeprefix("WDS:")
        index_file = Path(folder).expanduser() / "index.json"
        if "://" in folder or not index_file.is_file():
            continue
        try:
            index = json.loads(index_file.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            continue
        for member, key in _RECORDED_SHAPES.items():
            if index.get(key):
                shapes.setdefault(member, {})[folder] = [int(x) for x in index[key]]
    found: dict[str, list[int]] = {}
    for member, by_folder in shapes.items():
        if len({tuple(shape) for shape in by_folder.values()}) > 1:
            listed = "; ".join(f"{folder}: {shape}" for folder, shape in by_folder.items())
            what = "latents" if member == "latent.npy" else member.removesuffix(".npy").replace("_", " ") + "s"
            raise UsageError(f"the data folders hold {what} of different shapes ({listed})")
        found[member] = next(iter(by_folder.values()))
    return found


def latent_shape_of(datatags: Any) -> list[int] | None:
    """The latent shape ``encode-data`` recorded in the ``index.json`` of a loader's local ``WDS:`` folders (None
    when none has one; S3 folders are not read here). Folders that disagree are a one-line error."""
    return member_shapes_of(datatags).get("latent.npy")


def write_index(codec: Any, dst: Path | Destination, weights: Path, resolution: Resolution, num_shards: int,
                frames: Frames | None = None) -> dict[str, Any]:
    """``empty_prompt.npz`` and ``index.json`` (rank 0, after every shard is complete)."""
    where = dst if isinstance(dst, Destination) else Destination(dst)
    shards, shapes, audio_shapes = [], [], []
    for shard in range(num_shards):
        summary = json.loads(where.read_text(f"{shard_name(shard)}.json"))
        shards.append({"name": f"{shard_name(shard)}.tar", "samples": summary["samples"],
                       "skipped": len(summary["skipped"])})
        shapes.append(summary.get("latent_shape"))
        audio_shapes.append(summary.get("audio_shape"))
    latent_shape = next((shape for shape in shapes if shape), None)
    audio_shape = next((shape for shape in audio_shapes if shape), None)
    if latent_shape is None and where.s3 is None:  # sidecars of an earlier version: read a tar
        latent_shape = _first_latent_shape(where.local, shards)
    empty: dict[str, np.ndarray] = {}
    if getattr(codec, "text_in_shards", True):  # else the shards hold no text condition (Cosmos Predict 2.5)
        empty = _fields(codec, codec.encode_prompts([""]))
        with atomic_open(where.local / "empty_prompt.npz", "wb") as handle:
            np.savez(handle, **{name: values[0] for name, values in empty.items()})
        where.publish("empty_prompt.npz")
    vae = codec.vae.config
    normalisation = {key: vae[key] for key in ("scaling_factor", "shift_factor", "latents_mean", "latents_std")
                     if key in vae and vae[key] is not None}
    index = {"format": FORMAT, "version": 1, "family": codec.family, "weights": str(weights),
             "resolution": resolution if isinstance(resolution, int) else list(resolution),
             "latent_shape": latent_shape,
             "frames": None if frames is None else {"count": frames.count, "stride": frames.stride},
             "normalisation": normalisation,
             "fields": ["latent", *(["audio_latent"] if audio_shape else []), *empty, "txt", "json"],
             "samples": sum(s["samples"] for s in shards), "skipped": sum(s["skipped"] for s in shards),
             "shards": shards}
    if audio_shape:  # a family trained on sound (LTX-2, Cosmos 3): the clips' sound latents and their rate
        index.update(audio_shape=audio_shape, sound_rate=frames.sound_rate if frames is not None else None)
    atomic_write_text(where.local / "index.json", json.dumps(index, indent=1))
    where.publish("index.json")
    return index


__all__ = ["FORMAT", "Destination", "Frames", "ShardInput", "Source", "captioned_images", "check_sizes", "encode_folder",
           "encode_shard", "encode_shards", "folder_shards", "is_webdataset_source", "latent_shape_of", "member_shapes_of",
           "shard_name",
           "webdataset_shards", "write_index"]
