"""Tensor fingerprints, and their comparison across ranks: the code ``RankConsistencyCallback`` (during training)
and ``fastgen check-ranks`` (before it) share.

``tensor_fingerprint`` streams a tensor through a 64-bit XOR-multiply checksum in O(1) extra memory;
``gather_fingerprints`` collects every rank's ``{name: fingerprint}`` (one ``int64`` all-gather when the ranks
hold the same names, so it works with gloo on CPU and NCCL on GPU); ``disagreements`` says which names differ and
which ranks hold which value - the rank(s) outside the largest group (ties: the group of the lowest rank) are the
odd ones out.

The fingerprint (exact formula)
-------------------------------
A tensor's bytes are read as ``w``-bit integers, ``w = 8 * element_size`` (``uint8`` for bool / 1-byte types,
``int16``, ``int32``, ``int64``; a 16-byte element is two ``int64`` words). Let ``x_i`` be word ``i`` in
row-major order (the logical order, so a non-contiguous tensor fingerprints like its contiguous copy), and cut
the words into chunks of ``K = 65536`` words; word ``i`` is lane ``j = i mod K`` of chunk ``c = i div K``.
Each lane keeps one ``w``-bit state ``h_j``, updated chunk by chunk with XOR (all arithmetic mod ``2^w``)::

    h_j = x_j                                      (chunk 0)
    h_j = (h_j * A_w) XOR x_{cK + j}               (chunk c >= 1, for the lanes the chunk covers)

with ``A_w`` the low ``w`` bits of ``0x9E3779B97F4A7C17`` (odd and ``= 3 mod 4``). The lanes are then folded
with per-lane odd weights, and the tensor's size and dtype are mixed in::

    F = sum_j u(h_j) * P_j  +  numel * C_1  +  dtype_code * C_2          (mod 2^64, j < number of lanes)
    P_j = mix64((j + 1) * 0x9E3779B97F4A7C15) OR 1

where ``u(h)`` widens ``h`` to 64 bits: sign-extended for ``int16``/``int32`` words, zero-extended for ``uint8``,
and ``h XOR (h >>> 32)`` for ``int64`` words (without that shift, flipping the top bit of two 64-bit lanes -
negating two doubles - would add ``2^63 + 2^63 = 0``).

The number of lanes is ``min(words, K)``; ``mix64`` is the splitmix64 finalizer (Steele et al. 2014:
``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``, logical
shifts), ``C_1 = 0xD6E8FEB86659FD93``, ``C_2 = 0xA0761D6478BD642F`` and ``dtype_code`` a fixed small integer
per dtype. Properties that follow:

* any change to a single element always changes ``F``: ``x -> (h*A) XOR x`` and ``h -> h*A`` are bijections
  mod ``2^w`` (``A`` odd), and multiplying by an odd ``P_j`` is a bijection mod ``2^64``;
* moving elements changes ``F`` except by coincidence: across lanes the weights ``P_j`` differ, and within a
  lane the chunks are combined in order (the multiply between XORs makes the update non-commutative);
* known blind spot, the price of two ops per chunk: ``*``, ``+`` and ``XOR`` carry bits only upwards, so the
  top bit of a word (a float's sign) enters its lane's state linearly. Flipping the top bits of an *even*
  number of words in one lane (positions an exact multiple of ``K`` apart) cancels - for instance negating
  every element of a tensor with exactly ``2K`` elements. Any change to lower bits, and any odd number of
  sign flips per lane, is seen. Breaking this needs a right shift per chunk (three more ops: about 40% slower);
* extra memory is O(1): one ``K``-lane state, one ``K``-word ``int64`` scratch, ``K`` weights and, for
  non-contiguous tensors only, one ``K``-element staging buffer the logical chunk is copied into - whatever
  the tensor size. Each chunk costs two fused elementwise ops (``mul_`` and ``bitwise_xor_``) on data that
  stays in cache, so fingerprinting reads memory at close to copy speed (``benchmarks/fingerprint.py``).

It is a checksum for accidental divergence, not a cryptographic hash.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:  # torch built without distributed support
    DTensor = None  # type: ignore[assignment,misc]
    Replicate = None  # type: ignore[assignment,misc]

CHUNK_WORDS = 65536
_MASK64 = (1 << 64) - 1
_A64 = 0x9E3779B97F4A7C17
_C1 = 0xD6E8FEB86659FD93
_C2 = 0xA0761D6478BD642F
_WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Fixed codes (not hash(), which differs between processes), so ranks agree; unknown dtypes fall back to a
# CRC of the dtype's name, which is also process-independent.
_DTYPE_CODES = {
    torch.bool: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 4, torch.int32: 5, torch.int64: 6,
    torch.float16: 7, torch.bfloat16: 8, torch.float32: 9, torch.float64: 10, torch.complex64: 11,
    torch.complex128: 12,
}


def _signed64(value: int) -> int:
    """``value mod 2^64`` as the signed integer torch's ``int64`` arithmetic uses."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _mul_constant(word_dtype: torch.dtype) -> int:
    """``A_w``: the low ``w`` bits of ``_A64``, as a scalar that fits ``word_dtype`` (uint8 is unsigned)."""
    bits = torch.iinfo(word_dtype).bits
    low = _A64 & ((1 << bits) - 1)
    if word_dtype == torch.uint8:
        return low
    return low - (1 << bits) if low >= 1 << (bits - 1) else low


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of ``int64`` values (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _lane_weights_cpu(n: int) -> torch.Tensor:
    """``P_j = mix64((j + 1) * golden) | 1`` for ``j < n`` (module docstring), in wrapping ``int64`` arithmetic."""
    z = (torch.arange(1, n + 1, dtype=torch.int64) * _signed64(0x9E3779B97F4A7C15))
    z = (z ^ _shr(z, 30)) * _signed64(0xBF58476D1CE4E5B9)
    z = (z ^ _shr(z, 27)) * _signed64(0x94D049BB133111EB)
    z = z ^ _shr(z, 31)
    return z | 1


class _Scratch:
    """Per-device buffers reused across tensors and checks (each ``K`` entries: the O(1) extra memory)."""

    def __init__(self, device: torch.device, chunk_words: int) -> None:
        self.device = device
        self.chunk_words = chunk_words
        self.weights = _lane_weights_cpu(chunk_words).to(device)
        self.wide = torch.empty(chunk_words, dtype=torch.int64, device=device)
        self.high = torch.empty(chunk_words, dtype=torch.int64, device=device)
        self._state: dict[torch.dtype, torch.Tensor] = {}
        self._staging: dict[torch.dtype, torch.Tensor] = {}

    def state(self, word_dtype: torch.dtype) -> torch.Tensor:
        if word_dtype not in self._state:
            self._state[word_dtype] = torch.empty(self.chunk_words, dtype=word_dtype, device=self.device)
        return self._state[word_dtype]

    def staging(self, dtype: torch.dtype, elements: int) -> torch.Tensor:
        buf = self._staging.get(dtype)
        if buf is None or buf.numel() < elements:
            buf = self._staging[dtype] = torch.empty(elements, dtype=dtype, device=self.device)
        return buf


_SCRATCH: dict[tuple[torch.device, int], _Scratch] = {}


def _scratch(device: torch.device, chunk_words: int) -> _Scratch:
    key = (device, chunk_words)
    if key not in _SCRATCH:
        _SCRATCH[key] = _Scratch(device, chunk_words)
    return _SCRATCH[key]


def _range_views(t: torch.Tensor, start: int, end: int) -> Iterator[torch.Tensor]:
    """Views of ``t`` whose row-major concatenation is ``t.flatten()[start:end]`` (no copies; O(ndim) views)."""
    if start >= end:
        return
    if t.dim() == 0:
        yield t.reshape(1)
        return
    if t.dim() == 1:
        yield t[start:end]
        return
    row = t[0].numel()
    r0, o0 = divmod(start, row)
    r1, o1 = divmod(end, row)
    if r0 == r1:
        yield from _range_views(t[r0], o0, o1)
        return
    if o0:
        yield from _range_views(t[r0], o0, row)
        r0 += 1
    if r1 > r0:
        yield t[r0:r1]
    if o1:
        yield from _range_views(t[r1], 0, o1)


def _word_chunks(t: torch.Tensor, word_dtype: torch.dtype, chunk_elems: int,
                 scratch: _Scratch) -> Iterator[torch.Tensor]:
    """``t``'s words in row-major order, ``chunk_elems`` elements (``K`` words) at a time, as 1-D tensors.

    Contiguous tensors are sliced in place; a non-contiguous one has each logical chunk copied into the staging
    buffer (valid until the next chunk is requested).
    """
    n = t.numel()
    if t.is_contiguous():
        words = t.reshape(-1).view(word_dtype)
        step = words.numel() // n * chunk_elems
        for s in range(0, words.numel(), step):
            yield words[s:s + step]
        return
    staging = scratch.staging(t.dtype, chunk_elems)
    for s in range(0, n, chunk_elems):
        e = min(s + chunk_elems, n)
        pos = 0
        for view in _range_views(t, s, e):
            k = view.numel()
            staging[pos:pos + k].view(view.shape).copy_(view)
            pos += k
        yield staging[:e - s].view(word_dtype)


def _word_layout(element_size: int) -> tuple[torch.dtype, int]:
    """The integer dtype a tensor's bytes are read as, and how many such words one element has."""
    if element_size in _WORD_DTYPES:
        return _WORD_DTYPES[element_size], 1
    if element_size % 8 == 0:
        return torch.int64, element_size // 8
    raise TypeError(f"cannot fingerprint elements of {element_size} bytes")


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODES.get(dtype) or (zlib.crc32(str(dtype).encode()) | 0x100)


@torch.no_grad()
def tensor_fingerprint(tensor: torch.Tensor, chunk_words: int = CHUNK_WORDS) -> torch.Tensor:
    """The 64-bit fingerprint ``F`` of ``tensor`` (module docstring), as a 0-d ``int64`` tensor on its device.

    Stays on the device (no host sync), so a caller can fingerprint many tensors and read them all at once.
    """
    t = tensor.detach()
    if DTensor is not None and isinstance(t, DTensor):
        t = t.to_local()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    n = t.numel()
    meta = _signed64(n * _C1 + _dtype_code(t.dtype) * _C2)
    if n == 0:
        return torch.tensor(meta, dtype=torch.int64, device=t.device)
    word_dtype, per_elem = _word_layout(t.element_size())
    chunk_elems = max(1, chunk_words // per_elem)
    k = chunk_elems * per_elem
    scratch = _scratch(t.device, k)
    contiguous = t.is_contiguous()
    if n <= chunk_elems and contiguous:  # one chunk: h = x, fold straight from the tensor
        state = t.reshape(-1).view(word_dtype)
        lanes = state.numel()
    else:
        state = scratch.state(word_dtype)
        a = _mul_constant(word_dtype)
        if contiguous:  # the hot path: whole chunks in place, two fused ops each, no slicing of the state
            words = t.reshape(-1).view(word_dtype)
            total = words.numel()
            state.copy_(words[:k])
            full_end = total - total % k
            for s in range(k, full_end, k):
                state.mul_(a).bitwise_xor_(words[s:s + k])
            if full_end < total and full_end >= k:
                tail = total - full_end
                state[:tail].mul_(a).bitwise_xor_(words[full_end:])
            lanes = k
        else:
            lanes = 0
            for words in _word_chunks(t, word_dtype, chunk_elems, scratch):
                m = words.numel()
                if lanes == 0:
                    state[:m].copy_(words)
                    lanes = m
                else:
                    state[:m].mul_(a).bitwise_xor_(words)
        state = state[:lanes]
    # int64 multiplies are the slow part of the fold on CPUs without a 64-bit vector multiply: widen, then
    # multiply in place (cheaper than a type-promoting multiply).
    wide = scratch.wide[:lanes].copy_(state)
    if word_dtype == torch.int64:  # u = h XOR (h >>> 32): else top-bit flips of two lanes cancel in the sum
        high = torch.bitwise_right_shift(wide, 32, out=scratch.high[:lanes]).bitwise_and_(0xFFFFFFFF)
        wide.bitwise_xor_(high)
    return wide.mul_(scratch.weights[:lanes]).sum().add_(meta)


def fingerprint_tensors(tensors: Iterable[torch.Tensor], chunk_words: int = CHUNK_WORDS) -> torch.Tensor:
    """Fingerprints of ``tensors`` as one CPU ``int64`` tensor (one host transfer per device involved)."""
    results = [tensor_fingerprint(t, chunk_words) for t in tensors]
    if not results:
        return torch.empty(0, dtype=torch.int64)
    by_device: dict[torch.device, list[int]] = {}
    for i, fp in enumerate(results):
        by_device.setdefault(fp.device, []).append(i)
    out = torch.empty(len(results), dtype=torch.int64)
    for indices in by_device.values():
        out[torch.tensor(indices)] = torch.stack([results[i] for i in indices]).cpu()
    return out


def is_sharded(t: torch.Tensor) -> bool:
    """A DTensor placed other than ``Replicate`` on some mesh dimension: its local values differ by design."""
    if DTensor is None or not isinstance(t, DTensor):
        return False
    return not all(isinstance(p, Replicate) for p in t.placements)


def format_fingerprint(value: int) -> str:
    """A fingerprint as 16 hex digits (the unsigned view of the ``int64``)."""
    return f"{value & _MASK64:#018x}"


# ---- comparison across ranks ------------------------------------------------------------------------------------
def _world(group: Any = None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _collective_device(group: Any = None) -> torch.device:
    """Where a gather's tensors must live: CPU for gloo (also when gloo is one of several backends), else CUDA."""
    backend = str(dist.get_backend(group))
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _all_gather(values: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``[world, len]``: every rank's ``values`` (equal lengths on all ranks)."""
    local = values.to(_collective_device(group))
    parts = [torch.empty_like(local) for _ in range(_world(group))]
    dist.all_gather(parts, local, group=group)
    return torch.stack(parts).cpu()


def gather_fingerprints(names: Sequence[str], fingerprints: torch.Tensor, group: Any = None) -> list[dict[str, int]]:
    """Every rank's ``{name: fingerprint}``, indexed by rank in ``group`` (a collective: every rank calls it).

    The ranks first agree on what they compare (a count and a CRC of the names); when they hold the same names in
    the same order, one ``int64`` all-gather carries the fingerprints, else the dicts travel as objects so that
    ``disagreements`` can name what each rank lacks. Without a process group: ``[this rank's dict]``.
    """
    local = dict(zip(names, (int(v) for v in fingerprints.tolist())))
    if _world(group) == 1:
        return [local]
    digest = zlib.crc32("\0".join(names).encode())
    header = _all_gather(torch.tensor([len(names), digest], dtype=torch.int64), group)
    if bool((header == header[0]).all()):
        table = _all_gather(fingerprints.to(torch.int64), group).tolist() if names else [[] for _ in header]
        return [dict(zip(names, row)) for row in table]
    gathered: list[Any] = [None] * _world(group)
    dist.all_gather_object(gathered, local, group=group)
    return gathered


@dataclass(frozen=True)
class Disagreement:
    """One name on which the ranks do not agree.

    ``groups``: ``(value, ranks holding it)``, the reference group first (the largest; ties: the one with the lowest
    rank); ``missing``: ranks that lack the name.
    """

    name: str
    groups: tuple[tuple[Hashable, tuple[int, ...]], ...]
    missing: tuple[int, ...] = ()

    @property
    def reference_ranks(self) -> tuple[int, ...]:
        return self.groups[0][1] if self.groups else ()

    @property
    def odd_ranks(self) -> tuple[int, ...]:
        """The ranks that differ from the reference group, or lack the name."""
        return tuple(sorted([r for _, ranks in self.groups[1:] for r in ranks] + list(self.missing)))

    def describe(self, show: Any = format_fingerprint) -> str:
        """``ranks [0] have 0x...; ranks [1] have 0x...`` (reference first), and who lacks the name."""
        parts = [f"ranks {list(ranks)} have {show(value)}" for value, ranks in self.groups]
        if self.missing:
            parts.append(f"ranks {list(self.missing)} lack it")
        return "; ".join(parts)


def disagreements(per_rank: Sequence[Mapping[str, Hashable] | None], require_all: bool = True) -> list[Disagreement]:
    """The names whose values differ across ranks, in first-seen order.

    ``per_rank[r]`` is rank ``r``'s ``{name: value}``, or ``None`` to leave rank ``r`` out (it failed earlier and
    has nothing to compare). ``require_all``: a name some ranks lack is a disagreement; otherwise a name is compared
    among the ranks that hold it (e.g. the shards of hybrid sharding, held by one rank per replica group).
    """
    present = [r for r, values in enumerate(per_rank) if values is not None]
    order: dict[str, None] = {}
    for r in present:
        order.update(dict.fromkeys(per_rank[r]))  # type: ignore[arg-type]
    found = []
    for name in order:
        by_value: dict[Hashable, list[int]] = {}
        missing = []
        for r in present:
            values = per_rank[r]
            assert values is not None
            if name in values:
                by_value.setdefault(values[name], []).append(r)
            elif require_all:
                missing.append(r)
        if len(by_value) > 1 or missing:
            groups = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
            found.append(Disagreement(name, tuple((v, tuple(rs)) for v, rs in groups), tuple(missing)))
    return found


# ---- whole networks -------------------------------------------------------------------------------------------
def network_fingerprint(module: torch.nn.Module) -> str:
    """One fingerprint of a network's whole state (every parameter and buffer, by name and shape): 16 hex digits.

    What a checkpoint records of a frozen network it does not store (a distillation's teacher), so that a resume
    that rebuilt it from its source can tell a different one. Sharded tensors are fingerprinted whole - each is
    gathered in turn (a collective every rank joins, in the same order; memory: one tensor at a time) - so the
    value does not depend on the world size or the sharding."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        if DTensor is not None and isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        value = int(tensor_fingerprint(tensor).item())
        digest.update(f"{name}|{tuple(tensor.shape)}|{format_fingerprint(value)}\n".encode())
    return digest.hexdigest()[:16]
