"""Does each learning-rate schedule end with the run? A check made once the optimizers exist.

A decaying schedule is written in *its module's* updates (``LinearLR(total_iters=800)``), while the run's length
is ``trainer.max_iter`` iterations, and a method such as DMD2 steps each module in only some iterations. When the
two disagree - typically after ``- trainer.max_iter=...`` on the command line - the run either ends before the
decay does, or spends its tail at the final learning rate. Neither is an error (a warm-up is meant to end early),
so the trainer logs a warning that names both numbers.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class Horizon(NamedTuple):
    steps: int  # scheduler steps after which the learning rate stops changing
    decays: bool  # it falls over them (a decay) rather than rises (a warm-up)
    ends_at_zero: bool  # its final learning rate is 0, so updates past the end train nothing


def schedule_horizon(scheduler: Any) -> Horizon | None:
    """Where ``scheduler``'s learning rate stops changing, and how it gets there; ``None`` for schedulers without
    a fixed end."""
    from torch.optim import lr_scheduler as s

    if isinstance(scheduler, s.LinearLR):
        return Horizon(int(scheduler.total_iters), scheduler.end_factor < scheduler.start_factor,
                       scheduler.end_factor == 0)
    if isinstance(scheduler, s.PolynomialLR):
        return Horizon(int(scheduler.total_iters), True, True)
    if isinstance(scheduler, s.CosineAnnealingLR):
        return Horizon(int(scheduler.T_max), True, scheduler.eta_min == 0)
    if isinstance(scheduler, s.OneCycleLR):
        return Horizon(int(scheduler.total_steps), True, False)  # ends at initial_lr / final_div_factor
    return None


def updates_per_module(stepped_at: Callable[[int], list[str]], max_iter: int) -> dict[str, int]:
    """How many times each optimizer steps in iterations ``0 .. max_iter - 1`` (``model.get_optimizers``)."""
    counts: dict[str, int] = {}
    for iteration in range(max_iter):
        for name in stepped_at(iteration):
            counts[name] = counts.get(name, 0) + 1
    return counts


def schedule_length_mismatches(schedulers: dict[str, Any], stepped_at: Callable[[int], list[str]],
                               max_iter: int) -> list[str]:
    """One message per scheduler whose fixed end does not fall on the run's last update of its module: the run
    ends before it (any schedule), or a decay finishes early and the rest of the run stays at its final rate."""
    horizons = {name: h for name, scheduler in schedulers.items() if (h := schedule_horizon(scheduler)) is not None}
    counts = updates_per_module(stepped_at, max_iter) if horizons else {}
    messages = []
    for name, (steps, decays, ends_at_zero) in horizons.items():
        scheduler = schedulers[name]
        updates = counts.get(name, 0)
        if steps > updates:
            messages.append(f"{name}'s learning-rate schedule ({type(scheduler).__name__}) runs over {steps} updates, "
                            f"but trainer.max_iter={max_iter} gives {name} {updates}: the run ends before the "
                            f"schedule does (change the schedule with max_iter)")
        elif decays and steps < updates:
            final = "0, so they train nothing" if ends_at_zero else "the final learning rate"
            messages.append(f"{name}'s learning-rate schedule ({type(scheduler).__name__}) decays over {steps} updates, "
                            f"but trainer.max_iter={max_iter} gives {name} {updates}: the last {updates - steps} stay "
                            f"at {final} (change the schedule with max_iter)")
    return messages


def warn_on_schedule_length_mismatches(model: Any, max_iter: int) -> None:
    """Log :func:`schedule_length_mismatches` for ``model`` (its ``scheduler_dict`` and ``get_optimizers``)."""
    for message in schedule_length_mismatches(model.scheduler_dict, model.get_optimizers, max_iter):
        logger.warning(message)
