"""LazyCall / instantiate: deferred construction from import-path targets."""

from __future__ import annotations

import collections
import datetime
import fractions

import pytest
from omegaconf import DictConfig, OmegaConf

from fastgen.configs.instantiate import TARGET_KEY, LazyCall, instantiate, is_lazy, locate, target_path


def module_level_function(a: int = 1, b: int = 2) -> tuple[int, int]:
    return a, b


module_level_lambda = lambda: 42  # noqa: E731 - deliberately a lambda: it has no importable name


# ------------------------------------------------------------------------------------------- the seed usage
def test_seed_usage_builds_sft_model_from_toy_recipe():
    import torch

    from fastgen.configs.experiments.Toy.config_sft_toy import create_config
    from fastgen.methods.sft import SFTModel

    config = create_config()  # config.model_class is a deferred LazyCall
    assert is_lazy(config.model_class)
    model = instantiate(config.model_class, config=config.model)
    assert isinstance(model, SFTModel)
    assert isinstance(model, torch.nn.Module)
    assert model.config is config.model  # the attrs config is passed through unchanged
    assert model.num_classes == 0
    assert sum(p.numel() for p in model.net.parameters()) > 0


def test_seed_usage_on_loaded_recipe_builds_sft_model():
    from fastgen.configs.config_utils import load_config
    from fastgen.methods.sft import SFTModel

    config = load_config("Toy/config_sft_toy")
    model = instantiate(config.model_class, config=config.model)
    assert type(model) is SFTModel


def test_instantiate_does_not_modify_the_lazy_node():
    from fastgen.configs.experiments.Toy.config_sft_toy import create_config

    config = create_config()
    before = OmegaConf.to_container(config.model.net)
    instantiate(config.model.net)
    assert OmegaConf.to_container(config.model.net) == before


# ------------------------------------------------------------------------------------------------ LazyCall
def test_lazycall_records_import_path_not_object():
    node = LazyCall(fractions.Fraction)(numerator=1, denominator=3)
    assert isinstance(node, DictConfig)
    assert node[TARGET_KEY] == "fractions.Fraction"
    assert isinstance(node[TARGET_KEY], str)
    assert node.numerator == 1 and node.denominator == 3


def test_lazycall_accepts_target_string():
    node = LazyCall("fractions.Fraction")(numerator=2, denominator=4)
    assert node[TARGET_KEY] == "fractions.Fraction"
    assert instantiate(node) == fractions.Fraction(1, 2)


def test_lazycall_of_builtin_and_nested_attribute():
    assert LazyCall(dict)()[TARGET_KEY] == "builtins.dict"
    assert target_path(fractions.Fraction.from_float) == "fractions.Fraction.from_float"
    node = LazyCall(fractions.Fraction.from_float)(f=0.5)
    assert instantiate(node) == fractions.Fraction(1, 2)


def test_lazycall_of_module_level_function_in_test_module():
    node = LazyCall(module_level_function)(a=5)
    assert node[TARGET_KEY].endswith(".module_level_function")
    assert instantiate(node) == (5, 2)


def test_instantiate_nested_lazycalls_in_dicts_and_lists():
    node = LazyCall(dict)(
        delta=LazyCall(datetime.timedelta)(days=1, hours=2),
        items=[LazyCall(fractions.Fraction)(numerator=1, denominator=3), 7, {"inner": LazyCall(collections.Counter)()}],
        plain={"x": 1},
    )
    built = instantiate(node)
    assert built["delta"] == datetime.timedelta(days=1, hours=2)
    assert built["items"][0] == fractions.Fraction(1, 3)
    assert built["items"][1] == 7
    assert isinstance(built["items"][2]["inner"], collections.Counter)
    # plain containers arrive as plain python objects, not omegaconf nodes
    assert type(built["plain"]) is dict
    assert built["plain"] == {"x": 1}


def test_instantiate_deeply_nested():
    node = LazyCall(dict)(a=LazyCall(dict)(b=LazyCall(dict)(c=LazyCall(datetime.timedelta)(seconds=3))))
    assert instantiate(node) == {"a": {"b": {"c": datetime.timedelta(seconds=3)}}}


def test_instantiate_keyword_overrides_replace_and_add():
    node = LazyCall(module_level_function)(a=1, b=2)
    assert instantiate(node, b=20) == (1, 20)
    obj = object()
    built = instantiate(LazyCall(dict)(x=1), y=obj)
    assert built["y"] is obj  # overrides pass through unconverted


def test_instantiate_from_plain_dict_node():
    assert instantiate({"_target_": "datetime.timedelta", "minutes": 2}) == datetime.timedelta(minutes=2)


def test_instantiate_none_returns_none():
    assert instantiate(None) is None


def test_instantiate_rejects_non_lazy_node():
    with pytest.raises(TypeError, match="_target_"):
        instantiate({"lr": 1})
    with pytest.raises(TypeError):
        instantiate(3)


def test_instantiate_recipe_optimizer_with_params():
    import torch

    from fastgen.configs.experiments.Toy.config_sft_toy import create_config

    config = create_config()
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = instantiate(config.model.net_optimizer, params=params)
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert list(optimizer.param_groups[0]["betas"]) == [0.9, 0.999]


# ----------------------------------------------------------------------------------------------- bad targets
@pytest.mark.parametrize(
    "target",
    [
        "fastgen.no_such_module.Thing",
        "no_such_top_level_package_xyz.Thing",
        "fastgen.configs.config.NoSuchConfig",
        "fractions.Fraction.no_such_attribute",
    ],
)
def test_bad_target_raises_import_error_naming_it(target):
    with pytest.raises(ImportError) as info:
        instantiate(LazyCall(target)())
    assert target in str(info.value)


def test_bad_nested_target_raises_import_error_naming_it():
    node = LazyCall(dict)(inner=LazyCall("fastgen.networks.NoSuchNet")())
    with pytest.raises(ImportError, match=r"fastgen\.networks\.NoSuchNet"):
        instantiate(node)


def test_locate_finds_modules_classes_and_nested_attributes():
    import fastgen.configs.config as config_module

    assert locate("fastgen.configs.config.BaseConfig") is config_module.BaseConfig
    assert locate("fractions.Fraction.from_float") == fractions.Fraction.from_float
    assert locate("datetime.timedelta") is datetime.timedelta


def test_lazycall_of_local_function_raises_type_error():
    def local_function():
        return 1

    with pytest.raises(TypeError, match="importable"):
        LazyCall(local_function)


def test_lazycall_of_local_class_raises_type_error():
    class LocalClass:
        pass

    with pytest.raises(TypeError, match="importable"):
        LazyCall(LocalClass)


def test_lazycall_of_local_lambda_raises_type_error():
    with pytest.raises(TypeError):
        LazyCall(lambda: 1)


def test_lazycall_of_partial_raises_type_error():
    import functools

    with pytest.raises(TypeError):
        LazyCall(functools.partial(dict, a=1))


def test_lazycall_of_module_level_lambda_raises_type_error():
    # A module-level lambda has __qualname__ '<lambda>': 'module.<lambda>' is not an import path, so LazyCall
    # must reject it up front like any other non-importable target instead of failing later in instantiate.
    with pytest.raises(TypeError):
        LazyCall(module_level_lambda)
