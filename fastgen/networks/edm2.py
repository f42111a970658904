"""An EDM2 magnitude-preserving U-Net backbone (Karras et al. 2024, "Analyzing and Improving the Training
Dynamics of Diffusion Models"; configuration "G", Fig. 21, as in the reference ``networks_edm2.py``).

Every layer is built so that unit-magnitude inputs give (approximately) unit-magnitude outputs - magnitude being
the root mean square - which keeps activation and weight magnitudes from drifting during training (Sec. 2):

* ``MPConv`` - convolution / linear layer whose weight is normalised in ``forward``:
  ``w_hat = w_i / ||w_i||`` per output channel ``i``, scaled by ``gain / sqrt(fan_in)`` (Eqs. 46-47), so each
  output channel is a unit-norm combination of its inputs (variance preserved for independent inputs).
* ``normalize`` / ``forced_weight_norm_`` - *forced* weight normalisation (Sec. 2.3, Eq. 66): before each
  training step every stored weight is replaced by ``w_i / (eps + ||w_i|| / sqrt(fan_in))``, i.e. each output
  channel gets norm ``sqrt(fan_in)`` (elements of unit magnitude). With the forward normalisation above this
  fixes the effective learning rate (the weights cannot grow). In EDM2 this happens inside ``MPConv.forward`` in
  training mode; here it is done by ``fastgen.callbacks.forced_weight_norm.ForcedWeightNormCallback`` (one fused
  pass over all weights, before each step), so ``forward`` never writes to its parameters. Without the callback
  the network still trains (``forward`` normalises), but the weights' norms grow and the effective learning rate
  decays (Sec. 2.3).
* ``mp_silu(x) = silu(x) / 0.596`` - ``0.596`` is the magnitude (root mean square) of ``silu(x)`` for
  ``x ~ N(0, 1)`` (Eq. 81); its standard deviation is 0.560, as ``silu`` is not zero-mean.
* ``mp_sum(a, b, t) = lerp(a, b, t) / sqrt((1 - t)^2 + t^2)`` - a weighted sum of two independent unit-magnitude
  inputs with unit magnitude (Eq. 88).
* ``mp_cat(a, b, t)`` - concatenation weighted by ``t`` and rescaled so that the result has unit magnitude,
  ``w_a = C (1 - t) / sqrt(N_a)``, ``w_b = C t / sqrt(N_b)``, ``C = sqrt((N_a + N_b) / ((1 - t)^2 + t^2))``
  (Eq. 103).
* ``MPFourier`` - Fourier features ``sqrt(2) cos(2 pi (f c + phi))`` with random ``f ~ N(0, 1)`` and
  ``phi ~ U(0, 1)``: unit magnitude over the random phases (Eq. 75).
* pixel norm - ``normalize(x, dim=1)`` over channels on the encoder's main path; it replaces group
  normalisation (Sec. 2.4).
* learned gains ``emb_gain`` and ``out_gain`` start at zero (Sec. 2.5): the untrained network outputs ``0``, so
  ``DiffusionNet`` returns ``c_skip x``.

``forward(x, c_noise, condition=None, r_noise=None, feature_indices=None, return_logvar=False)`` follows the
backbone contract of ``fastgen.networks.diffusion_net``. ``return_logvar`` adds the EDM2 uncertainty
``u(sigma)`` (Sec. 5, Eq. 21; ``L = E[lambda(sigma) / e^u ||D - y||^2 + u]``), computed like EDM2's ``Precond``:
its own Fourier features of ``c_noise`` followed by a one-output ``MPConv``. It is returned with shape ``(B,)``,
one value per sample, matching fastgen's per-sample losses (EDM2 reshapes it to ``(B, 1, 1, 1)``).
``feature_indices`` returns the output of the listed encoder levels and the bottleneck (index
``len(channel_mult)``), like ``fastgen.networks.unet.UNet``.

Labels: integer ``(B,)`` or one-hot / soft ``(B, num_classes)``; ``None`` or an all-zero label is the
unconditional model (classifier-free guidance), as in EDM2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fastgen.networks.layers import as_one_hot, contract_output

#: Root mean square of ``silu(x)`` for ``x ~ N(0, 1)`` (EDM2 Eq. 81).
SILU_RMS = 0.596


# ---------------------------------------------------------------------------------------------------------------
# Magnitude-preserving primitives
# ---------------------------------------------------------------------------------------------------------------
def normalize(x: torch.Tensor, dim: int | list[int] | None = None, eps: float = 1e-4) -> torch.Tensor:
    """``x / (eps + ||x|| * sqrt(norm.numel() / x.numel()))`` (EDM2 Eq. 66, the reference ``normalize``).

    With ``dim=None`` the norm is over every dimension but the first: for a weight of shape ``(out, ...)`` each
    output channel ``w_i`` is divided by ``eps + ||w_i|| / sqrt(fan_in)``, so the result has per-channel norm
    ``~sqrt(fan_in)`` (unit-magnitude elements). With ``dim=1`` on activations it is pixel norm. The
    norm is computed in float32 whatever the dtype of ``x``.
    """
    if dim is None:
        dim = list(range(1, x.ndim))
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    norm = torch.add(eps, norm, alpha=math.sqrt(norm.numel() / x.numel()))
    return x / norm.to(x.dtype)


def mp_silu(x: torch.Tensor) -> torch.Tensor:
    """Magnitude-preserving SiLU: ``silu(x) / 0.596`` (EDM2 Eq. 81)."""
    return F.silu(x) / SILU_RMS


def mp_sum(a: torch.Tensor, b: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    """``((1 - t) a + t b) / sqrt((1 - t)^2 + t^2)``: unit variance for independent unit-variance ``a``, ``b``
    (EDM2 Eq. 88). ``t`` is the contribution of ``b``."""
    return a.lerp(b, t) / math.sqrt((1 - t) ** 2 + t**2)


def mp_cat(a: torch.Tensor, b: torch.Tensor, dim: int = 1, t: float = 0.5) -> torch.Tensor:
    """Magnitude-preserving concatenation (EDM2 Eq. 103): ``b`` gets relative weight ``t`` regardless of the
    channel counts ``N_a``, ``N_b``, and the concatenation has unit variance per element."""
    n_a, n_b = a.shape[dim], b.shape[dim]
    c = math.sqrt((n_a + n_b) / ((1 - t) ** 2 + t**2))
    w_a = c / math.sqrt(n_a) * (1 - t)
    w_b = c / math.sqrt(n_b) * t
    return torch.cat([w_a * a, w_b * b], dim=dim)


def resample(x: torch.Tensor, mode: str = "keep") -> torch.Tensor:
    """EDM2's ``resample`` with the default ``[1, 1]`` filter: 2x2 box downsampling, nearest upsampling."""
    if mode == "keep":
        return x
    if mode == "down":
        return F.avg_pool2d(x, 2)
    if mode == "up":
        return F.interpolate(x, scale_factor=2.0, mode="nearest")
    raise ValueError(f"unknown resample mode {mode!r}")


class MPFourier(nn.Module):
    """Magnitude-preserving Fourier features of a scalar: ``sqrt(2) cos(2 pi (f c + phi))``.

    ``f ~ N(0, bandwidth^2)`` and ``phi ~ U(0, 1)`` are fixed (saved with the weights, so an EMA copy and a
    resumed run use the same ones); each feature has unit magnitude over the random phase (EDM2 Eq. 75).
    """

    def __init__(self, num_channels: int, bandwidth: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("freqs", 2 * math.pi * torch.randn(num_channels) * bandwidth)
        self.register_buffer("phases", 2 * math.pi * torch.rand(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float().reshape(-1).outer(self.freqs.float()) + self.phases.float()
        return (y.cos() * math.sqrt(2.0)).to(x.dtype)


class MPConv(nn.Module):
    """Magnitude-preserving convolution (``kernel=(k, k)``) or linear layer (``kernel=()``), no bias.

    ``forward`` uses ``w_hat = normalize(w) * gain / sqrt(fan_in)`` (EDM2 Eqs. 46-47): each output channel is a
    unit-norm filter, so ``Var[y] = Var[x]`` for independent unit-variance inputs. ``gain`` (a float or a learned
    scalar) scales the output. The stored weight is renormalised in place by ``normalize_`` (forced weight
    normalisation, Sec. 2.3, Eq. 66), usually through ``forced_weight_norm_`` / ``ForcedWeightNormCallback``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, *kernel))

    @property
    def fan_in(self) -> int:
        return self.weight[0].numel()

    @torch.no_grad()
    def normalize_(self, eps: float = 1e-4) -> None:
        """Forced weight normalisation of this layer: ``w.copy_(normalize(w))`` (EDM2 Sec. 2.3, Eq. 66)."""
        self.weight.copy_(normalize(self.weight.float(), eps=eps))

    def forward(self, x: torch.Tensor, gain: float | torch.Tensor = 1.0) -> torch.Tensor:
        w = normalize(self.weight.float())  # "traditional" weight normalisation, differentiable
        w = w * (gain / math.sqrt(self.fan_in))  # magnitude-preserving scaling
        w = w.to(x.dtype)
        if w.ndim == 2:
            return x @ w.t()
        return F.conv2d(x, w, padding=w.shape[-1] // 2)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel={tuple(self.weight.shape[2:])}"


def _gains_as_vectors(state_dict: dict, prefix: str, *args: object) -> None:
    """Load hook: checkpoints written when the learned gains were 0-dim scalars load into their (1,) shape."""
    for name in ("emb_gain", "out_gain"):
        key = prefix + name
        if key in state_dict and state_dict[key].dim() == 0:
            state_dict[key] = state_dict[key].reshape(1)


def mpconv_weights(modules: nn.Module | Iterable[nn.Module]) -> list[torch.Tensor]:
    """The weights of every ``MPConv`` inside ``modules`` (each parameter once)."""
    if isinstance(modules, nn.Module):
        modules = [modules]
    seen: set[int] = set()
    weights: list[torch.Tensor] = []
    for root in modules:
        for module in root.modules():
            if isinstance(module, MPConv) and id(module.weight) not in seen:
                seen.add(id(module.weight))
                weights.append(module.weight)
    return weights


def _whole_rows(weight: torch.Tensor) -> torch.Tensor:
    """The part of ``weight`` this rank stores, as whole output-channel rows: the tensor itself, or a sharded
    parameter's local shard. FSDP2 shards dimension 0, so every local row is a complete output channel and the
    per-row normalisation needs no communication."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch built without distributed support
        return weight
    if not isinstance(weight, DTensor):
        return weight
    if any(not (isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim == 0)) for p in weight.placements):
        raise ValueError(f"forced weight normalisation needs whole output channels per rank; got placements "
                         f"{weight.placements}")
    return weight.to_local()


@torch.no_grad()
def forced_weight_norm_(modules: nn.Module | Iterable[nn.Module] | list[torch.Tensor], eps: float = 1e-4) -> int:
    """Forced weight normalisation of every ``MPConv`` weight in ``modules``, in place (EDM2 Sec. 2.3, Eq. 66):
    ``w_i <- w_i / (eps + ||w_i|| / sqrt(fan_in))`` for each output channel ``i``. Returns the number of weights.

    Fused: weights are grouped by ``(fan_in, dtype, device)``; each group's ``(out, fan_in)`` rows are stacked
    into one matrix, its row norms computed in one float32 kernel, and the rows written back with one
    ``torch._foreach_copy_``. The cost is a handful of kernels per distinct ``fan_in``, not per weight or row.
    ``modules`` may also be a list of weight tensors (e.g. cached by a callback).
    """
    if isinstance(modules, list) and all(isinstance(m, torch.Tensor) for m in modules):
        weights = modules
    else:
        weights = mpconv_weights(modules)  # type: ignore[arg-type]
    groups: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
    for w in map(_whole_rows, weights):
        if w.shape[0] > 0:  # an uneven FSDP shard can hold no rows on this rank
            groups.setdefault((w[0].numel(), w.dtype, w.device), []).append(w)
    for (fan_in, dtype, _), group in groups.items():
        stacked = torch.cat([w.reshape(w.shape[0], fan_in) for w in group], dim=0).float()
        norms = torch.linalg.vector_norm(stacked, dim=1, keepdim=True)
        stacked = stacked / norms.mul_(1.0 / math.sqrt(fan_in)).add_(eps)
        chunks = stacked.to(dtype).split([w.shape[0] for w in group], dim=0)
        # Contiguous weights are written through (out, fan_in) views in one fused copy; any other layout
        # (e.g. channels_last) is copied back on its own, since reshape would give a detached copy.
        views = [(w.view(w.shape[0], fan_in), c) for w, c in zip(group, chunks) if w.is_contiguous()]
        if views:
            torch._foreach_copy_([v for v, _ in views], [c for _, c in views])
        for w, c in zip(group, chunks):
            if not w.is_contiguous():
                w.copy_(c.reshape(w.shape))
    return len(weights)


# ---------------------------------------------------------------------------------------------------------------
# The U-Net
# ---------------------------------------------------------------------------------------------------------------
class Block(nn.Module):
    """EDM2's residual block (Fig. 21): encoder blocks pixel-normalise the main path; the residual branch is
    ``conv(mp_silu(conv(mp_silu(x))) * (1 + emb))``, joined with ``mp_sum`` (``res_balance``), then optional
    self-attention with normalised queries / keys / values joined with ``mp_sum`` (``attn_balance``)."""

    def __init__(self, in_channels: int, out_channels: int, emb_channels: int, flavor: str = "enc",
                 resample_mode: str = "keep", attention: bool = False, channels_per_head: int = 64,
                 dropout: float = 0.0, res_balance: float = 0.3, attn_balance: float = 0.3,
                 clip_act: float | None = 256.0) -> None:
        super().__init__()
        self._register_load_state_dict_pre_hook(_gains_as_vectors)
        self.out_channels = out_channels
        self.flavor = flavor
        self.resample_mode = resample_mode
        # At least one head, so attention survives in the small models used here (EDM2 divides by 64).
        self.num_heads = max(1, out_channels // channels_per_head) if attention else 0
        self.dropout = dropout
        self.res_balance = res_balance
        self.attn_balance = attn_balance
        self.clip_act = clip_act
        self.emb_gain = nn.Parameter(torch.zeros([1]))  # shape (1,), not a scalar: FSDP2 shards dimension 0
        self.conv_res0 = MPConv(out_channels if flavor == "enc" else in_channels, out_channels, kernel=(3, 3))
        self.emb_linear = MPConv(emb_channels, out_channels, kernel=())
        self.conv_res1 = MPConv(out_channels, out_channels, kernel=(3, 3))
        self.conv_skip = MPConv(in_channels, out_channels, kernel=(1, 1)) if in_channels != out_channels else None
        self.attn_qkv = MPConv(out_channels, out_channels * 3, kernel=(1, 1)) if self.num_heads else None
        self.attn_proj = MPConv(out_channels, out_channels, kernel=(1, 1)) if self.num_heads else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = resample(x, self.resample_mode)
        if self.flavor == "enc":
            if self.conv_skip is not None:
                x = self.conv_skip(x)
            x = normalize(x, dim=1)  # pixel norm
        y = self.conv_res0(mp_silu(x))
        c = self.emb_linear(emb, gain=self.emb_gain) + 1
        y = mp_silu(y * c[:, :, None, None].to(y.dtype))
        if self.training and self.dropout:
            y = F.dropout(y, p=self.dropout)
        y = self.conv_res1(y)
        if self.flavor == "dec" and self.conv_skip is not None:
            x = self.conv_skip(x)
        x = mp_sum(x, y, t=self.res_balance)
        if self.num_heads:
            b, ch, h, w = x.shape
            y = self.attn_qkv(x).reshape(b, self.num_heads, -1, 3, h * w)
            q, k, v = normalize(y, dim=2).unbind(3)  # pixel norm, then split
            out = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
            y = self.attn_proj(out.transpose(-1, -2).reshape(b, ch, h, w))
            x = mp_sum(x, y, t=self.attn_balance)
        if self.clip_act is not None:
            x = x.clamp(-self.clip_act, self.clip_act)
        return x


class EDM2UNet(nn.Module):
    """``EDM2UNet(img_resolution, in_channels, model_channels, channel_mult, num_blocks, num_classes, ...)``.

    Layout as EDM2's ``UNet``: the input gets a constant ones channel (the bias substitute), level 0 starts with a
    3x3 ``MPConv``, every other encoder level with a downsampling block, followed by ``num_blocks`` blocks; the
    decoder has two bottleneck blocks (the first with attention), an upsampling block per level and
    ``num_blocks + 1`` blocks fed by ``mp_cat`` skips; the output ``MPConv`` has a learned gain starting at zero.
    Attention is used at the resolutions in ``attn_resolutions`` (and at the bottleneck). Inputs must be divisible
    by ``2^(len(channel_mult) - 1)``; the network is convolutional, so other sizes than ``img_resolution`` work.
    """

    def __init__(
        self,
        img_resolution: int = 8,
        in_channels: int = 1,
        out_channels: int | None = None,
        model_channels: int = 32,
        channel_mult: list[int] | tuple[int, ...] = (1, 2, 2),
        num_blocks: int = 1,
        attn_resolutions: list[int] | tuple[int, ...] = (),
        num_classes: int = 0,
        channel_mult_noise: int | None = None,
        channel_mult_emb: int | None = None,
        channels_per_head: int = 64,
        dropout: float = 0.0,
        res_balance: float = 0.3,
        attn_balance: float = 0.3,
        label_balance: float = 0.5,
        concat_balance: float = 0.5,
        clip_act: float | None = 256.0,
        logvar_channels: int = 128,
        use_r: bool = False,
    ) -> None:
        super().__init__()
        self._register_load_state_dict_pre_hook(_gains_as_vectors)
        out_channels = out_channels or in_channels
        cblock = [model_channels * m for m in channel_mult]
        cnoise = model_channels * channel_mult_noise if channel_mult_noise is not None else cblock[0]
        cemb = model_channels * channel_mult_emb if channel_mult_emb is not None else max(cblock)
        self.num_classes = num_classes
        self.label_balance = label_balance
        self.concat_balance = concat_balance
        self.num_levels = len(cblock)
        block_kwargs = dict(channels_per_head=channels_per_head, dropout=dropout, res_balance=res_balance,
                            attn_balance=attn_balance, clip_act=clip_act)

        # Embedding (noise level, optional second time r, optional label) -> cemb channels.
        self.emb_fourier = MPFourier(cnoise)
        self.emb_noise = MPConv(cnoise, cemb, kernel=())
        self.emb_r_fourier = MPFourier(cnoise) if use_r else None
        self.emb_r = MPConv(cnoise, cemb, kernel=()) if use_r else None
        self.emb_label = MPConv(num_classes, cemb, kernel=()) if num_classes > 0 else None

        # Encoder.
        self.enc = nn.ModuleDict()
        self.enc_level: list[int] = []  # level of every encoder entry, for skips and feature_indices
        cout = in_channels + 1
        for level, channels in enumerate(cblock):
            res = img_resolution >> level
            if level == 0:
                cin, cout = cout, channels
                self.enc[f"{res}x{res}_conv"] = MPConv(cin, cout, kernel=(3, 3))
            else:
                self.enc[f"{res}x{res}_down"] = Block(cout, cout, cemb, flavor="enc", resample_mode="down",
                                                      **block_kwargs)
            self.enc_level.append(level)
            for idx in range(num_blocks):
                cin, cout = cout, channels
                self.enc[f"{res}x{res}_block{idx}"] = Block(cin, cout, cemb, flavor="enc",
                                                            attention=res in attn_resolutions, **block_kwargs)
                self.enc_level.append(level)

        # Decoder.
        self.dec = nn.ModuleDict()
        skips = [m.out_channels for m in self.enc.values()]
        for level, channels in reversed(list(enumerate(cblock))):
            res = img_resolution >> level
            if level == len(cblock) - 1:
                self.dec[f"{res}x{res}_in0"] = Block(cout, cout, cemb, flavor="dec", attention=True, **block_kwargs)
                self.dec[f"{res}x{res}_in1"] = Block(cout, cout, cemb, flavor="dec", **block_kwargs)
            else:
                self.dec[f"{res}x{res}_up"] = Block(cout, cout, cemb, flavor="dec", resample_mode="up", **block_kwargs)
            for idx in range(num_blocks + 1):
                cin, cout = cout + skips.pop(), channels
                self.dec[f"{res}x{res}_block{idx}"] = Block(cin, cout, cemb, flavor="dec",
                                                            attention=res in attn_resolutions, **block_kwargs)
        self.out_conv = MPConv(cout, out_channels, kernel=(3, 3))
        self.out_gain = nn.Parameter(torch.zeros([1]))

        # Uncertainty head u(sigma) (EDM2 Sec. 5, Eq. 21; as in EDM2's Precond).
        self.logvar_fourier = MPFourier(logvar_channels)
        self.logvar_linear = MPConv(logvar_channels, 1, kernel=())

    def shard_units(self) -> list[nn.Module]:
        """Every encoder and decoder block: FSDP's shard units."""
        return [m for m in (*self.enc.values(), *self.dec.values()) if isinstance(m, Block)]

    def embedding(self, c_noise: torch.Tensor, condition: torch.Tensor | None, r_noise: torch.Tensor | None,
                  dtype: torch.dtype) -> torch.Tensor:
        """``mp_silu`` of the noise embedding, ``mp_sum``-ed with the label embedding (``label_balance``)."""
        emb = self.emb_noise(self.emb_fourier(c_noise.to(dtype)))
        if self.emb_r is not None and self.emb_r_fourier is not None:
            r = c_noise if r_noise is None else r_noise
            emb = mp_sum(emb, self.emb_r(self.emb_r_fourier(r.to(dtype))), t=0.5)
        if self.emb_label is not None:
            if condition is None:  # unconditional = the all-zero label, as in EDM2's guidance
                label = torch.zeros(c_noise.shape[0], self.num_classes, device=c_noise.device, dtype=dtype)
            else:
                label = as_one_hot(condition, self.num_classes).to(dtype)
            emb = mp_sum(emb, self.emb_label(label * math.sqrt(self.num_classes)), t=self.label_balance)
        return mp_silu(emb)

    @property
    def bottleneck_feature_index(self) -> int:
        """The ``feature_indices`` entry of the bottleneck features - where discriminator heads attach."""
        return self.num_levels

    def forward(
        self,
        x: torch.Tensor,
        c_noise: torch.Tensor,
        condition: torch.Tensor | None = None,
        r_noise: torch.Tensor | None = None,
        feature_indices: list[int] | None = None,
        return_logvar: bool = False,
        features_only: bool = False,
    ) -> Any:
        wanted = len(feature_indices) if features_only and feature_indices is not None else -1
        emb = self.embedding(c_noise, condition, r_noise, x.dtype)
        h = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
        skips: list[torch.Tensor] = []
        features: list[torch.Tensor] = []
        entries = list(self.enc.items())
        for i, (name, block) in enumerate(entries):
            h = block(h) if name.endswith("_conv") else block(h, emb)
            skips.append(h)
            level = self.enc_level[i]
            last_of_level = i + 1 == len(entries) or self.enc_level[i + 1] != level
            if feature_indices is not None and last_of_level and level in feature_indices:
                features.append(h)
                if len(features) == wanted:
                    return features
        bottleneck_done = False
        for name, block in self.dec.items():
            if "block" in name:
                if not bottleneck_done:
                    bottleneck_done = True
                    if feature_indices is not None and self.num_levels in feature_indices:
                        features.append(h)
                    if features_only:
                        return features
                h = mp_cat(h, skips.pop(), t=self.concat_balance)
            h = block(h, emb)
        out = self.out_conv(h, gain=self.out_gain)
        return contract_output(out, features if feature_indices is not None else None,
                               self.logvar(c_noise).to(x.dtype) if return_logvar else None)

    def optional_parameters(self) -> list[nn.Parameter]:
        """The log-variance head's parameters: a forward uses them only with ``return_logvar``."""
        return list(self.logvar_linear.parameters()) + list(self.logvar_fourier.parameters())

    def logvar(self, c_noise: torch.Tensor) -> torch.Tensor:
        """The uncertainty ``u(sigma)``, shape ``(B,)`` (EDM2 Eq. 21)."""
        return self.logvar_linear(self.logvar_fourier(c_noise.float())).reshape(-1)
