"""CTScheduleCallback: the ECT consistency-training curriculum for the gap between ``t`` and ``r``.

Easy Consistency Tuning (Geng et al. 2024, "Consistency Models Made Easy", Sec. 3, "Mapping function") trains
the consistency condition ``f(x_t, t) = f(x_r, r)`` with ``r < t`` and shrinks the gap ``Delta t = t - r`` in
stages, moving from diffusion pre-training (``r = 0``) towards the continuous-time consistency model
(``Delta t -> 0``; Song et al. 2023, "Consistency Models", Sec. 5). With the constant mapping of the reference
implementation (``t_to_r_const``)::

    stage = floor(images_seen / (kimg_per_stage * 1000)),  images_seen = iteration * global_batch_size
    ratio = r / t = 1 - 1 / q^(stage + 1),  i.e. Delta t = t / q^(stage + 1)

clipped at ``ratio_limit`` (so ``r < t`` always holds). The paper writes ``Delta t = t / q^a * n(t)`` with
``a = ceil(iters / d)``; the code's ``stage + 1`` is that ``a`` (away from exact stage boundaries) and the
optional ``n(t) = 1 + k sigmoid(-b t)`` factor is left to the method, which multiplies it in if it wants it.
With ``q = 2`` the ratio runs ``0.5, 0.75, 0.875, ...``.

At ``on_training_step_begin`` (and at ``on_train_begin``, so validation and sampling at a resumed iteration see
the right value) the callback **always** sets ``model.ct_ratio`` (a plain float attribute) and
``model.ct_stage``; a consistency method reads ``self.ct_ratio`` when drawing ``r = ratio * t``. If the method
did not define ``ct_ratio`` itself, a warning says the schedule may be unused.

The ratio is a pure function of the iteration and the global batch, so a resumed run continues the same
sequence without any saved state; ``state_dict`` still holds the stage and ratio (for inspection, and a
warning on resume if the global batch size changed so that the stage would jump). Logged keys: ``ct/stage``,
``ct/ratio``.
"""

from __future__ import annotations

import math
from typing import Any

from fastgen.callbacks.callback import Callback
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


def ct_stage(iteration: int, global_batch_size: int, kimg_per_stage: float) -> int:
    """``floor(iteration * global_batch_size / (kimg_per_stage * 1000))`` (exact for integer image counts)."""
    images_seen = int(iteration) * int(global_batch_size)
    per_stage = kimg_per_stage * 1000.0
    if float(per_stage).is_integer():
        return images_seen // int(per_stage)
    return int(math.floor(images_seen / per_stage))


def ct_ratio(stage: int, q: float = 2.0, ratio_limit: float = 0.999) -> float:
    """``r / t = min(1 - q^-(stage + 1), ratio_limit)`` (ECT, Sec. 3)."""
    return min(1.0 - q ** -(stage + 1), ratio_limit)


class CTScheduleCallback(Callback):
    def __init__(self, q: float = 2.0, ratio_limit: float = 0.999, kimg_per_stage: float = 100.0) -> None:
        if q <= 1.0:
            raise ValueError(f"q must be > 1 so that the gap shrinks, got {q}")
        if not 0.0 < ratio_limit < 1.0:
            raise ValueError(f"ratio_limit must be in (0, 1), got {ratio_limit}")
        if kimg_per_stage <= 0:
            raise ValueError(f"kimg_per_stage must be positive, got {kimg_per_stage}")
        self.q = float(q)
        self.ratio_limit = float(ratio_limit)
        self.kimg_per_stage = float(kimg_per_stage)
        self.stage = 0
        self.ratio = ct_ratio(0, self.q, self.ratio_limit)
        self.iteration = 0  # the iteration ``stage`` was computed for
        self._restored: tuple[int, int] | None = None

    def ratio_at(self, iteration: int) -> tuple[int, float]:
        """``(stage, ratio)`` before the optimizer step ``iteration`` (0-based)."""
        stage = ct_stage(iteration, self.trainer.global_batch_size, self.kimg_per_stage)
        return stage, ct_ratio(stage, self.q, self.ratio_limit)

    def _apply(self, model: Any, iteration: int) -> None:
        self.iteration = int(iteration)
        self.stage, self.ratio = self.ratio_at(iteration)
        model.ct_ratio = self.ratio
        model.ct_stage = self.stage

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        if not hasattr(model, "ct_ratio"):
            logger.warning("CTScheduleCallback: %s defines no ct_ratio attribute; the schedule may be unused",
                           type(model).__name__)
        if self._restored is not None:
            saved_iteration, saved_stage = self._restored
            now = self.ratio_at(saved_iteration)[0]
            if now != saved_stage:
                logger.warning(
                    "CTScheduleCallback: the checkpoint had stage %d at iteration %d, but the global batch %d gives "
                    "stage %d there (did the global batch size change?); following the new batch size",
                    saved_stage, saved_iteration, self.trainer.global_batch_size, now,
                )
        self._apply(model, iteration)

    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        self._apply(model, iteration)
        self.trainer.log_scalar("ct/stage", self.stage)
        self.trainer.log_scalar("ct/ratio", self.ratio)

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "ratio": self.ratio, "iteration": self.iteration}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stage = int(state_dict.get("stage", 0))
        self.ratio = float(state_dict.get("ratio", ct_ratio(self.stage, self.q, self.ratio_limit)))
        self.iteration = int(state_dict.get("iteration", 0))
        self._restored = (self.iteration, self.stage)
