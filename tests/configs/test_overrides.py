"""apply_overrides: Hydra's override grammar on strict attrs configs and LazyCall dict nodes."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig

from fastgen.configs.config_utils import apply_overrides, load_config, strip_separator, validate_config
from fastgen.utils.errors import ConfigError


@pytest.fixture
def toy():
    return load_config("Toy/config_sft_toy")


@pytest.fixture
def digits():
    return load_config("Digits/config_sft_digits")


# ------------------------------------------------------------------------------------------- key=value
def test_seed_example_overrides(toy):
    result = apply_overrides(toy, ["trainer.max_iter=10000", "log_config.name=my_experiment"])
    assert result is toy  # in place, and returned
    assert toy.trainer.max_iter == 10000
    assert type(toy.trainer.max_iter) is int
    assert toy.log_config.name == "my_experiment"


def test_seed_example_with_lone_dash_separator(toy):
    apply_overrides(toy, ["-", "trainer.max_iter=10000", "log_config.name=my_experiment"])
    assert toy.trainer.max_iter == 10000
    assert toy.log_config.name == "my_experiment"


def test_strip_separator_drops_only_lone_dash():
    assert strip_separator(["-", "a=1", "-", "b=2"]) == ["a=1", "b=2"]


def test_unexpected_option_among_overrides_is_config_error(toy):
    with pytest.raises(ConfigError, match="--dryrun"):
        apply_overrides(toy, ["trainer.max_iter=3", "--dryrun"])


def test_set_attrs_fields_of_every_basic_type(toy):
    apply_overrides(
        toy,
        [
            "trainer.seed=7",
            "trainer.resume=false",
            "trainer.device=cpu",
            "model.guidance_scale=2",
            "model.condition_dropout=0.25",
            "model.precision=bfloat16",
            "model.input_shape=[3,16,16]",
            "log_config.wandb_mode=offline",
            "trainer.checkpointer.keep_last_n=3",
            "trainer.fsdp_reshard_after_forward=false",
            "credentials_dir=/secure/creds",
        ],
    )
    assert toy.trainer.seed == 7
    assert toy.trainer.resume is False
    assert toy.trainer.device == "cpu"
    assert toy.model.guidance_scale == 2.0 and type(toy.model.guidance_scale) is float
    assert toy.model.condition_dropout == 0.25
    assert toy.model.precision == "bfloat16"
    assert toy.model.input_shape == [3, 16, 16]
    assert toy.log_config.wandb_mode == "offline"
    assert toy.trainer.checkpointer.keep_last_n == 3
    assert toy.trainer.fsdp_reshard_after_forward is False
    assert toy.credentials_dir == "/secure/creds"
    validate_config(toy)


def test_union_field_accepts_bool_and_list(digits):
    apply_overrides(digits, ["model.use_ema=false"])
    assert digits.model.use_ema is False
    apply_overrides(digits, ["model.use_ema=[ema,ema_slow]"])
    assert digits.model.use_ema == ["ema", "ema_slow"]
    assert digits.model.ema_names == ["ema", "ema_slow"]


def test_set_lazycall_dict_keys(toy):
    apply_overrides(toy, ["dataloader_train.batch_size=32", "model.net_optimizer.lr=2e-4"])
    assert toy.dataloader_train.batch_size == 32
    assert toy.model.net_optimizer.lr == pytest.approx(2e-4)
    assert isinstance(toy.dataloader_train, DictConfig)
    # sibling keys and the target are untouched
    assert toy.dataloader_train._target_ == "fastgen.datasets.loader.build_dataloader"
    assert toy.dataloader_train.shuffle is True
    assert toy.dataloader_val.batch_size == 256


def test_set_nested_lazycall_keys(toy):
    apply_overrides(
        toy,
        [
            "dataloader_train.dataset.name=checkerboard",
            "model.net.backbone.hidden_dim=64",
            "trainer.callbacks.wandb.sample_iter=50",
        ],
    )
    assert toy.dataloader_train.dataset.name == "checkerboard"
    assert toy.model.net.backbone.hidden_dim == 64
    assert toy.trainer.callbacks.wandb.sample_iter == 50


def test_set_lazycall_target(toy):
    apply_overrides(toy, ["model.net_optimizer._target_=torch.optim.AdamW"])
    assert toy.model.net_optimizer._target_ == "torch.optim.AdamW"


def test_int_key_accepts_float_literal_for_float_field(toy):
    apply_overrides(toy, ["model.net_optimizer.lr=1"])  # an int where a float was: both numbers
    assert toy.model.net_optimizer.lr == 1


def test_overrides_apply_in_order(toy):
    apply_overrides(toy, ["trainer.max_iter=5", "trainer.max_iter=6"])
    assert toy.trainer.max_iter == 6


def test_value_with_equals_sign_and_quotes(toy):
    apply_overrides(toy, ["log_config.group='a=b c'"])
    assert toy.log_config.group == "a=b c"


def test_numeric_looking_string_for_str_field(toy):
    apply_overrides(toy, ["log_config.name=123"])
    assert toy.log_config.name == "123"


# ------------------------------------------------------------------------------------------- coercion
def test_scientific_notation_coerced_to_int(toy):
    apply_overrides(toy, ["trainer.max_iter=1e4"])
    assert toy.trainer.max_iter == 10000
    assert type(toy.trainer.max_iter) is int


def test_non_integral_float_rejected_for_int_field(toy):
    with pytest.raises(ConfigError, match=r"trainer\.max_iter"):
        apply_overrides(toy, ["trainer.max_iter=1.5"])


def test_wrong_type_names_field_and_expected_type(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["trainer.max_iter=abc"])
    message = str(info.value)
    assert "trainer.max_iter" in message
    assert "int" in message
    assert "abc" in message
    assert toy.trainer.max_iter == 2000  # unchanged


def test_bool_field_rejects_integer(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["trainer.resume=1"])
    assert "trainer.resume" in str(info.value)
    assert "bool" in str(info.value)
    assert toy.trainer.resume is True


def test_bool_field_rejects_string(toy):
    with pytest.raises(ConfigError, match=r"trainer\.ddp"):
        apply_overrides(toy, ["trainer.ddp=yes"])


def test_int_field_rejects_bool(toy):
    with pytest.raises(ConfigError, match=r"trainer\.seed"):
        apply_overrides(toy, ["trainer.seed=true"])


def test_literal_field_rejects_unknown_value(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["log_config.wandb_mode=bogus"])
    message = str(info.value)
    assert "log_config.wandb_mode" in message
    assert "bogus" in message
    assert "offline" in message  # the allowed values are listed
    assert toy.log_config.wandb_mode == "auto"


def test_literal_precision_rejects_unknown_value(toy):
    with pytest.raises(ConfigError, match=r"model\.precision"):
        apply_overrides(toy, ["model.precision=fp8"])


def test_list_field_rejects_scalar_and_wrong_items(toy):
    with pytest.raises(ConfigError, match=r"model\.input_shape"):
        apply_overrides(toy, ["model.input_shape=3"])
    with pytest.raises(ConfigError, match=r"model\.input_shape"):
        apply_overrides(toy, ["model.input_shape=[a,b]"])


def test_config_node_field_rejects_scalar(toy):
    with pytest.raises(ConfigError, match=r"trainer\.checkpointer"):
        apply_overrides(toy, ["trainer.checkpointer=5"])


def test_dict_key_with_int_value_rejects_string(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["dataloader_train.batch_size=abc"])
    message = str(info.value)
    assert "dataloader_train.batch_size" in message
    assert "abc" in message
    assert toy.dataloader_train.batch_size == 256


@pytest.mark.parametrize("value", ["true", "[1,2]", "{a: 1}"])
def test_dict_key_with_int_value_rejects_other_types(toy, value):
    with pytest.raises(ConfigError, match=r"dataloader_train\.batch_size"):
        apply_overrides(toy, [f"dataloader_train.batch_size={value}"])
    assert toy.dataloader_train.batch_size == 256


def test_dict_key_with_bool_value_rejects_number(toy):
    with pytest.raises(ConfigError, match=r"dataloader_train\.shuffle"):
        apply_overrides(toy, ["dataloader_train.shuffle=0"])


# ------------------------------------------------------------------------------------------- null
def test_null_on_optional_field(toy):
    apply_overrides(toy, ["trainer.validation_iter=null", "log_config.name=null", "dataloader_val=null"])
    assert toy.trainer.validation_iter is None
    assert toy.log_config.name is None
    assert toy.dataloader_val is None


def test_null_on_non_optional_field_is_config_error(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["trainer.max_iter=null"])
    assert "trainer.max_iter" in str(info.value)
    assert "null" in str(info.value)
    with pytest.raises(ConfigError, match=r"model\.net_optimizer"):
        apply_overrides(toy, ["model.net_optimizer=null"])


def test_null_on_dict_key(toy):
    apply_overrides(toy, ["dataloader_train.seed=null"])
    assert "seed" in toy.dataloader_train
    assert toy.dataloader_train.seed is None


def test_setting_a_key_below_a_null_node_is_config_error(toy):
    apply_overrides(toy, ["dataloader_val=null"])
    with pytest.raises(ConfigError, match="dataloader_val"):
        apply_overrides(toy, ["dataloader_val.batch_size=3"])


def test_replace_a_null_node_with_a_dict(toy):
    apply_overrides(toy, ["model.net_scheduler={_target_: torch.optim.lr_scheduler.ConstantLR, factor: 1.0}"])
    assert toy.model.net_scheduler._target_ == "torch.optim.lr_scheduler.ConstantLR"
    assert toy.model.net_scheduler.factor == 1.0
    assert isinstance(toy.model.net_scheduler, DictConfig)


# ------------------------------------------------------------------------------------------- unknown keys
def test_unknown_attrs_key_suggests_closest_field(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["trainer.max_itr=10"])
    message = str(info.value)
    assert "trainer.max_itr" in message
    assert "did you mean" in message
    assert "max_iter" in message


def test_unknown_top_level_key_suggests_closest_field(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["trainr.max_iter=10"])
    assert "did you mean" in str(info.value)
    assert "trainer" in str(info.value)


def test_unknown_dict_key_suggests_closest_key_and_plus(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["dataloader_train.batch_sise=32"])
    message = str(info.value)
    assert "did you mean" in message
    assert "batch_size" in message
    assert "+dataloader_train.batch_sise" in message  # how to add it on purpose


def test_unknown_key_in_method_subclass_field(toy):
    apply_overrides(toy, ["model.condition_dropout=0.3"])
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["model.condition_droput=0.3"])
    assert "condition_dropout" in str(info.value)


def test_key_below_scalar_is_config_error(toy):
    with pytest.raises(ConfigError):
        apply_overrides(toy, ["trainer.max_iter.x=1"])


def test_failing_override_names_the_key_in_the_message(toy):
    with pytest.raises(ConfigError, match=r"trainer\.checkpointer\.keep_last_n"):
        apply_overrides(toy, ["trainer.checkpointer.keep_last_n=many"])


def test_unparseable_override_is_config_error(toy):
    with pytest.raises(ConfigError, match="cannot parse"):
        apply_overrides(toy, ["trainer.max_iter=[1,"])


# ------------------------------------------------------------------------------------------- + and ++
def test_plus_adds_new_dict_key(toy):
    apply_overrides(toy, ["+dataloader_train.num_workers=4"])
    assert toy.dataloader_train.num_workers == 4


def test_plus_adds_list_value_seed_datatags(toy):
    apply_overrides(toy, ["-", "+dataloader_train.datatags=[WDS:/data/my_video_shards]"])
    assert list(toy.dataloader_train.datatags) == ["WDS:/data/my_video_shards"]


def test_plus_adds_nested_dict_path(toy):
    apply_overrides(toy, ["+trainer.callbacks.extra.flag=true"])
    assert toy.trainer.callbacks.extra.flag is True


def test_plus_adds_a_callback_lazycall(toy):
    apply_overrides(
        toy,
        ["+trainer.callbacks.ema={_target_: fastgen.callbacks.ema.EMACallback, ema_name: ema, beta: 0.99}"],
    )
    assert toy.trainer.callbacks.ema._target_ == "fastgen.callbacks.ema.EMACallback"
    assert toy.trainer.callbacks.ema.beta == 0.99
    assert list(toy.trainer.callbacks.keys())[-1] == "ema"
    validate_config(toy)


def test_plus_on_existing_dict_key_fails(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["+dataloader_train.batch_size=32"])
    assert "already exists" in str(info.value)
    assert toy.dataloader_train.batch_size == 256


def test_plus_on_existing_attrs_field_fails(toy):
    with pytest.raises(ConfigError, match="already exists"):
        apply_overrides(toy, ["+trainer.max_iter=5"])
    assert toy.trainer.max_iter == 2000


def test_plus_new_field_on_attrs_class_fails(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["+trainer.new_field=5"])
    assert "strict" in str(info.value)
    with pytest.raises(ConfigError):
        apply_overrides(toy, ["+log_config.extra=x"])
    with pytest.raises(ConfigError):
        apply_overrides(toy, ["++trainer.new_field=5"])


def test_plus_plus_sets_existing_and_adds_new(toy):
    apply_overrides(
        toy,
        ["++dataloader_train.batch_size=64", "++dataloader_train.pin_memory=true", "++trainer.max_iter=9"],
    )
    assert toy.dataloader_train.batch_size == 64
    assert toy.dataloader_train.pin_memory is True
    assert toy.trainer.max_iter == 9


def test_plus_plus_still_type_checks_attrs_fields(toy):
    with pytest.raises(ConfigError, match=r"trainer\.max_iter"):
        apply_overrides(toy, ["++trainer.max_iter=abc"])


def test_replace_dict_then_add(toy):
    apply_overrides(
        toy,
        [
            "trainer.callbacks={}",
            "+trainer.callbacks.grad_clip={_target_: fastgen.callbacks.grad_clip.GradClipCallback, grad_norm: 5.0}",
        ],
    )
    assert list(toy.trainer.callbacks.keys()) == ["grad_clip"]
    assert toy.trainer.callbacks.grad_clip.grad_norm == 5.0


# ------------------------------------------------------------------------------------------- ~ delete
def test_tilde_deletes_dict_key(toy):
    apply_overrides(toy, ["~trainer.callbacks.wandb", "~dataloader_train.shuffle"])
    assert "wandb" not in toy.trainer.callbacks
    assert "grad_clip" in toy.trainer.callbacks
    assert "shuffle" not in toy.dataloader_train


def test_tilde_with_matching_value_deletes(toy):
    apply_overrides(toy, ["~dataloader_train.batch_size=256"])
    assert "batch_size" not in toy.dataloader_train


def test_tilde_with_wrong_value_fails_and_keeps_key(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["~dataloader_train.batch_size=32"])
    assert "256" in str(info.value)
    assert toy.dataloader_train.batch_size == 256


def test_tilde_on_missing_dict_key_fails(toy):
    with pytest.raises(ConfigError, match="no such key"):
        apply_overrides(toy, ["~dataloader_train.no_such_key"])


def test_tilde_on_attrs_field_fails(toy):
    with pytest.raises(ConfigError) as info:
        apply_overrides(toy, ["~trainer.max_iter"])
    assert "null" in str(info.value)  # points at key=null instead
    assert toy.trainer.max_iter == 2000


def test_overrides_then_validate(toy):
    apply_overrides(toy, ["trainer.max_iter=10", "+dataloader_train.drop_last=false", "model.net_optimizer.lr=2e-4"])
    assert validate_config(toy) is toy


# ------------------------------------------------------------------------------------------- validate_config
def test_validate_config_catches_wrong_type_set_from_python(toy):
    toy.trainer.max_iter = "10"  # strictness checks names, not types; validation checks types
    with pytest.raises(ConfigError) as info:
        validate_config(toy)
    assert "trainer.max_iter" in str(info.value)
    assert "int" in str(info.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("log_config.wandb_mode", "bogus"),
        ("model.precision", "fp64"),
        ("trainer.resume", 1),
        ("model.input_shape", "2"),
        ("trainer.checkpointer.keep_last_n", 2.5),
        ("model.net_optimizer", None),
    ],
)
def test_validate_config_catches_wrong_values_set_from_python(toy, path, value):
    *parents, leaf = path.split(".")
    node = toy
    for part in parents:
        node = getattr(node, part)
    setattr(node, leaf, value)
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        validate_config(toy)


def test_validate_config_normalises_integral_float(toy):
    toy.trainer.max_iter = 1e4
    validate_config(toy)
    assert toy.trainer.max_iter == 10000
    assert type(toy.trainer.max_iter) is int


def test_validate_config_cross_field_rules(toy):
    toy.trainer.logging_iter = 0
    with pytest.raises(ConfigError, match="logging_iter"):
        validate_config(toy)


def test_validate_config_requires_net_and_data():
    from fastgen.configs.methods.config_sft import create_config

    with pytest.raises(ConfigError, match="model.net"):
        validate_config(create_config())


def test_validate_config_rejects_non_lazy_callback(toy):
    toy.trainer.callbacks["broken"] = {"grad_norm": 1.0}
    with pytest.raises(ConfigError, match=r"trainer\.callbacks\.broken"):
        validate_config(toy)


def test_validate_config_rejects_non_config():
    with pytest.raises(ConfigError):
        validate_config({"trainer": {}})


def test_float_override_of_an_int_dict_key_stays_int() -> None:
    from fastgen.configs.config_utils import apply_overrides, load_config
    from fastgen.utils.errors import ConfigError

    config = apply_overrides(load_config("Toy/config_sft_toy"), ["dataloader_train.batch_size=1e2"])
    assert config.dataloader_train.batch_size == 100 and isinstance(config.dataloader_train.batch_size, int)
    with pytest.raises(ConfigError, match="dataloader_train.batch_size"):
        apply_overrides(config, ["dataloader_train.batch_size=3.5"])
