"""The Cosmos Predict 2.5 codec (``Cosmos2_5_PredictBasePipeline``, diffusers 0.42
``pipelines/cosmos/pipeline_cosmos2_5_predict.py``): Wan 2.1's VAE and Qwen2.5-VL-7B's normalised hidden states.

* **Latents.** ``AutoencoderKLWan`` (16 channels, 4x in time, 8x in space), normalised per channel as the pipeline
  writes it: ``(z - mean) * (1 / std)`` with the reciprocal taken once in float32 (``self.latents_std = 1.0 /
  latents_std`` in ``__init__``; ``prepare_latents``), undone as ``z / (1 / std) + mean`` before decoding. Videos
  ``(B, C, F, H, W)``; an image ``(B, C, H, W)`` is one frame. ``encode_images`` is the posterior's mode unless a
  generator is given (the pipeline's conditioning frames are the mode: ``sample_mode="argmax"``).
* **Text** (``_get_prompt_embeds``). Each prompt in the chat template ``[system: "You are a helpful assistant who
  will provide prompts to an image generator.", user: prompt]`` (``apply_chat_template``, no generation prompt),
  truncated and padded to ``max_sequence_length`` (512) tokens; Qwen2.5-VL runs on the padded ids **without** an
  attention mask; every hidden state after the embedding layer's is normalised over its width, ``(h - mean) /
  (std + 1e-8)`` (``std`` unbiased, torch's default), and the states are concatenated: ``(B, 512, L x D)``, 28 x
  3584 = 100,352 wide for the 7B, in the text encoder's dtype. The transformer projects that width itself
  (``fastgen.networks.cosmos_predict25``). The negative prompt is encoded the same way (the pipeline's default
  negative prompt is a long sentence, ``DEFAULT_NEGATIVE_PROMPT``; fastgen's is ``""``).

**Why not in encode-data shards.** One caption's condition is ``512 x 100,352`` values: 98 MiB in bfloat16, 196 MiB
in the float32 that ``encode-data`` writes - a million captions would be 200 TB. So the family's codec says
``text_in_shards = False``: ``fastgen encode-data`` writes its latents and captions only (no ``text.npy``, and the
text encoder is not loaded), and the 2.5 recipes train with ``model.encode_batches = True``, the captions encoded
each step by this codec on the training ranks (under FSDP its text encoder is sharded like a teacher).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fastgen.networks.codecs import CosmosPredict2Codec

#: ``Cosmos2_5_PredictBasePipeline._get_prompt_embeds``' system turn
SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."
#: the normaliser's epsilon in ``_get_prompt_embeds``
NORM_EPS = 1e-8


class CosmosPredict25Codec(CosmosPredict2Codec):
    """Cosmos Predict 2.5's VAE and text encoder, used as its pipeline uses them (module docstring)."""

    family = "cosmos25"
    text_in_shards: ClassVar[bool] = False

    # ---- latents: the pipeline's reciprocal std -----------------------------------------------------------------
    def _inverse_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``latents_mean`` and ``1 / latents_std`` as ``(1, C, 1, 1, 1)``, computed in float32 as the pipeline's
        ``__init__`` does, then moved to ``like``'s device and dtype."""
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).float()
        inverse = 1.0 / torch.tensor(self.vae.config.latents_std).view(shape).float()
        return mean.to(like.device, like.dtype), inverse.to(like.device, like.dtype)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        mean, inverse = self._inverse_stats(raw)
        return (raw - mean) * inverse  # prepare_latents

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, inverse = self._inverse_stats(latents)
        return latents / inverse + mean  # __call__ before vae.decode

    @staticmethod
    def conditioning_image(image: Any, height: int, width: int) -> torch.Tensor:
        """``(1, 3, 1, H, W)`` in ``[-1, 1]`` of a PIL image, as ``Cosmos2_5_PredictBasePipeline`` prepares an
        ``image=``: to a ``[0, 1]`` tensor first (torchvision's ``to_tensor``), then the video processor's tensor
        resize - nearest-neighbour, not the Lanczos of a PIL resize (``fastgen.pipelines.world.load_clip``)."""
        import numpy as np
        from diffusers.video_processor import VideoProcessor

        pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
        return VideoProcessor(vae_scale_factor=8).preprocess_video(pixels[None, None], height, width)

    def conditioning_latents(self, clips: Sequence[torch.Tensor], num_frames: int,
                             generators: Sequence[torch.Generator] | None = None) -> tuple[torch.Tensor, int]:
        """The video-to-world conditioning as ``Cosmos2_5_PredictBasePipeline`` prepares it - zero-frame padding of an
        image, the posterior's mode (``fastgen.networks.cosmos_predict25.conditioning_latents``); ``generators`` are
        not drawn from (the pipeline's ``sample_mode="argmax"``). The hook a video-to-world sampler calls instead of
        Predict2's ``fastgen.pipelines.world.conditioning_latents`` when the codec has it."""
        from fastgen.networks.cosmos_predict25 import conditioning_latents

        return conditioning_latents(self, clips, num_frames)

    # ---- text ----------------------------------------------------------------------------------------------------
    def _ids(self, prompt: str) -> torch.Tensor:
        """The prompt's chat-template token ids, ``max_sequence_length`` long (``_get_prompt_embeds``)."""
        conversation = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                        {"role": "user", "content": [{"type": "text", "text": prompt}]}]
        ids: Any = self.tokenizers["tokenizer"].apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=False, add_vision_id=False,
            max_length=self.max_sequence_length, truncation=True, padding="max_length")
        ids = ids["input_ids"] if not isinstance(ids, list) and "input_ids" in ids else ids
        return torch.LongTensor(ids)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        encoder = self.encoders["text_encoder"]
        ids = torch.stack([self._ids(p) for p in prompts])
        states = encoder(ids.to(self.device), output_hidden_states=True).hidden_states
        normalised = [(h - h.mean(dim=-1, keepdim=True)) / (h.std(dim=-1, keepdim=True) + NORM_EPS)
                      for h in states[1:]]
        return {"text": torch.cat(normalised, dim=-1).to(dtype=encoder.dtype)}


__all__ = ["CosmosPredict25Codec", "NORM_EPS", "SYSTEM_PROMPT"]
