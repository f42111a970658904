"""A network's weights from where a config names them: ``load_network_state`` reads one network's state dict from a
fastgen checkpoint (local or ``s3://``, either layout) or a bare state-dict file - teachers, initial students,
stage-1 models; ``load_weights`` loads a state dict into a module, or fails in one line naming the file and the
config field."""

from __future__ import annotations

import torch
from torch import nn

from fastgen.utils.errors import CheckpointError


def load_weights(module: nn.Module, state: dict[str, torch.Tensor], path: object, target: str,
                 what: str = "weights") -> None:
    """``module.load_state_dict(state)``, or a one-line CheckpointError that names the file, the config field the
    module comes from (``target``) and the first line of torch's mismatch report, instead of its full dump."""
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{what} in {path} do not fit {target}: "
                              f"{str(exc).strip().splitlines()[0][:300]}") from None


def load_network_state(path: str, key: str = "auto") -> dict[str, torch.Tensor]:
    """A network's state dict from a fastgen checkpoint (module ``key``; ``auto`` prefers the first EMA network,
    which is what a trained model is evaluated with) or from a bare state-dict file: teachers, initial students."""
    from fastgen.checkpoint.stores import read_whole_checkpoint

    modules = read_whole_checkpoint(path, None).get("model", {})  # local, or s3:// (credentials: AWS_* variables)
    if key == "auto":
        ema_keys = [name for name in modules if name.startswith("ema")]
        key = ema_keys[0] if ema_keys else "net"
    if key not in modules:
        raise CheckpointError(f"checkpoint {path} has no module {key!r} (it has: {', '.join(modules) or 'none'})")
    return modules[key]
