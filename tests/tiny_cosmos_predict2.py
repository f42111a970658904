"""A tiny random ``Cosmos2TextToImagePipeline`` of the real classes, built here without downloads: the letter T5
tokenizer and a 1-layer T5 (``tiny_pipelines``), Cosmos 3's toy Wan VAE (16x16 pixels -> 8x8 latents, time halved),
the transformer of ``fastgen.configs.net_cosmos_predict2``'s ``TINY_COSMOS_PREDICT2*`` configs, a pass-through
safety checker (the pipelines refuse to run without one; ``cosmos_guardrail`` is not installed), and a stand-in
for torchvision's nearest resize, which the model's own ``forward`` calls on the padding mask (torchvision is not
installed either; fastgen's wrapper does not call it)."""

from __future__ import annotations

import types
from typing import Any

import torch
from tiny_cosmos3 import cosmos3_vae
from tiny_pipelines import t5_tokenizer

#: the prompt length the tiny pipelines are called with (``max_sequence_length``) and the wrapper pads to
TEXT_TOKENS = 16


class PassThroughSafetyChecker:
    """What ``Cosmos2TextToImagePipeline.__call__`` asks of its safety checker, accepting everything."""

    def to(self, *args: Any, **kwargs: Any) -> PassThroughSafetyChecker:
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, video: Any) -> Any:
        return video


def nearest_resize(x: torch.Tensor, size: list[int], interpolation: str = "nearest") -> torch.Tensor:
    """``torchvision.transforms.functional.resize`` of a tensor with ``InterpolationMode.NEAREST``: torch's
    ``interpolate(mode="nearest")``, which is what torchvision calls for it."""
    return torch.nn.functional.interpolate(x, size=list(size), mode=interpolation)


def stand_in_torchvision(monkeypatch: Any) -> None:
    """Give diffusers' Cosmos transformer module the ``transforms`` it imports from torchvision when installed."""
    import diffusers.models.transformers.transformer_cosmos as module

    stand_in = types.SimpleNamespace(functional=types.SimpleNamespace(resize=nearest_resize),
                                     InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))
    monkeypatch.setattr(module, "transforms", stand_in, raising=False)


def tiny_transformer(config: dict[str, Any], seed: int = 0) -> Any:
    """The tiny ``CosmosTransformer3DModel`` with its zero-initialised learnable positions drawn too, so that they
    show in the outputs."""
    from diffusers import CosmosTransformer3DModel

    torch.manual_seed(seed)
    model = CosmosTransformer3DModel.from_config(dict(config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pos_emb" in name:
                p.normal_(0.0, 0.3)
    return model.eval()


def cosmos_predict2_pipeline(transformer: Any) -> Any:
    """``Cosmos2TextToImagePipeline`` around ``transformer`` (16-wide text) with the toy T5 and VAE and its
    scheduler as the released folders configure it (``FlowMatchEulerDiscreteScheduler`` on Karras sigmas; the
    pipeline registers its EDM constants itself); ``Cosmos2VideoToWorldPipeline`` for a transformer with a
    condition-mask channel."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import T5Config, T5EncoderModel

    t5 = T5EncoderModel(T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                 decoder_start_token_id=0)).eval()
    video_to_world = transformer.config.in_channels > transformer.config.out_channels
    pipeline = diffusers.Cosmos2VideoToWorldPipeline if video_to_world else diffusers.Cosmos2TextToImagePipeline
    return pipeline(text_encoder=t5, tokenizer=t5_tokenizer(), transformer=transformer,
                                      vae=cosmos3_vae(int(transformer.config.out_channels)),
                                      scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
                                      safety_checker=PassThroughSafetyChecker())


def save_pipeline(pipe: Any, folder: Any) -> None:
    """``pipe.save_pretrained(folder)`` with no safety checker recorded (``model_index.json``: ``[null, null]``):
    the pass-through one is handed to ``load_pipeline`` instead."""
    pipe.register_to_config(safety_checker=(None, None))
    pipe.save_pretrained(folder)


def load_pipeline(folder: Any) -> Any:
    """``DiffusionPipeline.from_pretrained(folder)`` with the pass-through safety checker, progress bars off."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder, safety_checker=PassThroughSafetyChecker())
    pipe.set_progress_bar_config(disable=True)
    return pipe
