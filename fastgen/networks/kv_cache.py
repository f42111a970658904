"""The tagged key/value cache and block-causal mask shared by the chunked causal video networks
(``fastgen.networks.causal_dit.CausalVideoDiT``, ``fastgen.networks.causal_wan.CausalWanTransformer``).

A chunk-by-chunk generator (CausVid; Yin et al. 2025, "From slow bidirectional to fast autoregressive video
diffusion models", Sec. 3.1) runs a network on one chunk of frames at a time; the chunk attends to itself and to
the keys and values that the earlier chunks left in the cache, which is what block-causal attention over the whole
video computes - so a cached chunk-by-chunk pass equals the masked full pass, at the cost of one chunk per call.

* ``ChunkedKVCache`` is the mixin that gives a network its caches: ``with net.kv_cache(tag, write, keep_frames)``
  selects tag ``tag``'s cache for the forwards inside (classifier-free guidance keeps a ``cond`` and an ``uncond``
  one, which must never mix), ``write=True`` appends the call's own keys and values (detached: the cache is
  context, never a path for gradients), ``keep_frames`` rolls it, and ``clear_caches()`` empties them all. Frames
  are counted in the network's input frames (latent frames for a latent model); the cache holds tokens in
  proportion.
* ``block_causal_mask`` / ``chunk_ids``: query chunk ``i`` sees key chunk ``j`` iff ``j <= i``, over *absolute*
  frame indices, so a cached call (whose keys start with the cached frames) gets the rows of the full mask it
  stands for.
* ``causal_masks`` / ``attend``: the attention of a call under one of ``ATTENTION_BACKENDS`` - ``"sdpa"`` (the
  boolean mask to ``scaled_dot_product_attention``, any device), ``"flex"`` (a ``flex_attention`` block mask, which
  skips whole masked blocks instead of computing and discarding them; compiled on CUDA, eager elsewhere) or
  ``"auto"`` (flex on CUDA where torch has it, else SDPA). A call whose queries all lie in one chunk - every step of
  chunk-by-chunk generation - sees all of its keys and needs no mask at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

ATTENTION_BACKENDS = ("auto", "sdpa", "flex")


@dataclass
class ChunkCache:
    """One tag's cached keys / values per block (``(B, heads, tokens, head_dim)``): the last ``kept`` of the
    ``frames`` frames written so far (a rolling cache drops the oldest; positions stay absolute)."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    frames: int = 0
    kept: int = 0

    def past(self, block: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Block ``block``'s cached keys and values, or None while the cache is empty."""
        return (self.keys[block], self.values[block]) if self.kept else None

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor], frames: int, keep: int | None) -> None:
        """Add a call's keys and values (one per block, ``frames`` frames' tokens on dim 2), detached; then keep the
        last ``keep`` frames. Tokens are in proportion to frames (every frame has the same tokens), so the tokens
        to drop are the cached tokens' share of the frames dropped."""
        keys, values = [k.detach() for k in keys], [v.detach() for v in values]
        if self.kept:
            keys = [torch.cat([old, new], dim=2) for old, new in zip(self.keys, keys)]
            values = [torch.cat([old, new], dim=2) for old, new in zip(self.values, values)]
        self.keys, self.values = keys, values
        self.frames += frames
        self.kept += frames
        if keep is not None and self.kept > keep:  # roll: drop the oldest frames' tokens
            drop = self.keys[0].shape[2] * (self.kept - keep) // self.kept
            self.keys = [k[:, :, drop:] for k in self.keys]
            self.values = [v[:, :, drop:] for v in self.values]
            self.kept = keep


class ChunkedKVCache:
    """Mixin for a chunked video network (an ``nn.Module`` with ``chunk_frames``): tagged KV caches (module
    docstring). Call ``_init_caches()`` in ``__init__``; in ``forward``, ``_open_cache()`` says which cache the call
    reads (and writes)."""

    chunk_frames: int
    causal: bool

    def _init_caches(self) -> None:
        self._caches: dict[str, ChunkCache] = {}
        self._active: tuple[str, bool, int | None] | None = None

    @contextlib.contextmanager
    def kv_cache(self, tag: str = "default", write: bool = False, keep_frames: int | None = None) -> Iterator[None]:
        """Within the context, forwards attend to tag ``tag``'s cache (earlier chunks) and, with ``write``, append
        their own keys and values to it - keeping only the last ``keep_frames`` frames when given (a rolling cache:
        generation past the trained length attends to a window of recent chunks at their absolute positions)."""
        if keep_frames is not None and (keep_frames < self.chunk_frames or keep_frames % self.chunk_frames):
            raise ValueError(f"keep_frames must be a positive multiple of chunk_frames ({self.chunk_frames})")
        previous, self._active = self._active, (tag, write, keep_frames)
        try:
            yield
        finally:
            self._active = previous

    def clear_caches(self) -> None:
        self._caches.clear()

    def cached_frames(self, tag: str = "default") -> int:
        """Frames written to tag ``tag`` so far (the next call's frame offset)."""
        cache = self._caches.get(tag)
        return cache.frames if cache is not None else 0

    def kept_frames(self, tag: str = "default") -> int:
        """Frames whose keys and values tag ``tag`` holds now."""
        cache = self._caches.get(tag)
        return cache.kept if cache is not None else 0

    def _open_cache(self, frames: int) -> tuple[ChunkCache | None, bool, int | None]:
        """The cache this call of ``frames`` frames reads (None outside ``kv_cache``), whether it writes, and how
        many frames to keep. A causal network's cached calls go chunk by chunk: the frame offset is a chunk
        boundary and a written call is whole chunks (else the cache would cut through a chunk's block)."""
        if self._active is None:
            return None, False, None
        tag, write, keep = self._active
        cache = self._caches.setdefault(tag, ChunkCache())
        if self.causal and (cache.frames % self.chunk_frames or (write and frames % self.chunk_frames)):
            raise ValueError(f"cached calls go chunk by chunk ({self.chunk_frames} frames): {cache.frames} cached, "
                             f"{frames} given")
        return cache, write, keep


def chunk_ids(start: int, frames: int, per_frame: int, chunk_frames: int, device: torch.device) -> torch.Tensor:
    """``(frames * per_frame,)``: the chunk of each token of frames ``start .. start + frames - 1`` (frame major)."""
    return (torch.arange(start, start + frames, device=device) // chunk_frames).repeat_interleave(per_frame)


def block_causal_mask(frames: int, offset: int, past_frames: int, per_frame: int, chunk_frames: int,
                      device: torch.device) -> torch.Tensor:
    """``(queries, keys)`` boolean SDPA mask (True = attend) for the ``frames`` frames at absolute frame ``offset``
    against the ``past_frames`` cached frames before them and themselves: key chunk ``<=`` query chunk."""
    queries = chunk_ids(offset, frames, per_frame, chunk_frames, device)
    keys = chunk_ids(offset - past_frames, past_frames + frames, per_frame, chunk_frames, device)
    return keys[None, :] <= queries[:, None]


def check_backend(backend: str, owner: str) -> str:
    """``backend`` when it is one of ``ATTENTION_BACKENDS``, else a one-line ``ConfigError`` naming ``owner``."""
    if backend not in ATTENTION_BACKENDS:
        raise ConfigError(f"{owner}: attention_backend={backend!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    return backend


_compiled_flex: Any = None


def flex_attention_fn(device: torch.device) -> Any:
    """``flex_attention``, compiled on CUDA (where it runs as a fused kernel; eager flex attention is a reference
    implementation, used on other devices only when asked for)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        logger.info("compiling flex attention for the block-causal mask (once per process)")
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def causal_masks(backend: str, frames: int, offset: int, past_frames: int, per_frame: int, chunk_frames: int,
                 device: torch.device) -> tuple[torch.Tensor | None, Any]:
    """``(SDPA mask, flex block mask)`` of a block-causal call (module docstring) - at most one of them, none when
    the queries lie in one chunk. Frames are the attention's frames (token frames of a patched model)."""
    if offset // chunk_frames == (offset + frames - 1) // chunk_frames:
        return None, None
    use_flex = backend == "flex" or (backend == "auto" and device.type == "cuda")
    if not (use_flex and flex_available()):
        return block_causal_mask(frames, offset, past_frames, per_frame, chunk_frames, device), None
    from torch.nn.attention.flex_attention import create_block_mask

    queries = chunk_ids(offset, frames, per_frame, chunk_frames, device)
    keys = chunk_ids(offset - past_frames, past_frames + frames, per_frame, chunk_frames, device)

    def visible(_b: torch.Tensor, _h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return keys[k] <= queries[q]

    return None, create_block_mask(visible, None, None, len(queries), len(keys), device=device)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           block_mask: Any) -> torch.Tensor:
    """``(B, heads, L, head_dim)`` attention under the SDPA mask or the flex block mask (``causal_masks``)."""
    if block_mask is not None:
        return flex_attention_fn(query.device)(query, keys, values, block_mask=block_mask)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=0.0, is_causal=False)


__all__ = ["ATTENTION_BACKENDS", "ChunkCache", "ChunkedKVCache", "attend", "block_causal_mask", "causal_masks",
           "check_backend", "chunk_ids", "flex_attention_fn", "flex_available"]
