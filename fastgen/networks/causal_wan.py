"""A block-causal Wan: diffusers' ``WanTransformer3DModel`` (Wan 2025, "Wan: open and advanced large-scale video
generative models") run chunk by chunk, for the causal video students (CausVid, Self-Forcing; ``fastgen.methods``).
Query chunk ``i`` attends to key chunk ``j`` iff ``j <= i`` (Yin et al. 2025, "From slow bidirectional to fast
autoregressive video diffusion models", Sec. 3.1), with the interface of ``fastgen.networks.causal_dit``: tagged
KV caches (``kv_cache``, ``clear_caches``; ``fastgen.networks.kv_cache``), per-frame times, absolute frame
positions across cached calls. With ``causal=False`` it computes what the stock ``WanTransformer`` computes - the
bidirectional teacher - and the parameters are the wrapped model's, named as in ``WanTransformer``, so a student
loads the teacher's state dict (or a diffusers Wan folder) as it is.

Why the wrapper has its own forward (``_call``) over the model's own submodules rather than calling the model:

* Positions. ``WanRotaryPosEmbed`` numbers the frames it is given from 0; a cached call for chunk ``k`` must rotate
  its queries and keys at the chunk's *absolute* frames (the cached frames' count on), so that the cached keys -
  stored rotated - and the new ones stand where they stand in the full video. The wrapper slices the rotary tables
  of ``model.rope`` at the offset.
* Attention. Every block's self-attention (``attn1``) gets ``BlockCausalWanAttnProcessor``: ``WanAttnProcessor``'s
  math (projections, ``norm_q`` / ``norm_k`` over all heads, interleaved rotary, SDPA, ``to_out``) plus the mask
  and the cache. What one forward needs (rotary tables, mask, cache) reaches it through the block's ``rotary_emb``
  argument - ``WanTransformerBlock`` hands that argument to ``attn1`` only - as an ``AttentionContext``, so a
  gradient-checkpointed block recomputes with the same context. Cross-attention to the text is left as it is.
* Times. ``(B, F)`` per-frame times become per-token times, which the model handles as Wan 2.2 TI2V does (the
  blocks' and the output's modulation per token: ``temb`` ``(B, L, D)``, the projections ``(B, L, 6, D)``); the
  time embedding itself is computed once per frame, not per token.

The mask is a boolean SDPA mask (any device), or - with ``attention_backend="flex"``, or ``"auto"`` on CUDA where
``torch.nn.attention.flex_attention`` exists - a flex-attention block mask, which skips the masked blocks instead of
computing and discarding them. A call whose queries are one chunk (the cached chunk-by-chunk generation) needs no
mask at all: every key it sees is its own chunk's or an earlier one's.

Temporal patches (``patch_size[0] = p_t > 1``) are handled: ``chunk_frames`` (input frames, latent frames for a
latent model) must be a multiple of ``p_t``, and a token frame's time is its first input frame's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fastgen.networks.diffusers_nets import WanTransformer
from fastgen.networks.kv_cache import ChunkCache, ChunkedKVCache, attend, causal_masks, check_backend
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


@dataclass
class AttentionContext:
    """One forward's self-attention inputs, shared by every block: the rotary tables ``(cos, sin)`` at the call's
    absolute positions, the SDPA mask or flex block mask (None: attend to everything), the cache read, and the
    call's own rotated keys and values per block (``(B, heads, tokens, head_dim)``), which a cache write stores."""

    rotary: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor | None = None
    block_mask: Any = None
    cache: ChunkCache | None = None
    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding of ``x`` ``(B, L, heads, head_dim)``: channel pairs ``(2i, 2i + 1)`` rotated by the
    angle whose cosine and sine the tables (``(1, L, 1, head_dim)``, each value repeated for its pair) hold; in the
    tables' precision, cast back to ``x``'s - as ``WanAttnProcessor`` does."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).type_as(x)


class BlockCausalWanAttnProcessor:
    """Self-attention of block ``block`` of a ``CausalWanTransformer`` (module docstring): ``WanAttnProcessor``'s
    computation with the call's ``AttentionContext`` - its keys attend after the cached ones, under its mask."""

    def __init__(self, block: int) -> None:
        self.block = block

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, rotary_emb: Any = None) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("BlockCausalWanAttnProcessor is a self-attention processor (attn1); attn2 keeps Wan's")
        context = rotary_emb if isinstance(rotary_emb, AttentionContext) else None
        rotary = context.rotary if context is not None else rotary_emb
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)  # RMS norm across all heads, before the split
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        if rotary is not None:
            query, key = rotate(query, *rotary), rotate(key, *rotary)
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # (B, heads, L, head_dim)
        keys, values, mask, block_mask = key, value, attention_mask, None
        if context is not None:
            context.keys[self.block], context.values[self.block] = key, value
            past = context.cache.past(self.block) if context.cache is not None else None
            if past is not None:
                keys, values = torch.cat([past[0], key], dim=2), torch.cat([past[1], value], dim=2)
            mask, block_mask = context.mask, context.block_mask
        out = attend(query, keys, values, mask, block_mask).transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class CausalWanTransformer(WanTransformer, ChunkedKVCache):
    """``WanTransformer`` made block-causal over chunks of ``chunk_frames`` input frames (module docstring);
    ``causal=False`` is the stock bidirectional model. ``attention_backend``: ``"sdpa"`` (a boolean mask),
    ``"flex"`` (a flex-attention block mask) or ``"auto"`` (flex on CUDA where available, else SDPA)."""

    def __init__(self, config: dict[str, Any], chunk_frames: int = 1, causal: bool = True,
                 attention_backend: str = "auto", prompt_embeddings: str | None = None, num_prompts: int = 0,
                 prompt_tokens: int = 1) -> None:
        p_t = int(list(config.get("patch_size", (1, 2, 2)))[0])
        if chunk_frames < 1 or chunk_frames % p_t:
            raise ConfigError(f"CausalWanTransformer: chunk_frames={chunk_frames} must be a positive multiple of the "
                              f"temporal patch size {p_t}")
        check_backend(attention_backend, "CausalWanTransformer")
        super().__init__(config, prompt_embeddings, num_prompts, prompt_tokens)
        self.chunk_frames, self.causal, self.attention_backend = int(chunk_frames), bool(causal), attention_backend
        for index, block in enumerate(self.model.blocks):
            block.attn1.set_processor(BlockCausalWanAttnProcessor(index))
        self._init_caches()

    # ---- pieces of the forward ---------------------------------------------------------------------------------
    def rotary_tables(self, start: int, frames: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``WanRotaryPosEmbed.forward`` for a ``frames x height x width`` token grid whose frames are the absolute
        token frames ``start ..`` (the stock one starts at 0): ``(cos, sin)``, each ``(1, tokens, 1, head_dim)``."""
        rope = self.model.rope
        rows = rope.freqs_cos.shape[0]
        if start + frames > rows or height > rows or width > rows:
            raise ValueError(f"token frame positions up to {start + frames} (grid {height}x{width}) exceed the model's "
                             f"rope_max_seq_len {rows}")
        split = [rope.t_dim, rope.h_dim, rope.w_dim]
        tables = []
        for table in (rope.freqs_cos, rope.freqs_sin):
            t, h, w = table.split(split, dim=1)
            grid = torch.cat([t[start:start + frames].view(frames, 1, 1, -1).expand(frames, height, width, -1),
                              h[:height].view(1, height, 1, -1).expand(frames, height, width, -1),
                              w[:width].view(1, 1, width, -1).expand(frames, height, width, -1)], dim=-1)
            tables.append(grid.reshape(1, frames * height * width, 1, -1))
        return tables[0], tables[1]

    def _times(self, c_noise: torch.Tensor, text: torch.Tensor, frames: int, per_frame: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(temb, timestep_proj, text states)`` as ``WanTransformer3DModel.forward`` makes them: for ``(B,)``
        times ``(B, D)`` and ``(B, 6, D)``; for per-frame ``(B, F)`` times per token, ``(B, L, D)`` and
        ``(B, L, 6, D)`` (Wan 2.2's 2-D timestep path), embedded once per token frame and repeated over its
        ``per_frame`` tokens. The model's timestep embedding takes the pipeline's ``1000 t``."""
        embedder = self.model.condition_embedder
        p_t = int(self.model.config.patch_size[0])
        times = (c_noise * 1000.0).to(dtype)
        if times.dim() == 1:
            temb, proj, states, _ = embedder(times, text, None)
            return temb, proj.unflatten(1, (6, -1)), states
        if times.dim() != 2 or times.shape[1] != frames * p_t:
            raise ValueError(f"per-frame times must be (batch, {frames * p_t}); got {tuple(times.shape)}")
        per_token_frame = times[:, ::p_t]
        temb, proj, states, _ = embedder(per_token_frame.flatten(), text, None, timestep_seq_len=frames)
        temb = temb.repeat_interleave(per_frame, dim=1)
        proj = proj.repeat_interleave(per_frame, dim=1).unflatten(2, (6, -1))
        return temb, proj, states

    def _masks(self, frames: int, offset: int, past: int, per_frame: int, device: torch.device) -> tuple[Any, Any]:
        """The block-causal ``(SDPA mask, flex block mask)`` of a call - at most one of them; none when the network
        is bidirectional or the queries lie in one chunk (all their keys are then visible). In token frames."""
        if not self.causal:
            return None, None
        chunk = self.chunk_frames // int(self.model.config.patch_size[0])
        return causal_masks(self.attention_backend, frames, offset, past, per_frame, chunk, device)

    # ---- forward -----------------------------------------------------------------------------------------------
    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """``WanTransformer3DModel.forward`` step by step on the model's submodules, with the cache's frame offset,
        the block-causal attention context and per-frame times (module docstring)."""
        model = self.model
        video = x if x.dim() == 5 else x.unsqueeze(2)
        batch, _, frames, height, width = video.shape
        p_t, p_h, p_w = (int(p) for p in model.config.patch_size)
        if frames % p_t:
            raise ValueError(f"{frames} frames are not a whole number of {p_t}-frame temporal patches")
        cache, write, keep = self._open_cache(frames)
        offset, kept = (cache.frames, cache.kept) if cache is not None else (0, 0)
        grid_f, grid_h, grid_w = frames // p_t, height // p_h, width // p_w
        per_frame = grid_h * grid_w
        mask, block_mask = self._masks(grid_f, offset // p_t, kept // p_t, per_frame, video.device)
        blocks = len(model.blocks)
        context = AttentionContext(self.rotary_tables(offset // p_t, grid_f, grid_h, grid_w), mask, block_mask,
                                   cache, [None] * blocks, [None] * blocks)

        hidden = model.patch_embedding(video).flatten(2).transpose(1, 2).contiguous()
        temb, proj, states = self._times(c_noise, text, grid_f, per_frame, x.dtype)
        for block in model.blocks:
            if torch.is_grad_enabled() and model.gradient_checkpointing:
                hidden = model._gradient_checkpointing_func(block, hidden, states, proj, context)
            else:
                hidden = block(hidden, states, proj, context)
        if cache is not None and write:
            cache.append(context.keys, context.values, frames, keep)

        if temb.dim() == 3:  # per-token times: shift and scale per token
            shift, scale = (model.scale_shift_table.unsqueeze(0) + temb.unsqueeze(2)).chunk(2, dim=2)
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:
            shift, scale = (model.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        hidden = (model.norm_out(hidden.float()) * (1 + scale) + shift).type_as(hidden)
        hidden = model.proj_out(hidden)
        hidden = hidden.reshape(batch, grid_f, grid_h, grid_w, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        out = hidden.flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return out if x.dim() == 5 else out.squeeze(2)


__all__ = ["AttentionContext", "BlockCausalWanAttnProcessor", "CausalWanTransformer", "rotate"]
