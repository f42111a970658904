"""config_to_yaml / load_config(config.yaml): an equal config back, secrets redacted, atomic writes."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fastgen.configs.config import BaseConfig, BaseModelConfig
from fastgen.configs.config_utils import (
    REDACTED,
    apply_overrides,
    config_to_dict,
    config_to_yaml,
    load_config,
    save_config_yaml,
)
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_sft import SFTModelConfig
from fastgen.utils.errors import ConfigError

RECIPES = ["Toy/config_sft_toy", "Digits/config_sft_digits"]
SECRET_ENV_VARS = ("WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def no_secrets_in_environment(monkeypatch):
    """Round trips must not depend on credentials that happen to be exported in the developer's shell."""
    for name in SECRET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def round_trip(config: BaseConfig, folder: Path) -> BaseConfig:
    path = folder / "config.yaml"
    path.write_text(config_to_yaml(config))
    return load_config(path)


# ------------------------------------------------------------------------------------------------ round trip
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_round_trip_gives_equal_config(recipe, tmp_path):
    config = load_config(recipe)
    loaded = round_trip(config, tmp_path)
    assert loaded == config


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_round_trip_is_stable_yaml(recipe, tmp_path):
    config = load_config(recipe)
    text = config_to_yaml(config)
    assert config_to_yaml(round_trip(config, tmp_path)) == text


def test_credentials_dir_survives_round_trip(tmp_path):
    # credentials_dir is the *folder* holding credential files, not a secret: it must be written as it is.
    config = load_config("Toy/config_sft_toy")
    config.credentials_dir = "/secure/team/credentials/"
    text = config_to_yaml(config)
    assert "/secure/team/credentials/" in text
    assert round_trip(config, tmp_path).credentials_dir == "/secure/team/credentials/"


@pytest.mark.parametrize("recipe", RECIPES)
def test_round_trip_after_overrides(recipe, tmp_path):
    config = load_config(recipe)
    apply_overrides(
        config,
        [
            "-",
            "trainer.max_iter=10000",
            "log_config.name=my_experiment",
            "model.net_optimizer.lr=2e-4",
            "dataloader_train.batch_size=32",
            "+dataloader_train.datatags=[WDS:/data/my_video_shards]",
            "trainer.validation_iter=null",
            "model.use_ema=[ema,ema_slow]",
            "~trainer.callbacks.wandb",
            "trainer.checkpointer.keep_last_n=2",
            "log_config.wandb_mode=offline",
        ],
    )
    loaded = round_trip(config, tmp_path)
    assert loaded == config
    assert loaded.trainer.max_iter == 10000
    assert loaded.log_config.name == "my_experiment"
    assert loaded.model.net_optimizer.lr == pytest.approx(2e-4)
    assert list(loaded.dataloader_train.datatags) == ["WDS:/data/my_video_shards"]
    assert loaded.trainer.validation_iter is None
    assert loaded.model.use_ema == ["ema", "ema_slow"]
    assert "wandb" not in loaded.trainer.callbacks


def test_method_config_subclass_survives_round_trip(tmp_path):
    config = load_config("Digits/config_sft_digits")
    assert type(config.model) is SFTModelConfig
    loaded = round_trip(config, tmp_path)
    assert type(loaded.model) is SFTModelConfig
    assert loaded.model.condition_dropout == pytest.approx(0.1)
    assert loaded.model == config.model


def test_class_recorded_only_where_it_differs_from_schema():
    data = config_to_dict(load_config("Toy/config_sft_toy"))
    assert data["model"]["_class_"] == "fastgen.configs.methods.config_sft.SFTModelConfig"
    assert "_class_" not in data["trainer"]
    assert "_class_" not in data["trainer"]["checkpointer"]
    assert "_class_" not in data["log_config"]


def test_base_model_config_stays_base_after_round_trip(tmp_path):
    config = BaseConfig()
    config.trainer.max_iter = 3
    loaded = round_trip(config, tmp_path)
    assert type(loaded.model) is BaseModelConfig
    assert loaded == config


def test_targets_are_import_paths_in_yaml():
    text = config_to_yaml(load_config("Toy/config_sft_toy"))
    data = OmegaConf.to_container(OmegaConf.create(text))
    assert data["model_class"] == {"_target_": "fastgen.methods.sft.SFTModel"}
    assert data["model"]["net"]["_target_"] == "fastgen.networks.diffusion_net.DiffusionNet"
    assert data["dataloader_train"]["dataset"]["_target_"] == "fastgen.datasets.toy.ToyDataset"


def test_round_trip_keeps_value_types(tmp_path):
    config = load_config("Toy/config_sft_toy")
    config.model.guidance_scale = 2.0
    config.model.net_optimizer.eps = 1e-8
    loaded = round_trip(config, tmp_path)
    assert type(loaded.model.guidance_scale) is float
    assert type(loaded.model.net_optimizer.eps) is float
    assert loaded.model.net_optimizer.eps == 1e-8
    assert type(loaded.trainer.max_iter) is int
    assert type(loaded.trainer.resume) is bool
    assert loaded.model.input_shape == [2]
    assert list(loaded.model.net_optimizer.betas) == [0.9, 0.999]


def test_callback_order_survives_round_trip(tmp_path):
    config = load_config("Digits/config_sft_digits")
    loaded = round_trip(config, tmp_path)
    assert list(loaded.trainer.callbacks.keys()) == ["grad_clip", "ema", "wandb"]


def test_loaded_yaml_config_still_accepts_overrides(tmp_path):
    loaded = round_trip(load_config("Toy/config_sft_toy"), tmp_path)
    apply_overrides(loaded, ["dataloader_train.batch_size=16", "trainer.max_iter=5"])
    assert loaded.dataloader_train.batch_size == 16
    with pytest.raises(ConfigError, match="did you mean"):
        apply_overrides(loaded, ["trainer.max_itr=5"])


def test_loaded_yaml_config_is_strict(tmp_path):
    loaded = round_trip(load_config("Toy/config_sft_toy"), tmp_path)
    with pytest.raises(AttributeError, match="condition_dropout"):
        loaded.model.condition_droput = 0.2


def test_loaded_yaml_config_builds_the_model(tmp_path):
    from fastgen.configs.instantiate import instantiate
    from fastgen.methods.sft import SFTModel

    loaded = round_trip(load_config("Toy/config_sft_toy"), tmp_path)
    assert isinstance(instantiate(loaded.model_class, config=loaded.model), SFTModel)


def test_user_defined_method_config_class_round_trips(tmp_path, monkeypatch):
    (tmp_path / "cfg_user_method_class.py").write_text(
        textwrap.dedent(
            """
            from fastgen.configs.experiments.Toy.config_sft_toy import create_config as base_create_config
            from fastgen.configs.methods.config_sft import SFTModelConfig
            from fastgen.configs.schema import config_class


            @config_class
            class MyModelConfig(SFTModelConfig):
                my_weight: float = 0.5


            def create_config():
                config = base_create_config()
                old = config.model
                config.model = MyModelConfig(net=old.net, input_shape=old.input_shape, my_weight=0.75)
                return config
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    config = load_config("cfg_user_method_class.py")
    loaded = round_trip(config, tmp_path)
    assert type(loaded.model).__name__ == "MyModelConfig"
    assert loaded.model.my_weight == 0.75
    assert loaded == config


# ------------------------------------------------------------------------------------------------ bad YAML
def test_yaml_with_unknown_key_is_config_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  max_itr: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "trainer.max_itr" in str(info.value)
    assert "max_iter" in str(info.value)


def test_yaml_with_wrong_type_is_config_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  max_iter: abc\n")
    with pytest.raises(ConfigError, match=r"trainer\.max_iter"):
        load_config(path)


def test_yaml_with_bad_class_is_config_error(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text("model:\n  _class_: fastgen.configs.config.LogConfig\n")
    with pytest.raises(ConfigError, match="model"):
        load_config(path)


@pytest.mark.parametrize("text", ["trainer: [unclosed\n", "- just\n- a list\n", "42\n"])
def test_malformed_yaml_is_config_error(text, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


def test_partial_yaml_fills_defaults(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  max_iter: 5\nlog_config:\n  name: partial\n")
    config = load_config(path)
    expected = BaseConfig()
    expected.trainer.max_iter = 5
    expected.log_config.name = "partial"
    assert config == expected


# ------------------------------------------------------------------------------------------------- secrets
def test_lazycall_api_key_kwarg_is_redacted():
    config = load_config("Toy/config_sft_toy")
    config.trainer.callbacks["vlm"] = LazyCall("fastgen.callbacks.vlm.VLMLogger")(
        api_key="sk-test-THIS-MUST-NOT-LEAK-1234", base_url="http://localhost:8000/v1"
    )
    text = config_to_yaml(config)
    assert "sk-test-THIS-MUST-NOT-LEAK-1234" not in text
    assert REDACTED in text
    assert "http://localhost:8000/v1" in text  # non-secret siblings are kept
    assert "sk-test-THIS-MUST-NOT-LEAK-1234" in config_to_yaml(config, redact_secrets=False)


@pytest.mark.parametrize("key", ["api_key", "apikey", "openai_api_key", "token", "hf_token", "password", "client_secret"])
def test_secret_named_keys_are_redacted(key):
    config = load_config("Toy/config_sft_toy")
    apply_overrides(config, [f"+model.net.backbone.{key}=hunter2-secret-value"])
    assert "hunter2-secret-value" not in config_to_yaml(config)


def test_secret_nested_in_list_under_secret_key_is_redacted():
    config = load_config("Toy/config_sft_toy")
    config.dataloader_train["auth_token"] = ["tok-AAA-secret", "tok-BBB-secret"]
    text = config_to_yaml(config)
    assert "tok-AAA-secret" not in text and "tok-BBB-secret" not in text


def test_wandb_api_key_env_value_is_redacted_anywhere(monkeypatch):
    secret = "wandb-0123456789abcdef-secret"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    config = load_config("Toy/config_sft_toy")
    config.log_config.wandb_entity = secret
    config.dataloader_train["datatags"] = ["WDS:/data", secret]
    apply_overrides(config, [f"+trainer.callbacks.wandb.note={secret}"])
    text = config_to_yaml(config)
    assert secret not in text
    assert "WDS:/data" in text
    assert secret in config_to_yaml(config, redact_secrets=False)


def test_other_credential_env_values_are_redacted(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-zzz-999")
    config = load_config("Toy/config_sft_toy")
    config.trainer.checkpointer.s3_container = "aws-secret-zzz-999"
    assert "aws-secret-zzz-999" not in config_to_yaml(config)


def test_saved_yaml_has_secrets_redacted(tmp_path, monkeypatch):
    secret = "wandb-saved-file-secret-42"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    config = load_config("Toy/config_sft_toy")
    config.log_config.wandb_entity = secret
    config.trainer.callbacks.wandb["api_key"] = "another-secret-77"
    path = tmp_path / "run" / "config.yaml"
    save_config_yaml(config, path)
    text = path.read_text()
    assert secret not in text
    assert "another-secret-77" not in text


def test_redaction_does_not_modify_the_config(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-in-config-xyz")
    config = load_config("Toy/config_sft_toy")
    config.log_config.wandb_entity = "secret-in-config-xyz"
    config_to_yaml(config)
    assert config.log_config.wandb_entity == "secret-in-config-xyz"


# -------------------------------------------------------------------------------------------- save_config_yaml
def test_save_config_yaml_writes_loadable_file_and_no_temp_files(tmp_path):
    config = load_config("Digits/config_sft_digits")
    path = tmp_path / "run_dir" / "config.yaml"
    save_config_yaml(config, path)
    assert sorted(os.listdir(path.parent)) == ["config.yaml"]
    assert path.read_text() == config_to_yaml(config)
    assert load_config(path) == config


def test_save_config_yaml_overwrites_atomically(tmp_path):
    path = tmp_path / "config.yaml"
    first = load_config("Toy/config_sft_toy")
    save_config_yaml(first, path)
    second = load_config("Toy/config_sft_toy")
    second.trainer.max_iter = 42
    save_config_yaml(second, str(path))  # str paths work too
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
    assert load_config(path).trainer.max_iter == 42


def test_save_config_yaml_failure_leaves_no_temp_file(tmp_path):
    target = tmp_path / "config.yaml"
    target.mkdir()  # a directory where the file should go: the final rename fails
    with pytest.raises(OSError):
        save_config_yaml(load_config("Toy/config_sft_toy"), target)
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
    assert target.is_dir() and not any(target.iterdir())


def test_interpolations_and_plural_secret_keys(tmp_path, monkeypatch) -> None:
    from fastgen.configs.config_utils import config_to_yaml, load_config
    from fastgen.configs.instantiate import LazyCall

    config = load_config("Toy/config_sft_toy")
    config.trainer.callbacks["probe"] = LazyCall("fastgen.callbacks.callback.Callback")()
    config.trainer.callbacks.probe["steps"] = "${trainer.max_iter}"
    config.trainer.callbacks.probe["api_keys"] = ["k-one", "k-two"]
    text = config_to_yaml(config)
    assert "${trainer.max_iter}" in text
    assert "k-one" not in text and "k-two" not in text
