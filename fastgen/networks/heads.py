"""Widened output projections: one output head per interval of a time grid (PDD, ``fastgen.methods.pdd``).

Parallel Decoding Distillation (PDD) gives the student one velocity head per interval of a fixed time grid
``t_0 > t_1 > ... > t_N = 0``: one forward pass from ``x_n`` returns a velocity for every later interval. Only the
network's last projection changes; it becomes ``N`` copies of itself, stacked on the output axis, each a copy of the
teacher's projection at initialisation, so every head starts as the teacher's velocity.

Because a projection is linear in its weights, a weighted sum of heads is itself a projection of the base size:

    v_fused = sum_j w_j v_j  with  w_j = (t_{j+1} - t_j) / (t_e - t_s),  j in [s, e)

is the velocity whose single Euler step ``x_e = x_s + (t_e - t_s) v_fused`` equals the Euler steps of heads
``s .. e-1`` taken from the same evaluation (``sum_j (t_{j+1} - t_j) v_j``); the weights sum to 1, so the biases
fuse with them. ``fuse_heads`` evaluates such a block with one ordinary forward pass at the base width, which is
why a trained PDD student can sample with any partition of the grid into blocks without retraining.

Layouts. Where the extra heads sit in the widened output decides what the code after the projection sees:

* ``channel_major``: output rows ``[head, base_output]`` - for a projection whose output *is* the channels (a
  U-Net's last convolution; a packed-latent transformer whose tokens hold ``(channels, 2, 2)`` like Flux's), so the
  backbone returns ``heads * C`` channels, head-major;
* ``patch_major``: output rows ``[patch, head, channel]`` - for a per-token linear whose rows are ``(patch,
  channel)`` and are unpatchified with the channel last (DiT): unpatchifying ``heads * C`` channels then gives
  the same head-major channel order.

A backbone names its projection and layout with ``head_projection() -> HeadSpec``; the code after the projection
must take its channel count from the tensor (``DiT.unpatchify`` does), and ``DiffusionNet`` splits a ``heads * C``
output into ``(B, heads, C, ...)`` predictions.

Multimodal backbones (``fastgen.networks.modalities``; LTX-2's video and audio streams) have one output projection
per stream and name them with ``head_projections() -> {modality: HeadSpec}``. Every one is widened into the same
``N`` heads on the same grid (the streams of a sample share one time, as ``LTX2Pipeline`` samples them), and
``fuse_heads`` fuses all of them with the same weights, so one fused pass is the block's Euler step for every
stream. A head is never shared between streams: each stream's projection keeps its own rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Layout = Literal["channel_major", "patch_major"]


@dataclass(frozen=True)
class HeadSpec:
    """Where a backbone's output projection is (``path``: a dotted submodule path, ``nn.Linear`` or ``nn.Conv2d``)
    and how its widened rows are ordered (``layout``; ``channels`` - the output channels per patch - for
    ``patch_major``)."""

    path: str
    layout: Layout = "channel_major"
    channels: int | None = None

    def __post_init__(self) -> None:
        if self.layout not in ("channel_major", "patch_major"):
            raise ValueError(f"head layout must be channel_major or patch_major, got {self.layout!r}")
        if (self.layout == "patch_major") != (self.channels is not None):
            raise ValueError("a patch_major head layout needs `channels` (and channel_major takes none)")


class HeadProjection(nn.Module):
    """A linear or convolution layer widened to ``heads`` copies of its ``base_out`` outputs.

    ``forward`` returns all heads (``heads * base_out`` outputs) unless a ``fuse_heads`` context is active, which
    makes it return the weighted sum of the heads it names at the base width (one projection with the fused
    weights: the cost of the base layer). Parameters keep the names ``weight`` / ``bias``, so optimizers, FSDP
    and checkpoints treat it like the layer it replaces."""

    def __init__(self, base: nn.Module, heads: int, spec: HeadSpec, grid: torch.Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(base, (nn.Linear, nn.Conv2d)):
            raise TypeError(f"{spec.path} is a {type(base).__name__}; a head projection widens nn.Linear or nn.Conv2d")
        if heads < 1:
            raise ValueError("heads must be at least 1")
        self.heads, self.spec = int(heads), spec
        self.base_out = base.weight.shape[0]
        if spec.layout == "patch_major" and self.base_out % int(spec.channels or 0):
            raise ValueError(f"{spec.path} has {self.base_out} outputs, not a multiple of channels={spec.channels}")
        self.conv = None
        if isinstance(base, nn.Conv2d):
            if spec.layout != "channel_major":
                raise ValueError("a convolution's outputs are channels: use the channel_major layout")
            self.conv = {"stride": base.stride, "padding": base.padding, "dilation": base.dilation,
                         "groups": base.groups}
        self.weight = nn.Parameter(self.widen(base.weight.detach()), requires_grad=base.weight.requires_grad)
        self.bias = None if base.bias is None else nn.Parameter(self.widen(base.bias.detach()),
                                                                requires_grad=base.bias.requires_grad)
        self._fusion: torch.Tensor | None = None
        # The time grid the heads were trained on, saved with the weights: heads without their grid are meaningless,
        # and a checkpoint trained on another grid must not load silently (``_load_from_state_dict``).
        # The expected grid is also kept as Python floats: a meta-device build (model.meta_init) leaves the buffer
        # uninitialised until the weights arrive, and the check must not compare against that.
        self.expected_grid: list[float] | None = None if grid is None else [float(v) for v in grid.tolist()]
        if self.expected_grid is not None and len(self.expected_grid) != self.heads + 1:
            raise ValueError(f"a grid for {self.heads} heads has {self.heads + 1} times, got {len(self.expected_grid)}")
        values = self.expected_grid or [float("nan")] * (self.heads + 1)
        self.register_buffer("grid", torch.tensor(values, dtype=torch.float64, device=base.weight.device))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:  # noqa: ANN001 - torch's hook signature
        stored = state_dict.get(prefix + "grid")
        if stored is not None and self.expected_grid is not None and not getattr(stored, "is_meta", False):
            mine = torch.tensor(self.expected_grid, dtype=torch.float64)
            theirs = stored.detach().cpu().double() if isinstance(stored, torch.Tensor) else None
            # a network cast to bf16 casts its buffers too: compare at the coarser of the two precisions
            eps = max(torch.finfo(self.grid.dtype).eps, torch.finfo(stored.dtype).eps if theirs is not None else 0.0)
            if theirs is None or theirs.shape != mine.shape or not torch.allclose(theirs, mine, rtol=2 * eps,
                                                                                 atol=1e-6):
                shown = "?" if theirs is None else [round(v, 4) for v in theirs.tolist()]
                error_msgs.append(f"the checkpoint's heads were trained on the time grid {shown}, but this network's "
                                  f"is {[round(v, 4) for v in mine.tolist()]} (model.grid_size / grid_shift / "
                                  "grid_max_t must be those of the run that trained it)")
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ---- layouts ---------------------------------------------------------------------------------------------
    def widen(self, tensor: torch.Tensor) -> torch.Tensor:
        """A base weight or bias (first axis ``base_out``) repeated into every head, in this layout."""
        if tensor.shape[0] != self.base_out:
            raise ValueError(f"expected {self.base_out} outputs, got a tensor of shape {tuple(tensor.shape)}")
        rest = tensor.shape[1:]
        if self.spec.layout == "channel_major":
            return tensor.unsqueeze(0).expand(self.heads, *tensor.shape).reshape(-1, *rest).clone()
        c = int(self.spec.channels or 0)
        by_patch = tensor.reshape(self.base_out // c, 1, c, *rest)
        return by_patch.expand(-1, self.heads, -1, *rest).reshape(-1, *rest).clone()

    def by_head(self, tensor: torch.Tensor) -> torch.Tensor:
        """A widened weight or bias viewed as ``(heads, base_out, ...)``."""
        rest = tensor.shape[1:]
        if self.spec.layout == "channel_major":
            return tensor.reshape(self.heads, self.base_out, *rest)
        c = int(self.spec.channels or 0)
        return tensor.reshape(self.base_out // c, self.heads, c, *rest).transpose(0, 1).reshape(
            self.heads, self.base_out, *rest)

    def from_heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """``by_head`` undone: ``(heads, base_out, ...)`` as the widened weight or bias of this layout."""
        rest = tensor.shape[2:]
        if self.spec.layout == "channel_major":
            return tensor.reshape(self.heads * self.base_out, *rest)
        c = int(self.spec.channels or 0)
        return tensor.reshape(self.heads, self.base_out // c, c, *rest).transpose(0, 1).reshape(-1, *rest)

    # ---- forward ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def fused(self, coefficients: torch.Tensor) -> Iterator[None]:
        """Within the context, ``forward`` returns ``sum_h coefficients[h] * head_h`` at the base width."""
        if coefficients.shape != (self.heads,):
            raise ValueError(f"expected {self.heads} head coefficients, got shape {tuple(coefficients.shape)}")
        previous, self._fusion = self._fusion, coefficients
        try:
            yield
        finally:
            self._fusion = previous

    def _parameters_now(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self._fusion is None:
            return self.weight, self.bias
        w = self._fusion.to(device=self.weight.device, dtype=torch.float32)
        weight = torch.einsum("h,h...->...", w, self.by_head(self.weight).float()).to(self.weight.dtype)
        bias = None
        if self.bias is not None:
            bias = torch.einsum("h,h...->...", w, self.by_head(self.bias).float()).to(self.bias.dtype)
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._parameters_now()
        if self.conv is None:
            return F.linear(x, weight, bias)
        return F.conv2d(x, weight, bias, **self.conv)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, base_out={self.base_out}, layout={self.spec.layout}"


# ---- whole networks ------------------------------------------------------------------------------------------
def is_multi_head(net: nn.Module) -> bool:
    """Whether ``net``'s backbone names one output projection per modality (``head_projections()``)."""
    return callable(getattr(getattr(net, "backbone", net), "head_projections", None))


def head_specs(net: nn.Module) -> dict[str | None, HeadSpec]:
    """Every output projection of ``net``: ``{modality: HeadSpec}`` for a multimodal backbone
    (``head_projections()``), else ``{None: head_spec(net)}``. A one-line error for a backbone that names none."""
    backbone = getattr(net, "backbone", net)
    specs_fn = getattr(backbone, "head_projections", None)
    if callable(specs_fn):
        specs = dict(specs_fn())
        paths = [spec.path for spec in specs.values()]
        if not specs or len(set(paths)) != len(paths):  # one head shared by two streams would mix their rows
            raise ValueError(f"{type(backbone).__name__}.head_projections() must name one distinct projection per "
                             f"modality, got {paths}")
        return specs
    return {None: head_spec(net)}


def head_spec(net: nn.Module) -> HeadSpec:
    """The ``HeadSpec`` of ``net`` (a ``DiffusionNet`` or a backbone); a one-line error for a backbone without one
    or with one per modality (``head_specs``)."""
    backbone = getattr(net, "backbone", net)
    spec_fn = getattr(backbone, "head_projection", None)
    if spec_fn is None:
        if is_multi_head(net):
            raise ValueError(f"{type(backbone).__name__} has one output projection per modality (head_projections()); "
                             "this operation takes a network with a single one")
        raise ValueError(f"{type(backbone).__name__} does not name its output projection (head_projection()); "
                         "PDD needs it to widen the output into one head per interval")
    return spec_fn()


def _prefix(net: nn.Module) -> str:
    return "backbone." if hasattr(net, "backbone") else ""


def head_projection_of(net: nn.Module) -> HeadProjection | None:
    """``net``'s widened projection, or None when it has not been widened (a single-projection network; see
    ``head_projections_of`` for one per modality)."""
    module = net.get_submodule(_prefix(net) + head_spec(net).path)
    return module if isinstance(module, HeadProjection) else None


def head_projections_of(net: nn.Module) -> dict[str | None, HeadProjection]:
    """``net``'s widened projections by modality (``None``: a single-projection network); empty when none has been
    widened."""
    found = {}
    for name, spec in head_specs(net).items():
        module = net.get_submodule(_prefix(net) + spec.path)
        if isinstance(module, HeadProjection):
            found[name] = module
    return found


def _widen_one(net: nn.Module, spec: HeadSpec, heads: int, grid: torch.Tensor | None) -> HeadProjection:
    path = _prefix(net) + spec.path
    current = net.get_submodule(path)
    if isinstance(current, HeadProjection):
        if current.heads != heads:
            raise ValueError(f"{path} already has {current.heads} heads, not {heads}")
        return current
    widened = HeadProjection(current, heads, spec, grid)
    parent_path, _, name = path.rpartition(".")
    setattr(net.get_submodule(parent_path) if parent_path else net, name, widened)
    return widened


def widen_output(net: nn.Module, heads: int, grid: torch.Tensor | None = None) -> HeadProjection:
    """Replace ``net``'s output projection with ``heads`` copies of it (in place) and return the new layer;
    ``grid`` (``heads + 1`` times) is stored with it. Widening a network that already has that many heads returns
    its projection unchanged. A multimodal backbone: ``widen_outputs``."""
    return _widen_one(net, head_spec(net), heads, grid)


def widen_outputs(net: nn.Module, heads: int, grid: torch.Tensor | None = None) -> dict[str | None, HeadProjection]:
    """``widen_output`` for every projection of ``head_specs(net)``: each modality's own projection widened into
    ``heads`` copies of itself, all on the same ``grid`` (module docstring)."""
    return {name: _widen_one(net, spec, heads, grid) for name, spec in head_specs(net).items()}


def widen_state_dict(state: Mapping[str, torch.Tensor], net: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict of ``net``'s base (unwidened) architecture - a teacher's - with each output projection's weight
    and bias repeated into every head of ``net``'s widened projection (every modality's, for a multimodal
    backbone); tensors already widened pass unchanged."""
    out = dict(state)
    for projection in head_projections_of(net).values():
        key = _prefix(net) + projection.spec.path
        for name in ("weight", "bias"):
            tensor = out.get(f"{key}.{name}")
            if tensor is not None and tensor.shape[0] == projection.base_out:
                out[f"{key}.{name}"] = projection.widen(tensor)
        if projection.expected_grid is not None:
            out.setdefault(f"{key}.grid", torch.tensor(projection.expected_grid, dtype=torch.float64))
    return out


@contextlib.contextmanager
def fuse_heads(net: nn.Module, coefficients: torch.Tensor) -> Iterator[None]:
    """Within the context ``net`` computes ``sum_h coefficients[h] * head_h`` at the base width in one pass (every
    modality's projection with the same coefficients: the streams share the grid)."""
    projections = list(head_projections_of(net).values())
    if not projections:
        raise ValueError(f"{type(net).__name__} has no widened output projection (fastgen.networks.heads.widen_output)")
    with contextlib.ExitStack() as stack:
        for projection in projections:
            stack.enter_context(projection.fused(coefficients))
        yield


__all__ = ["HeadProjection", "HeadSpec", "fuse_heads", "head_projection_of", "head_projections_of", "head_spec",
           "head_specs", "is_multi_head", "widen_output", "widen_outputs", "widen_state_dict"]
