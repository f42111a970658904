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
    module comes from (``target``) and what does not fit - the first few missing and unexpected keys and shape
    mismatches - instead of torch's full dump (whose first line names none of them)."""
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        found = describe_mismatch(module.state_dict(), state)
        detail = found or str(exc).strip().splitlines()[0][:300]
        raise CheckpointError(f"{what} in {path} do not fit {target}: {detail}") from None


def describe_mismatch(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor], shown: int = 3) -> str:
    """``"missing 12 keys (a, b, c, ...); unexpected 2 keys (x, y); 1 shape mismatch (w: file (3, 4), model (4, 4))"``,
    or ``""`` when keys and shapes agree."""

    def listing(items: list[str]) -> str:
        more = ", ..." if len(items) > shown else ""
        return f"({', '.join(items[:shown])}{more})"

    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = [f"{k}: file {tuple(given[k].shape)}, model {tuple(expected[k].shape)}" for k in expected
              if k in given and hasattr(given[k], "shape") and tuple(given[k].shape) != tuple(expected[k].shape)]
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} key{'s' * (len(missing) > 1)} {listing(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)} key{'s' * (len(unexpected) > 1)} {listing(unexpected)}")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch{'es' * (len(shapes) > 1)} {listing(shapes)}")
    return "; ".join(parts)


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
