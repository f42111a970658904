"""Autocast for ``model.precision_amp`` (training) and ``model.precision_amp_infer`` (sampling).

Automatic mixed precision (Micikevicius et al. 2018, "Mixed Precision Training"): the weights, gradients and
optimizer state stay float32; inside the context, matrix products and convolutions run in the lower dtype and
reductions that need range (norms, softmax, losses) in float32, by torch's per-op autocast lists. ``bfloat16`` has
float32's exponent range and needs no loss scaling; ``float16`` does (``fastgen.callbacks.loss_scale``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from fastgen.utils.dtypes import AMP_DTYPES


def autocast(device_type: str, dtype: str | None) -> Any:
    """``torch.autocast(device_type, dtype)``, or a no-op context for ``None``; ``device_type`` is ``cpu`` or
    ``cuda`` (autocast has no ``meta`` mode: a traced step runs without it)."""
    if dtype is None or device_type not in ("cpu", "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=AMP_DTYPES[dtype])
