"""The teacher's scores cached beside its checkpoint: computed once, reused only when the weights and every
sampling setting match, recomputed otherwise; a read-only folder only costs the recomputation. The shipped entry
for the quick-start teacher is checked against a fresh computation (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fastgen.configs.instantiate import instantiate
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
from fastgen.configs.net import toy_mlp
from fastgen.evaluation.evaluate import evaluate_model
from fastgen.evaluation.teacher_cache import CACHE_FORMAT, cache_path, teacher_metrics, weights_digest

DATASET = "toy:eight_gaussians"


def toy_distiller(teacher_ckpt: str | None) -> Any:
    config = dmd2_config()
    config.model.net = toy_mlp(hidden_dim=16, num_layers=1)
    config.model.input_shape = [2]
    config.model.teacher_ckpt = teacher_ckpt
    torch.manual_seed(0)
    return instantiate(config.model_class, config=config.model)  # a random teacher is fine for the cache


class CountingEvaluate:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return evaluate_model(*args, **kwargs)


def test_scores_are_computed_once_then_read_back(tmp_path: Path) -> None:
    model = toy_distiller(str(tmp_path / "teacher.pth"))
    evaluate = CountingEvaluate()
    first, cached = teacher_metrics(model, 200, steps=3, dataset=DATASET, evaluate=evaluate)
    assert not cached and evaluate.calls == 1
    assert first == evaluate_model(model, 200, seed=0, steps=3, net=model.teacher, dataset=DATASET)
    stored = json.loads(cache_path(tmp_path / "teacher.pth").read_text())
    assert stored["format"] == CACHE_FORMAT and len(stored["entries"]) == 1
    (entry,) = stored["entries"].values()
    assert entry["weights_sha256"] == weights_digest(model.teacher)

    again, cached = teacher_metrics(model, 200, steps=3, dataset=DATASET, evaluate=evaluate)
    assert cached and evaluate.calls == 1 and again == json.loads(json.dumps(first))


@pytest.mark.parametrize("change", ["weights", "samples", "steps", "seed"])
def test_any_change_recomputes(tmp_path: Path, change: str) -> None:
    model = toy_distiller(str(tmp_path / "teacher.pth"))
    evaluate = CountingEvaluate()
    teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
    n, steps, seed = 100, 3, 0
    if change == "weights":
        with torch.no_grad():
            next(model.teacher.parameters()).add_(1e-3)
    elif change == "samples":
        n = 120
    elif change == "steps":
        steps = 4
    else:
        seed = 1
    _, cached = teacher_metrics(model, n, steps=steps, dataset=DATASET, seed=seed, evaluate=evaluate)
    assert not cached and evaluate.calls == 2
    assert len(json.loads(cache_path(tmp_path / "teacher.pth").read_text())["entries"]) == 2


def test_unwritable_folder_or_no_checkpoint_just_recomputes(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    model = toy_distiller(str(blocker / "teacher.pth"))  # the cache would go inside a file: cannot be written
    evaluate = CountingEvaluate()
    for _ in range(2):
        _, cached = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
        assert not cached
    assert evaluate.calls == 2

    model = toy_distiller(None)
    _, cached = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
    assert not cached and evaluate.calls == 3


def test_a_corrupt_cache_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    cache_path(tmp_path / "teacher.pth").write_text("{not json")
    model = toy_distiller(str(tmp_path / "teacher.pth"))
    _, cached = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=CountingEvaluate())
    assert not cached
    assert json.loads(cache_path(tmp_path / "teacher.pth").read_text())["format"] == CACHE_FORMAT


@pytest.mark.slow
def test_the_shipped_quickstart_teacher_scores_reproduce() -> None:
    """``fastgen/assets/digits_teacher.eval.json`` holds what a fresh computation gives (5,000 samples, 18 Heun
    steps), so the quick-start's printed teacher row is the teacher's real score."""
    from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config

    config = create_config()
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.eval()
    path = cache_path(config.model.teacher_ckpt)
    evaluate = CountingEvaluate()
    shipped, cached = teacher_metrics(model, 5000, steps=18, dataset="digits", evaluate=evaluate)
    assert cached and evaluate.calls == 0, f"{path} has no entry for the shipped teacher"
    fresh = evaluate_model(model, 5000, seed=0, steps=18, net=model.teacher, dataset="digits")
    assert fresh["fd_digits"] == pytest.approx(shipped["fd_digits"], rel=1e-3)
    assert fresh["accuracy"] == pytest.approx(shipped["accuracy"], abs=2e-3)
