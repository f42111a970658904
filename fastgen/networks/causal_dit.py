"""A video DiT with block-causal attention over chunks of frames and a key/value cache: the causal video students
(CausVid, Self-Forcing; ``fastgen.methods``) generate a video chunk by chunk, each chunk attending to itself and
to the chunks before it, never after (Yin et al. 2025, "From slow bidirectional to fast autoregressive video
diffusion models", Sec. 3.1). With ``causal=False`` the same class is the bidirectional teacher.

* Tokens: each frame is cut into ``p x p`` patches (DiT's patch embedding per frame); a token's position is the
  2-D sin-cos embedding of its patch plus a 1-D sin-cos embedding of its *absolute* frame index - the frame offset
  of a cached call included, so chunk ``k`` sees the same positions alone as inside the full video.
* Time: ``c_noise`` is ``(B,)`` or per frame ``(B, F)`` (diffusion forcing trains every chunk at its own noise
  level; Chen et al. 2024): each token is modulated (adaLN-Zero, Peebles & Xie 2023) by its frame's time
  embedding plus the label embedding.
* Attention: query chunk ``i`` sees key chunk ``j`` iff ``j <= i`` (``causal``), by a boolean mask to SDPA or a
  flex-attention block mask (``attention_backend``; ``"auto"``: flex on CUDA, ``fastgen.networks.kv_cache``).
* Cache: ``with backbone.kv_cache(tag, write=...)`` - inside, a forward attends to the keys and values the tag
  holds (earlier chunks, in order) and its frames continue their frame indices; with ``write=True`` it appends
  its own. Tags keep separate caches (classifier-free guidance holds a conditional and an unconditional one);
  ``clear_caches()`` empties them all. A cached chunk-by-chunk pass equals the masked full pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.networks.dit import LabelEmbedder, TimestepEmbedder
from fastgen.networks.heads import HeadSpec
from fastgen.networks.kv_cache import ChunkedKVCache, attend, causal_masks, check_backend
from fastgen.networks.layers import contract_output


def sincos(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """``(N, dim)`` sin-cos features of ``positions`` (``w_k = 10000^(-k / (dim / 2))``, as DiT's)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64, device=positions.device) / (dim / 2.0))
    angles = positions.double()[:, None] * omega[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()


class CausalAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, masks: tuple[torch.Tensor | None, Any],
                past: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention output under ``masks`` (``(SDPA mask, flex block mask)``, ``kv_cache.causal_masks``), and this
        call's own keys and values (for the cache)."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        out = attend(q, keys, values, *masks)
        return self.proj(out.transpose(1, 2).reshape(b, n, c)), k, v


class CausalBlock(nn.Module):
    """A DiT block (adaLN-Zero) with per-token modulation and cache-aware attention."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = CausalAttention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, hidden_size))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor, masks: tuple[torch.Tensor | None, Any],
                past: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)  # (B, L, D) each
        attn, k, v = self.attn(self.norm1(x) * (1 + scale1) + shift1, masks, past)
        x = x + gate1 * attn
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2), k, v


class CausalFinalLayer(nn.Module):
    """adaLN (shift and scale per token) then a linear to ``p * p * channels`` values per token."""

    def __init__(self, hidden_size: int, patch_size: int, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(self.norm(x) * (1 + scale) + shift)


class CausalVideoDiT(nn.Module, ChunkedKVCache):
    """``CausalVideoDiT(frames, height, width, in_channels, patch_size, hidden_size, depth, num_heads, num_classes,
    chunk_frames, causal, mlp_ratio, attention_backend)`` on ``(B, C, F, H, W)`` videos (module docstring)."""

    def __init__(self, frames: int = 8, height: int = 8, width: int = 16, in_channels: int = 1, patch_size: int = 2,
                 hidden_size: int = 96, depth: int = 4, num_heads: int = 4, num_classes: int = 10,
                 chunk_frames: int = 2, causal: bool = True, mlp_ratio: float = 4.0,
                 attention_backend: str = "auto") -> None:
        super().__init__()
        self.attention_backend = check_backend(attention_backend, "CausalVideoDiT")
        if height % patch_size or width % patch_size or hidden_size % 4:
            raise ValueError("height and width must be multiples of patch_size, hidden_size of 4")
        if chunk_frames < 1 or frames % chunk_frames:
            raise ValueError(f"chunk_frames ({chunk_frames}) must divide frames ({frames})")
        self.frames, self.height, self.width, self.in_channels = frames, height, width, in_channels
        self.patch_size, self.hidden_size, self.chunk_frames, self.causal = patch_size, hidden_size, chunk_frames, causal
        self.grid = (height // patch_size, width // patch_size)
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size) if num_classes > 0 else None
        self.blocks = nn.ModuleList(CausalBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth))
        self.final_layer = CausalFinalLayer(hidden_size, patch_size, in_channels)
        for block in self.blocks:  # adaLN-Zero: every block starts as the identity, the output at zero
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self._init_caches()

    # ---- the contract ------------------------------------------------------------------------------------------
    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def head_projection(self) -> HeadSpec:
        return HeadSpec("final_layer.linear", "patch_major", self.in_channels)

    @property
    def bottleneck_feature_index(self) -> int:
        return len(self.blocks) // 2

    # ---- forward -----------------------------------------------------------------------------------------------
    def _positions(self, frames: int, offset: int, device: torch.device) -> torch.Tensor:
        gh, gw = self.grid
        rows, cols = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij")
        half = self.hidden_size // 2
        spatial = torch.cat([sincos(cols.reshape(-1), half), sincos(rows.reshape(-1), half)], dim=1)  # (gh gw, D)
        temporal = sincos(torch.arange(offset, offset + frames, device=device), self.hidden_size)  # (F, D)
        return (temporal[:, None, :] + spatial[None]).reshape(frames * gh * gw, self.hidden_size)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, condition: torch.Tensor | None = None,
                r_noise: torch.Tensor | None = None, feature_indices: list[int] | None = None,
                return_logvar: bool = False) -> Any:
        if return_logvar or r_noise is not None:
            raise ValueError("CausalVideoDiT takes one time input and predicts no log-variance")
        b, c, frames, h, w = x.shape
        p, (gh, gw) = self.patch_size, self.grid
        cache, write, keep = self._open_cache(frames)
        offset = cache.frames if cache is not None else 0
        tokens = x.reshape(b, c, frames, gh, p, gw, p).permute(0, 2, 3, 5, 1, 4, 6).reshape(b, frames * gh * gw, -1)
        hidden = self.x_embedder(tokens) + self._positions(frames, offset, x.device).to(x.dtype)
        times = c_noise if c_noise.dim() == 2 else c_noise[:, None].expand(b, frames)
        cond = self.t_embedder(times.reshape(-1)).reshape(b, frames, 1, -1).expand(-1, -1, gh * gw, -1)
        cond = cond.reshape(b, frames * gh * gw, -1)
        if self.y_embedder is not None:
            cond = cond + self.y_embedder(condition, b, cond.dtype)[:, None]
        kept = cache.kept if cache is not None else 0
        masks = (causal_masks(self.attention_backend, frames, offset, kept, gh * gw, self.chunk_frames, x.device)
                 if self.causal else (None, None))
        features: list[torch.Tensor] = []
        new_keys, new_values = [], []
        for i, block in enumerate(self.blocks):
            hidden, k, v = block(hidden, cond, masks, cache.past(i) if cache is not None else None)
            new_keys.append(k)
            new_values.append(v)
            if feature_indices is not None and i in feature_indices:
                features.append(hidden.transpose(1, 2).reshape(b, -1, frames * gh, gw))
        if cache is not None and write:
            cache.append(new_keys, new_values, frames, keep)
        out = self.final_layer(hidden, cond)  # (B, L, p p C') - C' = C, or heads * C once widened
        channels = out.shape[-1] // (p * p)
        out = out.reshape(b, frames, gh, gw, p, p, channels).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, channels, frames, h, w)
        return contract_output(out, features if feature_indices is not None else None)


__all__ = ["CausalVideoDiT", "sincos"]
