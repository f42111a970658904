"""WebDataset shards (``WDS:`` datatags): tar files of samples, read from local folders or streamed from S3.

**Format** (the WebDataset convention, Aizman et al. 2020, "High Performance I/O For Large Scale Deep Learning"):
a shard is a plain ``.tar``; a sample is the run of consecutive members that share a *key*, the member name up to
the first dot of its file name (``shard0/00042.png`` and ``shard0/00042.cls`` are sample ``shard0/00042`` with
fields ``png`` and ``cls``). Fields are decoded by extension: ``png/jpg/jpeg/webp/bmp`` -> float32 ``(C, H, W)``
in ``[-1, 1]`` (``p / 127.5 - 1``, as the image zip), ``npy`` -> a tensor, ``cls`` -> int64, ``json`` -> the parsed
value and ``txt`` -> a string (those two are kept as lists in the batch), and the pseudo-fields ``__key__`` /
``__url__`` -> the sample's key and its shard. ``fields`` maps batch keys to ``;``-separated extensions, the
first one a sample has wins (``{"real": "png;jpg", "condition": "cls"}``). A dotted key nests: ``{"real.video":
"latent.npy", "real.audio": "audio.npy"}`` gives ``batch["real"] = {"video": ..., "audio": ...}``, a multimodal
sample (``fastgen.networks.modalities``).

**Sources.** ``datatags`` is a list of ``WDS:<location>``: a local folder (every ``*.tar`` below it), one ``.tar``
file, or ``s3://bucket/prefix`` (every ``.tar`` key below it, listed with boto3 and streamed with ranged GETs
through ``fastgen.checkpoint.s3.S3Storage``: the same credentials, endpoint and retries as S3 checkpoints). A read that
breaks off mid-shard is reopened at the byte it stopped at, so a dropped connection costs a request, not the
shard. Shard lists are sorted, so every process derives the same one without communication.

**Streams and passes.** A *pass* reads every shard once. Its shard order is a permutation drawn from
``seed + pass`` (identity with ``shuffle=False``); the ``S = world_size * max(num_workers, 1)`` *streams* (one per
rank and DataLoader worker) take shards ``s, s + S, ...`` of it, so each sample is read by exactly one stream per
pass. A stream reads its shards one after another and, at the end of its share, starts the next pass: the loader
is infinite, batches run across pass boundaries, and ranks whose shares hold different sample counts simply
start their next pass at different steps. A pass needs at least ``S`` shards (fewer would leave streams idle).

**Shuffle buffer.** Samples are shuffled in *blocks*: a stream reads ``shuffle_buffer`` samples (raw bytes, not
decoded), emits them in an order drawn from a seed that names the block (``seed``, pass, and the block's first
shard and sample), and reads the next block. WebDataset's own sliding buffer holds a sample for an unbounded
number of steps, so reproducing it after a restart would mean replaying the whole pass; a block is reproduced
by re-reading at most ``shuffle_buffer`` samples from a byte offset. Mixing comes from the block permutation
and the per-pass shard order and shard-to-stream assignment; with shards much larger than the buffer, samples
within a block still come from one or two shards (write shards with samples in random order, as usual for
WebDataset).

**Resume.** A stream's state is its pass, the byte offset and sample index at which its current block starts,
the shards still to read in the pass, and how many samples of the block it has emitted. DataLoader workers send
their stream's state with each batch; the loader keeps the state of the last batch *handed out* by each stream, so
what workers prefetched is read again after a restart and the run continues with exactly the batch an
uninterrupted run would have used next. (Batches arrive from the workers in turn; after ``k`` batches, worker
``j`` of a fresh DataLoader plays stream ``(k + j) % num_workers``, so the turn order survives the restart.)
At another world size or worker count (``load_every_rank_state``, given every old rank's state), each old
stream's unread remainder - the rest of its pass, brought up to the furthest pass any stream had reached - is
handed to the new streams before they start the next pass with the new split: within a pass no sample is
repeated or skipped.

**Why not the ``webdataset`` package.** Its pipelines have no checkpointable state (the shard iterators and the
shuffle buffer cannot report or restore a position, which the exact-resume guarantee needs), and it reads
``s3://`` by piping through ``curl``/``aws`` subprocesses; this module is stdlib ``tarfile`` plus the project's
boto3 client, and keeps the package's data format and field conventions.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from fastgen.distributed import group as dist_utils
from fastgen.utils.errors import FastGenRuntimeError, UsageError

logger = logging.getLogger(__name__)

TAG = "WDS"
IMAGE_FIELDS = ("png", "jpg", "jpeg", "webp", "bmp")
DEFAULT_FIELDS = {"real": "png;jpg;jpeg;webp;npy"}
READ_SIZE = 1 << 20  # bytes per read from a shard (tarfile's own default, 10 KiB, means many small S3 reads)
ID_BITS = 52  # sample ids stay below 2**52 (fastgen.distributed.keyed_rng hashes ids in two words of that range)


# ------------------------------------------------------------------------------------------------- sources
def parse_datatags(datatags: Sequence[str] | str) -> list[str]:
    """The locations of ``WDS:<location>`` tags (a bare location is taken as WDS too); other tags are refused."""
    if isinstance(datatags, str):
        datatags = [datatags]
    locations = []
    for tag in datatags:
        text = str(tag)
        name, sep, rest = text.partition(":")
        if sep and name.isupper() and not rest.startswith("//"):
            if name != TAG:
                raise UsageError(f"datatags: {text!r} has tag {name}:, the WebDataset loader reads {TAG}: only")
            text = rest
        if not text:
            raise UsageError("datatags: an empty location")
        locations.append(text)
    if not locations:
        raise UsageError("datatags is empty: give at least one WDS:<folder or s3://bucket/prefix>")
    return locations


_STORAGE: dict[int, Any] = {}


def _storage() -> Any:
    """This process's S3 client (one per process: a forked DataLoader worker makes its own), from the
    environment's credentials (``credentials_dir/s3.json`` is exported there when a run starts)."""
    from fastgen.checkpoint.s3 import S3Storage

    pid = os.getpid()
    if pid not in _STORAGE:
        _STORAGE.clear()
        _STORAGE[pid] = S3Storage()
    return _STORAGE[pid]


def list_shards(locations: Sequence[str], storage: Any = None) -> list[str]:
    """Every ``.tar`` shard of ``locations`` (local paths or ``s3://`` URLs), sorted within each location."""
    from fastgen.checkpoint.s3 import S3Location, is_s3_url

    shards: list[str] = []
    for location in locations:
        if is_s3_url(location):
            storage = storage or _storage()
            where = S3Location.parse(location)
            if where.key.endswith(".tar"):
                found = [location]
            else:
                found = [f"s3://{where.bucket}/{key}" for key in storage.list_keys(where) if key.endswith(".tar")]
        else:
            path = Path(location).expanduser()
            if path.is_file():
                found = [str(path)]
            elif path.is_dir():
                found = sorted(str(p) for p in path.rglob("*.tar") if p.is_file())
            else:
                raise UsageError(f"datatags: {location} does not exist")
        if not found:
            raise UsageError(f"datatags: no .tar shards in {location}")
        shards.extend(found)
    return shards


class _S3RangeReader(io.RawIOBase):
    """An S3 object read from byte ``start`` on with a ranged GET; a read that fails mid-body reopens the request
    at the byte it reached (botocore retries the request itself, not a body that breaks off)."""

    def __init__(self, storage: Any, url: str, start: int, reopen_attempts: int = 3) -> None:
        from fastgen.checkpoint.s3 import S3Location

        self.storage = storage
        self.location = S3Location.parse(url)
        self.position = start
        self.reopen_attempts = reopen_attempts
        self._body: Any = None
        self.total_size = -1  # known once the first request answered

    def readable(self) -> bool:
        return True

    def _open(self) -> Any:
        with self.storage._errors("reading", self.location):
            response = self.storage.client.get_object(Bucket=self.location.bucket, Key=self.location.key,
                                                      Range=f"bytes={self.position}-")
        # "bytes 100-999/1000": the object's size, for the end-of-archive check
        self.total_size = int(str(response.get("ContentRange", "")).rpartition("/")[2] or
                              self.position + int(response["ContentLength"]))
        return response["Body"]

    def readinto(self, buffer: Any) -> int:
        from botocore.exceptions import BotoCoreError

        view = memoryview(buffer).cast("B")
        for attempt in range(self.reopen_attempts + 1):
            try:
                if self._body is None:
                    self._body = self._open()
                data = self._body.read(len(view))
                break
            except (BotoCoreError, OSError) as exc:
                self._close_body()
                if attempt == self.reopen_attempts:
                    raise FastGenRuntimeError(f"reading {self.location} broke off at byte {self.position} "
                                              f"{attempt + 1} times ({type(exc).__name__})") from None
                logger.warning("reading %s broke off at byte %d (%s); reopening", self.location, self.position,
                               type(exc).__name__)
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def _close_body(self) -> None:
        if self._body is not None:
            try:
                self._body.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is dropped either way
                pass
            self._body = None

    def close(self) -> None:
        self._close_body()
        super().close()


def _size(handle: Any) -> int:
    """The byte size of an open shard (a local file, or the S3 object behind ``_S3RangeReader``)."""
    raw = getattr(handle, "raw", handle)
    if isinstance(raw, _S3RangeReader):
        return raw.total_size
    return os.fstat(handle.fileno()).st_size


def open_shard(url: str, start: int, storage: Any = None) -> io.BufferedIOBase:
    """Shard ``url`` as a binary stream positioned at byte ``start``."""
    from fastgen.checkpoint.s3 import is_s3_url

    if is_s3_url(url):
        return io.BufferedReader(_S3RangeReader(storage or _storage(), url, start), buffer_size=READ_SIZE)
    try:
        handle = open(url, "rb", buffering=READ_SIZE)  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise FastGenRuntimeError(f"cannot open shard {url}: {exc.strerror}") from None
    handle.seek(start)
    return handle


# ------------------------------------------------------------------------------------------------- samples
@dataclass
class RawSample:
    """One sample's undecoded fields; ``offset`` is the byte at which its first member's header starts."""

    url: str
    key: str
    index: int
    offset: int
    fields: dict[str, bytes] = field(default_factory=dict)


def _split_name(name: str) -> tuple[str, str]:
    """``"a/b/00042.seg.png"`` -> ``("a/b/00042", "seg.png")`` (WebDataset's key / extension split)."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def read_samples(url: str, start: int = 0, first_index: int = 0, storage: Any = None) -> Iterator[RawSample]:
    """The samples of shard ``url`` from byte ``start`` (a sample boundary), numbered from ``first_index``."""
    handle = open_shard(url, start, storage)
    current: RawSample | None = None
    index = first_index
    try:
        with tarfile.open(fileobj=handle, mode="r|", bufsize=READ_SIZE) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                key, extension = _split_name(member.name)
                if current is not None and key != current.key:
                    yield current
                    index += 1
                    current = None
                if current is None:
                    current = RawSample(url=url, key=key, index=index, offset=start + member.offset)
                data = archive.extractfile(member).read()
                if len(data) != member.size:  # stream mode returns what it got from a cut-off file
                    raise tarfile.ReadError(f"{member.name} is cut off at {len(data)} of {member.size} bytes")
                if extension:
                    current.fields[extension] = data
                archive.members = []  # a stream-mode TarFile keeps every member it has seen otherwise
            end, size = start + archive.offset, _size(handle)
            if size - end < 2 * tarfile.BLOCKSIZE:  # stream mode takes a cut-off header for the end of the archive
                raise tarfile.ReadError(f"it stops at byte {size} without tar's end-of-archive blocks (cut off?)")
    except (tarfile.TarError, EOFError) as exc:
        raise FastGenRuntimeError(f"shard {url} is not a readable tar file ({exc}) after byte {start}") from None
    finally:
        handle.close()
    if current is not None:
        yield current


def sample_id(url: str, index: int, pass_: int) -> int:
    """A sample's id for keyed training noise: a hash of its shard's file name, its index in the shard and the
    pass, below ``2**52``. It does not depend on the world size or the worker count, nor on where the shards
    live (the file name, not the folder, is hashed)."""
    digest = hashlib.blake2b(f"{pass_}/{os.path.basename(url)}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - ID_BITS)


def _decode(extension: str, data: bytes, sample: RawSample) -> Any:
    """Decode by the extension's last part, as webdataset does: ``latent.npy`` is an ``npy``, ``hr.png`` a ``png``."""
    kind = extension.rsplit(".", 1)[-1]
    if kind in IMAGE_FIELDS:
        import numpy as np
        import PIL.Image
        import torch

        try:
            with PIL.Image.open(io.BytesIO(data)) as image:
                array = np.array(image)  # a writable copy (torch refuses to wrap PIL's read-only buffer)
        except OSError as exc:
            raise FastGenRuntimeError(f"{sample.url}: {sample.key}.{extension} is not a readable image ({exc})") from None
        if array.ndim == 2:
            array = array[:, :, None]
        if array.dtype != np.uint8:
            raise FastGenRuntimeError(f"{sample.url}: {sample.key}.{extension} is not 8-bit ({array.dtype})")
        pixels = torch.from_numpy(array).permute(2, 0, 1)
        return pixels.to(torch.float32).div_(127.5).sub_(1.0)
    if kind == "npy":
        import numpy as np
        import torch

        return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))
    if kind == "cls":
        import torch

        try:
            return torch.tensor(int(data.decode().strip()), dtype=torch.int64)
        except ValueError:
            raise FastGenRuntimeError(f"{sample.url}: {sample.key}.cls is not an integer") from None
    if kind == "json":
        return json.loads(data)
    if kind == "txt":
        return data.decode()
    return data


def parse_fields(fields: dict[str, str] | None) -> dict[str, tuple[str, ...]]:
    """``{"real": "png;jpg"}`` -> ``{"real": ("png", "jpg")}``, extensions lower-cased."""
    chosen = dict(DEFAULT_FIELDS if fields is None else fields)
    if not chosen:
        raise UsageError("fields is empty: map at least one batch key to extensions, e.g. {real: png}")
    parsed = {}
    for name, extensions in chosen.items():
        options = tuple(e.strip().lower().lstrip(".") for e in str(extensions).split(";") if e.strip())
        if not options:
            raise UsageError(f"fields.{name}: no extensions")
        parsed[str(name)] = options
    nested = {str(name).partition(".")[0] for name in parsed if "." in str(name)}
    clash = sorted(nested & set(parsed))
    if clash:
        raise UsageError(f"fields.{clash[0]}: the key is also the prefix of a dotted one ({clash[0]}.*); use either")
    return parsed


def decode_sample(sample: RawSample, fields: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    decoded: dict[str, Any] = {}
    for name, options in fields.items():
        for extension in options:
            if extension == "__key__":
                decoded[name] = sample.key
            elif extension == "__url__":
                decoded[name] = sample.url
            elif extension in sample.fields:
                decoded[name] = _decode(extension, sample.fields[extension], sample)
            else:
                continue
            break
        else:
            have = ", ".join(sorted(sample.fields)) or "nothing"
            raise FastGenRuntimeError(f"{sample.url}: sample {sample.key} has no {' or '.join(options)} for field "
                                      f"{name!r} (it has {have}); set fields= to the extensions your shards hold")
    return decoded


def collate(samples: list[dict[str, Any]], ids: list[int]) -> dict[str, Any]:
    """Tensors stacked (one shape per field, or a one-line error), everything else kept as a list."""
    import torch

    batch: dict[str, Any] = {}
    for name in samples[0]:
        values = [s[name] for s in samples]
        if isinstance(values[0], torch.Tensor):
            shapes = {tuple(v.shape) for v in values}
            if len(shapes) > 1:
                raise FastGenRuntimeError(f"field {name!r} has different shapes in one batch ({sorted(shapes)}): "
                                          "every sample of a WebDataset must have the same size")
            value: Any = torch.stack(values)
        else:
            value = values
        outer, dotted, inner = name.partition(".")
        if dotted:  # "real.video": one modality of a multimodal sample
            batch.setdefault(outer, {})[inner] = value
        else:
            batch[name] = value
    batch["sample_ids"] = torch.tensor(ids, dtype=torch.int64)
    return batch


# ------------------------------------------------------------------------------------------------- streams
def pass_shards(shards: Sequence[str], pass_: int, seed: int, shuffle: bool) -> list[str]:
    """The pass's shard order (a permutation drawn from ``seed + pass``)."""
    order = list(shards)
    if shuffle:
        random.Random(seed + pass_).shuffle(order)
    return order


def block_order(seed: int, pass_: int, url: str, index: int, size: int) -> list[int]:
    """The emission order of a block of ``size`` samples that starts at sample ``index`` of ``url``: named by
    the block, not the stream, so whichever stream re-reads it after a restart emits it the same way."""
    digest = hashlib.blake2b(f"{seed}/{pass_}/{os.path.basename(url)}/{index}".encode(), digest_size=8).digest()
    order = list(range(size))
    random.Random(int.from_bytes(digest, "little")).shuffle(order)
    return order


@dataclass
class Part:
    """What a stream still has to read of one pass: ``queue`` is ``[[url, byte offset, sample index], ...]``,
    the first entry where the current block starts, the others shards not yet opened (from byte 0); ``emitted``
    samples of the current block were handed out already."""

    pass_: int
    queue: list[list[Any]]
    emitted: int = 0

    def to_state(self) -> dict[str, Any]:
        return {"pass": self.pass_, "queue": [list(q) for q in self.queue], "emitted": self.emitted}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Part:
        return cls(int(state["pass"]), [[str(u), int(o), int(i)] for u, o, i in state["queue"]], int(state["emitted"]))


class Stream:
    """One rank's (or one DataLoader worker's) share of the shards: ``parts`` to finish, then pass ``next_pass``
    onwards with the split ``(stream, streams)``. ``state()`` after any sample names exactly the next one."""

    def __init__(self, shards: Sequence[str], stream: int, streams: int, seed: int, shuffle: bool,
                 buffer: int, parts: list[Part], next_pass: int, storage: Any = None) -> None:
        self.shards, self.stream, self.streams = list(shards), stream, streams
        self.seed, self.shuffle, self.buffer = seed, shuffle, max(1, int(buffer))
        self.parts, self.next_pass = parts, next_pass
        self.storage = storage
        self._block: list[tuple[RawSample, int]] | None = None  # (sample, pass) in emission order
        self._after_block: list[list[Any]] = []  # the part's queue once the current block is emitted

    @classmethod
    def from_state(cls, state: dict[str, Any], shards: Sequence[str], stream: int, streams: int, seed: int,
                   shuffle: bool, buffer: int) -> Stream:
        """Stream ``stream`` of ``streams`` continuing from ``state`` (``Stream.state()``, as checkpoints hold it)."""
        return cls(shards, stream, streams, seed, shuffle, buffer, [Part.from_state(p) for p in state["parts"]],
                   int(state["next_pass"]))

    def share(self, pass_: int) -> list[list[Any]]:
        return [[url, 0, 0] for url in pass_shards(self.shards, pass_, self.seed, self.shuffle)[self.stream::self.streams]]

    def state(self) -> dict[str, Any]:
        return {"parts": [p.to_state() for p in self.parts], "next_pass": self.next_pass}

    def _read_block(self, part: Part) -> list[tuple[RawSample, int]]:
        """Read the part's next block from the head of its queue; the queue keeps the block's start."""
        samples: list[RawSample] = []
        queue = list(part.queue)
        while queue and len(samples) < self.buffer:
            url, offset, index = queue[0]
            reader = read_samples(url, offset, index, self.storage)
            for sample in reader:
                samples.append(sample)
                if len(samples) == self.buffer:
                    break
            else:
                queue.pop(0)
                continue
            # the block is full: where the next sample of this shard starts (or the shard is done)
            following = next(reader, None)
            reader.close()
            if following is None:
                queue.pop(0)
            else:
                queue[0] = [url, following.offset, following.index]
        self._after_block = queue
        if not samples:
            return []
        head = part.queue[0]
        order = block_order(self.seed, part.pass_, head[0], head[2], len(samples))
        return [(samples[i], part.pass_) for i in order]

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> tuple[RawSample, int]:
        while True:
            if not self.parts:
                self.parts = [Part(self.next_pass, self.share(self.next_pass))]
                self.next_pass += 1
                if not self.parts[0].queue:
                    raise UsageError(f"stream {self.stream} of {self.streams} has no shard in pass "
                                     f"{self.next_pass - 1}: write at least {self.streams} shards")
            part = self.parts[0]
            if self._block is None:
                self._block = self._read_block(part)
            if part.emitted < len(self._block):
                item = self._block[part.emitted]
                part.emitted += 1
                if part.emitted == len(self._block):  # the block is done: the state moves past it
                    part.queue, part.emitted, self._block = self._after_block, 0, None
                    if not part.queue:
                        self.parts.pop(0)
                return item
            # an empty block: the part has nothing left
            self._block = None
            self.parts.pop(0)


def resplit(states: list[dict[str, Any]], shards: Sequence[str], streams: int, seed: int,
            shuffle: bool) -> list[dict[str, Any]]:
    """New streams' states from old streams' ``states`` (another world size or worker count): each old stream's
    remainder up to the furthest pass any of them reached is dealt round-robin to the ``streams`` new ones,
    which then start the pass after it with the new split."""
    old_streams = len(states)
    furthest = max([p["pass"] for s in states for p in s["parts"]] + [s["next_pass"] - 1 for s in states])
    remainders: list[dict[str, Any]] = []
    for number, state in enumerate(states):
        remainders.extend(state["parts"])
        for pass_ in range(int(state["next_pass"]), furthest + 1):
            share = pass_shards(shards, pass_, seed, shuffle)[number::old_streams]
            if share:
                remainders.append({"pass": pass_, "queue": [[u, 0, 0] for u in share], "emitted": 0})
    new = [{"parts": [], "next_pass": furthest + 1} for _ in range(streams)]
    for i, remainder in enumerate(remainders):
        new[i % streams]["parts"].append(remainder)
    return new


# ------------------------------------------------------------------------------------------------- loader
class WebDatasetLoader:
    """The infinite, resumable WebDataset loader of ``WDS:`` datatags (see the module docstring).

    ``batch_size`` is per rank; ``rank`` / ``world_size`` default to the process group's. ``num_workers``
    DataLoader workers each read their own stream; ``prefetch_factor`` batches each may be read ahead.
    """

    def __init__(self, datatags: Sequence[str] | str, batch_size: int, fields: dict[str, str] | None = None,
                 shuffle: bool = True, shuffle_buffer: int = 1000, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, num_workers: int = 0, pin_memory: bool = False,
                 prefetch_factor: int | None = None) -> None:
        if batch_size < 1:
            raise UsageError(f"batch_size must be positive, got {batch_size}")
        if shuffle_buffer < 1:
            raise UsageError(f"shuffle_buffer must be at least 1 (1 = no sample shuffle), got {shuffle_buffer}")
        if num_workers < 0:
            raise UsageError(f"num_workers must be 0 or more, got {num_workers}")
        if num_workers == 0 and prefetch_factor is not None:
            raise UsageError("prefetch_factor needs worker processes: set num_workers > 0")
        self.batch_size = int(batch_size)
        self.fields = parse_fields(dict(fields) if fields is not None else None)
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = int(shuffle_buffer) if shuffle else 1
        self.seed = int(seed)
        self.rank = dist_utils.get_rank() if rank is None else int(rank)
        self.world_size = dist_utils.get_world_size() if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        self.num_workers = int(num_workers)
        import torch

        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()  # pinning needs CUDA
        self.prefetch_factor = prefetch_factor
        self.locations = parse_datatags(datatags)
        self.shards = list_shards(self.locations)
        self.streams_per_rank = max(1, self.num_workers)
        self.streams = self.world_size * self.streams_per_rank
        if len(self.shards) < self.streams:
            raise UsageError(f"{len(self.shards)} WebDataset shard(s) cannot feed {self.world_size} rank(s) x "
                             f"{self.streams_per_rank} reader(s): write at least {self.streams} shards, or use "
                             "fewer workers")
        self.batches = 0
        self.stream_states = [{"parts": [], "next_pass": 0} for _ in range(self.streams_per_rank)]  # from pass 0
        self._local: Stream | None = None
        self._dataloader: Any = None
        self._batches: Any = None

    def _stream(self, local: int, state: dict[str, Any]) -> Stream:
        return Stream.from_state(state, self.shards, self.rank * self.streams_per_rank + local, self.streams,
                                 self.seed, self.shuffle, self.shuffle_buffer)

    def __iter__(self) -> WebDatasetLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.num_workers == 0 and not self.pin_memory:
            if self._local is None:
                self._local = self._stream(0, self.stream_states[0])
            batch = next_batch(self._local, self.batch_size, self.fields)
            self.stream_states[0] = self._local.state()
        else:
            batch, state = next(self._worker_batches())
            self.stream_states[self.batches % self.streams_per_rank] = state
        self.batches += 1
        return batch

    def _worker_batches(self) -> Any:
        if self._batches is None:
            if self._dataloader is None:
                import torch
                from torch.utils.data import DataLoader

                self._dataloader = DataLoader(
                    _StreamBatches(self), batch_size=None, num_workers=self.num_workers,
                    pin_memory=self.pin_memory,
                    prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
                    generator=torch.Generator().manual_seed(self.seed * 65_537 + self.rank))
            self._batches = iter(self._dataloader)
        return self._batches

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "webdataset", "world_size": self.world_size, "streams_per_rank": self.streams_per_rank,
                "batches": self.batches, "seed": self.seed, "batch_size": self.batch_size,
                "streams": [dict(s) for s in self.stream_states]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's own state, saved at the same world size and worker count."""
        if state.get("kind") != "webdataset":
            raise UsageError("the checkpoint's data loader state is not a WebDataset loader's: resume with the "
                             "loader the run was started with")
        if int(state["world_size"]) != self.world_size or int(state["streams_per_rank"]) != self.streams_per_rank:
            raise UsageError(f"this WebDataset position was saved by {state['world_size']} rank(s) x "
                             f"{state['streams_per_rank']} reader(s); another split needs every rank's state "
                             "(load_every_rank_state)")
        self.batches = int(state["batches"])
        self.stream_states = [dict(s) for s in state["streams"]]
        self._reset()

    def load_every_rank_state(self, states: list[dict[str, Any]]) -> None:
        """Continue from every old rank's state (in rank order), at this or another world size / worker count."""
        if any(s.get("kind") != "webdataset" for s in states):
            raise UsageError("the checkpoint's data loader state is not a WebDataset loader's")
        same = len(states) == self.world_size and all(int(s["streams_per_rank"]) == self.streams_per_rank for s in states)
        if same:
            self.load_state_dict(states[self.rank])
            return
        old = [stream for s in states for stream in s["streams"]]
        new = resplit(old, self.shards, self.streams, self.seed, self.shuffle)
        mine = new[self.rank * self.streams_per_rank:(self.rank + 1) * self.streams_per_rank]
        logger.info("WebDataset: %d old stream(s) handed to %d new one(s) at pass %d", len(old), self.streams,
                    mine[0]["next_pass"])
        self.batches = 0
        self.stream_states = mine
        self._reset()

    def _reset(self) -> None:
        self._local = None
        self._dataloader = None  # workers hold the streams they started with: start new ones
        self._batches = None


def next_batch(stream: Stream, batch_size: int, fields: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    samples, ids = [], []
    for _ in range(batch_size):
        raw, pass_ = next(stream)
        samples.append(decode_sample(raw, fields))
        ids.append(sample_id(raw.url, raw.index, pass_))
    return collate(samples, ids)


class _StreamBatches(IterableDataset):
    """The DataLoader's iterable dataset: in worker ``j`` of ``n``, the batches of local stream ``(k + j) % n``
    (``k`` = batches handed out when the DataLoader started), each with the stream's state after it."""

    def __init__(self, loader: WebDatasetLoader) -> None:
        self.loader_state = (loader.shards, loader.rank, loader.streams_per_rank, loader.streams, loader.seed,
                             loader.shuffle, loader.shuffle_buffer, loader.batch_size, loader.fields)
        self.start_batches = loader.batches
        self.states = [dict(s) for s in loader.stream_states]

    def __iter__(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        from torch.utils.data import get_worker_info

        shards, rank, per_rank, streams, seed, shuffle, buffer, batch_size, fields = self.loader_state
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        local = (self.start_batches + worker) % per_rank if workers == per_rank else 0
        stream = Stream.from_state(self.states[local], shards, rank * per_rank + local, streams, seed, shuffle, buffer)
        while True:
            batch = next_batch(stream, batch_size, fields)
            yield batch, stream.state()


def build_webdataset_loader(datatags: Sequence[str] | str, batch_size: int, fields: dict[str, str] | None = None,
                            shuffle: bool = True, shuffle_buffer: int = 1000, seed: int = 0, rank: int | None = None,
                            world_size: int | None = None, num_workers: int = 0, pin_memory: bool = False,
                            prefetch_factor: int | None = None) -> WebDatasetLoader:
    """LazyCall target of a ``WDS:`` data loader (``fastgen.configs.data.webdataset_loader``)."""
    return WebDatasetLoader(datatags, batch_size, fields=fields, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                            seed=seed, rank=rank, world_size=world_size, num_workers=num_workers,
                            pin_memory=pin_memory, prefetch_factor=prefetch_factor)


build_webdataset_loader.DATA_PATH_ARGUMENTS = ("datatags",)  # type: ignore[attr-defined]  # checked before a run


# ------------------------------------------------------------------------------------------------- writing
def write_shards(samples: Sequence[dict[str, bytes]] | Iterator[dict[str, bytes]], folder: str | os.PathLike[str],
                 samples_per_shard: int, prefix: str = "shard") -> list[Path]:
    """Write ``samples`` (``{"__key__": key, extension: bytes, ...}``) as ``prefix-000000.tar``, ... in ``folder``;
    each shard is written to a temporary name and renamed, so a shard that exists is complete."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    archive: tarfile.TarFile | None = None
    partial: Path | None = None

    def close() -> None:
        nonlocal archive, partial
        if archive is not None and partial is not None:
            archive.close()
            final = partial.with_suffix("")
            os.replace(partial, final)
            written.append(final)
        archive, partial = None, None

    try:
        for count, sample in enumerate(samples):
            if count % samples_per_shard == 0:
                close()
                partial = folder / f"{prefix}-{len(written):06d}.tar.partial"
                archive = tarfile.open(partial, "w", format=tarfile.PAX_FORMAT)
            key = str(sample["__key__"])
            for extension, data in sample.items():
                if extension.startswith("__"):
                    continue
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                info.mode = 0o644
                assert archive is not None
                archive.addfile(info, io.BytesIO(data))
        close()
    except BaseException:
        if archive is not None:
            archive.close()
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise
    return written


__all__ = ["RawSample", "Stream", "WebDatasetLoader", "build_webdataset_loader", "list_shards", "parse_datatags",
           "read_samples", "resplit", "sample_id", "write_shards"]
