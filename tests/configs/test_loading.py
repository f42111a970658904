"""load_config: .py files from any working directory, built-in recipe names, and clear errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fastgen.configs.config import BaseConfig
from fastgen.configs.config_utils import list_recipes, load_config, resolve_recipe
from fastgen.configs.methods.config_sft import SFTModelConfig
from fastgen.utils.errors import ConfigError, UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_FILE = REPO_ROOT / "fastgen" / "configs" / "experiments" / "Toy" / "config_sft_toy.py"

SIMPLE_CONFIG = """
from fastgen.configs.config import BaseConfig

def create_config():
    config = BaseConfig()
    config.trainer.max_iter = {max_iter}
    return config
"""

# The seed's custom-config example, on the Toy recipe.
CUSTOM_CONFIG = """
from fastgen.configs.experiments.Toy.config_sft_toy import create_config as base_create_config

def create_config():
    config = base_create_config()
    config.dataloader_train.batch_size = 32
    return config
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def toy_reference() -> BaseConfig:
    from fastgen.configs.experiments.Toy.config_sft_toy import create_config

    config = create_config()
    config.log_config.name = "config_sft_toy"
    return config


# ------------------------------------------------------------------------------------------------ .py files
def test_load_relative_path(tmp_path, monkeypatch):
    write(tmp_path / "cfg_relative_plain.py", SIMPLE_CONFIG.format(max_iter=11))
    monkeypatch.chdir(tmp_path)
    config = load_config("cfg_relative_plain.py")
    assert isinstance(config, BaseConfig)
    assert config.trainer.max_iter == 11


def test_load_dot_slash_relative_path(tmp_path, monkeypatch):
    write(tmp_path / "cfg_dot_slash.py", SIMPLE_CONFIG.format(max_iter=12))
    monkeypatch.chdir(tmp_path)
    assert load_config("./cfg_dot_slash.py").trainer.max_iter == 12


def test_load_relative_path_in_subfolder(tmp_path, monkeypatch):
    write(tmp_path / "my_experiments_sub" / "cfg_in_subfolder.py", SIMPLE_CONFIG.format(max_iter=13))
    monkeypatch.chdir(tmp_path)
    assert load_config("my_experiments_sub/cfg_in_subfolder.py").trainer.max_iter == 13
    assert load_config("./my_experiments_sub/cfg_in_subfolder.py").trainer.max_iter == 13


def test_load_absolute_path(tmp_path, monkeypatch):
    path = write(tmp_path / "cfg_absolute.py", SIMPLE_CONFIG.format(max_iter=14))
    monkeypatch.chdir(tmp_path)
    assert load_config(str(path)).trainer.max_iter == 14
    assert load_config(path).trainer.max_iter == 14  # a PathLike works too


def test_load_absolute_path_from_another_working_directory(tmp_path, monkeypatch):
    path = write(tmp_path / "x" / "cfg_abs_elsewhere.py", SIMPLE_CONFIG.format(max_iter=15))
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    config = load_config(str(path))
    assert config.trainer.max_iter == 15
    assert config.log_config.name == "cfg_abs_elsewhere"


def test_load_parent_relative_path_from_sibling_directory(tmp_path, monkeypatch):
    write(tmp_path / "x" / "cfg_parent_rel.py", SIMPLE_CONFIG.format(max_iter=16))
    (tmp_path / "y").mkdir()
    monkeypatch.chdir(tmp_path / "y")
    config = load_config("../x/cfg_parent_rel.py")
    assert config.trainer.max_iter == 16
    assert config.log_config.name == "cfg_parent_rel"


def test_two_files_with_the_same_name_in_different_folders_load_separately(tmp_path, monkeypatch):
    a = write(tmp_path / "a" / "cfg_same_name.py", SIMPLE_CONFIG.format(max_iter=21))
    b = write(tmp_path / "b" / "cfg_same_name.py", SIMPLE_CONFIG.format(max_iter=22))
    monkeypatch.chdir(tmp_path)
    assert load_config(str(a)).trainer.max_iter == 21
    assert load_config(str(b)).trainer.max_iter == 22
    monkeypatch.chdir(tmp_path / "a")
    assert load_config("cfg_same_name.py").trainer.max_iter == 21
    monkeypatch.chdir(tmp_path / "b")
    assert load_config("cfg_same_name.py").trainer.max_iter == 22


def test_config_file_can_import_a_helper_beside_it(tmp_path, monkeypatch):
    write(tmp_path / "cfgs" / "helper_values_mod.py", "MAX_ITER = 77\n")
    write(
        tmp_path / "cfgs" / "cfg_with_helper.py",
        """
        from helper_values_mod import MAX_ITER
        from fastgen.configs.config import BaseConfig

        def create_config():
            config = BaseConfig()
            config.trainer.max_iter = MAX_ITER
            return config
        """,
    )
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    assert load_config("../cfgs/cfg_with_helper.py").trainer.max_iter == 77


def test_seed_custom_config_example(tmp_path, monkeypatch):
    write(tmp_path / "config_sft_toy_small.py", CUSTOM_CONFIG)
    monkeypatch.chdir(tmp_path)
    config = load_config("config_sft_toy_small.py")
    assert config.dataloader_train.batch_size == 32
    assert isinstance(config.model, SFTModelConfig)
    assert config.log_config.name == "config_sft_toy_small"
    expected = toy_reference()
    expected.dataloader_train.batch_size = 32
    expected.log_config.name = "config_sft_toy_small"
    expected.import_paths = [str(tmp_path)]  # the config file's folder (also the working directory), recorded
    assert config == expected


def test_seed_custom_config_example_from_another_directory(tmp_path, monkeypatch):
    path = write(tmp_path / "mine" / "config_sft_toy_small2.py", CUSTOM_CONFIG)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    by_absolute = load_config(str(path))
    by_relative = load_config("../mine/config_sft_toy_small2.py")
    assert by_absolute.dataloader_train.batch_size == 32
    assert by_absolute == by_relative
    # the base recipe is unaffected
    assert toy_reference().dataloader_train.batch_size == 256


def test_each_load_builds_a_fresh_config(tmp_path, monkeypatch):
    write(tmp_path / "cfg_fresh.py", SIMPLE_CONFIG.format(max_iter=5))
    monkeypatch.chdir(tmp_path)
    first = load_config("cfg_fresh.py")
    first.trainer.max_iter = 999
    assert load_config("cfg_fresh.py").trainer.max_iter == 5


# -------------------------------------------------------------------------------------------- log_config.name
def test_log_config_name_defaults_to_file_stem(tmp_path, monkeypatch):
    write(tmp_path / "my_fancy_run.py", SIMPLE_CONFIG.format(max_iter=1))
    monkeypatch.chdir(tmp_path)
    assert load_config("my_fancy_run.py").log_config.name == "my_fancy_run"


def test_log_config_name_set_by_file_is_kept(tmp_path, monkeypatch):
    write(
        tmp_path / "cfg_named.py",
        """
        from fastgen.configs.config import BaseConfig

        def create_config():
            config = BaseConfig()
            config.log_config.name = "explicit_name"
            return config
        """,
    )
    monkeypatch.chdir(tmp_path)
    assert load_config("cfg_named.py").log_config.name == "explicit_name"


def test_recipe_name_defaults_log_name_to_recipe_stem():
    assert load_config("Toy/config_sft_toy").log_config.name == "config_sft_toy"
    assert load_config("Digits/config_sft_digits").log_config.name == "config_sft_digits"


# ---------------------------------------------------------------------------------------------- recipe names
@pytest.mark.parametrize("name", ["Toy/config_sft_toy", "Toy.config_sft_toy", "config_sft_toy", "Toy/config_sft_toy.py"])
def test_recipe_names_load_the_toy_recipe(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository
    assert load_config(name) == toy_reference()


def test_seed_recipe_path_from_repository_root(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert load_config("fastgen/configs/experiments/Toy/config_sft_toy.py") == toy_reference()


def test_seed_recipe_path_from_directory_that_is_not_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "fastgen").exists()
    config = load_config("fastgen/configs/experiments/Toy/config_sft_toy.py")
    assert config == toy_reference()
    assert isinstance(config.model, SFTModelConfig)


def test_recipe_absolute_path_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(str(TOY_FILE)) == toy_reference()


def test_list_and_resolve_recipes():
    recipes = list_recipes()
    assert "Toy/config_sft_toy" in recipes
    assert "Digits/config_sft_digits" in recipes
    assert resolve_recipe("Toy.config_sft_toy") == TOY_FILE
    assert resolve_recipe("sft_toy") == TOY_FILE
    assert resolve_recipe("no_such_recipe_anywhere") is None


# ---------------------------------------------------------------------------------------------------- errors
def test_missing_file_is_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        load_config("no_such_config_file.py")
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "absent" / "cfg.py"))
    with pytest.raises(ConfigError, match="not found"):
        load_config("./nowhere/cfg.py")


def test_missing_yaml_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "config.yaml")


def test_config_error_is_a_usage_error():
    assert issubclass(ConfigError, UsageError)
    assert ConfigError.exit_code == 2


def test_file_without_create_config_is_config_error(tmp_path, monkeypatch):
    write(tmp_path / "cfg_no_create.py", "X = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="create_config"):
        load_config("cfg_no_create.py")


def test_file_with_non_callable_create_config_is_config_error(tmp_path, monkeypatch):
    write(tmp_path / "cfg_create_not_callable.py", "create_config = 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="create_config"):
        load_config("cfg_create_not_callable.py")


def test_file_with_syntax_error_is_config_error(tmp_path, monkeypatch):
    write(tmp_path / "cfg_syntax.py", "def create_config(:\n    return None\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="syntax error") as info:
        load_config("cfg_syntax.py")
    assert "cfg_syntax.py" in str(info.value)
    # also from outside the working directory (synthetic module name)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    with pytest.raises(ConfigError, match="syntax error"):
        load_config(str(tmp_path / "cfg_syntax.py"))


def test_file_importing_missing_module_is_config_error(tmp_path, monkeypatch):
    write(
        tmp_path / "cfg_bad_import.py",
        """
        import no_such_module_for_fastgen_tests

        def create_config():
            return None
        """,
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no_such_module_for_fastgen_tests"):
        load_config("cfg_bad_import.py")


@pytest.mark.parametrize("returned", ["None", "{'trainer': {}}", "BaseModelConfig()"])
def test_create_config_returning_wrong_type_is_config_error(returned, tmp_path, monkeypatch):
    name = f"cfg_wrong_type_{abs(hash(returned)) % 10_000}.py"
    write(
        tmp_path / name,
        f"""
        from fastgen.configs.config import BaseModelConfig

        def create_config():
            return {returned}
        """,
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="expected a BaseConfig"):
        load_config(name)


def test_failed_load_can_be_retried_after_fixing_the_file(tmp_path, monkeypatch):
    path = write(tmp_path / "other_dir" / "cfg_fix_later.py", "def create_config(:\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        load_config(str(path))
    write(path, SIMPLE_CONFIG.format(max_iter=3))
    assert load_config(str(path)).trainer.max_iter == 3


@pytest.mark.parametrize("name", ["config_sft_tyo", "Toy.config_sft_tyo", "toy"])
def test_unknown_recipe_name_suggests_close_names(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(name)
    message = str(info.value)
    assert name in message
    assert "did you mean" in message
    if name == "toy":  # a bare folder name: any of the folder's recipes is a fair suggestion
        assert "'Toy/config_" in message
    else:
        assert "Toy/config_sft_toy" in message or "Toy/config_sft_flow_toy" in message


@pytest.mark.parametrize("name", ["Toy/config_sft_tyo", "Digits/config_sft_digit"])
def test_unknown_slash_recipe_name_suggests_close_names(name, tmp_path, monkeypatch):
    # 'Group/config_name' is the documented recipe-name form, so a typo in it deserves the same hint.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(name)
    message = str(info.value)
    assert name in message
    assert "did you mean" in message
    expected = "Toy/config_sft_toy" if name.startswith("Toy") else "Digits/config_sft_digits"
    assert expected in message


def test_unrelated_recipe_name_lists_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("qqqqqqqq")
    assert "Digits/config_sft_digits" in str(info.value)


def test_an_edited_config_file_is_imported_again(tmp_path) -> None:
    import os

    from fastgen.configs.config_utils import load_config

    path = tmp_path / "edited_cfg.py"
    body = "from fastgen.configs.experiments.Toy.config_sft_toy import create_config as base\n" \
           "def create_config():\n    c = base()\n    c.trainer.max_iter = {}\n    return c\n"
    path.write_text(body.format(1))
    assert load_config(path).trainer.max_iter == 1
    path.write_text(body.format(2))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_config(path).trainer.max_iter == 2
