"""LoRA training with ``model.net_adapter``: a low-rank update trained on top of a frozen network.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3) replaces a layer's
``h = W0 x`` by ``h = W0 x + (alpha / r) B A x`` with ``A: r x in`` and ``B: out x r``, ``r`` much smaller than
``in`` and ``out``; ``W0`` stays frozen and only ``A`` and ``B`` train. ``B`` starts at zero, so the adapted
network starts as the base network; ``A`` starts as a Kaiming-uniform matrix (the paper's random Gaussian; peft's
default). A convolution gets the same update as a convolution: ``A`` is a convolution with the base's kernel,
stride, padding and dilation into ``r`` channels and ``B`` a 1x1 convolution back, so ``B A`` is a rank-``r``
update of the unfolded kernel.

**Config.** ``model.net_adapter`` is a LazyCall of ``LoRAAdapter``::

    config.model.net_adapter = LazyCall("fastgen.utils.lora_utils.LoRAAdapter")(
        rank=16, alpha=16.0, dropout=0.0, target_modules=["*qkv", "*proj", "*mlp.fc*"])

``target_modules`` are ``fnmatch`` patterns over the network's module names (``blocks.3.attn.qkv``); every
``nn.Linear``, ``nn.Conv1d`` and ``nn.Conv2d`` (ungrouped) whose name matches one is adapted, and a pattern that
matches none of them is an error (a typo would otherwise train nothing). ``fastgen dryrun`` lists the counts.

**What trains and what is saved.** The method's trained network (``net``) is adapted when it is built, before
its EMA copies are made: the base parameters are frozen (``requires_grad=False``), so the optimizer holds only
the adapter's. Checkpoints hold only the adapter's tensors for an adapted network and its EMA copies (keys
ending in ``.lora.down.weight`` / ``.lora.up.weight``); the base is not saved again. It is rebuilt from where it
came from - the distillation teacher (``model.teacher_ckpt``) or ``trainer.checkpointer.pretrained_ckpt_path``
- on a fresh run *and* on a resume, so a resume needs that source where it was. Loading tells the two apart:
an adapter-only state loads into the adapter, a base-only state (a pretrained network) into the base.

**Export.** ``fastgen convert-ckpt RUN merged.pth --merge-lora`` rebuilds the run's method (base from its
source, adapter from the checkpoint), folds ``(alpha / r) B A`` into each adapted weight (``merge_lora``) and
writes plain networks that load without an adapter (as a teacher, or ``pretrained_ckpt_path``).

**Why not peft.** peft's ``inject_adapter_in_model`` wraps each target layer in a new module whose weight moves
to ``<name>.base_layer.weight``: every checkpoint key of the base changes, so EMA copies, checkpoints and the
frozen teacher no longer share names with the adapted network; and peft installs transformers and accelerate.
Here the adapter is a child module plus a forward hook: the base keys stay exactly what they were.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

ADAPTER_KEY_PARTS = (".lora.down.", ".lora.up.")
ADAPTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d)


def is_adapter_key(key: str) -> bool:
    """Whether a state-dict key belongs to a LoRA adapter (``...qkv.lora.down.weight``)."""
    return any(part in f".{key}" for part in ADAPTER_KEY_PARTS)


class LoRABranch(nn.Module):
    """The ``(alpha / r) B A`` branch of one layer; ``forward(x)`` is its contribution to the layer's output."""

    def __init__(self, base: nn.Module, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.scale = float(alpha) / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        if isinstance(base, nn.Linear):
            self.down = nn.Linear(base.in_features, rank, bias=False, **factory)
            self.up = nn.Linear(rank, base.out_features, bias=False, **factory)
        else:
            conv = type(base)
            self.down = conv(base.in_channels, rank, base.kernel_size, stride=base.stride, padding=base.padding,
                             dilation=base.dilation, bias=False, padding_mode=base.padding_mode, **factory)
            self.up = conv(rank, base.out_channels, 1, bias=False, **factory)
        if base.weight.device.type != "meta":
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(self.dropout(x))) * self.scale

    def delta_weight(self) -> torch.Tensor:
        """``(alpha / r) B A`` in the base weight's shape."""
        down, up = self.down.weight, self.up.weight
        if down.dim() == 2:
            return (up @ down) * self.scale
        return torch.einsum("or,ri...->oi...", up.flatten(1), down) * self.scale


def _add_branch(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    return output + module.lora(inputs[0])


class LoRAAdapter:
    """``model.net_adapter``'s target: the adapter's shape and where it goes (see the module docstring)."""

    def __init__(self, rank: int = 16, alpha: float = 16.0, dropout: float = 0.0,
                 target_modules: Sequence[str] = ("*",)) -> None:
        if int(rank) < 1:
            raise ConfigError(f"model.net_adapter.rank must be at least 1, got {rank}")
        if not 0 <= float(dropout) < 1:
            raise ConfigError(f"model.net_adapter.dropout must be in [0, 1), got {dropout}")
        patterns = [str(p) for p in ([target_modules] if isinstance(target_modules, str) else target_modules)]
        if not patterns:
            raise ConfigError("model.net_adapter.target_modules is empty: give fnmatch patterns of module names")
        self.rank, self.alpha, self.dropout, self.target_modules = int(rank), float(alpha), float(dropout), patterns

    def apply(self, network: nn.Module) -> list[str]:
        """Adapt ``network`` in place: freeze it, add a branch to every matching layer; returns their names."""
        candidates = {name: m for name, m in network.named_modules()
                      if isinstance(m, ADAPTABLE) and getattr(m, "groups", 1) == 1 and not hasattr(m, "lora")}
        for pattern in self.target_modules:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in candidates):
                raise ConfigError(f"model.net_adapter.target_modules: {pattern!r} matches no Linear / Conv layer of "
                                  f"{type(network).__name__} (e.g. {', '.join(list(candidates)[:4])})")
        chosen = [name for name in candidates if any(fnmatch.fnmatchcase(name, p) for p in self.target_modules)]
        network.requires_grad_(False)
        for name in chosen:
            layer = candidates[name]
            rank = min(self.rank, *layer.weight.shape[:2])
            layer.lora = LoRABranch(layer, rank, self.alpha, self.dropout)
            layer.register_forward_hook(_add_branch)
        network._fastgen_lora = chosen  # marks the network as adapted (checkpoint filtering, merging)
        trained = sum(p.numel() for p in network.parameters() if p.requires_grad)
        total = sum(p.numel() for p in network.parameters())
        logger.info("LoRA rank %d on %d layers: %s trainable of %s parameters", self.rank, len(chosen),
                    f"{trained:,}", f"{total:,}")
        return chosen


def is_adapted(module: nn.Module) -> bool:
    return bool(getattr(module, "_fastgen_lora", None))


def adapter_state(state: dict[str, Any]) -> dict[str, Any]:
    """The adapter's entries of an adapted network's state dict (what its checkpoints hold)."""
    return {key: value for key, value in state.items() if is_adapter_key(key)}


def check_loadable(module: nn.Module, state: dict[str, Any], where: str) -> None:
    """An adapted network loads either its adapter (an adapter-only state, from its checkpoints) or its base (a
    state without adapter keys, e.g. a pretrained network); anything else is an error naming what is missing."""
    own = module.state_dict().keys()
    adapter_keys = {k for k in own if is_adapter_key(k)}
    given = set(state)
    unknown = given - set(own)
    if unknown:
        raise RuntimeError(f"unexpected keys for the adapted network in {where}: {', '.join(sorted(unknown)[:4])}")
    has_adapter = given & adapter_keys
    if has_adapter and has_adapter != adapter_keys:
        missing = sorted(adapter_keys - given)
        raise RuntimeError(f"{where} has only part of the LoRA adapter (missing {', '.join(missing[:4])}): was it "
                           "saved with other model.net_adapter settings?")


@torch.no_grad()
def merge_lora(network: nn.Module) -> int:
    """Fold every branch into its layer's weight (``W0 + (alpha / r) B A``), remove the branches and their hooks,
    and unfreeze the network: it then is a plain network with the adapted network's outputs. Returns the count."""
    merged = 0
    for module in network.modules():
        branch = getattr(module, "lora", None)
        if isinstance(branch, LoRABranch):
            module.weight.add_(branch.delta_weight().to(module.weight.dtype))
            del module.lora
            for key, hook in list(module._forward_hooks.items()):
                if hook is _add_branch:
                    del module._forward_hooks[key]
            merged += 1
    if hasattr(network, "_fastgen_lora"):
        del network._fastgen_lora
    network.requires_grad_(True)
    return merged


__all__ = ["LoRAAdapter", "LoRABranch", "adapter_state", "check_loadable", "is_adapted",
           "is_adapter_key", "merge_lora"]
