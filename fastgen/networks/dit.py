"""DiT: a diffusion transformer on patches (Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

The input ``(B, C, H, W)`` is cut into ``p x p`` patches by a convolution of stride ``p`` (Sec. 3.2, "Patchify"),
each token gets a fixed 2-D sin-cos position (as in MAE), and ``depth`` transformer blocks follow. Every block is
conditioned by adaLN-Zero (Sec. 3.2, "adaLN-Zero block"): a linear map of the conditioning vector ``c = t_emb +
y_emb`` regresses a shift, scale and gate for the attention and for the MLP branch,
``x = x + gate * Attn(LN(x) * (1 + scale) + shift)``, and that map starts at zero, so every block starts as the
identity and the network as ``F = 0`` (the final adaLN layer and linear are zero too; the wrapped
``DiffusionNet`` then returns ``c_skip x``). A final adaLN layer, a linear to ``p * p * C`` per token and
unpatchify give the output.

SiT (Ma et al. 2024, "SiT: Exploring Flow and Diffusion-based Generative Models with Scalable Interpolant
Transformers") is the same backbone trained on an interpolant instead of DDPM: here it is this class under the
rectified-flow schedule (``fastgen.configs.net_dit.sit``), not another class.

The contract (``fastgen.networks.diffusion_net``): ``forward(x, c_noise, condition, r_noise, feature_indices,
return_logvar, features_only)``. ``c_noise`` is whatever the schedule passes (``ln(sigma) / 4`` for EDM, ``t`` in
[0, 1] for rectified flow); it is multiplied by ``noise_scale`` (1000: DiT's timesteps run over 0..999) before the
sinusoidal embedding. ``condition`` is integer labels or one-hot rows; the all-zero row is the null class of
classifier-free guidance (how the trainer's ``condition_dropout`` drops a label), which gets its own learned
embedding - DiT's ``(num_classes + 1)``-row table, Sec. 3.2 / App. B. ``feature_indices`` lists blocks whose
output tokens are returned as a ``(B, hidden, H / p, W / p)`` map for the discriminator heads;
``return_logvar`` adds the EDM2 uncertainty ``u(sigma)`` (Karras et al. 2024, Eq. 21) of shape ``(B,)``.
With ``text_dim > 0`` the condition is text instead: token embeddings ``(B, T, text_dim)`` (``TextEmbedder``,
pooled into the conditioning vector as SD3 does; zeros are the null text). DiT's learned per-pixel variance
(``learn_sigma``) is not built: no method here trains it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fastgen.networks.heads import HeadSpec
from fastgen.networks.layers import FourierEmbedding, as_one_hot, contract_output


def sincos_pos_embed_2d(dim: int, grid: int) -> torch.Tensor:
    """The fixed 2-D sin-cos position embedding of DiT / MAE, ``(grid * grid, dim)``: half the channels encode the
    row, half the column, each ``[sin(pos * w_k), cos(pos * w_k)]`` with ``w_k = 10000^(-k / (dim / 4))``."""
    if dim % 4 != 0:
        raise ValueError(f"the 2-D sin-cos embedding needs hidden_size divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4.0))
    coords = np.arange(grid, dtype=np.float64)
    rows, cols = np.meshgrid(coords, coords, indexing="ij")  # token i = (row i // grid, column i % grid)

    def embed(pos: np.ndarray) -> np.ndarray:
        angles = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    # DiT's get_2d_sincos_pos_embed puts the column (w) embedding first, then the row (h).
    # torch.tensor, not from_numpy: it honours a ``torch.device("meta")`` build like every other tensor here.
    return torch.tensor(np.concatenate([embed(cols), embed(rows)], axis=1), dtype=torch.float32)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: ``x * (1 + scale) + shift`` with per-sample ``shift, scale`` broadcast over tokens."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    """Sinusoidal features of ``noise_scale * c_noise`` (256 frequencies as DiT) followed by a 2-layer SiLU MLP."""

    def __init__(self, hidden_size: int, frequency_dim: int = 256, noise_scale: float = 1000.0) -> None:
        super().__init__()
        self.fourier = FourierEmbedding(frequency_dim, scale=noise_scale)
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, c_noise: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.fourier(c_noise).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """DiT's ``(num_classes + 1) x hidden`` label table on the codebase's one-hot labels: a one-hot row picks its
    class's embedding and the all-zero row (the null label ``condition_dropout`` substitutes) picks the learned
    null embedding, ``emb = onehot @ W + (1 - sum(onehot)) * null``. Soft labels mix the rows linearly."""

    def __init__(self, num_classes: int, hidden_size: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.table = nn.Linear(num_classes, hidden_size, bias=False)
        self.null = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, condition: torch.Tensor | None, batch: int, dtype: torch.dtype) -> torch.Tensor:
        if condition is None:
            label = torch.zeros(batch, self.num_classes, device=self.null.device, dtype=dtype)
        else:
            label = as_one_hot(condition, self.num_classes).to(dtype)
        return self.table(label) + (1 - label.sum(dim=1, keepdim=True)) * self.null.to(dtype)


class TextEmbedder(nn.Module):
    """Text conditioning for DiT: token embeddings ``(B, T, text_dim)`` from a frozen text encoder, mean-pooled
    over tokens and mapped by a 2-layer SiLU MLP into the conditioning vector - the pooled-text path SD3 adds to
    its timestep embedding (Esser et al. 2024, Sec. 5.1 / Fig. 2a). The all-zero embedding (the null condition that
    ``condition_dropout`` substitutes) maps to the MLP's learned constant, the unconditional embedding."""

    def __init__(self, text_dim: int, hidden_size: int) -> None:
        super().__init__()
        self.text_dim = text_dim
        self.mlp = nn.Sequential(nn.Linear(text_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, text: torch.Tensor | None, batch: int, dtype: torch.dtype) -> torch.Tensor:
        weight = self.mlp[0].weight
        pooled = (torch.zeros(batch, self.text_dim, device=weight.device, dtype=dtype) if text is None
                  else text.to(dtype).mean(dim=1))
        return self.mlp(pooled)


class Attention(nn.Module):
    """Multi-head self-attention over the tokens (qkv with bias, as timm's ``Attention`` that DiT uses)."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        if hidden_size % num_heads != 0:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class DiTBlock(nn.Module):
    """A transformer block with adaLN-Zero conditioning (Peebles & Xie 2023, Sec. 3.2, Fig. 3)."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        mlp_hidden = int(hidden_size * mlp_ratio)
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, mlp_hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp_hidden, hidden_size))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    """adaLN (shift and scale, no gate) then a linear to ``p * p * out_channels`` values per token."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm(x), shift, scale))


class DiT(nn.Module):
    """``DiT(input_size, patch_size, in_channels, hidden_size, depth, num_heads, mlp_ratio, num_classes, ...)``."""

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        out_channels: int | None = None,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_classes: int = 1000,
        noise_scale: float = 1000.0,
        use_r: bool = False,
        text_dim: int = 0,
    ) -> None:
        super().__init__()
        if input_size % patch_size != 0:
            raise ValueError(f"input_size {input_size} is not a multiple of patch_size {patch_size}")
        self.in_channels = in_channels
        self.out_channels = out_channels or in_channels
        self.patch_size = patch_size
        self.grid = input_size // patch_size
        self.num_classes = num_classes
        self.x_embedder = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.register_buffer("pos_embed", sincos_pos_embed_2d(hidden_size, self.grid).unsqueeze(0), persistent=False)
        self.t_embedder = TimestepEmbedder(hidden_size, noise_scale=noise_scale)
        # MeanFlow's second time r (the interval start): its own embedder, summed into the conditioning vector.
        self.r_embedder = TimestepEmbedder(hidden_size, noise_scale=noise_scale) if use_r else None
        self.y_embedder = LabelEmbedder(num_classes, hidden_size) if num_classes > 0 and text_dim <= 0 else None
        self.text_embedder = TextEmbedder(text_dim, hidden_size) if text_dim > 0 else None
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth))
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        # Uncertainty head u(sigma) (EDM2 Eq. 21): sinusoidal features of c_noise and one linear output.
        self.logvar_fourier = FourierEmbedding(256, scale=noise_scale)
        self.logvar_linear = nn.Linear(256, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DiT's ``initialize_weights``: Xavier-uniform linears (the patch conv as a linear), N(0, 0.02) label and
        timestep embeddings, and zero for every adaLN modulation and the output layer (adaLN-Zero, Sec. 3.2), so
        each block is the identity and ``F = 0`` at initialisation. The uncertainty head starts at ``u = 0``."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        weight = self.x_embedder.weight
        nn.init.xavier_uniform_(weight.view(weight.shape[0], -1))
        nn.init.zeros_(self.x_embedder.bias)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.table.weight, std=0.02)
            nn.init.normal_(self.y_embedder.null, std=0.02)
        for embedder in (self.t_embedder, self.r_embedder, self.text_embedder):
            if embedder is not None:
                nn.init.normal_(embedder.mlp[0].weight, std=0.02)
                nn.init.normal_(embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear, self.logvar_linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def shard_units(self) -> list[nn.Module]:
        """Each transformer block: FSDP's shard units."""
        return list(self.blocks)

    @property
    def bottleneck_feature_index(self) -> int:
        """The ``feature_indices`` entry where discriminator heads attach by default: the middle block (a
        transformer has no bottleneck; its middle tokens are as far from pixels as any)."""
        return len(self.blocks) // 2

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T, p * p * C)`` -> ``(B, C, H, W)``, token ``i`` at patch row ``i // grid``, column ``i % grid``."""
        b, p, g = tokens.shape[0], self.patch_size, self.grid
        c = tokens.shape[-1] // (p * p)  # out_channels, or heads * out_channels once widened (head_projection)
        x = tokens.reshape(b, g, g, p, p, c)
        return torch.einsum("bhwpqc->bchpwq", x).reshape(b, c, g * p, g * p)

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: the final linear, whose rows are ``(patch, channel)`` per token."""
        return HeadSpec("final_layer.linear", "patch_major", self.out_channels)

    def _token_map(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` tokens as a ``(B, D, H / p, W / p)`` map: what ``FeatureHead`` convolves."""
        return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, self.grid, self.grid)

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
        if feature_indices is not None and any(not 0 <= i < len(self.blocks) for i in feature_indices):
            raise ValueError(f"feature_indices {feature_indices} must name blocks 0..{len(self.blocks) - 1}")
        h = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed.to(x.dtype)
        c = self.t_embedder(c_noise)
        if self.r_embedder is not None:
            c = c + self.r_embedder(c_noise if r_noise is None else r_noise)
        if self.y_embedder is not None:
            c = c + self.y_embedder(condition, x.shape[0], c.dtype)
        if self.text_embedder is not None:
            if condition is not None and condition.dim() != 3:
                raise ValueError(f"this DiT is text-conditioned (text_dim={self.text_embedder.text_dim}): condition "
                                 f"must be token embeddings (B, T, {self.text_embedder.text_dim}), got "
                                 f"{tuple(condition.shape)}")
            c = c + self.text_embedder(condition, x.shape[0], c.dtype)
        features: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            h = block(h, c)
            if feature_indices is not None and i in feature_indices:
                features.append(self._token_map(h))
                if len(features) == wanted:
                    return features
        if features_only:
            return features
        out = self.unpatchify(self.final_layer(h, c))
        return contract_output(out, features if feature_indices is not None else None,
                               self.logvar(c_noise).to(x.dtype) if return_logvar else None)

    def optional_parameters(self) -> list[nn.Parameter]:
        """The log-variance head's parameters: a forward uses them only with ``return_logvar``."""
        return list(self.logvar_linear.parameters()) + list(self.logvar_fourier.parameters())

    def logvar(self, c_noise: torch.Tensor) -> torch.Tensor:
        """The uncertainty ``u(sigma)``, shape ``(B,)`` (EDM2 Eq. 21)."""
        return self.logvar_linear(self.logvar_fourier(c_noise).to(self.logvar_linear.weight.dtype)).reshape(-1)
