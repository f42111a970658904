"""Cosmos 3 (NVIDIA 2026, "Cosmos 3: an omni world model"): diffusers' ``Cosmos3OmniTransformer`` in the network
contract (``fastgen.networks.diffusion_net``), called as ``Cosmos3OmniPipeline`` calls it.

**What the model is.** A Mixture-of-Transformers over one packed token sequence: a causal *understanding* stream
(the prompt's text tokens, a Qwen3-VL-style LLM with its own token embedding table) and a bidirectional
*generation* stream (the noisy vision latents as 2x2 patches, and - with ``sound_gen`` - one token per sound latent
frame), each with its own projections, MLPs and norms in every layer; the generation queries attend to the text
keys and values and to their own (the model's ``Cosmos3AttnProcessor``). Positions are 3-D mRoPE ids over the
whole sequence: text tokens at ``0..L-1`` on all three axes, vision patches at ``(L + margin + frame, row,
column)`` (the frame axis rescaled by ``fps``), sound frames on the frame axis from the same offset. The model's
``forward`` takes *one* packed sample without a batch axis: ``input_ids`` and index tensors that say where each
modality sits in the sequence, and it embeds the token ids itself.

**Where this adapter departs from the other diffusers wrappers** (``fastgen.networks.diffusers_nets``), and why:

* *It builds the packed sequence itself, batched.* The layers are called with ``(B, L, D)`` text and ``(B, N, D)``
  generation streams; every sample's text is left-aligned and zero-padded to the batch's longest, and the padding
  is masked out of both attentions (causal over the text, full for the generation queries), so a sample's output
  does not depend on its neighbours or on how far it was padded: it is the model's own ``forward`` on that sample's
  packed sequence (``test_cosmos3``: to 1e-5). The layers are the model's; only the attention processor is
  replaced (``BatchedPackedAttention``), which runs the model's own processor on the model's unbatched inputs, so
  ``Cosmos3OmniPipeline`` with this transformer is unchanged. Positions are the pipeline's own
  (``get_3d_mrope_ids_text_tokens`` / ``get_3d_mrope_ids_vae_tokens``), per sample, with its text length.
* *The text condition is the prompt's token embeddings through the model's own table.* Our methods multiply the
  condition by 0/1 for classifier-free-guidance dropout and pass ``zeros_like(condition)`` as the unconditional
  input, so token ids cannot be the condition (zero is a token, and a bfloat16 cast corrupts ids above 256). The
  condition is ``(B, T, D)`` rows of ``embed_tokens`` (``D = hidden_size``) for the pipeline's ids of the prompt
  (``prompt_ids``: the pipeline's templates, chat template, end-of-text and vision-start tokens), zero-padded
  after the prompt; the wrapper hands them to the layers where the model would have looked the ids up, which is
  exactly the model's computation. A row is padding iff it is all zero (a real embedding row never is), as for
  Qwen-Image. ``embed_tokens`` is therefore frozen (training it would desynchronise the encoded data).
* *The null condition is the pipeline's negative prompt, not zeros.* ``Cosmos3OmniPipeline`` guides against the
  *tokenised* negative prompt (``""`` by default, with the inverse duration / resolution templates), a real token
  sequence. A sample whose condition is all zero (dropped by ``condition_dropout``, or the methods' unconditional
  branch, or ``None``) is given those ids, embedded by the model's table: ``negative_ids`` when the recipe gives
  them, else tokenised from ``tokenizer`` (the pipeline folder, which ``model.pretrained_model_path`` sets through
  ``adopt_folder``) for the sample's pixel size (latent size times the VAE's compression) and ``fps`` - what the
  pipeline's unconditional pass sees for that size (``test_cosmos3``).
* *Parameters no output depends on are frozen*: the LM head, the text embedding table (above), the text stream's
  final norm and the last layer's text-only parts (its queries, output projection, MLP and post-attention norm:
  the generation stream reads only that layer's text keys and values), and the action heads. They get no gradient
  ever, so DDP needs no unused-parameter search and Adam keeps no state for them (1.2B parameters of Cosmos3-Nano);
  they stay in the state dict, so the export is the full diffusers model.
* *Modalities*: ``x`` is video latents ``(B, C, F, H, W)`` (an image ``(B, C, H, W)`` is one frame: the pipeline's
  text-to-image mode, ``num_frames=1``) or a dict ``{"video": ..., "audio": (B, C_s, T_s)}`` when the model has a
  sound path (``fastgen.networks.modalities``), each with its own ``c_noise`` (rectified-flow ``t``; the model
  embeds ``1000 t * timestep_scale`` as the pipeline passes it the scheduler's timestep). Every frame is noisy:
  the pipeline's image/video-to-video conditioning (clean frames without a time embedding) and action generation
  are not offered.

Guidance is the pipeline's plain ``u + s (c - u)`` per modality with one scale. Feature taps
(``feature_indices``): the chosen layers' generation-stream vision tokens as ``(B, D, F h, w)`` maps. Shard units
(FSDP2, activation checkpointing, ``torch.compile``): every decoder layer. PDD's widened head: ``proj_out``, whose
rows per token are ``(patch row, patch column, channel)``. LoRA targets the layers' ``nn.Linear`` projections by
name (``to_q`` / ``add_q_proj`` ...) like any other backbone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fastgen.networks.diffusers_nets import DiffusersBackbone, _tokens_to_map
from fastgen.networks.heads import HeadSpec
from fastgen.networks.modalities import is_multimodal
from fastgen.utils.errors import ConfigError, UsageError

MODALITIES = ("video", "audio")
VISION_START = "<|vision_start|>"
POSITION_CACHE = 256  # (text length, grid, sound length) entries of position ids kept
#: the pipeline's system turns (``default_use_system_prompt``) and metadata sentences, which the model was trained
#: with; the negative prompt takes the inverse sentences (``Cosmos3OmniPipeline.__init__``)
SYSTEM_PROMPTS = {"image": "You are a helpful assistant who will generate images from a give prompt.",
                  "video": "You are a helpful assistant who will generate videos from a give prompt."}
TEMPLATES = {
    "duration": ("The video is {duration:.1f} seconds long and is of {fps:.0f} FPS.",
                 "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."),
    "image": ("This image is of {height}x{width} resolution.", "This image is not of {height}x{width} resolution."),
    "video": ("This video is of {height}x{width} resolution.", "This video is not of {height}x{width} resolution."),
}


def prompt_ids(tokenizer: Any, text: str, *, negative: bool = False, num_frames: int, height: int, width: int,
               fps: float = 24.0, use_system_prompt: bool = True, add_resolution_template: bool = True,
               add_duration_template: bool = True) -> list[int]:
    """The token ids ``Cosmos3OmniPipeline.tokenize_prompt`` gives ``text`` for a sample of ``num_frames`` frames
    of ``height x width`` pixels (``num_frames = 1``: an image): the metadata sentences appended (their inverses for
    the ``negative`` prompt), the system and user turns in the tokenizer's chat template with the generation
    prompt, then end-of-text and vision-start."""
    kind = "image" if num_frames == 1 else "video"
    which = 1 if negative else 0

    def append(base: str, sentence: str) -> str:
        base = base.rstrip(".")
        return f"{base}. {sentence}" if base else sentence

    if kind == "video" and add_duration_template:
        text = append(text, TEMPLATES["duration"][which].format(duration=num_frames / fps, fps=fps))
    if add_resolution_template:
        text = append(text, TEMPLATES[kind][which].format(height=height, width=width))
    turns = [{"role": "system", "content": SYSTEM_PROMPTS[kind]}] if use_system_prompt else []
    turns.append({"role": "user", "content": text})
    ids = tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=True, add_vision_id=False,
                                        return_dict=True)["input_ids"]
    return [int(i) for i in ids] + [int(tokenizer.eos_token_id), int(tokenizer.convert_tokens_to_ids(VISION_START))]


def load_tokenizer(folder: str) -> Any:
    """The pipeline's ``text_tokenizer`` from a Cosmos 3 pipeline folder (or the tokenizer folder itself)."""
    from transformers import AutoTokenizer

    root = Path(folder).expanduser()
    for candidate in (root / "text_tokenizer", root):
        if (candidate / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(candidate))
    raise UsageError(f"Cosmos3Transformer: no text tokenizer in {root / 'text_tokenizer'} or {root} (the pipeline "
                     "folder's text_tokenizer/ makes the null condition, the pipeline's negative prompt)")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class BatchedPackedAttention:
    """The model's dual-pathway attention (``Cosmos3AttnProcessor``) for a batch of packed samples.

    Called by the model's own layers with ``(B, L, D)`` text and ``(B, N, D)`` generation streams and
    ``rotary = (cos_text, sin_text, cos_gen, sin_gen, text_mask, gen_mask)`` (tables ``(B, *, head_dim)``;
    boolean attention masks ``(B, 1, L, L)`` / ``(B, 1, 1, L + N)``, or None when no sample is padded): the same
    projections, per-head norms and rotations, a causal pass over the text and a full pass of the generation
    queries over text and generation keys, through torch's SDPA with grouped-query heads. Unbatched inputs (the
    model's own ``forward``, the pipeline's call) go to the model's processor unchanged."""

    def __init__(self) -> None:
        from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor

        self.stock = Cosmos3AttnProcessor()

    def __call__(self, attn: nn.Module, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary: tuple) -> Any:
        if und_seq.dim() == 2:
            return self.stock(attn, und_seq, gen_seq, rotary)
        cos_u, sin_u, cos_g, sin_g, und_mask, gen_mask = rotary
        heads, groups, width = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim

        def split(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.unflatten(-1, (n, width))

        def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            return t * cos.unsqueeze(2) + _rotate_half(t) * sin.unsqueeze(2)

        q_u = attn.norm_q(split(attn.to_q(und_seq), heads))
        k_u = attn.norm_k(split(attn.to_k(und_seq), groups))
        v_u = split(attn.to_v(und_seq), groups)
        k_ug = attn.k_norm_und_for_gen(k_u) if attn.k_norm_und_for_gen is not None else k_u
        q_g = attn.norm_added_q(split(attn.add_q_proj(gen_seq), heads))
        k_g = attn.norm_added_k(split(attn.add_k_proj(gen_seq), groups))
        v_g = split(attn.add_v_proj(gen_seq), groups)
        q_u, k_u, k_ug = rotate(q_u, cos_u, sin_u), rotate(k_u, cos_u, sin_u), rotate(k_ug, cos_u, sin_u)
        q_g, k_g = rotate(q_g, cos_g, sin_g), rotate(k_g, cos_g, sin_g)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   causal: bool) -> torch.Tensor:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=mask, is_causal=causal and mask is None, enable_gqa=True)
            return out.transpose(1, 2).flatten(-2)

        text = attend(q_u, k_u, v_u, und_mask, causal=True)
        gen = attend(q_g, torch.cat([k_ug, k_g], dim=1), torch.cat([v_u, v_g], dim=1), gen_mask, causal=False)
        return attn.to_out(text), attn.to_add_out(gen)


class Cosmos3Transformer(DiffusersBackbone):
    """``Cosmos3OmniTransformer`` in the network contract (module docstring).

    ``negative_ids``: the token ids of the null condition; without them they are the pipeline's negative prompt
    ``negative_prompt`` tokenised from ``tokenizer`` (a pipeline folder) for each sample size, as
    ``Cosmos3OmniPipeline.tokenize_prompt`` does with ``use_system_prompt`` and the two metadata templates.
    ``fps``: the frame rate the positions and templates assume (the pipeline's ``fps``); ``temporal_compression``
    / ``spatial_compression``: the VAE's (Wan 2.2's 4 and 16; the pipeline reads them from its VAE's config)."""

    model_class = "Cosmos3OmniTransformer"
    weights_subfolder = "transformer"
    text_dim_key = "hidden_size"

    def __init__(self, config: dict[str, Any], negative_ids: list[int] | None = None, tokenizer: str | None = None,
                 negative_prompt: str = "", fps: float = 24.0, temporal_compression: int = 4,
                 spatial_compression: int = 16, use_system_prompt: bool = True, add_resolution_template: bool = True,
                 add_duration_template: bool = True, prompt_embeddings: str | None = None, num_prompts: int = 0,
                 prompt_tokens: int = 1) -> None:
        if config.get("action_gen") and not config.get("action_dim"):
            raise ConfigError("Cosmos3Transformer: action_gen needs action_dim (the model's config)")
        super().__init__(config, prompt_embeddings, num_prompts, prompt_tokens)
        if negative_ids is not None and not len(negative_ids):
            raise ConfigError("Cosmos3Transformer: negative_ids is empty (the null condition needs a token)")
        self.negative_ids = None if negative_ids is None else [int(i) for i in negative_ids]
        self.tokenizer, self.negative_prompt = tokenizer, str(negative_prompt)
        self.fps, self.temporal_compression = float(fps), int(temporal_compression)
        self.spatial_compression = int(spatial_compression)
        self.templates = {"use_system_prompt": bool(use_system_prompt),
                          "add_resolution_template": bool(add_resolution_template),
                          "add_duration_template": bool(add_duration_template)}
        self._negatives: dict[tuple[int, int, int], list[int]] = {}
        self._positions: dict[tuple[Any, ...], torch.Tensor] = {}
        for layer in self.model.layers:
            layer.self_attn.set_processor(BatchedPackedAttention())
        for parameter in self.unused_parameters():
            parameter.requires_grad_(False)

    @classmethod
    def adopt_folder(cls, backbone: Any, path: str) -> bool:
        """``model.pretrained_model_path`` is also where the null condition's tokenizer is: a pipeline folder with a
        ``text_tokenizer/`` becomes ``tokenizer`` (on every rank, before the network is built)."""
        if backbone.get("negative_ids") is not None or not (Path(path).expanduser() / "text_tokenizer").is_dir():
            return False
        backbone.tokenizer = str(path)
        return True

    # ---- the contract ---------------------------------------------------------------------------------------
    #: image / video to video (``fastgen.networks.conditioning_frames``): the pipeline's conditioned latent frames
    #: are clean tokens without a time embedding (``_apply_timestep_embeds_to_noisy_tokens`` skips them), so the
    #: time they would be read at does not matter
    takes_conditioning_frames = True
    conditioning_time = 0.0

    def shard_units(self) -> list[nn.Module]:
        return list(self.model.layers)

    def head_projection(self) -> HeadSpec:
        """PDD's widened projection: ``proj_out``, rows per token ``(p, p, channel)``; the unpatchify below takes
        the channel count from the tensor."""
        return HeadSpec("model.proj_out", "patch_major", int(self.model.config.latent_channel))

    def unused_parameters(self) -> list[nn.Parameter]:
        """The parameters no prediction depends on (module docstring), frozen at construction."""
        model = self.model
        unused: list[nn.Module] = [model.lm_head, model.embed_tokens, model.norm]
        last = model.layers[-1]
        attn = last.self_attn
        unused += [attn.to_q, attn.norm_q, attn.to_out, last.post_attention_layernorm, last.mlp]
        unused += [getattr(model, name) for name in ("action_proj_in", "action_proj_out") if hasattr(model, name)]
        params = [p for module in unused for p in module.parameters()]
        if hasattr(model, "action_modality_embed"):
            params.append(model.action_modality_embed)
        return params

    # ---- the null condition ---------------------------------------------------------------------------------
    def null_ids(self, frames: int, height: int, width: int) -> list[int]:
        """The token ids of the null condition for ``frames`` latent frames of ``height x width`` latents."""
        if self.negative_ids is not None:
            return self.negative_ids
        key = (frames, height, width)
        if key not in self._negatives:
            if not self.tokenizer:
                raise ConfigError("Cosmos3Transformer: the null condition is the pipeline's negative prompt; give "
                                  "tokenizer (the pipeline folder; model.pretrained_model_path sets it) or "
                                  "negative_ids")
            tokenizer = self.__dict__.get("_tokenizer")
            if tokenizer is None:
                tokenizer = self.__dict__["_tokenizer"] = load_tokenizer(self.tokenizer)
            self._negatives[key] = prompt_ids(
                tokenizer, self.negative_prompt, negative=True, num_frames=(frames - 1) * self.temporal_compression + 1,
                height=height * self.spatial_compression, width=width * self.spatial_compression, fps=self.fps,
                **self.templates)
        return self._negatives[key]

    def _text_rows(self, text: torch.Tensor, frames: int, height: int, width: int) -> list[torch.Tensor]:
        """Each sample's text tokens ``(L_i, D)``: its nonzero rows, or the null condition's embedded ids. On the
        meta device (a shape probe: DMD2 sizes its GAN heads by a forward there) every row counts as text."""
        if text.is_meta:
            return list(text.unbind(0))
        rows = []
        keep = text.ne(0).any(dim=-1)
        for i in range(text.shape[0]):
            if bool(keep[i].any()):
                rows.append(text[i][keep[i]])
            else:
                ids = torch.tensor(self.null_ids(frames, height, width), device=text.device)
                rows.append(self.model.embed_tokens(ids))
        return rows

    # ---- positions --------------------------------------------------------------------------------------------
    def _sample_positions(self, text_len: int, grid: tuple[int, int, int], sound_len: int) -> torch.Tensor:
        """``(3, L + N)`` mRoPE ids of one sample with ``text_len`` text tokens, a ``(frames, rows, columns)`` patch
        grid and ``sound_len`` sound frames, as ``Cosmos3OmniPipeline`` builds them (``_prepare_text_segment`` /
        ``_prepare_vision_segment`` / ``_prepare_sound_segment``); cached (they depend on the sizes alone)."""
        key = (text_len, grid, sound_len)
        cached = self._positions.get(key)
        if cached is not None:
            return cached
        if len(self._positions) >= POSITION_CACHE:  # prompts of many lengths: start over rather than grow
            self._positions.clear()
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
            get_3d_mrope_ids_text_tokens,
            get_3d_mrope_ids_vae_tokens,
        )

        config = self.model.config
        modulated = bool(config.enable_fps_modulation)
        with torch.device("cpu"):  # host tensors also inside a meta-device build (the functions read values)
            text, offset = get_3d_mrope_ids_text_tokens(text_len, 0, use_float_positions=modulated)
            offset = offset + config.unified_3d_mrope_temporal_modality_margin
            common = {"temporal_offset": offset, "reset_spatial_indices": config.unified_3d_mrope_reset_spatial_ids,
                      "base_fps": float(config.base_fps)}
            vision, _ = get_3d_mrope_ids_vae_tokens(*grid, fps=self.fps if modulated else None,
                                                    temporal_compression_factor=self.temporal_compression, **common)
            parts = [text.float(), vision.float()]
            if sound_len:
                sound, _ = get_3d_mrope_ids_vae_tokens(sound_len, 1, 1, temporal_compression_factor=1,
                                                       fps=float(config.sound_latent_fps) if modulated else None,
                                                       **common)
                parts.append(sound.float())
            cached = self._positions[key] = torch.cat(parts, dim=1)
        return cached

    # ---- packing ------------------------------------------------------------------------------------------------
    def _split(self, x: Any, c_noise: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                     torch.Tensor | None]:
        if not is_multimodal(x):
            return x, c_noise, None, None
        unknown = set(x) - set(MODALITIES)
        if "video" not in x or unknown:
            raise ValueError(f"Cosmos3Transformer takes the modalities {list(MODALITIES)} (video required); got "
                             f"{sorted(x)}")
        if "audio" in x and not self.model.config.sound_gen:
            raise ConfigError("Cosmos3Transformer: an audio modality needs a model with sound_gen (its config)")
        times = c_noise if is_multimodal(c_noise) else {name: c_noise for name in x}
        return x["video"], times["video"], x.get("audio"), times.get("audio") if "audio" in x else None

    def _time_embedding(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``(B, D)``: the model's time embedding of the pipeline's timestep ``1000 t`` (times ``timestep_scale``)."""
        model = self.model
        embedder_dtype = next(model.time_embedder.parameters()).dtype
        scaled = (t.float() * 1000.0) * model.config.timestep_scale
        return model.time_embedder(model.time_proj(scaled).to(embedder_dtype)).to(dtype)

    def _patchify(self, video: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """``(B, C, F, H, W)`` -> ``(B, F h w, p p C)`` tokens of ``p x p`` patches (H, W zero-padded to a multiple of
        ``p``), frame-row-column order, patch row, column, channel inside a token (``_patchify_and_pack_latents``)."""
        p = int(self.model.config.latent_patch_size)
        b, c, f, h, w = video.shape
        video = F.pad(video, (0, -w % p, 0, -h % p))
        rows, cols = video.shape[-2] // p, video.shape[-1] // p
        tokens = video.reshape(b, c, f, rows, p, cols, p).permute(0, 2, 3, 5, 4, 6, 1)
        return tokens.reshape(b, f * rows * cols, p * p * c), (f, rows, cols)

    def _unpatchify(self, tokens: torch.Tensor, grid: tuple[int, int, int], height: int, width: int) -> torch.Tensor:
        p = int(self.model.config.latent_patch_size)
        f, rows, cols = grid
        b = tokens.shape[0]
        patches = tokens.reshape(b, f, rows, cols, p, p, -1)
        video = patches.permute(0, 6, 1, 2, 4, 3, 5).reshape(b, -1, f, rows * p, cols * p)
        return video[..., :height, :width]

    def _call(self, x: Any, c_noise: Any, text: torch.Tensor, conditioning_frames: int = 0) -> Any:
        video, t_video, audio, t_audio = self._split(x, c_noise)
        if conditioning_frames:  # per-frame times from DiffusionNet: the sample's time on every generated frame
            t_video = t_video[:, -1]
        image = video.dim() == 4
        if image:
            video = video.unsqueeze(2)
        if video.dim() != 5 or video.shape[1] != self.model.config.latent_channel:
            raise ValueError(f"Cosmos3Transformer takes latents (B, {self.model.config.latent_channel}, F, H, W); got "
                             f"{tuple(video.shape)}")
        if t_video.dim() != 1 or (t_audio is not None and t_audio.dim() != 1):
            raise ValueError("Cosmos3Transformer takes one time per sample and modality, (B,)")
        model = self.model
        b, _, frames, height, width = video.shape
        tokens, grid = self._patchify(video)
        gen = model.proj_in(tokens)
        dtype = gen.dtype
        embedded = self._time_embedding(t_video, dtype)[:, None]
        if conditioning_frames:  # the given frames' tokens carry no time embedding, as the pipeline packs them
            per_frame = math.prod(grid[1:])
            noisy = torch.arange(gen.shape[1], device=gen.device) >= conditioning_frames * per_frame
            embedded = embedded * noisy[None, :, None].to(dtype)
        gen = gen + embedded
        parts = [gen]
        sound_len = 0
        if audio is not None:
            sound_len = audio.shape[-1]
            sound = model.audio_proj_in(audio.transpose(1, 2).to(dtype)) + model.audio_modality_embed
            parts.append(sound + self._time_embedding(t_audio, dtype)[:, None])
        gen = torch.cat(parts, dim=1) if len(parts) > 1 else gen

        texts = self._text_rows(text, frames, height, width)
        lengths = [len(rows) for rows in texts]
        longest = max(lengths)
        und = gen.new_zeros(b, longest, gen.shape[-1])
        for i, rows in enumerate(texts):
            und[i, : lengths[i]] = rows.to(dtype)
        positions = torch.stack([self._padded_positions(n, longest, grid, sound_len) for n in lengths], dim=1)
        if video.is_meta:  # a shape probe: the rotary module turns autocast off, which the meta device has not
            cos = sin = video.new_empty(b, positions.shape[-1], int(model.config.head_dim), dtype=dtype)
        else:
            cos, sin = model.rotary_emb(positions.to(video.device), video.device, dtype)
        und_mask = gen_mask = None
        if min(lengths) < longest:  # padding: masked out of the causal text pass and of the generation queries' keys
            ends = torch.tensor(lengths, device=video.device)[:, None]
            valid = torch.arange(longest, device=video.device)[None, :] < ends
            causal = torch.ones(longest, longest, dtype=torch.bool, device=video.device).tril()
            und_mask = (causal[None] & valid[:, None, :])[:, None]
            gen_mask = torch.cat([valid, valid.new_ones(b, gen.shape[1])], dim=1)[:, None, None]
        rotary = (cos[:, :longest], sin[:, :longest], cos[:, longest:], sin[:, longest:], und_mask, gen_mask)
        for layer in model.layers:
            und, gen = layer(und, gen, rotary)
        gen = model.norm_moe_gen(gen)

        vision_len = math.prod(grid)
        out = self._unpatchify(model.proj_out(gen[:, :vision_len]), grid, height, width)
        out = out.squeeze(2) if image else out
        if audio is None:
            return {"video": out} if is_multimodal(x) else out
        return {"video": out, "audio": model.audio_proj_out(gen[:, vision_len:]).transpose(1, 2)}

    def _padded_positions(self, text_len: int, longest: int, grid: tuple[int, int, int],
                          sound_len: int) -> torch.Tensor:
        """One sample's ids with its text padded to ``longest`` tokens (the padding's ids continue the text's; the
        padding is masked, so they only need to be finite)."""
        ids = self._sample_positions(text_len, grid, sound_len)
        if text_len == longest:
            return ids
        pad = torch.arange(text_len, longest, dtype=ids.dtype).expand(3, -1)
        return torch.cat([ids[:, :text_len], pad, ids[:, text_len:]], dim=1)

    def _feature_map(self, output: Any, x: Any) -> torch.Tensor:
        video = x["video"] if is_multimodal(x) else x
        p = int(self.model.config.latent_patch_size)
        frames = video.shape[2] if video.dim() == 5 else 1
        rows, cols = -(-video.shape[-2] // p), -(-video.shape[-1] // p)
        # a copy, not a view of the layer's output: FSDP2 hooks a wrapped network's outputs for backward, and warns
        # that an in-place op on a view would skip that hook (the features are DMD2's GAN inputs)
        return _tokens_to_map(output[1][:, : frames * rows * cols], frames * rows, cols).contiguous()


__all__ = ["BatchedPackedAttention", "Cosmos3Transformer", "MODALITIES", "load_tokenizer", "prompt_ids"]
