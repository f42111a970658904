"""A tiny random ``Cosmos2_5_PredictBasePipeline`` of the real classes, built here without downloads: the byte-level
Qwen tokenizer of ``tiny_pipelines`` with a Qwen2-VL-style chat template (content lists of text parts, as the
pipeline passes them), the toy Qwen2.5-VL (2 layers of 16: its normalised states are 32 wide), Cosmos 3's toy Wan
VAE (16x16 pixels -> 8x8 latents, time halved: 5 frames -> 3 latent frames), the transformer of
``fastgen.configs.net_cosmos_predict25.TINY_COSMOS_PREDICT25``, the released folder's kind of scheduler (UniPC on
flow sigmas; the tests replace it by fastgen's export), Predict2's pass-through safety checker, and stand-ins for
the torchvision functions the pipeline (``to_tensor`` of the conditioning image) and the model (the padding mask's
nearest resize) call when torchvision is installed - it is not, and fastgen's wrapper calls neither."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch
from tiny_cosmos3 import cosmos3_vae
from tiny_cosmos_predict2 import PassThroughSafetyChecker, load_pipeline, save_pipeline, stand_in_torchvision
from tiny_cosmos_predict2 import tiny_transformer as tiny_transformer
from tiny_pipelines import qwen_text_encoder, qwen_tokenizer

#: the prompt length the tiny pipeline is called with (``max_sequence_length``; the chat template's system turn
#: alone is about 95 byte tokens) and the wrapper pads to
TEXT_TOKENS = 128

#: Qwen2-VL's chat template, reduced to text parts: each turn ``<|im_start|>role\n...<|im_end|>\n``
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def cosmos25_tokenizer() -> Any:
    """``tiny_pipelines.qwen_tokenizer`` (one token per byte, Qwen's chat tokens) with ``CHAT_TEMPLATE``."""
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def to_tensor(image: Any) -> torch.Tensor:
    """``torchvision.transforms.functional.to_tensor`` of an RGB PIL image: ``(3, H, W)`` float32 in ``[0, 1]``."""
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)


def stand_in_torchvision25(monkeypatch: Any) -> None:
    """The model's nearest resize (``tiny_cosmos_predict2.stand_in_torchvision``) and the 2.5 pipeline's
    ``torchvision.transforms.functional.to_tensor``."""
    import diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict as module

    stand_in_torchvision(monkeypatch)
    functional = types.SimpleNamespace(to_tensor=to_tensor)
    monkeypatch.setattr(module, "torchvision", types.SimpleNamespace(transforms=types.SimpleNamespace(
        functional=functional)), raising=False)


def cosmos_predict25_pipeline(transformer: Any) -> Any:
    """``Cosmos2_5_PredictBasePipeline`` around ``transformer`` (32-wide projected text) with the toy Qwen2.5-VL,
    tokenizer and VAE, UniPC on flow sigmas (shift 5) and the pass-through safety checker."""
    from diffusers import Cosmos2_5_PredictBasePipeline, UniPCMultistepScheduler

    tokenizer = cosmos25_tokenizer()
    scheduler = UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=5.0, prediction_type="flow_prediction")
    return Cosmos2_5_PredictBasePipeline(text_encoder=qwen_text_encoder(16, len(tokenizer)), tokenizer=tokenizer,
                                         transformer=transformer, vae=cosmos3_vae(int(transformer.config.out_channels)),
                                         scheduler=scheduler, safety_checker=PassThroughSafetyChecker())


__all__ = ["TEXT_TOKENS", "cosmos25_tokenizer", "cosmos_predict25_pipeline", "load_pipeline", "save_pipeline",
           "stand_in_torchvision25", "tiny_transformer"]
