"""LTX-2's codec (HaCohen et al. 2026): its frozen video VAE, audio VAE, vocoder and Gemma-3 text encoder with the
text connectors, used exactly as ``LTX2Pipeline`` uses them (``fastgen.networks.codecs`` for the other families).

* **Video** (``AutoencoderKLLTX2Video``, a causal 3-D VAE: ``(F - 1) / k + 1`` latent frames of ``F`` frames):
  per-channel ``z = (E(x) - mu_c) s / sigma_c`` with the VAE's ``latents_mean`` / ``latents_std`` buffers and its
  ``scaling_factor`` (``_normalize_latents``; the pipeline's decode is the inverse, ``_denormalize_latents``); with
  a timestep-conditioned decoder it decodes at time 0 (the pipeline's default ``decode_timestep``). Videos are
  ``(B, 3, F, H, W)`` in ``[-1, 1]``; an image is one frame.
* **Audio** (``AutoencoderKLLTX2Audio`` over a log-mel spectrogram ``(B, 2, T, M)``, stereo, ``M`` mel bins): its
  latents ``(B, C, T / 4, M / 4)`` are normalised in the pipeline's packed layout - one token per latent frame with
  every channel's bins, channel major - by the VAE's ``latents_mean`` / ``latents_std`` (``C M / 4`` entries;
  ``prepare_audio_latents`` / ``_denormalize_audio_latents``), and decoded to a waveform as the pipeline does: the
  audio VAE's mel spectrogram through the vocoder (``LTX2Vocoder``; ``sample_rate`` its output rate). Waveforms
  (``encode_waveforms``, what ``encode-data`` calls) go through LTX-2's own front end first - a log-mel spectrogram
  (``fastgen.networks.log_mel``) at the audio VAE's rate, hop and mel bins - and their latents are cut to the
  pipeline's count for the clip (next point).
* **Text**: each prompt stripped, tokenised left-padded to ``max_sequence_length`` (1024, the pipeline's call
  default; the tokenizer's eos pads when it has no pad token), Gemma-3's hidden states of every layer stacked and
  flattened (``_get_gemma_prompt_embeds``), then ``LTX2TextConnectors`` - per-layer masked normalisation (LTX-2.0)
  or per-token RMS norm and per-stream projections (LTX-2.3), and one connector transformer per stream whose
  learnable registers replace the padding. The network's condition is the video and audio embeddings concatenated
  on the last axis (``fastgen.networks.ltx2``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fastgen.networks.codecs import Codec, _component, has_component
from fastgen.networks.ltx2 import pack_audio, unpack_audio
from fastgen.networks.modalities import is_multimodal
from fastgen.utils.errors import UsageError


def _pipeline_component(folder: Path, name: str, dtype: torch.dtype) -> nn.Module:
    """A component ``LTX2Pipeline`` defines itself (``model_index.json`` names its library ``ltx2``: the
    connectors, the vocoder), frozen, from safetensors."""
    from diffusers.pipelines import ltx2

    library, class_name = json.loads((folder / "model_index.json").read_text()).get(name) or (None, None)
    cls = getattr(ltx2, str(class_name), None) if library == "ltx2" else None
    if cls is None:
        return _component(folder, name, dtype)
    return cls.from_pretrained(folder, subfolder=name, use_safetensors=True, torch_dtype=dtype).requires_grad_(False).eval()


class LTX2Codec(Codec):
    """LTX-2's VAEs, vocoder and text stack (module docstring). ``encode_images`` / ``encode_audio`` give the
    normalised latents of videos / mel spectrograms; ``decode_latents`` of a ``{"video", "audio"}`` dict gives
    ``{"video": pixels, "audio": waveform}``."""

    family = "ltx2"
    video = True
    components = ("tokenizer", "text_encoder", "connectors")
    #: the parts the audio stream needs besides the video VAE (loaded with or without the text stack)
    AUDIO_PARTS: ClassVar[tuple[str, ...]] = ("audio_vae", "vocoder")

    def __init__(self, vae: nn.Module, audio_vae: nn.Module | None = None, vocoder: nn.Module | None = None,
                 max_sequence_length: int = 1024, n_fft: int = 1024, **parts: Any) -> None:
        super().__init__(vae, **parts)
        self.audio_vae = audio_vae
        self.vocoder = vocoder
        self.max_sequence_length = int(max_sequence_length)
        #: the STFT size of the waveform front end (LTX-2's ``filter_length``; diffusers' audio VAE config omits it)
        self.n_fft = int(n_fft)

    # ---- video ---------------------------------------------------------------------------------------------
    def _video_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        shape = (1, -1, 1, 1, 1)
        return (self.vae.latents_mean.view(shape).to(like.device, like.dtype),
                self.vae.latents_std.view(shape).to(like.device, like.dtype), float(self.vae.config.scaling_factor))

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        mean, std, scale = self._video_stats(raw)
        return (raw - mean) * scale / std

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std, scale = self._video_stats(latents)
        return latents * std / scale + mean

    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B, C, f, h, w)`` latents of ``(B, 3, F, H, W)`` videos; ``(B, 3, H, W)`` images are one frame."""
        return super().encode_images(pixels if pixels.dim() == 5 else pixels.unsqueeze(2), generator)

    @torch.no_grad()
    def decode_video(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, 3, F, H, W)`` in ``[-1, 1]`` (not clamped) of normalised latents; 4-D latents (one frame)
        give images ``(B, 3, H, W)``."""
        z = self.denormalise((latents if latents.dim() == 5 else latents.unsqueeze(2)).to(self.device, self.dtype))
        temb = torch.zeros(z.shape[0], device=z.device, dtype=z.dtype) if self.vae.config.timestep_conditioning else None
        decoded = self.vae.decode(z, temb, return_dict=False)[0]
        return decoded[:, :, 0] if latents.dim() == 4 else decoded

    # ---- audio ---------------------------------------------------------------------------------------------
    def _audio(self) -> nn.Module:
        if self.audio_vae is None:
            raise UsageError("this LTX-2 codec was built without its audio VAE (the pipeline folder's audio_vae/)")
        return self.audio_vae

    def normalise_audio(self, raw: torch.Tensor) -> torch.Tensor:
        """``(B, C, T, M)`` raw audio latents normalised as the pipeline does, in its packed layout."""
        vae = self._audio()
        mean, std = vae.latents_mean.to(raw.device, raw.dtype), vae.latents_std.to(raw.device, raw.dtype)
        return unpack_audio((pack_audio(raw) - mean) / std, raw.shape[3])

    def denormalise_audio(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self._audio()
        mean, std = vae.latents_mean.to(latents.device, latents.dtype), vae.latents_std.to(latents.device, latents.dtype)
        return unpack_audio(pack_audio(latents) * std + mean, latents.shape[3])

    @torch.no_grad()
    def encode_audio(self, mel: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised latents ``(B, C, T / 4, M / 4)`` of log-mel spectrograms ``(B, 2, T, M)``: the posterior's
        mode, or a sample with ``generator``."""
        posterior = self._audio().encode(mel.to(self.device, self.dtype)).latent_dist
        raw = posterior.mode() if generator is None else posterior.sample(generator=generator)
        return self.normalise_audio(raw)

    @torch.no_grad()
    def decode_audio(self, latents: torch.Tensor) -> torch.Tensor:
        """Waveforms ``(B, channels, samples)`` at ``sample_rate`` of normalised audio latents: the audio VAE's mel
        spectrogram through the vocoder."""
        if self.vocoder is None:
            raise UsageError("this LTX-2 codec was built without its vocoder (the pipeline folder's vocoder/)")
        mel = self._audio().decode(self.denormalise_audio(latents.to(self.device, self.dtype)), return_dict=False)[0]
        return self.vocoder(mel)

    @property
    def waveform_rate(self) -> int:
        """The rate (Hz) of the waveforms ``encode_waveforms`` takes: the audio VAE's; 0 without one."""
        return int(self.audio_vae.config.sample_rate) if self.audio_vae is not None else 0

    @torch.no_grad()
    def encode_waveforms(self, waveforms: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``(B, C, T_a, M / 4)`` of stereo waveforms ``(B, 2, N)`` at ``waveform_rate``: the
        log-mel spectrogram (``floor(N / h) + 1`` frames of hop ``h``), its latents, and of those the first
        ``T_a = round(N / (h r))`` (``r``: the VAE's temporal compression) - the count ``LTX2Pipeline`` samples for a
        clip of ``N`` samples (``round(duration * sr / h / r)``). The causal encoder gives ``ceil((N / h + 1) / r)``;
        the one past the pipeline's count holds only the centred STFT's padded tail, and dropping it changes no
        other latent (each depends on the frames before it)."""
        from fastgen.networks.log_mel import log_mel_spectrogram

        vae = self._audio()
        config = vae.config
        mel = log_mel_spectrogram(waveforms.float(), int(config.sample_rate), n_fft=self.n_fft,
                                  hop_length=int(config.mel_hop_length), mel_bins=int(config.mel_bins))
        count = round(waveforms.shape[-1] / int(config.mel_hop_length) / int(vae.temporal_compression_ratio))
        return self.encode_audio(mel)[:, :, :count]

    @property
    def sample_rate(self) -> int:
        """The vocoder's output rate (Hz) of ``decode_audio``'s waveforms."""
        return int(self.vocoder.config.output_sampling_rate) if self.vocoder is not None else 0

    @torch.no_grad()
    def decode_latents(self, latents: Any) -> Any:
        """``{"video": pixels, "audio": waveform}`` of a multimodal sample - the pipeline's ``output_type="np"``
        decoding of both streams, what ``fastgen sample --prompt`` writes (``PromptSampler.pixels``); pixels of video
        latents alone."""
        if not is_multimodal(latents):
            return self.decode_video(latents)
        return {"video": self.decode_video(latents["video"]), "audio": self.decode_audio(latents["audio"])}

    # ---- text ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """``text``: ``(B, T, D_v + D_a)``, the connectors' video and audio embeddings side by side; ``text_mask``:
        the connectors' mask (all ones: registers fill the padding)."""
        tokenizer = self.tokenizers["tokenizer"]
        tokenizer.padding_side = "left"  # as the pipeline sets it: Gemma's chat-style prompts are left-padded
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokens = self._tokens("tokenizer", [p.strip() for p in prompts], self.max_sequence_length,
                              add_special_tokens=True)
        mask = tokens.attention_mask.to(self.device)
        encoder = self.encoders["text_encoder"]
        hidden = encoder(input_ids=tokens.input_ids.to(self.device), attention_mask=mask,
                         output_hidden_states=True).hidden_states
        stacked = torch.stack(hidden, dim=-1).flatten(2, 3).to(encoder.dtype)
        video, audio, text_mask = self.encoders["connectors"](stacked, mask, padding_side=tokenizer.padding_side)
        return {"text": torch.cat([video, audio], dim=-1), "text_mask": text_mask}

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32, text: bool = True,
                        **kwargs: Any) -> Codec:
        """The codec of an ``LTX2Pipeline`` folder; ``text=False``: without the text stack (decoding needs none)."""
        folder = Path(folder).expanduser()
        audio = {name: _pipeline_component(folder, name, dtype) for name in cls.AUDIO_PARTS
                 if has_component(folder, name)}
        vae = _component(folder, "vae", dtype)
        parts = {name: _pipeline_component(folder, name, dtype) for name in cls.components} if text else {}
        return cls(vae, **audio, **parts, **kwargs)


__all__ = ["LTX2Codec"]
