"""Training noise keyed by each sample's global index: a run's result does not depend on the world size.

Every random number a method draws in a training or validation step is a pure function of
``(seed, stream, step, sample id, draw index, element index)`` - a *counter-based* generator (Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3", Sec. 2: the n-th number is ``f_key(n)``, no state carried from one
number to the next). The data loader gives every sample its global stream position as ``sample_ids``
(``fastgen.datasets.loader``), so a 1-process run at batch 2B and a 2-rank run at batch B per rank draw exactly
the same noise for the same sample, every rank agrees on per-step choices without communicating, and a resume -
at any world size - needs no saved generator state.

**The hash.** ``lowbias32`` (C. Wellons 2018, "Prospecting for Hash Functions", nullprogram.com; the
hash-prospector's best two-multiply 32-bit permutation, avalanche bias 0.17)::

    x ^= x >> 16;  x *= 0x7feb352d;  x ^= x >> 15;  x *= 0x846ca68b;  x ^= x >> 16     (mod 2^32)

computed in place on int64 tensors holding values in ``[0, 2^32)``, so it runs on any device with plain torch
integer ops and never relies on signed overflow: a multiplier ``m >= 2^31`` is replaced by ``m - 2^32`` (the same
residue mod ``2^32``), so every product stays below ``2^63`` in magnitude, and ``& (2^32 - 1)`` reduces it.

**Keys.** A row's 32-bit key chains the hash over its key words, ``k <- lowbias32(k ^ w)`` for ``w`` in
``(domain, seed lo/hi, stream, step lo/hi, draw, id lo, id hi | copy << 20)`` (the words before the id are
Python ints, hashed once per draw; ids below ``2^52`` and copies below ``2^12`` are distinct): each word enters
a bijection, so rows that differ in one word never share a key through that word (two rows can still collide by
chance, ~``R^2 / 2^33`` for ``R`` rows of a step). Element ``e`` of a row with key ``K`` gets ``lowbias32(K ^ g(e))`` with
``g(e) = lowbias32(e + c)``: one hash per element, and two rows' element sets overlap only at isolated points
(``g(e1) ^ g(e2) = K_a ^ K_b``), never as shifted copies as plain ``K ^ e`` would.

**Distributions.** Uniforms are ``(h + 1/2) / 2^32`` in float64 (in ``(0, 1)``, so logarithms are finite);
normals come two at a time from the Box-Muller transform ``r = sqrt(-2 ln u1)``, ``z = (r cos 2 pi u2,
r sin 2 pi u2)`` (Box & Muller 1958, "A note on the generation of random normal deviates", Ann. Math. Stat. 29,
Eq. 1), elements ``2p`` and ``2p + 1`` sharing the pair ``p``; integers below ``n`` are Lemire's multiply-shift
``(h n) >> 32`` (Lemire 2019, "Fast random integer generation in an interval", Sec. 2; bias below ``n / 2^32``).
Results are cast to the requested dtype and device.

**Rows.** A per-sample draw's first dimension is the batch: row ``i`` is keyed by ``sample_ids[i]``. A draw of
``m B`` rows (a batch repeated ``m`` times, ``torch.Tensor.repeat`` order: copy ``k`` of sample ``i`` at row
``k B + i``) keys row ``j`` by ``(sample_ids[j % B], copy j // B)``, so "several noisings per sample" stay keyed
by the sample whatever the batch split. ``rows(n)`` gives ``n`` rows cycling through the batch the same way (a
pool of ``n`` draws for a batch of ``B``). ``shared`` draws (a per-step choice) are keyed by
``(seed, stream, step, draw)`` only: every rank, and every accumulation round of a step, draws the same value -
a per-step choice is one choice per optimizer step, however the global batch is split over ranks and rounds.

The k-th draw of a step gets draw index k (a counter that starts at 0 when a batch is bound); every rank runs the
same code path, so the k-th draw means the same draw on every rank and at every world size.

``TorchNoise`` has the same interface on torch's own generator (the global one by default): the fallback for a
step that is not bound to keyed sample ids (unit tests that call ``single_train_step`` directly, or a custom loader
that gives no ``sample_ids``).

**What stays world-size dependent.** Anything that reads several samples of a rank's batch at once: f-distill's
weights are normalised by their mean over the batch, a minibatch-std discriminator groups a rank's samples, and
network dropout draws from torch's generator. Gradient accumulation splits a step's samples differently from
ranks (the loader's order), so "W ranks x R rounds" agrees with "W' ranks x R' rounds" only when ``W R = W' R'``
and ``R = R'``.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterator, Sequence
from typing import Protocol, Union, runtime_checkable

import torch

MASK32 = 0xFFFFFFFF
_LOWBIAS32 = ((16, 0x7FEB352D), (15, 0x846CA68B))
_FINAL_SHIFT = 16
_ELEMENT_SALT = 0x9E3779B9  # the golden-ratio constant: g(e) = lowbias32(e + c) does not start at lowbias32(0)
_DOMAIN_ROWS, _DOMAIN_SHARED = 0x52574B59, 0x53484152  # key-word 0: per-sample rows vs step-shared draws
_TWO_PI = 2.0 * math.pi
_COPY_SHIFT = 20  # the last key word: id bits 32..51, then the copy index in bits 20..31
_ID_HIGH_MASK, _COPY_MASK = (1 << _COPY_SHIFT) - 1, (1 << (32 - _COPY_SHIFT)) - 1

Shape = Union[int, Sequence[int], torch.Size]


def _as_signed(multiplier: int) -> int:
    """``multiplier`` or ``multiplier - 2^32``, whichever is below ``2^31`` in magnitude: congruent mod ``2^32``,
    and its product with any ``x < 2^32`` stays inside int64 (no signed overflow)."""
    return multiplier if multiplier < 2**31 else multiplier - 2**32


def lowbias32(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Wellons' ``lowbias32`` permutation of ``[0, 2^32)``, elementwise and **in place** on an int64 tensor ``x``
    of values in that range (returned). ``x * m mod 2^32`` is ``(x * m') & (2^32 - 1)`` with ``m' = m`` or
    ``m - 2^32`` (``|x m'| < 2^63``; ``&`` of a negative int64 is its residue mod ``2^32``, two's complement).
    ``scratch`` (same shape) holds the shifted copies; every step is an in-place op, no temporaries."""
    scratch = torch.empty_like(x) if scratch is None else scratch
    for shift, multiplier in _LOWBIAS32:
        x.bitwise_xor_(torch.bitwise_right_shift(x, shift, out=scratch))
        x.mul_(_as_signed(multiplier)).bitwise_and_(MASK32)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, _FINAL_SHIFT, out=scratch))


def lowbias32_int(x: int) -> int:
    """``lowbias32`` of one Python int (the scalar key prefix, computed without launching device kernels)."""
    x &= MASK32
    for shift, multiplier in _LOWBIAS32:
        x = ((x ^ (x >> shift)) * multiplier) & MASK32
    return x ^ (x >> _FINAL_SHIFT)


def _words(value: int) -> tuple[int, int]:
    """A Python int (any sign, below 2^64 in magnitude) as two 32-bit key words."""
    value &= (1 << 64) - 1
    return value & MASK32, value >> 32


def stream_word(stream: str | int) -> int:
    """A stable 32-bit word for a stream name (CRC-32, the same in every process, unlike ``hash``)."""
    if isinstance(stream, int):
        return stream & MASK32
    return zlib.crc32(stream.encode("utf-8")) & MASK32


def _chain(key: torch.Tensor, *words: torch.Tensor) -> torch.Tensor:
    """``key <- lowbias32(key ^ w)`` for each per-row word, after hashing ``key`` itself (int64 tensors)."""
    key = lowbias32(key)
    for word in words:
        key = lowbias32(key.bitwise_xor_(word))
    return key


@functools.lru_cache(maxsize=64)
def _element_hashes(width: int, device: torch.device) -> torch.Tensor:
    """``g(e) = lowbias32(e + c)`` for ``e < width`` (cached: every draw of a row size needs the same ones)."""
    return lowbias32(torch.arange(width, dtype=torch.int64, device=device).add_(_ELEMENT_SALT))


def _shape(shape: Shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)

def _below_one(u: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``u`` (float64 in [0, 1)) cast to ``dtype``, kept below 1 where rounding reaches it."""
    return u.to(dtype).clamp_max_(1.0 - torch.finfo(dtype).eps / 2)


#: Elements hashed per block on the CPU: the int64 block and its scratch stay in the L2 cache and are reused,
#: where hashing a whole large batch at once would stream ~10 passes through main memory and page-fault two
#: fresh buffers per draw (5x slower than torch.randn on a 512x3x32x32 batch; blocks: ~2x, see benchmarks/).
#: On CUDA one block is the whole draw (kernel launches cost more there than memory passes).
CPU_BLOCK = 1 << 15


@runtime_checkable
class NoiseSource(Protocol):
    """What a method draws its training randomness from (``KeyedNoise`` or ``TorchNoise``)."""

    def randn(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> torch.Tensor: ...

    def randn_like(self, x: torch.Tensor) -> torch.Tensor: ...

    def rand(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor: ...

    def randint(self, high: int, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor: ...

    def rows(self, n: int) -> NoiseSource: ...

    @property
    def shared(self) -> NoiseSource: ...


class KeyedNoise:
    """The keyed stream of one bound batch: ``KeyedNoise(seed, sample_ids, step, stream)``.

    Per-sample draws (``randn``, ``randn_like``, ``rand``, ``randint``) need a first dimension that is a multiple
    of the number of rows (``len(sample_ids)``); ``shared`` draws take any shape and are the same on every rank.
    Draws land on ``device`` (default: the device of ``sample_ids``)."""

    def __init__(self, seed: int, sample_ids: torch.Tensor, step: int, stream: str | int = "train",
                 _copies: torch.Tensor | None = None, _counter: list[int] | None = None,
                 _shared: bool = False) -> None:
        ids = torch.as_tensor(sample_ids)
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"sample_ids must be a non-empty 1-D integer tensor, got {tuple(ids.shape)} {ids.dtype}")
        self.seed, self.step, self.stream = int(seed), int(step), stream
        self.sample_ids = ids.long()
        self.copies = _copies if _copies is not None else torch.zeros_like(self.sample_ids)
        self._counter = _counter if _counter is not None else [0]
        self._shared = _shared
        self.device = self.sample_ids.device

    # ---- keys -----------------------------------------------------------------------------------------------
    @property
    def draws(self) -> int:
        """How many draws this step has made so far (counted together with ``rows`` / ``shared`` views)."""
        return self._counter[0]

    def _next_draw(self) -> int:
        draw = self._counter[0]
        self._counter[0] += 1
        return draw

    def _prefix(self, domain: int, draw: int) -> int:
        """The key chained over ``(domain, seed, stream, step, draw)`` (Python ints: no device work)."""
        key = 0
        for word in (domain, *_words(self.seed), stream_word(self.stream), *_words(self.step), draw & MASK32):
            key = lowbias32_int(key ^ word)
        return key

    def _expand(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ids and copy indices of ``n`` rows cycling through the batch: row ``j`` is sample ``j % B`` with
        copy ``copies[j % B] + (j // B) (max copy + 1)`` (distinct also for a view of a view)."""
        batch = self.sample_ids.numel()
        if n == batch:
            return self.sample_ids, self.copies
        j = torch.arange(n, device=self.sample_ids.device)
        span = int(self.copies.max()) + 1 if n > batch else 1
        return self.sample_ids[j % batch], self.copies[j % batch] + (j // batch) * span

    def _row_keys(self, rows: int, device: torch.device) -> torch.Tensor:
        """``(rows,)`` keys of the next draw: per sample and copy, or one shared key."""
        draw = self._next_draw()
        if self._shared:
            return torch.full((1,), self._prefix(_DOMAIN_SHARED, draw), dtype=torch.int64, device=device)
        batch = self.sample_ids.numel()
        if rows % batch:
            raise ValueError(f"a per-sample draw of {rows} rows does not fit a batch of {batch} samples: the first "
                             "dimension must be a multiple of the batch (rows(n) gives a pool of n draws)")
        ids, copies = self._expand(rows)
        ids, copies = ids.to(device), copies.to(device)
        high = ((ids >> 32) & _ID_HIGH_MASK).bitwise_or_((copies & _COPY_MASK) << _COPY_SHIFT)
        return _chain((ids & MASK32) ^ self._prefix(_DOMAIN_ROWS, draw), high)

    def _hash_blocks(self, shape: tuple[int, ...], device: torch.device | str | None, pair: bool = False
                     ) -> tuple[tuple[int, int, int], Iterator[tuple[torch.Tensor, slice, slice]]]:
        """``(rows, per_row, width)`` of a draw and an iterator over blocks ``(bits, row slice, column slice)`` of
        its ``(rows, width)`` 32-bit hashes (``width``: ``per_row`` rounded up to even when ``pair``, for
        Box-Muller's pairs). A block's ``bits`` buffer is reused by the next block: consume it first."""
        device = torch.device(device) if device is not None else self.device
        if self._shared:
            rows, per_row = 1, math.prod(shape)
        else:
            if len(shape) == 0:
                raise ValueError("a per-sample draw needs a batch dimension (use .shared for a scalar)")
            rows, per_row = shape[0], math.prod(shape[1:])
        keys = self._row_keys(rows, device).unsqueeze(1)
        width = per_row + (per_row % 2 if pair else 0)
        elements = _element_hashes(width, device)
        block = CPU_BLOCK if device.type == "cpu" else max(rows * width, 1)
        cols = min(width, max(block - block % 2, 2))
        rows_per_block = max(1, block // max(cols, 1))
        buffers = torch.empty((2, min(rows, rows_per_block) * cols), dtype=torch.int64, device=device)

        def blocks() -> Iterator[tuple[torch.Tensor, slice, slice]]:
            for r0 in range(0, rows, rows_per_block):
                r1 = min(rows, r0 + rows_per_block)
                for c0 in range(0, width, cols):
                    c1 = min(width, c0 + cols)
                    size = (r1 - r0) * (c1 - c0)
                    bits = buffers[0, :size].view(r1 - r0, c1 - c0)
                    bits.copy_(keys[r0:r1]).bitwise_xor_(elements[c0:c1])  # in place: no broadcast temporary
                    yield lowbias32(bits, buffers[1, :size].view(r1 - r0, c1 - c0)), slice(r0, r1), slice(c0, c1)

        return (rows, per_row, width), blocks()

    # ---- distributions --------------------------------------------------------------------------------------
    def randn(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> torch.Tensor:
        """Standard normals by Box-Muller on pairs of keyed uniforms. ``u1`` and its logarithm are float64 (the
        tails: ``u1 >= 2^-33`` bounds ``|z|`` by 6.9); radius, angle and products are float32 unless float64 is
        asked for (an angle quantised to ``2 pi 2^-24`` changes nothing a float32 normal can show)."""
        shape = _shape(shape)
        (rows, per_row, width), blocks = self._hash_blocks(shape, device, pair=True)
        work = torch.float64 if dtype == torch.float64 else torch.float32
        out = None
        for bits, r, c in blocks:
            if out is None:
                out = torch.empty((rows, width), dtype=work, device=bits.device)
            pairs = bits.view(bits.shape[0], -1, 2)
            radius = pairs[..., 0].to(torch.float64).add_(0.5).mul_(2.0**-32).log_().mul_(-2.0).to(work).sqrt_()
            angle = pairs[..., 1].to(work).mul_(_TWO_PI * 2.0**-32)
            target = out[r, c].view(bits.shape[0], -1, 2)
            torch.mul(radius, torch.cos(angle), out=target[..., 0])
            torch.mul(radius, angle.sin_(), out=target[..., 1])
        assert out is not None
        if width != per_row:
            out = out[:, :per_row]
        return out.to(dtype).reshape(shape)

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        return self.randn(x.shape, dtype=x.dtype, device=x.device)

    def rand(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor:
        """Uniforms in ``[0, 1)``: ``h / 2^32`` in float64, cast, and kept below 1."""
        shape = _shape(shape)
        (rows, _, width), blocks = self._hash_blocks(shape, device)
        out = None
        for bits, r, c in blocks:
            if out is None:
                out = torch.empty((rows, width), dtype=dtype, device=bits.device)
            out[r, c] = _below_one(bits.to(torch.float64).mul_(2.0**-32), dtype)
        assert out is not None
        return out.reshape(shape)

    def randint(self, high: int, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        """Integers in ``[0, high)`` (int64) by Lemire's multiply-shift ``(h high) >> 32``."""
        if not 0 < high < 2**31:
            raise ValueError(f"randint needs 0 < high < 2^31, got {high}")
        shape = _shape(shape)
        (rows, _, width), blocks = self._hash_blocks(shape, device)
        out = None
        for bits, r, c in blocks:
            if out is None:
                out = torch.empty((rows, width), dtype=torch.int64, device=bits.device)
            out[r, c] = bits.mul_(int(high)).bitwise_right_shift_(32)
        assert out is not None
        return out.reshape(shape)

    # ---- views ----------------------------------------------------------------------------------------------
    def rows(self, n: int) -> KeyedNoise:
        """A view over ``n`` rows cycling through the batch (row ``j``: sample ``j % B``, copy ``j // B``) that
        shares this step's draw counter: e.g. a pool of ``n`` regression pairs picked for a batch of ``B``."""
        if n < 1:
            raise ValueError(f"rows needs n >= 1, got {n}")
        ids, copies = self._expand(n)
        return KeyedNoise(self.seed, ids, self.step, self.stream, _copies=copies, _counter=self._counter)

    @property
    def shared(self) -> KeyedNoise:
        """Draws keyed by ``(seed, stream, step, draw)`` only - the same on every rank (per-step choices)."""
        return KeyedNoise(self.seed, self.sample_ids, self.step, self.stream, _copies=self.copies,
                          _counter=self._counter, _shared=True)


class TorchNoise:
    """The ``NoiseSource`` interface on torch's generator (``generator=None``: the global one, which is what every
    draw used before keyed noise). Not world-size invariant: each rank draws from its own stream."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def randn(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> torch.Tensor:
        return torch.randn(_shape(shape), dtype=dtype, device=device, generator=self.generator)

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        return self.randn(x.shape, dtype=x.dtype, device=x.device)

    def rand(self, shape: Shape, *, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor:
        return torch.rand(_shape(shape), dtype=dtype, device=device, generator=self.generator)

    def randint(self, high: int, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.randint(int(high), _shape(shape), device=device, generator=self.generator)

    def rows(self, n: int) -> TorchNoise:
        return self

    @property
    def shared(self) -> TorchNoise:
        return self


GLOBAL_NOISE = TorchNoise()

#: What draw sites accept: torch's generator (None: the global one) or a ``NoiseSource``.
RandomSource = Union[torch.Generator, NoiseSource, None]


def as_noise_source(source: RandomSource) -> NoiseSource:
    """A ``NoiseSource`` for ``source`` (a torch generator or None is wrapped in ``TorchNoise``)."""
    if source is None:
        return GLOBAL_NOISE
    if isinstance(source, torch.Generator):
        return TorchNoise(source)
    return source


def randn(shape: Shape, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
          generator: RandomSource = None) -> torch.Tensor:
    """``torch.randn`` from a torch generator or a ``NoiseSource``."""
    return as_noise_source(generator).randn(shape, dtype=dtype, device=device)


def rand(shape: Shape, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
         generator: RandomSource = None) -> torch.Tensor:
    """``torch.rand`` from a torch generator or a ``NoiseSource``."""
    return as_noise_source(generator).rand(shape, dtype=dtype, device=device)


__all__ = ["CPU_BLOCK", "GLOBAL_NOISE", "KeyedNoise", "NoiseSource", "RandomSource", "TorchNoise", "as_noise_source",
           "lowbias32", "lowbias32_int", "rand", "randn", "stream_word"]
