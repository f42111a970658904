"""CTScheduleCallback: the ECT r/t curriculum by hand, in real runs, with accumulation, and across resume."""

from __future__ import annotations

from typing import Any

import pytest
from fastgen_testing import tiny_toy_config
from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.ct_schedule import CTScheduleCallback, ct_ratio, ct_stage
from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer


def test_stage_and_ratio_by_hand() -> None:
    # 32 images per stage, 16 per step: two steps per stage; q = 2 halves the gap 1 - r/t every stage.
    kimg = 0.032
    assert [ct_stage(i, 16, kimg) for i in range(7)] == [0, 0, 1, 1, 2, 2, 3]
    assert [ct_ratio(s) for s in range(4)] == [0.5, 0.75, 0.875, 0.9375]
    assert ct_ratio(2, q=4.0) == 1 - 1 / 64
    assert ct_ratio(9) == 0.999  # 1 - 2^-10 = 0.99902 is clipped at ratio_limit
    assert ct_ratio(9, ratio_limit=0.9999) == 1 - 2**-10
    # 100 kimg per stage, global batch 512: stage k from step ceil(k * 100000 / 512).
    assert ct_stage(195, 512, 100.0) == 0 and ct_stage(196, 512, 100.0) == 1
    assert ct_stage(390, 512, 100.0) == 1 and ct_stage(391, 512, 100.0) == 2
    assert ct_stage(3, 1000, 0.5) == 6  # fractional kimg: floor(3000 / 500)
    assert ct_stage(7, 3, 0.0025) == 8  # non-integer images per stage: floor(21 / 2.5)


def test_arguments_are_checked() -> None:
    for kwargs in ({"q": 1.0}, {"ratio_limit": 1.0}, {"ratio_limit": 0.0}, {"kimg_per_stage": 0.0}):
        with pytest.raises(ValueError):
            CTScheduleCallback(**kwargs)


class RatioProbe(Callback):
    """Records ``(iteration, model.ct_ratio, model.ct_stage)`` at every forward, and the logged scalars."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float, int]] = []
        self.scalars: list[dict[str, Any]] = []

    def on_training_accum_step_begin(self, model, data_batch, iteration=0, accum_iter=0):
        self.seen.append((iteration, model.ct_ratio, model.ct_stage))

    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
        self.scalars.append(self.trainer.pop_scalars())


def _config(name: str, max_iter: int, **trainer: Any):
    config = tiny_toy_config(name, max_iter=max_iter, save_ckpt_iter=3, **trainer)  # per-rank batch 16
    config.trainer.callbacks = DictConfig({
        **config.trainer.callbacks,
        "ct": LazyCall(CTScheduleCallback)(q=2.0, ratio_limit=0.95, kimg_per_stage=0.032),
    })
    return config


def _expected(start: int, end: int, batch: int, rounds: int = 1) -> list[tuple[int, float, int]]:
    out = []
    for it in range(start, end):
        stage = it * batch // 32
        out += [(it, min(1 - 0.5 ** (stage + 1), 0.95), stage)] * rounds
    return out


def test_the_model_sees_the_schedule_in_a_real_run() -> None:
    probe = RatioProbe()
    trainer = Trainer(_config("ct_run", max_iter=8), extra_callbacks={"probe": probe})
    model = trainer.run()
    assert probe.seen == _expected(0, 8, 16)
    # iterations 0..7 -> stages 0,0,1,1,2,2,3,3 -> 0.5, 0.75, 0.875, then 0.9375 (under the 0.95 limit)
    assert [r for _, r, _ in probe.seen] == [0.5, 0.5, 0.75, 0.75, 0.875, 0.875, 0.9375, 0.9375]
    assert [s["ct/stage"] for s in probe.scalars] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [s["ct/ratio"] for s in probe.scalars] == [r for _, r, _ in probe.seen]
    assert model.ct_ratio == 0.9375
    ct = trainer.callbacks["ct"]
    assert ct.state_dict() == {"stage": 3, "ratio": 0.9375, "iteration": 7}


def test_the_stage_counts_images_of_the_global_batch() -> None:
    probe = RatioProbe()
    Trainer(_config("ct_accum", max_iter=5, batch_size_global=32), extra_callbacks={"probe": probe}).run()
    # 2 accumulation rounds of 16: 32 images per step, so a new stage every step; 1 - 2^-5 is clipped at 0.95.
    assert probe.seen == _expected(0, 5, 32, rounds=2)
    assert [r for _, r, _ in probe.seen[::2]] == [0.5, 0.75, 0.875, 0.9375, 0.95]


def test_a_resumed_run_continues_the_same_sequence(caplog: pytest.LogCaptureFixture) -> None:
    straight = RatioProbe()
    Trainer(_config("ct_straight", max_iter=9), extra_callbacks={"straight": straight}).run()

    first, second = RatioProbe(), RatioProbe()
    trainer = Trainer(_config("ct_resumed", max_iter=5), extra_callbacks={"probe": first})
    trainer.run()  # checkpoints at 3 and 5
    saved = load_checkpoint(trainer.checkpointer.path_for(5))["callbacks"]["ct"]
    assert saved == {"stage": 2, "ratio": 0.875, "iteration": 4}
    resumed = Trainer(_config("ct_resumed", max_iter=9), extra_callbacks={"probe": second})
    with caplog.at_level("WARNING"):
        model = resumed.run()
    assert resumed.start_iteration == 5
    assert first.seen + second.seen == straight.seen == _expected(0, 9, 16)
    assert model.ct_ratio == straight.seen[-1][1]
    assert "did the global batch size change" not in caplog.text

    # Resuming with another global batch follows the new batch size, and says so.
    changed = Trainer(_config("ct_resumed", max_iter=10, batch_size_global=32))
    with caplog.at_level("WARNING"):
        changed.run()
    assert "did the global batch size change" in caplog.text


def test_state_dict_round_trips() -> None:
    a = CTScheduleCallback()
    a.load_state_dict({"stage": 4, "ratio": 0.96875, "iteration": 1234})
    b = CTScheduleCallback()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == {"stage": 4, "ratio": 0.96875, "iteration": 1234}
