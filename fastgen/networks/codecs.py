"""Codecs: a latent model family's frozen VAE and text encoder(s), used exactly as its diffusers pipeline uses them.

A latent diffusion model is trained on ``z = normalise(E(x))`` and conditioned on text embeddings; sampling ends
with ``x = D(denormalise(z))``. Each family normalises latents its own way and encodes prompts its own way, and a
distilled student is only usable in the family's pipeline if fastgen does both exactly as that pipeline does:

* **SD 1.5** (``StableDiffusionPipeline``): ``z = s E(x)`` with the VAE's ``scaling_factor`` ``s`` (Rombach et al.
  2022, Sec. 4.3.2: unit-variance latents); prompts -> CLIP's last hidden state, padded to the tokenizer's
  ``model_max_length`` (77).
* **Flux** (``FluxPipeline``): ``z = s (E(x) - m)`` with the VAE's ``shift_factor`` ``m``; prompts -> T5's last
  hidden state (padded to ``max_sequence_length``, 512) plus CLIP's pooled output; the network's ``condition``
  packs both (``pack_flux_condition``).
* **Wan** (``WanPipeline``, video): per-channel ``z = (E(x) - mu_c) / sigma_c`` from the VAE's ``latents_mean`` /
  ``latents_std``; prompts cleaned as the pipeline cleans them -> umT5's last hidden state under the attention
  mask, cut at each prompt's length and zero-padded to ``max_sequence_length`` (512, what ``WanPipeline.__call__``
  uses). ``(B, C, F, H, W)`` videos; an image is one frame.
* **Qwen-Image** (``QwenImagePipeline``): its 5-D VAE, per-channel ``z = (E(x) - mu_c) / sigma_c`` as its pipelines
  write it (times ``1 / sigma_c``), images as ``(B, C, H, W)`` (the one frame dropped); prompts in the pipeline's
  chat template -> Qwen2.5-VL's last hidden state under the attention mask, the template's first 34 tokens dropped
  (``_get_qwen_prompt_embeds``), each prompt cut at ``max_sequence_length`` (512, what ``__call__`` uses) and
  zero-padded to it; ``text_mask`` marks its own tokens (the network reads the mask back from the zero rows).
* **CogVideoX** (``CogVideoXPipeline``, video): ``z = s E(x)`` with the 3-D VAE's ``scaling_factor``, videos
  ``(B, C, F, H, W)`` (``(F - 1) / 4 + 1`` latent frames; an image is one frame); prompts -> T5's last hidden state
  of the prompt padded to ``max_sequence_length`` (226), without an attention mask.
* **Cosmos Predict2** (``Cosmos2TextToImagePipeline`` / ``Cosmos2VideoToWorldPipeline``): Wan's VAE and
  normalisation, T5's states as Wan's umT5 ones but of the prompt uncleaned; images ``(B, C, H, W)``.
* **Cosmos Predict 2.5** (``Cosmos2_5_PredictBasePipeline``): ``fastgen.networks.cosmos_predict25_codec``
  (``LAZY_CODECS``) - Wan's VAE, Qwen2.5-VL's normalised hidden states of every layer concatenated.
* **LTX-2** (``LTX2Pipeline``, video with sound): ``fastgen.networks.ltx2_codec`` (``LAZY_CODECS``: its module imports
  this one) - the video and audio VAEs, the vocoder, Gemma-3 through the text connectors.

``E(x)`` is the mode (mean) of the VAE's posterior unless a generator is given (then a sample, as diffusers'
training scripts draw): deterministic latents make a data set reproducible. Pixels are ``[-1, 1]``.

``load_codec(folder)`` reads a diffusers pipeline folder (``model_index.json`` says which classes; weights from
safetensors only, nothing is unpickled) and returns the family's codec, frozen, in the requested dtype. The networks
themselves come from the same folder (``fastgen.networks.diffusers_nets``)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fastgen.networks.diffusers_nets import import_diffusers, import_extra, pack_flux_condition, pack_sdxl_condition
from fastgen.utils.errors import UsageError


def has_component(folder: str | Path, name: str) -> bool:
    """Whether the pipeline folder's ``model_index.json`` names a component ``name`` (``[library, class]``; an
    optional one a pipeline was saved without is ``[null, null]``)."""
    entry = json.loads((Path(folder) / "model_index.json").read_text()).get(name)
    return isinstance(entry, list) and entry[0] is not None


def _component(folder: Path, name: str, dtype: torch.dtype | None) -> Any:
    """Pipeline component ``name`` of ``folder`` as its ``model_index.json`` names it (library, class)."""
    if not has_component(folder, name):
        raise UsageError(f"{folder}: the pipeline has no {name!r} component (model_index.json)")
    library, class_name = json.loads((folder / "model_index.json").read_text())[name]
    module = import_diffusers() if library == "diffusers" else import_extra("transformers", "text encoders")
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UsageError(f"{folder}/{name}: {library} has no class {class_name}")
    if "Tokenizer" in class_name:
        return cls.from_pretrained(folder, subfolder=name)
    # dtype at load, not .to() after: a model may keep some modules in float32 (T5's feed-forward outputs)
    dtype_kwarg = {"torch_dtype": dtype} if library == "diffusers" else {"dtype": dtype}
    model = cls.from_pretrained(folder, subfolder=name, use_safetensors=True, **dtype_kwarg)
    return model.requires_grad_(False).eval()


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """diffusers' and transformers' own chatter while loading (progress bars, 'install accelerate') stays out of
    fastgen's output; their levels are restored after."""
    import logging

    names = ("diffusers", "transformers")
    previous = {name: logging.getLogger(name).level for name in names}
    bars = []
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
        utils = sys.modules.get(f"{name}.utils.logging")
        if utils is not None and hasattr(utils, "disable_progress_bar"):
            bars.append((utils, utils.is_progress_bar_enabled()))
            utils.disable_progress_bar()
    try:
        yield
    finally:
        for name, level in previous.items():
            logging.getLogger(name).setLevel(level)
        for utils, enabled in bars:
            if enabled:
                utils.enable_progress_bar()


class Codec(nn.Module):
    """A family's VAE and text encoders (frozen modules of this ``nn.Module``, so ``.to()`` and FSDP see them)."""

    family: ClassVar[str] = ""
    video: ClassVar[bool] = False  # whether it encodes videos (encode-data reads video inputs for it)
    components: ClassVar[tuple[str, ...]] = ()  # pipeline components besides the VAE, in encoding order
    #: whether ``fastgen encode-data`` writes the text condition into its shards (Cosmos Predict 2.5's is 100,352
    #: wide, about 100 MB a caption: its shards hold latents and captions, encoded on the fly when training)
    text_in_shards: ClassVar[bool] = True

    def __init__(self, vae: nn.Module, **parts: Any) -> None:
        super().__init__()
        self.vae = vae
        self.tokenizers: dict[str, Any] = {k: v for k, v in parts.items() if k.startswith("tokenizer")}
        self.encoders = nn.ModuleDict({k: v for k, v in parts.items() if not k.startswith("tokenizer")})

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    @property
    def waveform_rate(self) -> int:
        """The rate (Hz) of the waveforms ``encode_waveforms`` takes; 0: the family (or this folder) has no sound
        (LTX-2 and Cosmos 3 override it)."""
        return 0

    # ---- latents -------------------------------------------------------------------------------------------
    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised latents of ``pixels`` in ``[-1, 1]``: the posterior's mode, or a sample with ``generator``."""
        posterior = self.vae.encode(pixels.to(self.device, self.dtype)).latent_dist
        raw = posterior.mode() if generator is None else posterior.sample(generator=generator)
        return self.normalise(raw)

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels in ``[-1, 1]`` (not clamped) of normalised ``latents``."""
        return self.vae.decode(self.denormalise(latents.to(self.device, self.dtype)), return_dict=False)[0]

    # ---- text ----------------------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """The family's text inputs: ``text`` ``(B, T, D)`` and, per family, ``pooled`` / ``text_mask``."""
        raise NotImplementedError

    def condition(self, encoded: dict[str, torch.Tensor]) -> torch.Tensor:
        """``encode_prompts``' output as the network's ``condition`` (``fastgen.networks.diffusers_nets``)."""
        return encoded["text"]

    def encode_negative(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """The text inputs of classifier-free guidance's negative side, as the family's pipeline makes them when its
        call gives ``negative_prompt`` (``""``: the pipeline's default)."""
        return self.encode_prompts(prompts)

    def _tokens(self, name: str, prompts: list[str], max_length: int, **kwargs: Any) -> Any:
        return self.tokenizers[name](prompts, padding="max_length", max_length=max_length, truncation=True,
                                     return_tensors="pt", **kwargs)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32, text: bool = True,
                        **kwargs: Any) -> Codec:
        """The codec of ``folder``; ``text=False``: the VAE alone (decoding samples needs no text encoder)."""
        folder = Path(folder).expanduser()
        parts = {name: _component(folder, name, dtype) for name in cls.components} if text else {}
        return cls(_component(folder, "vae", dtype), **parts, **kwargs)


class SDCodec(Codec):
    family = "sd"
    components = ("tokenizer", "text_encoder")

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        return raw * self.vae.config.scaling_factor

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        return latents / self.vae.config.scaling_factor

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        ids = self._tokens("tokenizer", prompts, self.tokenizers["tokenizer"].model_max_length).input_ids
        encoder = self.encoders["text_encoder"]
        return {"text": encoder(ids.to(self.device), attention_mask=None)[0]}


class SDXLCodec(Codec):
    """SDXL (Podell et al. 2023): the same VAE normalisation as SD (SDXL's ``scaling_factor``; ``latents_mean`` /
    ``latents_std`` when the VAE config has them), two CLIP text encoders whose penultimate hidden states are
    concatenated, the second's projected pooled vector, and the empty negative prompt as zeros when the pipeline
    has ``force_zeros_for_empty_prompt`` (SDXL base's default)."""

    family = "sdxl"
    components = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")

    def __init__(self, vae: nn.Module, force_zeros_for_empty_prompt: bool = True, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.force_zeros_for_empty_prompt = bool(force_zeros_for_empty_prompt)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        config = self.vae.config
        if getattr(config, "latents_mean", None) is None or getattr(config, "latents_std", None) is None:
            return None
        shape = (1, -1, 1, 1)
        return (torch.tensor(config.latents_mean, dtype=like.dtype, device=like.device).view(shape),
                torch.tensor(config.latents_std, dtype=like.dtype, device=like.device).view(shape))

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        stats = self._stats(raw)
        if stats is None:
            return raw * self.vae.config.scaling_factor
        return (raw - stats[0]) * self.vae.config.scaling_factor / stats[1]

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        stats = self._stats(latents)
        if stats is None:
            return latents / self.vae.config.scaling_factor
        return latents * stats[1] / self.vae.config.scaling_factor + stats[0]

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        states, pooled = [], None
        for index in ("", "_2"):
            ids = self._tokens(f"tokenizer{index}", prompts, self.tokenizers[f"tokenizer{index}"].model_max_length)
            out = self.encoders[f"text_encoder{index}"](ids.input_ids.to(self.device), output_hidden_states=True)
            if pooled is None and out[0].ndim == 2:  # CLIPTextModelWithProjection's text_embeds (the pipeline's test)
                pooled = out[0]
            states.append(out.hidden_states[-2])
        assert pooled is not None, "SDXL's second text encoder gives the pooled vector"
        return {"text": torch.cat(states, dim=-1), "pooled": pooled}

    def encode_negative(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        encoded = self.encode_prompts(prompts)
        if self.force_zeros_for_empty_prompt and all(p == "" for p in prompts):
            return {key: torch.zeros_like(value) for key, value in encoded.items()}
        return encoded

    def condition(self, encoded: dict[str, torch.Tensor]) -> torch.Tensor:
        return pack_sdxl_condition(encoded["text"], encoded["pooled"], encoded.get("time_ids"))

    @staticmethod
    def time_ids(size: Sequence[int], crop: Sequence[int], resolution: int | Sequence[int]) -> list[float]:
        """SDXL's micro-conditioning of an image center-cropped and resized to ``resolution`` (Podell et al. 2023,
        Sec. 2.2; as diffusers' SDXL training script computes it): the original ``(height, width)``, the crop's
        top-left corner in the resized image's pixels, the target ``(height, width)``. ``size`` is ``(width,
        height)``, ``crop`` ``(left, top, side)`` or ``(left, top, width, height)`` in the original's pixels
        (encode-data's json), ``resolution`` a square side or ``(width, height)``."""
        (width, height), (left, top, crop_w) = size, crop[:3]
        target_w, target_h = (resolution, resolution) if isinstance(resolution, int) else resolution
        scale = target_w / crop_w  # the crop has the target's aspect ratio: one scale for both axes
        return [float(height), float(width), float(round(top * scale)), float(round(left * scale)),
                float(target_h), float(target_w)]

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32, text: bool = True,
                        **kwargs: Any) -> Codec:
        index = json.loads((Path(folder).expanduser() / "model_index.json").read_text())
        kwargs.setdefault("force_zeros_for_empty_prompt", bool(index.get("force_zeros_for_empty_prompt", True)))
        return super().from_pretrained(folder, dtype=dtype, text=text, **kwargs)


class FluxCodec(Codec):
    family = "flux"
    components = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")

    def __init__(self, vae: nn.Module, max_sequence_length: int = 512, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.max_sequence_length = int(max_sequence_length)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        return (raw - self.vae.config.shift_factor) * self.vae.config.scaling_factor

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        return latents / self.vae.config.scaling_factor + self.vae.config.shift_factor

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        clip_ids = self._tokens("tokenizer", prompts, self.tokenizers["tokenizer"].model_max_length).input_ids
        pooled = self.encoders["text_encoder"](clip_ids.to(self.device), output_hidden_states=False).pooler_output
        t5_ids = self._tokens("tokenizer_2", prompts, self.max_sequence_length).input_ids
        text = self.encoders["text_encoder_2"](t5_ids.to(self.device), output_hidden_states=False)[0]
        return {"text": text, "pooled": pooled}

    def condition(self, encoded: dict[str, torch.Tensor]) -> torch.Tensor:
        return pack_flux_condition(encoded["text"], encoded["pooled"])


class WanCodec(Codec):
    family = "wan"
    video = True
    components = ("tokenizer", "text_encoder")

    def __init__(self, vae: nn.Module, max_sequence_length: int = 512, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.max_sequence_length = int(max_sequence_length)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean, dtype=like.dtype, device=like.device).view(shape)
        std = torch.tensor(self.vae.config.latents_std, dtype=like.dtype, device=like.device).view(shape)
        return mean, std

    @staticmethod
    def _as_video(x: torch.Tensor) -> torch.Tensor:
        return x if x.dim() == 5 else x.unsqueeze(2)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(raw)
        return (raw - mean) / std

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return latents * std + mean

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return super().encode_images(self._as_video(pixels), generator)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, C, F, H, W)``; the images of 4-D latents (one frame) as ``(B, C, H, W)``."""
        decoded = super().decode_latents(self._as_video(latents))
        return decoded[:, :, 0] if latents.dim() == 4 else decoded

    @staticmethod
    def clean(prompts: list[str]) -> list[str]:
        """The prompts as the pipeline cleans them before tokenising (``WanPipeline``'s ``prompt_clean``)."""
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean  # the pipeline's own cleaning (ftfy if present)

        return [prompt_clean(p) for p in prompts]

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        tokens = self._tokens("tokenizer", self.clean(prompts), self.max_sequence_length,
                              add_special_tokens=True, return_attention_mask=True)
        mask = tokens.attention_mask.to(self.device)
        hidden = self.encoders["text_encoder"](tokens.input_ids.to(self.device), mask).last_hidden_state
        keep = mask.gt(0).unsqueeze(-1)  # each prompt's own tokens; the rest zero, as the pipeline pads
        return {"text": hidden * keep.to(hidden.dtype), "text_mask": mask}


class CosmosPredict2Codec(WanCodec):
    """Cosmos Predict2 (``Cosmos2TextToImagePipeline``, ``Cosmos2VideoToWorldPipeline``): Wan 2.1's VAE with Wan's
    per-channel normalisation (the pipelines' ``sigma_data`` is 1), and T5's last hidden state of the prompt under
    its attention mask, zero past its tokens, padded to ``max_sequence_length`` (512) - ``_get_t5_prompt_embeds``,
    which (unlike ``WanPipeline``) does not clean the prompt. Images are ``(B, C, H, W)`` latents (the text-to-image
    pipeline's one frame, dropped); videos ``(B, C, F, H, W)``."""

    family = "cosmos2"

    @staticmethod
    def clean(prompts: list[str]) -> list[str]:
        return list(prompts)

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        latents = super().encode_images(pixels, generator)
        return latents if pixels.dim() == 5 else latents[:, :, 0]


class QwenImageCodec(Codec):
    """Qwen-Image (Wu et al. 2025): ``AutoencoderKLQwenImage`` (a causal 3-D VAE; images are one frame) with its
    per-channel ``latents_mean`` / ``latents_std``, and Qwen2.5-VL's last hidden states of the prompt in the
    pipeline's chat template, variable-length (each prompt's own tokens, zero-padded)."""

    family = "qwenimage"
    components = ("tokenizer", "text_encoder")
    #: ``QwenImagePipeline.prompt_template_encode``: the system turn that asks for a description, then the prompt
    PROMPT_TEMPLATE: ClassVar[str] = (
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
        "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
        "<|im_start|>assistant\n")
    #: ``prompt_template_encode_start_idx``: the template's leading tokens (the system turn) dropped from the states
    TEMPLATE_TOKENS: ClassVar[int] = 34
    #: ``tokenizer_max_length``: the prompt's tokens kept by the tokenizer beyond the dropped ones
    TOKENIZER_MAX_LENGTH: ClassVar[int] = 1024

    def __init__(self, vae: nn.Module, max_sequence_length: int = 512, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.max_sequence_length = int(max_sequence_length)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``latents_mean`` and ``1 / latents_std`` as ``(1, C, 1, 1, 1)``: the pipelines scale by the reciprocal."""
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(like.device, like.dtype)
        inverse = 1.0 / torch.tensor(self.vae.config.latents_std).view(shape).to(like.device, like.dtype)
        return mean, inverse

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        mean, inverse = self._stats(raw)
        return (raw - mean) * inverse  # QwenImageImg2ImgPipeline._encode_vae_image

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, inverse = self._stats(latents)
        return latents / inverse + mean  # QwenImagePipeline.__call__ before vae.decode

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B, C, H, W)`` latents of ``(B, 3, H, W)`` pixels (the VAE sees one frame)."""
        return super().encode_images(pixels.unsqueeze(2), generator)[:, :, 0]

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` pixels of ``(B, C, H, W)`` latents (decoded as one frame, as the pipeline does)."""
        return super().decode_latents(latents.unsqueeze(2))[:, :, 0]

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        tokens = self.tokenizers["tokenizer"]([self.PROMPT_TEMPLATE.format(p) for p in prompts],
                                              max_length=self.TOKENIZER_MAX_LENGTH + self.TEMPLATE_TOKENS,
                                              padding=True, truncation=True, return_tensors="pt")
        attention = tokens.attention_mask.to(self.device)
        hidden = self.encoders["text_encoder"](input_ids=tokens.input_ids.to(self.device), attention_mask=attention,
                                               output_hidden_states=True).hidden_states[-1]
        text = hidden.new_zeros(len(prompts), self.max_sequence_length, hidden.shape[-1])
        mask = torch.zeros(len(prompts), self.max_sequence_length, dtype=torch.long, device=hidden.device)
        for row, (states, keep) in enumerate(zip(hidden, attention.bool())):
            own = states[keep][self.TEMPLATE_TOKENS:][: self.max_sequence_length]
            text[row, : len(own)] = own
            mask[row, : len(own)] = 1
        return {"text": text, "text_mask": mask}


class CogVideoXCodec(Codec):
    """CogVideoX (Yang et al. 2024): ``AutoencoderKLCogVideoX`` (a causal 3-D VAE: ``(F - 1) / k + 1`` latent frames
    of ``F`` frames, ``k`` its ``temporal_compression_ratio``) with ``z = s E(x)`` by its ``scaling_factor`` (the
    pipelines' ``vae_scaling_factor_image``: ``CogVideoXVideoToVideoPipeline.prepare_latents`` multiplies,
    ``CogVideoXPipeline.decode_latents`` divides), videos ``(B, C, F, H, W)`` - the pipelines hold them frame major,
    fastgen channel major - and an image one frame; prompts -> T5's last hidden state of the prompt padded to
    ``max_sequence_length`` (226), encoded **without** an attention mask (``_get_t5_prompt_embeds``: the padding
    tokens are encoded too), the negative prompt ``""`` the same way (not zeros)."""

    family = "cogvideox"
    video = True
    components = ("tokenizer", "text_encoder")

    def __init__(self, vae: nn.Module, max_sequence_length: int = 226, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.max_sequence_length = int(max_sequence_length)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        return raw * self.vae.config.scaling_factor

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        return latents / self.vae.config.scaling_factor

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B, C, f, h, w)`` latents of ``(B, 3, F, H, W)`` videos; ``(B, 3, H, W)`` images are one frame."""
        return super().encode_images(pixels if pixels.dim() == 5 else pixels.unsqueeze(2), generator)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, 3, F, H, W)``; the images of 4-D latents (one frame) as ``(B, 3, H, W)``."""
        decoded = super().decode_latents(latents if latents.dim() == 5 else latents.unsqueeze(2))
        return decoded[:, :, 0] if latents.dim() == 4 else decoded

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        ids = self._tokens("tokenizer", prompts, self.max_sequence_length, add_special_tokens=True).input_ids
        return {"text": self.encoders["text_encoder"](ids.to(self.device))[0]}


CODECS: dict[str, type[Codec]] = {cls.family: cls for cls in (SDCodec, SDXLCodec, FluxCodec, WanCodec,
                                                             QwenImageCodec, CogVideoXCodec, CosmosPredict2Codec)}
_BY_PIPELINE = {"StableDiffusionPipeline": "sd", "StableDiffusionXLPipeline": "sdxl", "FluxPipeline": "flux",
                "WanPipeline": "wan", "QwenImagePipeline": "qwenimage", "CogVideoXPipeline": "cogvideox",
                "LTX2Pipeline": "ltx2", "Cosmos3OmniPipeline": "cosmos3", "Cosmos2TextToImagePipeline": "cosmos2",
                "Cosmos2VideoToWorldPipeline": "cosmos2", "Cosmos2_5_PredictBasePipeline": "cosmos25"}
#: codecs in modules of their own, which import this one (so they are looked up by name when used): family -> class
LAZY_CODECS = {"ltx2": "fastgen.networks.ltx2_codec.LTX2Codec", "cosmos3": "fastgen.networks.cosmos3_codec.Cosmos3Codec",
               "cosmos25": "fastgen.networks.cosmos_predict25_codec.CosmosPredict25Codec"}


def codec_class(family: str) -> type[Codec]:
    """The codec class of ``family`` (``CODECS``, or imported from ``LAZY_CODECS``)."""
    if family in CODECS:
        return CODECS[family]
    import importlib

    module, _, name = LAZY_CODECS[family].rpartition(".")
    return getattr(importlib.import_module(module), name)


def codec_family(folder: str | Path, family: str | None = None) -> str:
    """The codec family of the diffusers pipeline folder ``folder`` (``family``: from its ``model_index.json``'s
    ``_class_name`` when not given), or a one-line UsageError - without loading anything."""
    folder = Path(folder).expanduser()
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise UsageError(f"{folder} is not a diffusers pipeline folder (no model_index.json)")
    if family is None:
        pipeline = json.loads(index_file.read_text()).get("_class_name", "")
        family = _BY_PIPELINE.get(pipeline)
        if family is None:
            raise UsageError(f"{folder}: no codec for the pipeline {pipeline!r} (known: {', '.join(_BY_PIPELINE)})")
    if family not in CODECS and family not in LAZY_CODECS:
        raise UsageError(f"unknown codec family {family!r} (known: {', '.join([*CODECS, *LAZY_CODECS])})")
    return family


def codec_options(net: Any) -> dict[str, Any]:
    """What a network asks of the codec that feeds it (its backbone's ``codec_options()``; Cosmos Predict2: the
    prompt length it pads to, which the text encoder must encode to), for ``load_codec``."""
    options = getattr(getattr(net, "backbone", None), "codec_options", None)
    return dict(options()) if callable(options) else {}


def load_codec(folder: str | Path, family: str | None = None, dtype: torch.dtype = torch.float32, text: bool = True,
               **kwargs: Any) -> Codec:
    """The codec of the diffusers pipeline folder ``folder`` (``codec_family``), frozen, at ``dtype``; ``text=False``
    loads the VAE alone."""
    family = codec_family(folder, family)
    import_diffusers()
    if text:
        import_extra("transformers", "text encoders")
    with quiet_libraries():
        return codec_class(family).from_pretrained(folder, dtype=dtype, text=text, **kwargs)


__all__ = [
    "CODECS",
    "Codec",
    "codec_options",
    "CogVideoXCodec",
    "CosmosPredict2Codec",
    "FluxCodec",
    "QwenImageCodec",
    "SDCodec",
    "SDXLCodec",
    "WanCodec",
    "codec_class",
    "codec_family",
    "load_codec",
]
