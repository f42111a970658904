"""Samples of several modalities at once - ``{"video": (B, C, F, H, W), "audio": (B, C, T, M)}`` for an
audio-visual model such as LTX-2 - and the few operations the methods and samplers need on them.

A multimodal sample is a plain ``dict`` from a modality's name to its batch-first tensor; every entry holds the
same batch. Times may be shared (one ``(B,)`` tensor) or per modality (a dict of them, for families that train
each modality at its own noise level). ``per_modality(fn, *args)`` applies ``fn`` entry by entry (non-dict
arguments are passed to every call), so elementwise code - noising, Euler / Heun steps, prediction-type
conversions - is written once for tensors and dicts alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

import torch

Sample = Union[torch.Tensor, dict[str, torch.Tensor]]
T = TypeVar("T")


def is_multimodal(x: Any) -> bool:
    return isinstance(x, Mapping)


def per_modality(fn: Callable[..., T], *args: Any) -> Any:
    """``fn(*args)``, or for dict arguments ``{name: fn(*(a[name] for dicts, a for the rest))}`` over the first
    dict's modalities; every dict argument must hold the same modalities."""
    dicts = [a for a in args if is_multimodal(a)]
    if not dicts:
        return fn(*args)
    names = list(dicts[0])
    for other in dicts[1:]:
        if set(other) != set(names):
            raise ValueError(f"modalities {sorted(other)} do not match {sorted(names)}")
    return {name: fn(*(a[name] if is_multimodal(a) else a for a in args)) for name in names}


def batch_size(x: Sample) -> int:
    """The batch of a tensor or of a multimodal sample (the same for every modality)."""
    if not is_multimodal(x):
        return int(x.shape[0])
    sizes = {int(v.shape[0]) for v in x.values()}
    if len(sizes) != 1:
        raise ValueError(f"the modalities hold different batches: {sorted(sizes)}")
    return sizes.pop()


def first_tensor(x: Sample) -> torch.Tensor:
    """A tensor of ``x`` (its dtype and device stand for the sample's)."""
    return next(iter(x.values())) if is_multimodal(x) else x


def cat(samples: list[Sample]) -> Sample:
    """``torch.cat`` along the batch, per modality."""
    if is_multimodal(samples[0]):
        return {name: torch.cat([s[name] for s in samples]) for name in samples[0]}
    return torch.cat(samples)


def chunk(x: Sample, parts: int) -> list[Sample]:
    """``x.chunk(parts)`` along the batch, per modality."""
    if is_multimodal(x):
        pieces = {name: v.chunk(parts) for name, v in x.items()}
        return [{name: pieces[name][i] for name in x} for i in range(parts)]
    return list(x.chunk(parts))


__all__ = ["Sample", "batch_size", "cat", "chunk", "first_tensor", "is_multimodal", "per_modality"]
