"""Cosmos Predict 2.5 (NVIDIA 2025, the ``nvidia-cosmos/cosmos-predict2.5`` release): diffusers'
``CosmosTransformer3DModel`` with a projected Qwen2.5-VL text condition, in the network contract
(``fastgen.networks.diffusion_net``), called as ``Cosmos2_5_PredictBasePipeline`` calls it
(``diffusers/pipelines/cosmos/pipeline_cosmos2_5_predict.py``, diffusers 0.42).

**What changed from Predict2** (``fastgen.networks.cosmos_predict2``, whose wrapper this one extends):

* *One model for text-, image- and video-to-world.* The transformer always reads a condition-mask channel
  (``in_channels = out_channels + 1``): all zeros for text-to-world, 1 on the first latent frames for the others.
* *Text.* The prompt goes through Qwen2.5-VL-7B in a system + user chat template, padded to 512 tokens, encoded
  **without** an attention mask; every hidden state after the embedding layer is normalised over its width
  (``(h - mean) / (std + 1e-8)``) and the 28 of them are concatenated (``28 x 3584 = 100,352`` wide:
  ``fastgen.networks.cosmos_predict25_codec``). The transformer projects that width to its text width itself
  (``use_crossattn_projection``: ``crossattn_proj``, a linear layer and a GELU) before the blocks cross-attend to
  it; so the network's ``condition`` is the 100,352-wide states (``text_width``), and the wrapper applies the
  projection where the model's ``forward`` does.
* *Schedule.* Rectified flow, ``x_t = (1 - sigma) x0 + sigma eps``, the model predicting the velocity ``eps - x0``
  at ``timestep = sigma`` itself (the pipeline passes ``scheduler.sigmas[i]``; no EDM ``u`` transform): fastgen's
  ``RectifiedFlowScheduler`` with its identity preconditioning (``c_noise = t``).
* *No fps.* The pipeline calls the model without ``fps``: the rotary frame axis is unscaled (``fps=None``).

**Video-to-world in band** (``fastgen.networks.conditioning_frames``). The pipeline's loop: the transformer reads
``cond_mask * cond_latent + (1 - cond_mask) * latents`` at the per-frame time ``cond_indicator *
conditional_frame_timestep + (1 - cond_indicator) * sigma`` (``conditional_frame_timestep`` 1e-4), and its
velocity on the given frames is replaced by ``gt_velocity = noise - cond_latent`` (``noise``: the starting latents).
fastgen keeps the given frames in the state: there the network reads the clean latents, at ``conditioning_time``
(1e-4, here the schedule's own time, so ``c_noise`` is the pipeline's value), with the mask 1 - the same input as
the pipeline's, so the generated frames' outputs are the same, and every scheduler step (Euler, UniPC) is per
element, so the generated frames of the two samples are the same to rounding (``test_cosmos_predict25``).

What differs is the given frames' *own* velocity and state, which the generated frames never read. The pipeline's
``gt_velocity`` keeps its state there on the straight path ``(1 - sigma) c + sigma n`` (its denoised estimate
``x - sigma v`` is ``c`` at every step), ending at ``c`` when the last sigma is 0. fastgen's ``keep_given_frames``
makes the denoised estimate there the state, which *is* ``c``: the velocity converted from it is
``(x - x0) / sigma = 0`` (``eps = c`` too), so the state stays ``c`` - the same end point, and the same denoised
estimate at every step, hence nothing in fastgen (SFT's loss over the generated frames, samplers, guidance: the
two guided velocities agree there, so ``u + s (c - u)`` is either's) depends on the difference. The velocity
replacement would matter only to code that reads a given frame's *velocity* as a function of the noise
(``noise - c``), which no fastgen method does.

The conditioning image or clip is prepared as the pipeline prepares it (``conditioning_latents`` here, not
``fastgen.pipelines.world``'s Predict2 version): an image is padded with **zero** frames (black, ``-1`` in model
pixels; Predict2 repeats the last frame), a clip keeps its last ``4 (k - 1) + 1`` frames padded with its last
frame, and the padded video is encoded to the posterior's **mode** (``sample_mode="argmax"``: no generator draw,
so the starting noise is the generator's first draw).

Guidance is linear: the pipeline's ``v_c + g (v_c - v_u)`` on the velocities is fastgen's ``u + s (c - u)`` with
``s = g + 1`` (the pipeline guides only for ``g > 1``). Feature taps, shard units and PDD's head: Predict2's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastgen.networks.conditioning_frames import encode_given_clips, temporal_factor
from fastgen.networks.cosmos_predict2 import CosmosPredict2Transformer
from fastgen.utils.errors import ConfigError, UsageError

#: ``Cosmos2_5_PredictBasePipeline.__call__``'s ``conditional_frame_timestep``: the given frames' time
CONDITIONAL_FRAME_TIMESTEP = 1e-4


class CosmosPredict25Transformer(CosmosPredict2Transformer):
    """``CosmosTransformer3DModel`` of Cosmos Predict 2.5 in the network contract (module docstring). ``condition``:
    the codec's ``(B, T, crossattn_proj_in_channels)`` normalised Qwen2.5-VL states (zero-padded to ``text_tokens``
    rows, 512, as for Predict2); ``fps``: None, as the pipeline calls the model; ``conditioning_time``: the
    pipeline's ``conditional_frame_timestep``."""

    def __init__(self, config: dict[str, Any], fps: float | None = None, text_tokens: int = 512,
                 prompt_embeddings: str | None = None, num_prompts: int = 0, prompt_tokens: int | None = None,
                 conditioning_time: float = CONDITIONAL_FRAME_TIMESTEP) -> None:
        super().__init__(config, fps, text_tokens, prompt_embeddings, num_prompts, prompt_tokens, conditioning_time)

    @classmethod
    def _check_config(cls, config: dict[str, Any]) -> int:
        if not config.get("use_crossattn_projection"):
            raise ConfigError(f"{cls.__name__}: Predict 2.5's transformer projects its Qwen2.5-VL text "
                              "(use_crossattn_projection: true); without it the model is Predict2's "
                              "(CosmosPredict2Transformer)")
        if int(config.get("encoder_hidden_states_channels", 1024)) != int(config.get("text_embed_dim", 1024)):
            raise ConfigError(f"{cls.__name__}: encoder_hidden_states_channels (the projection's output) must be "
                              "text_embed_dim (what the blocks cross-attend to)")
        extra = super()._check_config({k: v for k, v in config.items() if k != "use_crossattn_projection"})
        if extra != 1:
            raise ConfigError(f"{cls.__name__}: in_channels - out_channels = {extra}; Predict 2.5's model always "
                              "reads a condition-mask channel (in_channels = out_channels + 1)")
        return extra

    @classmethod
    def text_width(cls, config: dict[str, Any]) -> int:
        """The condition's width: the projection's input (100,352 = 28 layers x 3584 for Qwen2.5-VL-7B)."""
        return int(config.get("crossattn_proj_in_channels", 1024))

    def _context(self, text: torch.Tensor) -> torch.Tensor:
        """``crossattn_proj`` of the text rows, as the model's ``forward`` applies it before the blocks."""
        return self.model.crossattn_proj(text)


def pad_conditioning_clip(clip: torch.Tensor, num_frames: int, temporal: int = 4,
                          latent_frames: int = 2) -> tuple[torch.Tensor, int]:
    """``(1, C, num_frames, H, W)`` pixels in ``[-1, 1]`` and the number of given latent frames, as
    ``Cosmos2_5_PredictBasePipeline.__call__`` pads its conditioning. One frame (an image) is followed by frames of
    zeros in ``[0, 1]`` pixels, ``-1`` here (``num_frames_in = 1``). A clip keeps its last ``4 (latent_frames - 1)
    + 1`` frames (``num_latent_conditional_frames``, 1 or 2, default 2: 5 frames) padded with its last frame; a
    shorter clip is refused, as the pipeline refuses it. ``temporal``: the VAE's temporal factor (the given latent
    frames are ``(num_frames_in - 1) // temporal + 1``; the pipeline's 4 in the extraction is fixed)."""
    frames = clip.shape[2]
    if frames == 1:
        pad = torch.full_like(clip[:, :, :1], -1.0).expand(-1, -1, num_frames - 1, -1, -1)
        return torch.cat([clip, pad], dim=2), 1
    if latent_frames not in (1, 2):
        raise UsageError(f"latent_frames {latent_frames}: the pipeline continues a clip from 1 or 2 latent frames")
    extract = 4 * (latent_frames - 1) + 1
    if frames < extract:
        raise UsageError(f"a conditioning clip of {frames} frames: Cosmos Predict 2.5's pipeline continues a clip "
                         f"from its last {extract} frames (or an image)")
    clip = clip[:, :, -extract:]
    if extract < num_frames:
        clip = torch.cat([clip, clip[:, :, -1:].expand(-1, -1, num_frames - extract, -1, -1)], dim=2)
    return clip, (extract - 1) // temporal + 1


def conditioning_latents(codec: Any, clips: Sequence[torch.Tensor], num_frames: int) -> tuple[torch.Tensor, int]:
    """``(B, C, F, H, W)`` normalised latents of the padded ``clips`` (pixels in ``[-1, 1]``, one ``(1, C, n, H, W)``
    clip per sample, all with the same ``n``; ``pad_conditioning_clip``), each the posterior's mode (the pipeline's
    ``sample_mode="argmax"``: the sample's generator is not drawn from), and how many latent frames are given."""
    factor = temporal_factor(codec.vae)  # the pipeline's ``vae_scale_factor_temporal``
    return encode_given_clips(codec, [pad_conditioning_clip(clip, num_frames, factor) for clip in clips])


__all__ = ["CONDITIONAL_FRAME_TIMESTEP", "CosmosPredict25Transformer", "conditioning_latents", "pad_conditioning_clip"]
