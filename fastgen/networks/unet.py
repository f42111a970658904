"""A small, configurable U-Net in the style of DDPM++ (Song et al. 2021; EDM's ``SongUNet``).

Works down to 8x8 inputs; class-conditional through a label embedding added to the noise embedding. Each
resolution level has ``num_blocks`` residual blocks with scale-shift conditioning (Dhariwal & Nichol 2021,
Sec. 3 "AdaGN": ``h = GroupNorm(h) * (1 + s) + b``), optional self-attention at the resolutions listed in
``attn_resolutions``, and the output convolution starts at zero so the untrained network returns ``c_skip x``.

``feature_indices`` returns the outputs of the listed encoder levels and the bottleneck (index
``len(channel_mult)``), for discriminator heads; with ``features_only`` the forward pass stops once the deepest
requested feature is computed (a discriminator head never needs the decoder).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fastgen.networks.heads import HeadSpec
from fastgen.networks.layers import ConditionEmbedding


def _groups(channels: int) -> int:
    for g in (32, 16, 8, 4, 2, 1):
        if channels % g == 0 and channels // g >= 4:
            return g
    return 1


class ResBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, emb_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(in_ch), in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb = nn.Linear(emb_dim, 2 * out_ch)
        self.norm2 = nn.GroupNorm(_groups(out_ch), out_ch)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.emb(emb)[:, :, None, None].chunk(2, dim=1)
        h = F.silu(self.norm2(h) * (1 + scale) + shift)
        h = self.conv2(self.dropout(h))
        return (self.skip(x) + h) * (2**-0.5)


class SelfAttention(nn.Module):
    def __init__(self, channels: int, heads: int = 1) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(_groups(channels), channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).unbind(1)
        out = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
        out = out.transpose(-1, -2).reshape(b, c, h, w)
        return (x + self.proj(out)) * (2**-0.5)


class Unit(nn.Module):
    """A residual block, optionally followed by self-attention; one skip connection per unit."""

    def __init__(self, block: ResBlock, attention: SelfAttention | None) -> None:
        super().__init__()
        self.block = block
        self.attention = attention

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.block(x, emb)
        return self.attention(h) if self.attention is not None else h


class UNet(nn.Module):
    """``UNet(img_resolution, in_channels, out_channels, model_channels, channel_mult, num_blocks, ...)``."""

    def __init__(
        self,
        img_resolution: int = 8,
        in_channels: int = 1,
        out_channels: int | None = None,
        model_channels: int = 32,
        channel_mult: list[int] | tuple[int, ...] = (1, 2),
        num_blocks: int = 1,
        attn_resolutions: list[int] | tuple[int, ...] = (),
        num_classes: int = 0,
        dropout: float = 0.0,
        use_r: bool = False,
    ) -> None:
        super().__init__()
        out_channels = out_channels or in_channels
        emb_dim = model_channels * 4
        self.embed = ConditionEmbedding(emb_dim, num_classes=num_classes, use_r=use_r)
        self.conv_in = nn.Conv2d(in_channels, model_channels, 3, padding=1)
        self.down = nn.ModuleList()
        channels = [model_channels]  # channel count of every skip connection, in push order
        ch, res = model_channels, img_resolution
        for level, mult in enumerate(channel_mult):
            units = nn.ModuleList()
            for _ in range(num_blocks):
                out_ch = model_channels * mult
                units.append(Unit(ResBlock(ch, out_ch, emb_dim, dropout), SelfAttention(out_ch) if res in attn_resolutions else None))
                ch = out_ch
                channels.append(ch)
            if level != len(channel_mult) - 1:
                units.append(nn.AvgPool2d(2))
                channels.append(ch)
                res //= 2
            self.down.append(units)
        self.mid = nn.ModuleList([ResBlock(ch, ch, emb_dim, dropout), SelfAttention(ch), ResBlock(ch, ch, emb_dim, dropout)])
        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(channel_mult))):
            units = nn.ModuleList()
            for _ in range(num_blocks + 1):
                out_ch = model_channels * mult
                units.append(Unit(ResBlock(ch + channels.pop(), out_ch, emb_dim, dropout), SelfAttention(out_ch) if res in attn_resolutions else None))
                ch = out_ch
            if level != 0:
                units.append(nn.Upsample(scale_factor=2, mode="nearest"))
                res *= 2
            self.up.append(units)
        self.norm_out = nn.GroupNorm(_groups(ch), ch)
        self.conv_out = nn.Conv2d(ch, out_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    def shard_units(self) -> list[nn.Module]:
        """Each residual unit (with its attention) and each middle block: FSDP's shard units."""
        units = [u for level in (*self.down, *self.up) for u in level if isinstance(u, Unit)]
        return units + [block for block in self.mid if any(True for _ in block.parameters())]

    @property
    def bottleneck_feature_index(self) -> int:
        """The ``feature_indices`` entry of the bottleneck (deepest) features - where discriminator heads attach."""
        return len(self.down)

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: the last convolution (its outputs are the channels)."""
        return HeadSpec("conv_out")

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
        if return_logvar:
            raise ValueError("UNet does not predict a log-variance; use an EDM2 backbone")
        wanted = len(feature_indices) if features_only and feature_indices is not None else -1
        emb = self.embed(c_noise, condition, r_noise)
        h = self.conv_in(x)
        skips = [h]
        features = []
        for level, units in enumerate(self.down):
            for unit in units:
                h = unit(h, emb) if isinstance(unit, Unit) else unit(h)
                skips.append(h)
            if feature_indices is not None and level in feature_indices:
                features.append(h)
                if len(features) == wanted:
                    return features
        for block in self.mid:
            h = block(h, emb) if isinstance(block, ResBlock) else block(h)
        if feature_indices is not None and len(self.down) in feature_indices:
            features.append(h)
        if features_only:
            return features
        for units in self.up:
            for unit in units:
                h = unit(torch.cat([h, skips.pop()], dim=1), emb) if isinstance(unit, Unit) else unit(h)
        out = self.conv_out(F.silu(self.norm_out(h)))
        if feature_indices is not None:
            return out, features
        return out
