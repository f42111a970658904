"""``MediaEntry`` and ``LogModule``: pluggable per-sample-step processing for ``WandbCallback``.

At every sample step each rank turns its share of the samples into a list of ``MediaEntry`` (one per sample,
tensors on the CPU); the lists are gathered to rank 0 (``gather_to_rank0``), and rank 0 hands the whole list to
every log module's ``process``. What a module returns is logged by the callback: its ``loss_dict`` goes through
the same scalar aggregation as the training losses (mean over the logging window, under ``<module name>/<key>``),
everything else is logged as media under ``<module name>/<key>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from fastgen.distributed import group as dist_utils

MediaKind = Literal["image", "video", "audio", "points"]


@dataclass
class MediaEntry:
    """One generated sample as the log modules see it.

    ``data`` (float32, CPU) is, by ``kind``:

    * ``image`` - ``(C, H, W)`` in ``[-1, 1]``;
    * ``video`` - ``(C, T, H, W)`` in ``[-1, 1]`` (``fps`` frames per second);
    * ``audio`` - ``(T,)`` or ``(channels, T)`` waveform in ``[-1, 1]`` at ``sample_rate`` Hz;
    * ``points`` - ``(D,)``, one point of a low-dimensional (toy) sample cloud.

    ``caption`` is the prompt or a description (``"label 3"``); ``label`` the class label of a conditional
    model; ``rank`` / ``index`` say which rank drew the sample and its position there; ``metadata`` holds
    per-sample side information copied from the training batch, e.g. ``camera_poses`` ``(T, 4, 4)``,
    ``intrinsics`` ``(3, 3)`` or ``(T, 3, 3)`` and ``actions`` ``(T, D)`` (see ``VipeLogger``).
    """

    kind: MediaKind
    data: torch.Tensor
    iteration: int
    rank: int = 0
    index: int = 0
    label: int | None = None
    caption: str | None = None
    fps: float | None = None
    sample_rate: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: an audio-visual sample's sound track: a ``(channels, T)`` waveform in ``[-1, 1]`` at ``sample_rate`` Hz
    audio: torch.Tensor | None = None


class LogModule:
    """Base class of the W&B log modules; subclass it and override ``process`` (and ``close`` if it keeps work
    in flight).

    Hook signature::

        process(entries: list[MediaEntry], iteration: int) -> dict[str, Any] | None

    ``process`` runs on rank 0 only, at every sample step of ``WandbCallback`` (``sample_iter``, and at the end
    of training), with the entries of *all* ranks in rank order. Return ``None`` to log nothing, or a dict:

    * ``"loss_dict"``: ``{key: float or 1-element tensor}`` - averaged over the logging window like the
      training losses and logged as ``<module name>/<key>``;
    * any other key: media logged as ``<module name>/<key>`` at ``iteration`` - a ``wandb`` data type, a PIL
      image (wrapped in ``wandb.Image``), or a list of those.

    ``setup(run_dir, is_rank0)`` runs on every rank at the start of training (raise there for a bad
    configuration, so every rank fails alike); ``close(timeout_s)`` runs on rank 0 at the end of training
    (and again, harmlessly, at shutdown) and may return a last dict like ``process``. ``self.name`` is the
    module's key in ``log_modules``; ``self.run_dir`` is the run directory (for local copies of what it logs).
    """

    name: str = ""
    run_dir: Path | None = None

    def setup(self, run_dir: Path, is_rank0: bool) -> None:
        self.run_dir = Path(run_dir)

    def process(self, entries: list[MediaEntry], iteration: int) -> dict[str, Any] | None:
        return None

    def close(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        return None


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj``, in rank order, on rank 0 (``None`` elsewhere); ``[obj]`` without a process group.

    Uses ``torch.distributed.gather_object`` (pickled, so CPU tensors and plain Python travel on gloo and NCCL).
    """
    if not dist_utils.is_initialized() or dist_utils.get_world_size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * dist_utils.get_world_size() if dist_utils.is_rank0() else None
    dist.gather_object(obj, out, dst=0)
    return out
