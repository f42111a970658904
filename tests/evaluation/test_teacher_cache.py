"""The teacher's scores cached in the user's cache folder (``$XDG_CACHE_HOME/fastgen``, never beside the teacher,
which for the quick-start lives inside the installed package): computed once, reused only when the weights and every
sampling setting match, recomputed otherwise; a cache folder that cannot be written only costs the recomputation. A
``.eval.json`` beside the checkpoint (the package ships one) is read, never written. The shipped entry for the
quick-start teacher is checked against a fresh computation (slow)."""

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
from fastgen.evaluation.teacher_cache import (CACHE_FORMAT, cache_folder, cache_key, cache_path, seed_path,
                                             teacher_metrics, weights_digest)

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


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg_cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def teacher_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "teacher"
    folder.mkdir()
    (folder / "teacher.pth").write_bytes(b"the checkpoint")  # only its name matters to the cache
    return folder


def test_scores_are_computed_once_cached_under_xdg_cache_home_then_read_back(cache_home: Path,
                                                                            teacher_dir: Path) -> None:
    model = toy_distiller(str(teacher_dir / "teacher.pth"))
    evaluate = CountingEvaluate()
    first, source = teacher_metrics(model, 200, steps=3, dataset=DATASET, evaluate=evaluate)
    assert source is None and evaluate.calls == 1
    assert first == evaluate_model(model, 200, seed=0, steps=3, net=model.teacher, dataset=DATASET)
    digest = weights_digest(model.teacher)
    path = cache_path(teacher_dir / "teacher.pth", digest)
    assert path.parent == cache_home / "fastgen" / "teacher_eval" == cache_folder()
    assert files_under(cache_home) == [path] and path.name == f"teacher-{digest[:16]}.eval.json"
    stored = json.loads(path.read_text())
    assert stored["format"] == CACHE_FORMAT and len(stored["entries"]) == 1
    (entry,) = stored["entries"].values()
    assert entry["weights_sha256"] == digest
    assert files_under(teacher_dir) == [teacher_dir / "teacher.pth"]  # nothing beside the teacher

    again, source = teacher_metrics(model, 200, steps=3, dataset=DATASET, evaluate=evaluate)
    assert source == path and evaluate.calls == 1 and again == json.loads(json.dumps(first))
    assert files_under(teacher_dir) == [teacher_dir / "teacher.pth"]


def test_without_xdg_cache_home_the_cache_is_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "fastgen" / "teacher_eval"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG rules say
    assert cache_folder() == tmp_path / "home" / ".cache" / "fastgen" / "teacher_eval"


def test_two_teachers_with_the_same_file_name_never_share_a_cache_file(cache_home: Path, tmp_path: Path) -> None:
    one = toy_distiller(str(tmp_path / "a" / "teacher.pth"))
    other = toy_distiller(str(tmp_path / "b" / "teacher.pth"))
    with torch.no_grad():
        next(other.teacher.parameters()).add_(1e-3)
    evaluate = CountingEvaluate()
    for model in (one, other, one, other):
        teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
    assert evaluate.calls == 2 and len(files_under(cache_home)) == 2


@pytest.mark.parametrize("change", ["weights", "samples", "steps", "seed"])
def test_any_change_recomputes(cache_home: Path, teacher_dir: Path, change: str) -> None:
    model = toy_distiller(str(teacher_dir / "teacher.pth"))
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
    _, source = teacher_metrics(model, n, steps=steps, dataset=DATASET, seed=seed, evaluate=evaluate)
    assert source is None and evaluate.calls == 2
    entries = [json.loads(p.read_text())["entries"] for p in files_under(cache_home)]
    assert sum(len(e) for e in entries) == 2  # new weights: a file of their own; new settings: a second entry
    assert len(entries) == (2 if change == "weights" else 1)


def test_an_unwritable_cache_folder_warns_and_recomputes(tmp_path: Path, teacher_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch, fastgen_records) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache would go inside a file: cannot be written
    model = toy_distiller(str(teacher_dir / "teacher.pth"))
    evaluate = CountingEvaluate()
    for _ in range(2):
        metrics, source = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
        assert source is None and "energy_distance" in metrics
    assert evaluate.calls == 2
    warnings = [r.getMessage() for r in fastgen_records.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("could not cache the teacher's scores" in w and str(blocker) in w
                                      for w in warnings), warnings
    assert files_under(teacher_dir) == [teacher_dir / "teacher.pth"]  # no fallback to beside the teacher

    model = toy_distiller(None)  # no checkpoint: nothing to key a cache by
    _, source = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
    assert source is None and evaluate.calls == 3


def test_a_cache_beside_the_checkpoint_is_read_but_never_written(cache_home: Path, teacher_dir: Path) -> None:
    """The package ships ``digits_teacher.eval.json`` beside its teacher: a read-only seed."""
    model = toy_distiller(str(teacher_dir / "teacher.pth"))
    digest = weights_digest(model.teacher)
    key = cache_key(digest, DATASET, 100, 0, 3, model.config.guidance_scale, model.precision)
    seed = seed_path(teacher_dir / "teacher.pth")
    shipped = {"format": CACHE_FORMAT, "entries": {key: {"weights_sha256": digest, "metrics": {"shipped": 1.0}}}}
    seed.write_text(json.dumps(shipped))
    evaluate = CountingEvaluate()
    metrics, source = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=evaluate)
    assert metrics == {"shipped": 1.0} and source == seed and evaluate.calls == 0

    _, source = teacher_metrics(model, 120, steps=3, dataset=DATASET, evaluate=evaluate)  # not in the seed
    assert source is None and evaluate.calls == 1
    assert json.loads(seed.read_text()) == shipped  # the seed is untouched...
    assert files_under(teacher_dir) == sorted([teacher_dir / "teacher.pth", seed])
    assert files_under(cache_home) == [cache_path(teacher_dir / "teacher.pth", digest)]  # ...the new entry is here


def test_a_corrupt_cache_file_is_ignored_and_rewritten(cache_home: Path, teacher_dir: Path) -> None:
    model = toy_distiller(str(teacher_dir / "teacher.pth"))
    path = cache_path(teacher_dir / "teacher.pth", weights_digest(model.teacher))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    _, source = teacher_metrics(model, 100, steps=3, dataset=DATASET, evaluate=CountingEvaluate())
    assert source is None
    assert json.loads(path.read_text())["format"] == CACHE_FORMAT


@pytest.mark.slow
def test_the_shipped_quickstart_teacher_scores_reproduce() -> None:
    """``fastgen/assets/digits_teacher.eval.json`` holds what a fresh computation gives (5,000 samples, 18 Heun
    steps), so the quick-start's printed teacher row is the teacher's real score."""
    from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config

    config = create_config()
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.eval()
    path = seed_path(config.model.teacher_ckpt)
    evaluate = CountingEvaluate()
    shipped, source = teacher_metrics(model, 5000, steps=18, dataset="digits", evaluate=evaluate)
    assert source == path and evaluate.calls == 0, f"{path} has no entry for the shipped teacher"
    fresh = evaluate_model(model, 5000, seed=0, steps=18, net=model.teacher, dataset="digits")
    assert fresh["fd_digits"] == pytest.approx(shipped["fd_digits"], rel=1e-3)
    assert fresh["accuracy"] == pytest.approx(shipped["accuracy"], abs=2e-3)
