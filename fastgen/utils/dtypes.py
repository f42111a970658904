"""The one table of floating-point dtypes a config or command names by string (``model.precision``,
``trainer.fsdp_param_dtype`` / ``fsdp_reduce_dtype``, ``model.precision_amp``, ``convert-ckpt --dtype``).

The formats fastgen reads and writes keep their own codes next to their readers (safetensors' ``F32``...,
the pickle allowlist's ``torch.float32``...): those name dtypes in a file, not in a config."""

from __future__ import annotations

import torch

FLOAT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AMP_DTYPES: dict[str, torch.dtype] = {name: FLOAT_DTYPES[name] for name in ("bfloat16", "float16")}  # autocast's
