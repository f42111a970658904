"""diffusers-backed backbones: Stable-Diffusion-style U-Nets, Flux-, Wan-, Qwen-Image- and CogVideoX-style transformers
in the network contract (``fastgen.networks.diffusion_net``), behind the optional extra ``pip install fastgen[diffusers]``.

Each class wraps one diffusers model class, built from its architecture config (a dict, as in the model's
``config.json``), so that ``fastgen dryrun`` and meta-device builds size a 12B transformer without its weights.
The weights come from ``model.pretrained_model_path`` - a local diffusers folder (``transformer/`` or ``unet/``
inside a pipeline folder, or the model folder itself) read with safetensors in ``load_pretrained`` - when a run
starts, never in ``__init__``. The schedule is the one the model was trained with, set by the config builders in
``fastgen.configs.net_diffusers``: discrete VP with epsilon prediction for SD (``DiscreteVPScheduler``; CogVideoX's
with v prediction, its SNR shift and zero terminal SNR), rectified
flow for Flux, Wan and Qwen-Image (``x_t = (1 - t) x0 + t eps``, velocity ``eps - x0``; Esser et al. 2024; Wan
2025; Wu et al. 2025).

What each backbone is given (``forward(x, c_noise, condition, r_noise, feature_indices, return_logvar)``):

* ``x``: latents ``(B, C, H, W)``; for Wan and CogVideoX also ``(B, C, F, H, W)`` video latents (an image is one
  frame; CogVideoX's model takes them frame major, the backbone transposes). Flux
  and Qwen-Image pack 2x2 latent patches into tokens themselves (their pipelines' ``_pack_latents``), so
  ``in_channels = 4 C``.
* ``c_noise``: the schedule's time: SD's and CogVideoX's step index ``0..N-1``; Flux's and Qwen-Image's ``t in [0, 1]`` (the
  transformers scale by 1000 themselves; Qwen-Image's pipeline passes ``timestep / 1000``); Wan's ``t`` scaled to
  ``0..1000`` here, as its pipeline passes it.
* ``condition``: **text embeddings** ``(B, T, D)`` (``D`` = the model's cross-attention / joint-attention / text
  dimension); for Flux, row 0 carries the pooled text vector (CLIP's, first ``pooled_projection_dim`` channels,
  zero-padded) and rows ``1..T`` the token embeddings - ``pack_flux_condition`` builds that layout. Qwen-Image's
  variable-length prompts are zero-padded (as its pipeline pads them) and the padding is the all-zero rows: the
  backbone masks them out of the joint attention (``encoder_hidden_states_mask``), so the one tensor carries the
  mask too. **Or class
  labels** (``(B,)`` integers or ``(B, num_prompts)`` one-hot rows) when the backbone has a prompt bank
  (``prompt_embeddings``: one embedding sequence per class, e.g. "a photo of a {class}" encoded once): a label
  selects its prompt's embeddings, so the library's class-conditional machinery (label dropout, guidance, balanced
  sample grids, ``fastgen eval``) works unchanged. The all-zero row / ``None`` is the null condition (zero
  embeddings), which is what the trainer's ``condition_dropout`` substitutes.
* ``feature_indices``: indices into ``shard_units()``; the chosen units' image-token outputs come back as
  ``(B, D, h, w)`` maps (video frames stacked along ``h``) for the discriminator heads.
* ``return_logvar``: not provided by these models (a one-line error).

Classifier-free guidance is ``u + s (c - u)`` - linear, the same on any prediction type - except where a backbone
says otherwise (``linear_guidance = False``; ``guide``): Qwen-Image's pipeline rescales the guided velocity to the
conditional one's norm, per token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.networks.heads import HeadSpec
from fastgen.networks.layers import contract_output
from fastgen.networks.modalities import batch_size, first_tensor
from fastgen.utils.errors import UsageError
from fastgen.utils.safe_pickle import torch_load

INSTALL_HINT = "pip install 'fastgen[diffusers]'"


def import_extra(package: str, needed_by: str) -> Any:
    """``package`` of the ``diffusers`` extra, or a one-line UsageError that says how to install it."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise UsageError(f"{needed_by} need the {package} package: {INSTALL_HINT}") from None


def import_diffusers() -> Any:
    """``diffusers``, or a one-line UsageError that says how to install it."""
    return import_extra("diffusers", "diffusers-backed networks")


def pack_flux_condition(tokens: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """Flux's two text inputs in one ``condition`` tensor: ``(B, 1 + T, D)`` with the pooled vector ``(B, P)``
    (``P <= D``), zero-padded to ``D``, in row 0 and the token embeddings ``(B, T, D)`` after it."""
    if pooled.shape[-1] > tokens.shape[-1]:
        raise ValueError(f"the pooled vector ({pooled.shape[-1]}) is wider than the token embeddings ({tokens.shape[-1]})")
    row = torch.nn.functional.pad(pooled, (0, tokens.shape[-1] - pooled.shape[-1])).unsqueeze(1)
    return torch.cat([row.to(tokens.dtype), tokens], dim=1)


SDXL_TIME_IDS = 6  # original height, width, crop top, left, target height, width (Podell et al. 2023, Sec. 2.2)


def pack_sdxl_condition(tokens: torch.Tensor, pooled: torch.Tensor, time_ids: torch.Tensor | None = None) -> torch.Tensor:
    """SDXL's three text inputs in one ``condition`` tensor: ``(B, 1 + T, D)`` with row 0 holding the pooled vector
    ``(B, P)`` of the second text encoder, then the six size-and-crop ``time_ids`` (pixels; zeros: the backbone's
    default, the sampled size uncropped), zero-padded to ``D``, and the concatenated token embeddings after it."""
    if time_ids is None:
        time_ids = torch.zeros(pooled.shape[0], SDXL_TIME_IDS, dtype=pooled.dtype, device=pooled.device)
    return pack_flux_condition(tokens, torch.cat([pooled, time_ids.to(pooled.dtype)], dim=-1))


def pack_flux_latents(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` latents as Flux's ``(B, H/2 * W/2, 4 C)`` tokens of 2x2 patches (``FluxPipeline._pack_latents``)."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_flux_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``pack_flux_latents`` undone: ``(B, H/2 * W/2, 4 C)`` tokens as ``(B, C, H, W)`` latents."""
    b, _, d = tokens.shape
    c = d // 4
    return tokens.reshape(b, height // 2, width // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, height, width)


def read_diffusers_state(path: str, subfolder: str) -> dict[str, torch.Tensor]:
    """The state dict of a diffusers model folder (``diffusion_pytorch_model.safetensors``, or the shards an
    ``.safetensors.index.json`` lists), looked for in ``path/subfolder`` and then ``path``. safetensors only:
    it loads tensors without running pickled code."""
    from safetensors.torch import load_file

    root = Path(path)
    for folder in (root / subfolder, root):
        single = folder / "diffusion_pytorch_model.safetensors"
        index = folder / "diffusion_pytorch_model.safetensors.index.json"
        if single.is_file():
            return load_file(str(single))
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(folder / shard)))
            return state
    if not root.exists():
        raise UsageError(f"model.pretrained_model_path: {path} does not exist (download the model's diffusers "
                         f"weights there, or set - model.pretrained_model_path=PATH)")
    raise UsageError(f"model.pretrained_model_path: no diffusion_pytorch_model.safetensors (or its .index.json) in "
                     f"{root / subfolder} or {root}")


def folder_architecture(path: str, subfolder: str) -> dict[str, Any] | None:
    """The architecture in a diffusers model folder's ``config.json`` (``path/subfolder``, then ``path``), without
    diffusers' bookkeeping keys (``_class_name``...); None when neither folder has one (not downloaded yet: the
    recipe's own architecture is then kept, and loading the weights names the missing folder)."""
    root = Path(path).expanduser()
    for folder in (root / subfolder, root):
        file = folder / "config.json"
        if file.is_file():
            return {k: v for k, v in json.loads(file.read_text()).items() if not k.startswith("_")}
    return None


#: the modules whose backbones wrap diffusers models (``fastgen.networks.causal_wan``: the block-causal Wan)
BACKBONE_MODULES = (__name__, "fastgen.networks.causal_wan", "fastgen.networks.ltx2", "fastgen.networks.cosmos3",
                    "fastgen.networks.cosmos_predict2", "fastgen.networks.cosmos_predict25")


def diffusers_backbone_class(network: Any) -> type[DiffusersBackbone] | None:
    """The backbone class of a ``DiffusionNet`` LazyCall when it is a ``DiffusersBackbone`` of ``BACKBONE_MODULES``
    (a latent model), else None - read from the config, nothing built."""
    import importlib

    backbone = getattr(network, "backbone", None) if network is not None else None
    module, _, name = str(getattr(backbone, "_target_", "") or "").rpartition(".")
    if module == __name__:
        return BACKBONES.get(name)
    if module not in BACKBONE_MODULES:
        return None
    found = getattr(importlib.import_module(module), name, None)
    return found if isinstance(found, type) and issubclass(found, DiffusersBackbone) else None


def adopt_folder_architecture(network: Any, path: str) -> bool:
    """``model.pretrained_model_path`` decides the architecture of a diffusers-backed network config (a
    ``DiffusionNet`` LazyCall whose backbone is one of this module's classes): its ``config`` becomes the weights
    folder's ``config.json``, so fine-tunes and other sizes of a family load, not only the recipe's default.
    Returns whether ``network`` was changed (in place)."""
    cls = diffusers_backbone_class(network)
    if cls is None:
        return False
    backbone = network.backbone
    adopted = cls.adopt_folder(backbone, path)  # what else the folder decides (Cosmos 3: its tokenizer)
    found = folder_architecture(path, cls.weights_subfolder)
    if found is None:
        return adopted
    backbone.config = found
    return True


class DiffusersBackbone(nn.Module):
    """Base class: builds ``model_class`` from ``config`` and adds the contract's conditioning, feature taps, shard
    units and weight loading. Subclasses say how the model is called (``_call``) and where its blocks are."""

    model_class: str = ""
    weights_subfolder: str = ""
    text_dim_key: str = ""  # the config entry with the width of the text embeddings the model attends to
    bank_extra_tokens: int = 0  # rows a prompt of the bank holds beyond its tokens (Flux: the pooled row)
    #: whether classifier-free guidance is ``u + s (c - u)`` (then it is the same on any prediction type); when
    #: not, samplers combine the native predictions with ``guide`` (Qwen-Image: rescaled to the conditional norm)
    linear_guidance: bool = True

    def __init__(self, config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
                 prompt_tokens: int = 1) -> None:
        super().__init__()
        diffusers = import_diffusers()
        self.model = getattr(diffusers, self.model_class).from_config(dict(config))
        self.text_dim = self.text_width(config)
        bank = self._prompt_bank(prompt_embeddings, num_prompts, prompt_tokens + self.bank_extra_tokens)
        self.register_buffer("prompt_bank", bank if bank is not None else torch.zeros(0, 1, self.text_dim))

    @classmethod
    def adopt_folder(cls, backbone: Any, path: str) -> bool:
        """Besides the architecture, what the weights folder ``path`` decides in the backbone's config node
        (``adopt_folder_architecture``, on every rank before a build); returns whether it changed it. Default: nothing."""
        return False

    @classmethod
    def text_width(cls, config: dict[str, Any]) -> int:
        """The width ``D`` of the ``condition`` rows (``text_dim_key``'s entry; LTX-2: its two streams' together)."""
        return int(config[cls.text_dim_key])

    def _prompt_bank(self, path: str | None, num_prompts: int, tokens: int) -> torch.Tensor | None:
        """``(num_prompts, T, D)``: read from ``path`` (a safetensors or ``torch.save`` file holding one tensor of
        that shape, loaded with ``weights_only=True``; not read in a meta-device build, so ``fastgen dryrun``
        works before it exists) or, without a path, drawn once from N(0, 1) with seed 0 - a fixed stand-in for
        encoded prompts in tests and tiny recipes. It is a buffer in the state dict, so checkpoints carry it."""
        if num_prompts > 0 and torch.empty(0).device.type == "meta":
            # a meta-device build (dryrun, model.meta_init): the shape only; rank 0's real build is broadcast into it
            return torch.empty(num_prompts, tokens, self.text_dim)
        if path:
            file = os.path.expanduser(path)
            if not os.path.isfile(file):
                raise UsageError(f"prompt_embeddings: {path} does not exist")
            if file.endswith(".safetensors"):
                from safetensors.torch import load_file

                tensors = list(load_file(file).values())
            else:
                loaded = torch_load(file, what=f"prompt_embeddings: {path}")
                tensors = list(loaded.values()) if isinstance(loaded, dict) else [loaded]
            want = (num_prompts, tokens, self.text_dim)
            if len(tensors) != 1 or tuple(tensors[0].shape) != want:
                found = ", ".join(str(tuple(t.shape)) for t in tensors)
                raise UsageError(f"prompt_embeddings: {path} must hold one tensor of shape {want} (num_prompts, "
                                 f"tokens, width); it holds {found or 'none'}")
            return tensors[0].float()
        if num_prompts <= 0:
            return None
        generator = torch.Generator(device="cpu").manual_seed(0)
        return torch.randn(num_prompts, tokens, self.text_dim, generator=generator, device="cpu")

    # ---- conditioning -------------------------------------------------------------------------------------
    def text_embeddings(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        """``(B, T, D)`` embeddings from text embeddings, labels (through the prompt bank) or ``None``."""
        if condition is None:
            tokens = self.prompt_bank.shape[1] if len(self.prompt_bank) else 1
            return torch.zeros(batch, tokens, self.text_dim, dtype=dtype, device=device)
        if condition.dim() == 3:
            if condition.shape[-1] != self.text_dim:
                raise ValueError(f"text embeddings of width {condition.shape[-1]}; this network takes {self.text_dim}")
            return condition.to(dtype)
        if not len(self.prompt_bank):
            raise ValueError(f"{type(self).__name__} is conditioned on text embeddings (B, T, {self.text_dim}); got "
                             f"a condition of shape {tuple(condition.shape)} and it has no prompt bank for labels")
        labels = condition
        if labels.dim() == 1:
            labels = nn.functional.one_hot(labels.long(), len(self.prompt_bank))
        return torch.einsum("bc,ctd->btd", labels.to(self.prompt_bank.dtype), self.prompt_bank).to(dtype)

    # ---- the contract ---------------------------------------------------------------------------------------
    def shard_units(self) -> list[nn.Module]:
        raise NotImplementedError

    @property
    def bottleneck_feature_index(self) -> int:
        return len(self.shard_units()) // 2

    def guide(self, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
        """Classifier-free guidance of the native predictions ``cond`` / ``uncond`` (Ho & Salimans 2022, Eq. 6)."""
        return uncond + scale * (cond - uncond)

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, condition: torch.Tensor | None = None,
                r_noise: torch.Tensor | None = None, feature_indices: list[int] | None = None,
                return_logvar: bool = False, conditioning_frames: int = 0) -> Any:
        """``conditioning_frames``: the video's first frames are given clean (``fastgen.networks.conditioning_frames``;
        only backbones with ``takes_conditioning_frames`` are asked)."""
        if return_logvar:
            raise ValueError(f"{type(self).__name__} does not predict a log-variance (model.net is diffusers-backed)")
        if r_noise is not None:
            raise ValueError(f"{type(self).__name__} takes one time input; methods with a second one (MeanFlow) need "
                             "a backbone built with use_r")
        units = self.shard_units()
        features: dict[int, torch.Tensor] = {}
        handles = []
        for index in feature_indices or []:
            if not 0 <= index < len(units):
                raise ValueError(f"feature_indices {feature_indices} must name blocks 0..{len(units) - 1}")

            def keep(_module: nn.Module, _args: Any, output: Any, index: int = index) -> None:
                features[index] = self._feature_map(output, x)

            handles.append(units[index].register_forward_hook(keep))
        try:
            like = first_tensor(x)  # a multimodal backbone (LTX-2) takes a dict of modalities
            text = self.text_embeddings(condition, batch_size(x), like.dtype, like.device)
            out = self._call(x, c_noise, text, **({"conditioning_frames": conditioning_frames}
                                                  if conditioning_frames else {}))
        finally:
            for handle in handles:
                handle.remove()
        if feature_indices is None:
            return out
        return contract_output(out, [features[i] for i in feature_indices])

    def load_pretrained(self, path: str) -> None:
        """The diffusers weights in ``path`` (``model.pretrained_model_path``) into the wrapped model, strictly:
        a key that is missing or left over is a one-line CheckpointError."""
        from fastgen.checkpoint.weights import load_weights

        load_weights(self.model, read_diffusers_state(path, self.weights_subfolder), path, "model.pretrained_model_path",
                     what="diffusers weights")


def _tokens_to_map(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``(B, h * w, D)`` image tokens as a ``(B, D, h, w)`` map."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], height, width)


class SDUNet(DiffusersBackbone):
    """A Stable-Diffusion-style ``UNet2DConditionModel``: ``unet(x_t, step, encoder_hidden_states)`` predicts the
    noise (or ``v``). Shard units: the down blocks, the mid block and the up blocks."""

    model_class = "UNet2DConditionModel"
    weights_subfolder = "unet"
    text_dim_key = "cross_attention_dim"

    def shard_units(self) -> list[nn.Module]:
        return [*self.model.down_blocks, self.model.mid_block, *self.model.up_blocks]

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: the last convolution (its outputs are the channels)."""
        return HeadSpec("model.conv_out")

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.model(x, c_noise, encoder_hidden_states=text, return_dict=False)[0]

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # down blocks return (hidden, skip connections)


class SDXLUNet(SDUNet):
    """SDXL's ``UNet2DConditionModel`` (Podell et al. 2023): cross-attention to two CLIP encoders' concatenated
    penultimate states, plus ``added_cond_kwargs``: the second encoder's pooled vector and the size-and-crop
    ``time_ids`` (micro-conditioning, Sec. 2.2), both in row 0 of ``condition`` (``pack_sdxl_condition``). All-zero
    ``time_ids`` - the null condition, or a prompt encoded without a size - mean the pipeline's default: the sampled
    size (latent size x ``vae_scale_factor``), uncropped."""

    bank_extra_tokens = 1

    def __init__(self, config: dict[str, Any], vae_scale_factor: int = 8, prompt_embeddings: str | None = None,
                 num_prompts: int = 0, prompt_tokens: int = 1) -> None:
        super().__init__(config, prompt_embeddings, num_prompts, prompt_tokens)
        self.vae_scale_factor = int(vae_scale_factor)
        embed = int(config["addition_time_embed_dim"])
        self.pooled_dim = int(config["projection_class_embeddings_input_dim"]) - SDXL_TIME_IDS * embed
        if self.pooled_dim + SDXL_TIME_IDS > self.text_dim:
            raise ValueError(f"the pooled vector ({self.pooled_dim}) and {SDXL_TIME_IDS} time ids do not fit a row of "
                             f"the {self.text_dim}-wide text embeddings")

    def text_embeddings(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        text = super().text_embeddings(condition, batch, dtype, device)
        if condition is None and text.shape[1] < 2:  # the null condition: a zero row 0 and one zero token
            text = torch.zeros(batch, 2, self.text_dim, dtype=dtype, device=device)
        return text

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        pooled = text[:, 0, : self.pooled_dim]
        time_ids = text[:, 0, self.pooled_dim: self.pooled_dim + SDXL_TIME_IDS]
        height, width = (n * self.vae_scale_factor for n in x.shape[-2:])
        default = torch.tensor([height, width, 0, 0, height, width], dtype=text.dtype, device=text.device)
        unset = time_ids.eq(0).all(dim=1, keepdim=True)
        time_ids = torch.where(unset, default.expand_as(time_ids), time_ids)
        return self.model(x, c_noise, encoder_hidden_states=text[:, 1:], return_dict=False,
                          added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids})[0]


class FluxTransformer(DiffusersBackbone):
    """A Flux-style ``FluxTransformer2DModel`` (MM-DiT double-stream blocks, then single-stream blocks; Esser et al.
    2024): latents are packed into 2x2-patch tokens with ``(0, row, column)`` position ids, the text tokens get
    zero ids, and the output is unpacked. With ``guidance_embeds`` (FLUX.1-dev's distilled guidance) the embedded
    guidance is ``guidance`` (3.5 by default, the dev pipeline's). Shard units: every transformer block."""

    model_class = "FluxTransformer2DModel"
    weights_subfolder = "transformer"
    text_dim_key = "joint_attention_dim"
    bank_extra_tokens = 1  # the bank's rows are in the packed layout: row 0 is the pooled vector

    def __init__(self, config: dict[str, Any], guidance: float = 3.5, prompt_embeddings: str | None = None,
                 num_prompts: int = 0, prompt_tokens: int = 1) -> None:
        super().__init__(config, prompt_embeddings, num_prompts, prompt_tokens)
        self.pooled_dim = int(config.get("pooled_projection_dim", 768))
        self.guidance = float(guidance)

    def shard_units(self) -> list[nn.Module]:
        return [*self.model.transformer_blocks, *self.model.single_transformer_blocks]

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: ``proj_out``, whose rows per token are ``(channel, 2, 2)`` - channel
        major, so ``unpack_flux_latents`` of a widened output gives the heads' channels one after another."""
        return HeadSpec("model.proj_out")

    def text_embeddings(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        text = super().text_embeddings(condition, batch, dtype, device)
        if condition is None and text.shape[1] < 2:  # the null condition: a zero pooled row and one zero token
            text = torch.zeros(batch, 2, self.text_dim, dtype=dtype, device=device)
        return text

    @staticmethod
    def _image_ids(height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        rows = torch.arange(height, device=device, dtype=dtype).repeat_interleave(width)
        cols = torch.arange(width, device=device, dtype=dtype).repeat(height)
        return torch.stack([torch.zeros_like(rows), rows, cols], dim=1)

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        if h % 2 or w % 2:
            raise ValueError(f"Flux packs 2x2 latent patches: height and width must be even, got {h}x{w}")
        packed = pack_flux_latents(x)
        pooled, tokens = text[:, 0, : self.pooled_dim], text[:, 1:]
        guidance = None
        if self.model.config.guidance_embeds:
            guidance = torch.full((b,), self.guidance, device=x.device, dtype=x.dtype)
        out = self.model(
            hidden_states=packed, encoder_hidden_states=tokens, pooled_projections=pooled, timestep=c_noise.to(x.dtype),
            img_ids=self._image_ids(h // 2, w // 2, x.device, x.dtype),
            txt_ids=torch.zeros(tokens.shape[1], 3, device=x.device, dtype=x.dtype), guidance=guidance, return_dict=False,
        )[0]
        return unpack_flux_latents(out, h, w)

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        image_tokens = output[1]  # every Flux block returns (text tokens, image tokens)
        return _tokens_to_map(image_tokens, x.shape[-2] // 2, x.shape[-1] // 2)


class WanTransformer(DiffusersBackbone):
    """A Wan-style ``WanTransformer3DModel`` (Wan 2025: a DiT over 3-D patches with cross-attention to umT5 text
    tokens). It takes ``(B, C, F, H, W)`` video latents; ``(B, C, H, W)`` images are one frame. Its timestep
    embedding expects the pipeline's ``1000 t``. Shard units: every transformer block."""

    model_class = "WanTransformer3DModel"
    weights_subfolder = "transformer"
    text_dim_key = "text_dim"

    def shard_units(self) -> list[nn.Module]:
        return list(self.model.blocks)

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: ``proj_out``, whose rows per token are ``(p_t, p_h, p_w, channel)``
        (patch major; the model unpatchifies with the channel count taken from the tensor)."""
        return HeadSpec("model.proj_out", "patch_major", int(self.model.config.out_channels))

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        video = x if x.dim() == 5 else x.unsqueeze(2)
        out = self.model(video, (c_noise * 1000.0).to(x.dtype), text, return_dict=False)[0]
        return out if x.dim() == 5 else out.squeeze(2)

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        p_t, p_h, p_w = self.model.config.patch_size
        frames = (x.shape[2] if x.dim() == 5 else 1) // p_t
        return _tokens_to_map(output, frames * (x.shape[-2] // p_h), x.shape[-1] // p_w)


class QwenImageTransformer(DiffusersBackbone):
    """Qwen-Image's ``QwenImageTransformer2DModel`` (Wu et al. 2025: an MM-DiT of double-stream blocks over 2x2-patch
    latent tokens and Qwen2.5-VL text states), called as ``QwenImagePipeline`` calls it: latents packed as Flux's
    (``_pack_latents``), ``img_shapes`` one frame of ``(H/2, W/2)`` tokens, ``timestep`` the flow time ``t`` (the
    pipeline's ``timestep / 1000``) and ``encoder_hidden_states_mask`` the prompt's own tokens.

    The mask travels in the condition itself: the pipeline zero-pads each prompt's states to the batch's longest
    (``_get_qwen_prompt_embeds``) and the codec to ``max_sequence_length``, so a token is padding exactly when its
    row is all zero - and the null condition (all zeros) is the text fully masked out, the unconditional model.
    The mask never changes a real token's position (text RoPE starts after the image grid whatever the padding),
    so the output does not depend on how far a prompt is padded.

    Guidance is the pipeline's ``true_cfg_scale`` path (``guide``): ``u + s (c - u)`` rescaled per token to the
    conditional velocity's norm. Shard units: every transformer block (each returns ``(text, image)`` tokens)."""

    model_class = "QwenImageTransformer2DModel"
    weights_subfolder = "transformer"
    text_dim_key = "joint_attention_dim"
    linear_guidance = False

    def shard_units(self) -> list[nn.Module]:
        return list(self.model.transformer_blocks)

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: ``proj_out``, rows per token ``(channel, 2, 2)`` as Flux's."""
        return HeadSpec("model.proj_out")

    @staticmethod
    def text_mask(text: torch.Tensor) -> torch.Tensor:
        """``(B, T)``: True for a prompt's own tokens, False for the zero rows that pad it."""
        return text.ne(0).any(dim=-1)

    def _restore_rope_tables(self) -> None:
        """The rotary tables of ``QwenEmbedRope`` are plain attributes, not buffers (diffusers keeps complex numbers
        out of ``register_buffer``), so a meta-device build (``model.meta_init``, dryrun) leaves them on the meta
        device after ``to_empty``; they depend on the config alone, so they are rebuilt here, once."""
        rope = self.model.pos_embed
        tables = getattr(rope, "pos_freqs", None)
        if tables is None or not tables.is_meta:
            return
        with torch.device("cpu"):
            fresh = type(rope)(theta=rope.theta, axes_dim=list(rope.axes_dim), scale_rope=rope.scale_rope)
        rope.pos_freqs, rope.neg_freqs = fresh.pos_freqs, fresh.neg_freqs

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        if h % 2 or w % 2:
            raise ValueError(f"Qwen-Image packs 2x2 latent patches: height and width must be even, got {h}x{w}")
        self._restore_rope_tables()
        out = self.model(
            hidden_states=pack_flux_latents(x), encoder_hidden_states=text,
            encoder_hidden_states_mask=self.text_mask(text), timestep=c_noise.to(x.dtype),
            img_shapes=[[(1, h // 2, w // 2)]] * b, return_dict=False,
        )[0]
        return unpack_flux_latents(out, h, w)

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        image_tokens = output[1]  # every block returns (text tokens, image tokens)
        return _tokens_to_map(image_tokens, x.shape[-2] // 2, x.shape[-1] // 2)

    def guide(self, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
        """``QwenImagePipeline.__call__``'s true classifier-free guidance of the velocities ``(B, C, H, W)``:
        ``g = u + s (c - u)``, then ``g ||c|| / ||g||`` with the norms over each packed token's ``4 C`` channels
        (one 2x2 latent patch; the pipeline takes them over the last axis of its packed latents)."""
        h, w = cond.shape[-2:]
        packed_cond = pack_flux_latents(cond)
        combined = pack_flux_latents(uncond + scale * (cond - uncond))
        rescaled = combined * (packed_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))
        return unpack_flux_latents(rescaled, h, w)


class CogVideoXTransformer(DiffusersBackbone):
    """CogVideoX's ``CogVideoXTransformer3DModel`` (Yang et al. 2024: an expert-adaptive-LayerNorm DiT over 2x2
    spatial patches of the 3-D VAE's latents, text and video tokens in one sequence), called as ``CogVideoXPipeline``
    calls it: frame-major ``(B, F, C, H, W)`` latents (fastgen's videos are ``(B, C, F, H, W)``; an image
    ``(B, C, H, W)`` is one frame), the DDPM step index as ``timestep``, the T5 states as ``encoder_hidden_states``
    and - with ``use_rotary_positional_embeddings`` (CogVideoX-5b) - the 3-D rotary tables the pipeline computes
    itself (``_prepare_rotary_positional_embeddings``: ``get_3d_rotary_pos_embed`` over the latent grid, cropped
    from the ``sample_height x sample_width`` base grid by ``get_resize_crop_region_for_grid``). CogVideoX-2b adds
    sincos positions inside the model instead (a non-persistent buffer, which a meta-device build receives from rank
    0 like any other buffer).

    The text is always ``max_text_seq_length`` (226) tokens, as the pipeline pads it: the sincos table of 2b spans
    exactly that many text positions, so the null condition is 226 zero tokens. Guidance is plain
    ``u + s (c - u)`` (the pipeline's default ``use_dynamic_cfg=False``). CogVideoX 1.5 (``patch_size_t``, temporal
    patches and frame padding) is not supported. Shard units: every transformer block (each returns ``(video
    tokens, text tokens)``)."""

    model_class = "CogVideoXTransformer3DModel"
    weights_subfolder = "transformer"
    text_dim_key = "text_embed_dim"

    def __init__(self, config: dict[str, Any], prompt_embeddings: str | None = None, num_prompts: int = 0,
                 prompt_tokens: int | None = None) -> None:
        if config.get("patch_size_t") is not None:
            raise UsageError(f"CogVideoXTransformer: patch_size_t={config['patch_size_t']} (CogVideoX 1.5's temporal "
                             "patches) is not supported; CogVideoX-2b and -5b have none")
        if config.get("ofs_embed_dim"):
            raise UsageError("CogVideoXTransformer: ofs_embed_dim (CogVideoX 1.5 image-to-video) is not supported")
        max_text_tokens = int(config.get("max_text_seq_length", 226))
        super().__init__(config, prompt_embeddings, num_prompts, max_text_tokens if prompt_tokens is None else prompt_tokens)
        self.max_text_tokens = max_text_tokens
        self._rope_cache: dict[tuple[int, int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def shard_units(self) -> list[nn.Module]:
        return list(self.model.transformer_blocks)

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: ``proj_out``, whose rows per token are ``(channel, p, p)`` (the model
        unpatchifies with ``reshape(..., -1, p, p)``, the channel count taken from the tensor): channel major."""
        return HeadSpec("model.proj_out")

    def text_embeddings(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        if condition is None and not len(self.prompt_bank):  # the null condition: the pipeline's text length
            return torch.zeros(batch, self.max_text_tokens, self.text_dim, dtype=dtype, device=device)
        return super().text_embeddings(condition, batch, dtype, device)

    def rotary_embeddings(self, frames: int, height: int, width: int,
                          device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``CogVideoXPipeline._prepare_rotary_positional_embeddings`` for ``frames`` latent frames of ``height x
        width`` latents (the pipeline's ``height // (vae_scale_factor_spatial * patch_size)`` is the latent size over
        ``patch_size``), or None for a model with sincos positions. Cached per size and device."""
        config = self.model.config
        if not config.use_rotary_positional_embeddings:
            return None
        key = (frames, height, width, str(device))
        if key not in self._rope_cache:
            from diffusers.models.embeddings import get_3d_rotary_pos_embed
            from diffusers.pipelines.cogvideo.pipeline_cogvideox import (
                get_resize_crop_region_for_grid,
            )

            p = config.patch_size
            grid = (height // p, width // p)
            crops = get_resize_crop_region_for_grid(grid, config.sample_width // p, config.sample_height // p)
            self._rope_cache[key] = get_3d_rotary_pos_embed(embed_dim=config.attention_head_dim, crops_coords=crops,
                                                            grid_size=grid, temporal_size=frames, device=device)
        return self._rope_cache[key]

    def _call(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        video = x if x.dim() == 5 else x.unsqueeze(2)
        p = self.model.config.patch_size
        if video.shape[-2] % p or video.shape[-1] % p:
            raise ValueError(f"CogVideoX patches {p}x{p} latents: height and width must be multiples of {p}, got "
                             f"{video.shape[-2]}x{video.shape[-1]}")
        frames = video.shape[2]
        rotary = self.rotary_embeddings(frames, video.shape[-2], video.shape[-1], x.device)
        out = self.model(hidden_states=video.transpose(1, 2), encoder_hidden_states=text, timestep=c_noise.to(x.dtype),
                         image_rotary_emb=rotary, return_dict=False)[0].transpose(1, 2)
        return out if x.dim() == 5 else out.squeeze(2)

    def _feature_map(self, output: Any, x: torch.Tensor) -> torch.Tensor:
        p = self.model.config.patch_size
        frames = x.shape[2] if x.dim() == 5 else 1
        return _tokens_to_map(output[0], frames * (x.shape[-2] // p), x.shape[-1] // p)


BACKBONES: dict[str, type[DiffusersBackbone]] = {cls.__name__: cls for cls in (SDUNet, SDXLUNet, FluxTransformer,
                                                                                WanTransformer, QwenImageTransformer,
                                                                                CogVideoXTransformer)}
