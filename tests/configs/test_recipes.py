"""Every built-in recipe (``list_recipes()``) as a user meets it: it loads, validates, every ``LazyCall`` in it
names an importable target whose signature takes the given arguments, its callbacks build, ``fastgen dryrun``'s
code path prints its build plan (modules built on the meta device, memory estimate), and it round-trips through
the ``config.yaml`` a run writes - an equal config and the same YAML (so the same dry-run plan: the plan is computed
from the config alone)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import attrs
import pytest
from omegaconf import DictConfig, ListConfig

from fastgen.cli.common import resolve_config
from fastgen.cli.dryrun import show_plan
from fastgen.configs.config_utils import config_to_yaml, list_recipes, save_config_yaml
from fastgen.configs.instantiate import TARGET_KEY, instantiate, is_lazy, locate
from fastgen.profiling.estimate import build_meta_model

RECIPES = list_recipes()


def lazy_calls(node: Any, where: str) -> list[tuple[str, DictConfig]]:
    """Every ``LazyCall`` node under ``node`` (attrs config classes, dicts, lists), with its config key."""
    found: list[tuple[str, DictConfig]] = []
    if attrs.has(type(node)):
        for field in attrs.fields(type(node)):
            found += lazy_calls(getattr(node, field.name), f"{where}.{field.name}" if where else field.name)
    elif isinstance(node, (DictConfig, dict)):
        if is_lazy(node):
            found.append((where, node))
        for key, value in node.items():
            if key != TARGET_KEY:
                found += lazy_calls(value, f"{where}.{key}")
    elif isinstance(node, (ListConfig, list)):
        for i, value in enumerate(node):
            found += lazy_calls(value, f"{where}.{i}")
    return found


def test_the_recipe_list_is_complete() -> None:
    """The parametrisation below covers every recipe file (a recipe list that came back empty or short would
    make the tests pass vacuously)."""
    root = Path(__file__).resolve().parents[2] / "fastgen" / "configs" / "experiments"
    files = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("config_*.py"))
    assert RECIPES == files and len(RECIPES) >= 26


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_loads_validates_dry_runs_and_round_trips(recipe: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = resolve_config(recipe, [])  # what `fastgen dryrun --config RECIPE` and `fastgen train` resolve

    calls = lazy_calls(config, "")
    assert any(where == "model_class" for where, _ in calls) and any(where == "model.net" for where, _ in calls)
    for where, node in calls:
        target = locate(node[TARGET_KEY])  # ImportError names the path
        arguments = {k: v for k, v in node.items() if k != TARGET_KEY}
        try:
            inspect.signature(target).bind_partial(**arguments)
        except TypeError as exc:
            pytest.fail(f"{recipe}: {where} -> {node[TARGET_KEY]}: {exc}")
    for name, node in config.trainer.callbacks.items():  # the Trainer builds these first
        instantiate(node)

    show_plan(config, as_yaml=False)
    plan = capsys.readouterr().out
    assert "build plan" in plan and "memory per rank" in plan
    model = build_meta_model(config)
    for name, module in model.model_dict.items():
        assert f"{sum(p.numel() for p in module.parameters()):,}" in plan, f"no parameter count for {name}"

    path = tmp_path / "config.yaml"
    save_config_yaml(config, path)
    loaded = resolve_config(str(path), [])
    assert loaded == config  # equal configs: the dry-run plan, a function of the config alone, is the same
    assert config_to_yaml(loaded) == config_to_yaml(config)
