"""Process-group helpers that work the same with one process (no group) and under torchrun.

Library code asks these instead of ``torch.distributed`` directly, so nothing assumes a single process and
nothing crashes when no group exists.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_rank0() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (in place when distributed; the tensor itself otherwise)."""
    if is_initialized() and get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= get_world_size()
    return tensor


def broadcast_object(obj: object, src: int = 0) -> object:
    if not is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def select_device(preference: str = "auto") -> torch.device:
    """``auto``: this rank's CUDA device when CUDA is available, else CPU."""
    if preference == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", get_local_rank() % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")
    return torch.device(preference)
