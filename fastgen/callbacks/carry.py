"""CarryCallback: a method-owned state dictionary carried atomically from one iteration to the next.

Some methods need values from the previous iteration - a running loss scale, a cached latent, an adaptive
weight. Keeping them in ad-hoc attributes breaks in two ways: a step whose optimizer update is skipped (non-finite
gradients) still changes them, and a resumed run starts them over. The contract (``FastGenModel`` implements the
model side):

* ``model.carry_state: dict[str, Tensor]`` - the committed state. The method reads it in ``single_train_step``
  and treats it as read-only; ``None`` (the base class default) means the method carries nothing.
* ``model.propose_carry(new_state)`` - called by the method during the step: the complete next state (all keys;
  it replaces the old dictionary as a whole). The latest proposal of an iteration wins, so with gradient
  accumulation every round reads the same committed state and the last round's proposal is the one considered.
* ``model.take_carry_proposal()`` - returns the pending proposal and clears it (used by this callback).

At ``on_training_step_end`` the callback commits the proposal only if the step completed: an optimizer stepped
(``trainer.stepping`` is not empty) and no callback skipped it (``trainer.step_skipped``, set e.g. by
``GradClipCallback`` on a non-finite gradient norm); otherwise the proposal is discarded and the old state stays.
A commit is all or nothing: the new dictionary is built in full (values detached, so no autograd graph is kept
alive across iterations), every floating-point tensor is checked to be finite (one host sync per device), and only
then is ``model.carry_state`` replaced - one reference swap. A proposal with any non-finite entry is rejected as a
whole (warning, ``carry/rejected`` logged) - on every rank when it is non-finite on any (one all-reduce of a flag per
commit), so the ranks' states stay in step; one with a non-tensor entry raises ``TypeError``.

Validation (``model.validation_step`` usually calls ``single_train_step``, which proposes) leaves the state
untouched: proposals made during validation are dropped. With ``carry_through_validation=True`` each validation
step's proposal is committed at ``on_validation_step_end`` instead, so the state carries through validation.

The committed state is saved in checkpoints (``state_dict``: compact CPU copies; tensors that lived on the
accelerator go back to ``trainer.device`` on load), so a resumed run continues with exactly the state it stopped
with. A method without carry state makes the callback a no-op (one log line).
"""

from __future__ import annotations

from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


def _checked(proposal: Any) -> dict[str, torch.Tensor]:
    """The proposal as a fresh dictionary of detached tensors; ``TypeError`` for anything else."""
    state: dict[str, torch.Tensor] = {}
    for key, value in dict(proposal).items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise TypeError(f"carry proposal entry {key!r} is a {type(value).__name__}; carried state maps str keys "
                            "to tensors")
        state[key] = value.detach()
    return state


def _non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """Keys of floating-point tensors holding NaN or Inf: one ``all()`` per device on the fast path, per key only
    when something is wrong."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for value in state.values():
        if value.is_floating_point() or value.is_complex():
            by_device.setdefault(value.device, []).append(torch.isfinite(value).all())
    if all(bool(torch.stack(flags).all()) for flags in by_device.values()):
        return []
    return [k for k, v in state.items() if (v.is_floating_point() or v.is_complex()) and not bool(torch.isfinite(v).all())]


class CarryCallback(Callback):
    def __init__(self, carry_through_validation: bool = False, check_finite: bool = True) -> None:
        self.carry_through_validation = bool(carry_through_validation)
        self.check_finite = bool(check_finite)
        self.commits = 0
        self.rejected = 0
        self._model: Any = None  # the method, once it is known to carry state
        self._restored: dict[str, Any] | None = None  # a loaded state_dict not (yet) applied to a method

    # ---- setup ----------------------------------------------------------------------------------------------------
    def on_model_init_end(self, model: Any) -> None:
        if isinstance(getattr(model, "carry_state", None), dict) and callable(getattr(model, "take_carry_proposal", None)):
            self._model = model
            if self._restored is not None:
                self._apply(self._restored)
        else:
            logger.info("CarryCallback: %s carries no state (its carry_state is not a dict); nothing to carry",
                        type(model).__name__)

    # ---- training -------------------------------------------------------------------------------------------------
    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        if self._model is not None:
            self._model.take_carry_proposal()  # nothing stale reaches this step's decision

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        if self._model is None:
            return
        proposal = self._model.take_carry_proposal()
        if proposal is None:
            return
        if self.trainer.step_skipped or not self.trainer.stepping:
            logger.debug("CarryCallback: step %d did not complete; its carry proposal is discarded", iteration)
            return
        self._commit(proposal, f"iteration {iteration}")

    # ---- validation -----------------------------------------------------------------------------------------------
    def on_validation_begin(self, model: Any, iteration: int = 0) -> None:
        if self._model is not None:
            self._model.take_carry_proposal()

    def on_validation_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        if self._model is None:
            return
        proposal = self._model.take_carry_proposal()
        if proposal is not None and self.carry_through_validation:
            self._commit(proposal, f"validation at iteration {iteration}")

    def on_validation_end(self, model: Any, loss_dict: dict | None = None, iteration: int = 0) -> None:
        if self._model is not None:
            self._model.take_carry_proposal()

    # ---- the commit -----------------------------------------------------------------------------------------------
    def _commit(self, proposal: Any, where: str) -> None:
        state = _checked(proposal)
        if self.check_finite:
            bad = _non_finite(state)
            # Collective: if any rank's proposal is non-finite, every rank keeps its previous state, so state that
            # the ranks share (a running scale, a step counter) never goes out of step between them.
            if dist_utils.any_rank(bool(bad)):
                self.rejected += 1
                self.trainer.log_scalar("carry/rejected", float(self.rejected))
                logger.warning("CarryCallback: the carry proposal of %s has non-finite values in %s; the previous "
                               "state is kept", where, ", ".join(bad) if bad else "another rank's proposal")
                return
        self._model.carry_state = state  # the one reference swap: all keys or none
        self.commits += 1

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._model is None:
            return dict(self._restored) if self._restored is not None else {}
        state = self._model.carry_state
        if not isinstance(state, dict):
            raise TypeError(f"{type(self._model).__name__}.carry_state is a {type(state).__name__}; only CarryCallback "
                            "replaces it, with a dict")
        return {
            "state": {k: v.detach().to("cpu", copy=True) for k, v in state.items()},
            "on_cpu": sorted(k for k, v in state.items() if v.device.type == "cpu"),
            "commits": self.commits,
            "rejected": self.rejected,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._restored = dict(state_dict)
        self.commits = int(state_dict.get("commits", 0))
        self.rejected = int(state_dict.get("rejected", 0))
        if self._model is not None:
            self._apply(self._restored)

    def _apply(self, restored: dict[str, Any]) -> None:
        trainer = getattr(self, "trainer", None)
        device = trainer.device if trainer is not None else torch.device("cpu")
        on_cpu = set(restored.get("on_cpu", []))
        self._model.carry_state = {k: (v if k in on_cpu else v.to(device)) for k, v in restored.get("state", {}).items()}
        self._restored = None
