"""Strict config classes: misspelled fields, mutable defaults, subclasses, type coercion."""

from __future__ import annotations

import attrs
import pytest
from omegaconf import DictConfig, ListConfig

from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import (
    BaseConfig,
    BaseModelConfig,
    BaseTrainerConfig,
    CheckpointerConfig,
    LogConfig,
    WandbMode,
)
from fastgen.configs.methods.config_sft import SFTModelConfig
from fastgen.configs.schema import (
    CoercionError,
    build_from_mapping,
    closest,
    coerce,
    config_class,
    did_you_mean,
)
from fastgen.utils.errors import ConfigError

# (class, a misspelling, the field it should point to)
MISSPELLINGS = [
    (BaseConfig, "modle", "model"),
    (BaseConfig, "log_confg", "log_config"),
    (BaseModelConfig, "net_optimiser", "net_optimizer"),
    (BaseModelConfig, "input_shap", "input_shape"),
    (BaseTrainerConfig, "max_itr", "max_iter"),
    (BaseTrainerConfig, "callbaks", "callbacks"),
    (LogConfig, "projct", "project"),
    (LogConfig, "wandb_mod", "wandb_mode"),
    (CheckpointerConfig, "save_dri", "save_dir"),
    (CheckpointerConfig, "keep_last", "keep_last_n"),
    (SFTModelConfig, "condition_dropuot", "condition_dropout"),
    (SFTModelConfig, "precison", "precision"),  # inherited field
]
ALL_CLASSES = [BaseConfig, BaseModelConfig, BaseTrainerConfig, LogConfig, CheckpointerConfig, SFTModelConfig]


# ------------------------------------------------------------------------------------------ misspelled fields
@pytest.mark.parametrize(("cls", "typo", "field"), MISSPELLINGS, ids=lambda v: getattr(v, "__name__", v))
def test_assigning_misspelled_field_raises_attribute_error_naming_closest_field(cls, typo, field):
    config = cls()
    with pytest.raises(AttributeError) as info:
        setattr(config, typo, 1)
    message = str(info.value)
    assert repr(typo) in message
    assert repr(field) in message
    assert "did you mean" in message


@pytest.mark.parametrize(("cls", "typo", "field"), MISSPELLINGS, ids=lambda v: getattr(v, "__name__", v))
def test_reading_misspelled_field_raises_attribute_error_naming_closest_field(cls, typo, field):
    config = cls()
    with pytest.raises(AttributeError) as info:
        getattr(config, typo)
    assert repr(field) in str(info.value)
    assert repr(typo) in str(info.value)


def test_misspelled_assignment_leaves_no_attribute_behind():
    trainer = BaseTrainerConfig()
    with pytest.raises(AttributeError):
        trainer.max_itr = 5
    assert not hasattr(trainer, "max_itr")
    assert trainer.max_iter == 1000


def test_misspelled_nested_assignment_on_whole_config():
    config = BaseConfig()
    with pytest.raises(AttributeError, match="max_iter"):
        config.trainer.max_itr = 10
    with pytest.raises(AttributeError, match="save_dir"):
        config.trainer.checkpointer.savedir = "x"


def test_valid_assignment_still_works():
    config = BaseConfig()
    config.trainer.max_iter = 7
    config.log_config.name = "run"
    assert config.trainer.max_iter == 7
    assert config.log_config.name == "run"


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_config_instances_have_no_instance_dict(cls):
    # slotted attrs classes: there is nowhere to silently store a new attribute
    assert not hasattr(cls(), "__dict__")


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_config_classes_are_keyword_only(cls):
    first_field = attrs.fields(cls)[0].name
    with pytest.raises(TypeError):
        cls(getattr(cls(), first_field))


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_constructor_rejects_unknown_keyword(cls):
    with pytest.raises(TypeError):
        cls(no_such_field=1)


def test_unrelated_misspelling_lists_valid_keys():
    with pytest.raises(AttributeError) as info:
        LogConfig().zzzzzzzz = 1
    message = str(info.value)
    assert "valid keys" in message
    assert "project" in message


def test_private_dunder_lookup_is_plain_attribute_error():
    # copy/pickle probe dunders; they must not get a 'did you mean'
    with pytest.raises(AttributeError) as info:
        BaseTrainerConfig().__no_such_dunder__  # noqa: B018
    assert "did you mean" not in str(info.value)


# ------------------------------------------------------------------------------------------ mutable defaults
def _is_mutable(value):
    return isinstance(value, (list, dict, set, DictConfig, ListConfig)) or attrs.has(type(value))


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_no_mutable_default_is_shared_between_two_instances(cls):
    a, b = cls(), cls()
    assert a == b
    for f in attrs.fields(cls):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if _is_mutable(va):
            assert va is not vb, f"{cls.__name__}.{f.name} default is shared between instances"


def test_mutating_base_model_config_defaults_does_not_leak():
    a, b = BaseModelConfig(), BaseModelConfig()
    a.input_shape.append(99)
    a.net_optimizer.lr = 0.5
    a.net_optimizer.betas[0] = 0.0
    assert b.input_shape == [1, 8, 8]
    assert b.net_optimizer.lr == 1e-3
    assert list(b.net_optimizer.betas) == [0.9, 0.999]
    assert BaseModelConfig().input_shape == [1, 8, 8]


def test_mutating_trainer_defaults_does_not_leak():
    a, b = BaseTrainerConfig(), BaseTrainerConfig()
    a.callbacks["x"] = {"_target_": "builtins.dict"}
    a.checkpointer.save_dir = "/elsewhere"
    assert "x" not in b.callbacks
    assert b.checkpointer.save_dir == "checkpoints"
    assert len(BaseTrainerConfig().callbacks) == 0


def test_mutating_base_config_defaults_does_not_leak():
    a, b = BaseConfig(), BaseConfig()
    a.model.num_classes = 10
    a.model_class["_target_"] = "somewhere.Else"
    a.trainer.max_iter = 1
    a.log_config.project = "other"
    assert b.model.num_classes == 0
    assert b.model_class["_target_"] == "fastgen.methods.sft.SFTModel"
    assert b.trainer.max_iter == 1000
    assert b.log_config.project == "fastgen"


def test_mutating_sft_model_config_defaults_does_not_leak():
    a, b = SFTModelConfig(), SFTModelConfig()
    a.input_shape[0] = 3
    a.net_optimizer.lr = 1.0
    assert b.input_shape == [1, 8, 8]
    assert b.net_optimizer.lr == 1e-3


def test_recipe_edits_do_not_change_callback_presets_or_next_recipe():
    from fastgen.configs.experiments.Digits.config_sft_digits import create_config

    first = create_config()
    # the recipe itself edits its copies of the presets
    assert first.trainer.callbacks.ema.type == "power"
    assert EMA_CALLBACK["ema"].type == "constant"
    assert WANDB_CALLBACK["wandb"].num_samples == 64
    first.trainer.callbacks.grad_clip.grad_norm = 123.0
    first.model.input_shape.append(5)
    second = create_config()
    assert GradClip_CALLBACK["grad_clip"].grad_norm == 1.0
    assert second.trainer.callbacks.grad_clip.grad_norm == 1.0
    assert second.model.input_shape == [1, 8, 8]


# ------------------------------------------------------------------------------------------------ subclasses
def test_sft_model_config_is_strict_subclass_with_own_field():
    config = SFTModelConfig(condition_dropout=0.2)
    assert isinstance(config, BaseModelConfig)
    assert config.condition_dropout == 0.2
    with pytest.raises(AttributeError, match="condition_dropout"):
        config.condition_droput = 0.3
    # the base class does not have the subclass field
    with pytest.raises(AttributeError):
        BaseModelConfig().condition_dropout = 0.1


@config_class
class _ExtendedModelConfig(SFTModelConfig):
    extra_weight: float = 1.0
    extra_names: list[str] = attrs.field(factory=list)


def test_user_subclass_made_with_config_class_is_strict():
    config = _ExtendedModelConfig()
    config.extra_weight = 2.0
    config.condition_dropout = 0.5
    with pytest.raises(AttributeError, match="extra_weight"):
        config.extra_wieght = 3.0
    with pytest.raises(AttributeError, match="extra_weight"):
        config.extra_wieght  # noqa: B018
    assert not hasattr(config, "__dict__")
    other = _ExtendedModelConfig()
    config.extra_names.append("a")
    assert other.extra_names == []


def test_subclass_without_decorator_is_still_strict():
    class Plain(BaseTrainerConfig):
        pass

    config = Plain()
    with pytest.raises(AttributeError, match="max_iter"):
        config.max_itr = 3
    config.max_iter = 3
    assert config.max_iter == 3


def test_config_class_requires_strict_config_base():
    class NotStrict:
        x: int = 1

    with pytest.raises(TypeError, match="StrictConfig"):
        config_class(NotStrict)


def test_subclass_equality_distinguishes_classes():
    assert SFTModelConfig() != BaseModelConfig()
    assert SFTModelConfig() == SFTModelConfig()
    assert SFTModelConfig(condition_dropout=0.1) != SFTModelConfig()


# ------------------------------------------------------------------------------------------------- coerce
@pytest.mark.parametrize(
    ("value", "tp", "expected"),
    [
        (10000.0, int, 10000),
        (3, float, 3.0),
        ("x", str, "x"),
        (True, bool, True),
        (None, int | None, None),
        ("online", WandbMode, "online"),
        ([1, 2], list[int], [1, 2]),
        ((1, 2), list[int], [1, 2]),
        (["a"], bool | list[str], ["a"]),
        (False, bool | list[str], False),
    ],
)
def test_coerce_accepts_and_converts(value, tp, expected):
    result = coerce(value, tp)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "tp"),
    [
        (1.5, int),
        ("abc", int),
        (True, int),
        (1, bool),
        ("true", bool),
        (True, float),
        ("1.0", float),
        (None, int),
        ([1], str),
        ({"a": 1}, str),
        ("x", list[int]),
        (["a"], list[int]),
        (3, dict),
    ],
)
def test_coerce_rejects(value, tp):
    with pytest.raises(CoercionError):
        coerce(value, tp)


def test_coerce_literal():
    from typing import Literal

    assert coerce("bfloat16", Literal["float32", "bfloat16"]) == "bfloat16"
    with pytest.raises(CoercionError, match="float32"):
        coerce("fp8", Literal["float32", "bfloat16"])


def test_coerce_mapping_to_config_class():
    built = coerce({"save_dir": "/x", "keep_last_n": 2}, CheckpointerConfig)
    assert built == CheckpointerConfig(save_dir="/x", keep_last_n=2)


def test_build_from_mapping_is_strict():
    with pytest.raises(ConfigError) as info:
        build_from_mapping(BaseTrainerConfig, {"max_itr": 3})
    assert "max_itr" in str(info.value)
    assert "max_iter" in str(info.value)
    with pytest.raises(ConfigError, match=r"trainer\.max_iter"):
        build_from_mapping(BaseConfig, {"trainer": {"max_iter": "abc"}})


def test_build_from_mapping_class_key_must_be_a_subclass():
    with pytest.raises(ConfigError, match="is not a BaseModelConfig"):
        build_from_mapping(BaseModelConfig, {"_class_": "fastgen.configs.config.LogConfig"})
    with pytest.raises(ConfigError):
        build_from_mapping(BaseModelConfig, {"_class_": "fastgen.no_such_module.Thing"})
    built = build_from_mapping(BaseModelConfig, {"_class_": "fastgen.configs.methods.config_sft.SFTModelConfig"})
    assert type(built) is SFTModelConfig


def test_closest_and_did_you_mean():
    assert closest("max_itr", ["max_iter", "seed", "device"])[0] == "max_iter"
    assert "did you mean 'max_iter'" in did_you_mean("max_itr", ["max_iter", "seed"])
    assert did_you_mean("qqqq", ["alpha", "beta"]).startswith("valid keys")
