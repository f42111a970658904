"""Cosmos Predict2 (NVIDIA 2025, "Cosmos World Foundation Model Platform for Physical AI" and its Predict2 release):
diffusers' ``CosmosTransformer3DModel`` in the network contract (``fastgen.networks.diffusion_net``), called as
``Cosmos2TextToImagePipeline`` and ``Cosmos2VideoToWorldPipeline`` call it.

**The model.** A DiT over ``1 x 2 x 2`` patches of Wan 2.1's VAE latents (16 channels, 8x spatial and 4x temporal
compression): each block self-attends with 3-D rotary positions (the frame axis scaled by ``fps`` for videos),
cross-attends to T5-11B's states of the prompt (1024 wide, padded to 512 tokens) and is modulated by an adaptive
LayerNorm of the time with a low-rank ("adaln_lora") term; learnable absolute positions are added before every block
(``extra_pos_embed_type="learnable"``). The patch embedding reads extra input channels: a *padding mask* (the
pipelines' zeros, resized to the latent grid: ``concat_padding_mask``) and, in the video-to-world models, a
*condition mask* (``in_channels = 17``: 1 on the latent frames given clean, 0 on those generated).

**Why the wrapper runs the blocks itself.** The model's ``forward`` resizes the padding mask with torchvision
(``transforms.functional.resize``), which fastgen does not depend on. The pipelines' padding mask is all zeros, and
any resize of zeros is zeros, so the wrapper appends that zero channel at the latent size and then calls the model's
own submodules in the order of its ``forward`` (rotary and learnable positions, patch embedding, time embedding,
the blocks, the output norm and projection, the unpatchify): the same computation without the import
(``test_cosmos_predict2``: bit for bit equal to ``forward``, torchvision's resize stood in for).

**What each input is.**

* ``x``: latents ``(B, C, H, W)`` (an image: the text-to-image pipeline's one frame) or ``(B, C, F, H, W)``.
* ``c_noise``: the rectified-flow time ``u = sigma / (1 + sigma)`` of ``EDMFlowScheduler`` (the pipelines'
  ``timestep``), ``(B,)``; or ``(B, F)``, one per latent frame (the model's per-frame path).
* ``condition``: T5 states ``(B, T, 1024)`` zero past each prompt's tokens, as the pipelines' ``_get_t5_prompt_embeds``
  makes them. The model attends to every one of the 512 rows, padding included (a zero row adds ``exp(0)`` to the
  attention's normaliser), so the wrapper zero-pads a shorter condition to ``text_tokens`` (the pipelines'
  ``max_sequence_length``): a prompt bank cut short, or the null condition, gives the pipeline's output. The null
  condition is 512 zero rows.
* ``conditioning_frames`` (video-to-world models): the first latent frames of ``x`` are the clean latents of the
  conditioning image or clip, at ``conditioning_time`` (the pipeline's ``sigma_conditioning``, 1e-4, which is
  ``EDMFlowScheduler``'s time) - ``fastgen.networks.conditioning_frames``; the condition mask is 1 on them and 0
  elsewhere. Without conditioning frames a video-to-world model generates every frame (an all-zero mask).

Guidance is linear: the pipelines' ``x_c + g (x_c - x_u)`` on the denoised estimates is fastgen's ``u + s (c - u)``
with ``s = g + 1``. Feature taps: the chosen blocks' tokens as ``(B, D, F h, w)`` maps. Shard units (FSDP2,
activation checkpointing): every transformer block. PDD's widened head: ``proj_out``, rows per token ``(p_h, p_w,
p_t, channel)`` - patch major (the unpatchify takes the channel count from the tensor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.networks.diffusers_nets import DiffusersBackbone, _tokens_to_map
from fastgen.networks.heads import HeadSpec
from fastgen.utils.errors import ConfigError


class CosmosPredict2Transformer(DiffusersBackbone):
    """``CosmosTransformer3DModel`` in the network contract (module docstring). ``fps``: the frame rate of video
    samples (the rotary frame axis; ``Cosmos2VideoToWorldPipeline``'s default 16; images take none);
    ``text_tokens``: the length every condition is zero-padded to (the pipelines' ``max_sequence_length``)."""

    model_class = "CosmosTransformer3DModel"
    weights_subfolder = "transformer"
    text_dim_key = "text_embed_dim"

    def __init__(self, config: dict[str, Any], fps: float | None = 16.0, text_tokens: int = 512,
                 prompt_embeddings: str | None = None, num_prompts: int = 0, prompt_tokens: int | None = None,
                 conditioning_time: float = 1e-4) -> None:
        extra = self._check_config(config)
        super().__init__(config, prompt_embeddings, num_prompts, text_tokens if prompt_tokens is None else prompt_tokens)
        self.fps = None if fps is None else float(fps)  # None: the rotary frame axis unscaled (Predict 2.5's call)
        self.text_tokens = int(text_tokens)
        self.condition_channels = extra
        self.conditioning_time = float(conditioning_time)

    @classmethod
    def _check_config(cls, config: dict[str, Any]) -> int:
        """One-line ConfigErrors for what this wrapper does not run; returns the extra input channels (0, or 1 for
        the condition mask)."""
        name = cls.__name__
        if config.get("img_context_dim_in"):
            raise ConfigError(f"{name}: img_context_dim_in (Cosmos Transfer's image context) is not supported")
        if config.get("use_crossattn_projection"):
            raise ConfigError(f"{name}: use_crossattn_projection (Cosmos Predict 2.5's Qwen2.5-VL text) is "
                              "CosmosPredict25Transformer's (fastgen.networks.cosmos_predict25)")
        patch = list(config.get("patch_size", (1, 2, 2)))
        if patch[0] != 1:
            raise ConfigError(f"{name}: patch_size {patch}: temporal patches are not supported")
        extra = int(config.get("in_channels", 16)) - int(config.get("out_channels", 16))
        if extra not in (0, 1):
            raise ConfigError(f"{name}: in_channels - out_channels = {extra}; Predict2's models "
                              "read the latents (text-to-image) or the latents and a condition mask (video-to-world)")
        return extra

    def _context(self, text: torch.Tensor) -> torch.Tensor:
        """The cross-attention context of the ``(B, T, D)`` text rows: the rows themselves (Predict 2.5 projects)."""
        return text

    def codec_options(self) -> dict[str, Any]:
        """The prompt length the codec encodes to: the ``text_tokens`` this network pads every condition to."""
        return {"max_sequence_length": self.text_tokens}

    @property
    def takes_conditioning_frames(self) -> bool:
        """Whether the model reads a condition mask (the video-to-world models: ``in_channels = out_channels + 1``)."""
        return self.condition_channels == 1

    # ---- the contract ---------------------------------------------------------------------------------------
    def shard_units(self) -> list[nn.Module]:
        return list(self.model.transformer_blocks)

    def head_projection(self) -> HeadSpec:
        """PDD's widened projection: ``proj_out``, rows per token ``(p_h, p_w, p_t, channel)``."""
        return HeadSpec("model.proj_out", "patch_major", int(self.model.config.out_channels))

    def text_embeddings(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        """The condition zero-padded to ``text_tokens`` rows, as the pipelines pad the prompt (module docstring)."""
        if condition is None:
            return torch.zeros(batch, self.text_tokens, self.text_dim, dtype=dtype, device=device)
        text = super().text_embeddings(condition, batch, dtype, device)
        if text.shape[1] > self.text_tokens:
            raise ValueError(f"{text.shape[1]} text tokens; this network pads the prompt to text_tokens="
                             f"{self.text_tokens} (the pipelines' max_sequence_length)")
        return nn.functional.pad(text, (0, 0, 0, self.text_tokens - text.shape[1]))

    # ---- the forward ----------------------------------------------------------------------------------------
    def _time_embeddings(self, tokens: torch.Tensor, c_noise: torch.Tensor,
                         grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(temb, embedded_timestep)``: ``(B, 3D)`` / ``(B, D)`` for one time per sample, or per token ``(B, N, .)``
        for one time per frame (the model's 5-D ``timestep`` path: each frame's rows repeated over its patches)."""
        embed = self.model.time_embed
        if c_noise.dim() == 1:
            return embed(tokens, c_noise)
        frames, rows, cols = grid
        if c_noise.shape != (tokens.shape[0], frames):
            raise ValueError(f"per-frame times must be (B, F) = {(tokens.shape[0], frames)}; got {tuple(c_noise.shape)}")
        temb, embedded = embed(tokens, c_noise.flatten())
        return tuple(e.view(tokens.shape[0], frames, 1, 1, -1).expand(-1, -1, rows, cols, -1).flatten(1, 3)
                     for e in (temb, embedded))  # type: ignore[return-value]

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor,
              conditioning_frames: int = 0) -> torch.Tensor:
        model = self.model
        config = model.config
        video = x if x.dim() == 5 else x.unsqueeze(2)
        b, channels, frames, height, width = video.shape
        _, p_h, p_w = config.patch_size
        if height % p_h or width % p_w:
            raise ValueError(f"Cosmos patches {p_h}x{p_w} latents: height and width must be multiples, got "
                             f"{height}x{width}")
        if channels != config.out_channels:
            raise ValueError(f"CosmosPredict2Transformer takes {config.out_channels}-channel latents; got {channels}")
        # the condition mask (video-to-world models: 1 on the frames given clean) and the pipelines' zero padding mask
        masks = video.new_zeros(b, self.condition_channels + int(bool(config.concat_padding_mask)), frames, height,
                                width)
        if conditioning_frames:
            masks[:, 0, :conditioning_frames] = 1.0
        hidden = torch.cat([video, masks], dim=1)
        rotary = model.rope(hidden, fps=self.fps if x.dim() == 5 else None)
        positions = model.learnable_pos_embed(hidden) if config.extra_pos_embed_type else None
        grid = (frames, height // p_h, width // p_w)
        tokens = model.patch_embed(hidden).flatten(1, 3)
        temb, embedded = self._time_embeddings(tokens, c_noise.to(video.dtype), grid)
        text = self._context(text)
        for block in model.transformer_blocks:
            tokens = block(tokens, text, embedded, temb, rotary, positions, None)
        out = model.proj_out(model.norm_out(tokens, embedded, temb))
        # the model's unpatchify: rows per token (p_h, p_w, p_t, channel), the channel count from the tensor
        out = out.unflatten(2, (p_h, p_w, 1, -1)).unflatten(1, grid)
        out = out.permute(0, 7, 1, 6, 2, 4, 3, 5).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return out if x.dim() == 5 else out.squeeze(2)

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        _, p_h, p_w = self.model.config.patch_size
        frames = x.shape[2] if x.dim() == 5 else 1
        return _tokens_to_map(output, frames * (x.shape[-2] // p_h), x.shape[-1] // p_w).contiguous()


__all__ = ["CosmosPredict2Transformer"]
