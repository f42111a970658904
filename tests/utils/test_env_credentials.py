"""Credential files (load_credentials / describe_credentials) and .env loading at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastgen.utils.env as env
from fastgen.utils.env import KNOWN_VARIABLES, describe_credentials, load_credentials
from fastgen.utils.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"

S3_FIELDS = {
    "aws_access_key_id": ("AWS_ACCESS_KEY_ID", "AKIATESTACCESSKEY0001"),
    "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY", "test-secret-access-key-0002"),
    "aws_session_token": ("AWS_SESSION_TOKEN", "test-session-token-0003"),
    "region_name": ("AWS_REGION", "us-test-1"),
    "endpoint_url": ("AWS_ENDPOINT_URL", "https://s3.test.invalid"),
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Unset every variable fastgen knows; restore the real environment afterwards (load_credentials writes
    os.environ directly, so each variable is first set through monkeypatch to record its original state)."""
    for name in (*KNOWN_VARIABLES, "MY_CUSTOM_VAR", "lowercase_var"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setattr(env, "_SOURCES", {})


def write_s3(folder: Path, data) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s3.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


# ------------------------------------------------------------------------------------------------- s3.json
def test_s3_json_fields_map_to_aws_variables(tmp_path):
    path = write_s3(tmp_path, {key: value for key, (_, value) in S3_FIELDS.items()})
    found = load_credentials(tmp_path)
    for _, (variable, value) in S3_FIELDS.items():
        assert os.environ[variable] == value
        assert found[variable] == str(path)
    assert set(found) == {variable for variable, _ in S3_FIELDS.values()}


def test_s3_json_partial_fields_set_only_those(tmp_path):
    write_s3(tmp_path, {"aws_access_key_id": "AKIAONLY", "aws_secret_access_key": "only-secret"})
    load_credentials(tmp_path)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIAONLY"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "only-secret"
    assert "AWS_SESSION_TOKEN" not in os.environ
    assert "AWS_REGION" not in os.environ


def test_s3_json_overrides_existing_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-environment")
    monkeypatch.setenv("AWS_REGION", "env-region")
    write_s3(tmp_path, {"aws_access_key_id": "from-file"})
    load_credentials(tmp_path)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-file"
    assert os.environ["AWS_REGION"] == "env-region"  # not in the file: left alone


def test_s3_json_empty_values_leave_environment_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    write_s3(tmp_path, {"aws_access_key_id": "AKIAX", "aws_session_token": "", "region_name": "   "})
    load_credentials(tmp_path)
    assert os.environ["AWS_SESSION_TOKEN"] == "env-token"
    assert "AWS_REGION" not in os.environ


def test_empty_s3_json_file_leaves_environment_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-environment")
    write_s3(tmp_path, "")
    assert load_credentials(tmp_path) == {}
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-environment"


@pytest.mark.parametrize("text", ["{not json", '{"aws_access_key_id": "x",}', "aws_access_key_id: x"])
def test_invalid_s3_json_raises_usage_error(tmp_path, text):
    write_s3(tmp_path, text)
    with pytest.raises(UsageError, match="s3.json"):
        load_credentials(tmp_path)


@pytest.mark.parametrize("data", [["aws_access_key_id", "x"], "just a string", 42])
def test_s3_json_that_is_not_an_object_raises_usage_error(tmp_path, data):
    write_s3(tmp_path, json.dumps(data))
    with pytest.raises(UsageError, match="s3.json"):
        load_credentials(tmp_path)


def test_invalid_s3_json_error_does_not_echo_its_content(tmp_path):
    write_s3(tmp_path, '{"aws_secret_access_key": "leaky-secret-value" oops}')
    with pytest.raises(UsageError) as info:
        load_credentials(tmp_path)
    assert "leaky-secret-value" not in str(info.value)


# ------------------------------------------------------------------------------------------------ token files
def test_wandb_api_txt_sets_wandb_api_key(tmp_path):
    (tmp_path / "wandb_api.txt").write_text("wandb-token-abc123\n")
    found = load_credentials(tmp_path)
    assert os.environ["WANDB_API_KEY"] == "wandb-token-abc123"  # trailing newline stripped
    assert found == {"WANDB_API_KEY": str(tmp_path / "wandb_api.txt")}


def test_openai_api_txt_sets_openai_api_key(tmp_path):
    (tmp_path / "openai_api.txt").write_text("sk-openai-test")
    load_credentials(tmp_path)
    assert os.environ["OPENAI_API_KEY"] == "sk-openai-test"


def test_variable_named_txt_file_sets_that_variable(tmp_path):
    (tmp_path / "VLM_BASE_URL.txt").write_text("http://localhost:8000/v1\n")
    (tmp_path / "MY_CUSTOM_VAR.txt").write_text("custom")
    load_credentials(tmp_path)
    assert os.environ["VLM_BASE_URL"] == "http://localhost:8000/v1"
    assert os.environ["MY_CUSTOM_VAR"] == "custom"


def test_other_txt_files_are_ignored(tmp_path):
    (tmp_path / "notes.txt").write_text("not a credential")
    (tmp_path / "lowercase_var.txt").write_text("x")
    assert load_credentials(tmp_path) == {}
    assert "lowercase_var" not in os.environ


def test_non_empty_token_file_overrides_existing_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-environment")
    (tmp_path / "wandb_api.txt").write_text("from-file")
    load_credentials(tmp_path)
    assert os.environ["WANDB_API_KEY"] == "from-file"


@pytest.mark.parametrize("content", ["", "\n", "   \n  \n"])
def test_empty_token_file_leaves_existing_variable_alone(tmp_path, monkeypatch, content):
    monkeypatch.setenv("WANDB_API_KEY", "from-environment")
    (tmp_path / "wandb_api.txt").write_text(content)
    assert load_credentials(tmp_path) == {}
    assert os.environ["WANDB_API_KEY"] == "from-environment"


def test_empty_token_file_does_not_create_variable(tmp_path):
    (tmp_path / "wandb_api.txt").write_text("")
    load_credentials(tmp_path)
    assert "WANDB_API_KEY" not in os.environ


def test_missing_token_file_leaves_existing_variable_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-environment")
    write_s3(tmp_path, {"region_name": "r"})  # the folder holds other credentials, but no wandb_api.txt
    load_credentials(tmp_path)
    assert os.environ["WANDB_API_KEY"] == "from-environment"


def test_missing_credentials_folder_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-environment")
    assert load_credentials(tmp_path / "does_not_exist") == {}
    assert os.environ["WANDB_API_KEY"] == "from-environment"


def test_credentials_dir_relative_to_working_directory(tmp_path, monkeypatch):
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials" / "wandb_api.txt").write_text("relative-dir-token")
    monkeypatch.chdir(tmp_path)
    load_credentials("./credentials/")  # the config default
    assert os.environ["WANDB_API_KEY"] == "relative-dir-token"


def test_multi_line_token_file_raises_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-environment")
    (tmp_path / "wandb_api.txt").write_text("first-line-secret\nsecond-line-secret\n")
    with pytest.raises(UsageError) as info:
        load_credentials(tmp_path)
    assert "wandb_api.txt" in str(info.value)
    assert "single line" in str(info.value)
    assert "first-line-secret" not in str(info.value)
    assert os.environ["WANDB_API_KEY"] == "from-environment"


def test_usage_error_exit_code():
    assert UsageError.exit_code == 2


# ----------------------------------------------------------------------------------------- describe_credentials
def test_describe_credentials_never_contains_secret_values(tmp_path, monkeypatch):
    write_s3(tmp_path, {key: value for key, (_, value) in S3_FIELDS.items()})
    (tmp_path / "wandb_api.txt").write_text("wandb-describe-secret-xyz")
    (tmp_path / "openai_api.txt").write_text("sk-describe-secret-xyz")
    (tmp_path / "VLM_BASE_URL.txt").write_text("http://vlm.describe.invalid")
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", "/tmp/out-root-describe")
    load_credentials(tmp_path)
    report = describe_credentials()
    text = repr(report)
    secret_values = [value for _, value in S3_FIELDS.values()] + [
        "wandb-describe-secret-xyz",
        "sk-describe-secret-xyz",
        "http://vlm.describe.invalid",
        "/tmp/out-root-describe",
    ]
    for value in secret_values:
        assert value not in text
    assert set(report) == set(KNOWN_VARIABLES)
    assert report["WANDB_API_KEY"] == f"set (from {tmp_path / 'wandb_api.txt'})"
    assert report["AWS_SECRET_ACCESS_KEY"] == f"set (from {tmp_path / 's3.json'})"
    assert report["FASTGEN_OUTPUT_ROOT"].startswith("set")
    assert report["DATA_ROOT_DIR"] == "not set"


def test_describe_credentials_reports_environment_source(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "env-only-secret-value")
    report = describe_credentials()
    assert report["WANDB_API_KEY"].startswith("set")
    assert "env-only-secret-value" not in repr(report)
    assert report["AWS_ACCESS_KEY_ID"] == "not set"


def test_describe_credentials_when_nothing_is_set():
    assert all(status == "not set" for status in describe_credentials().values())


# ----------------------------------------------------------------------------------------------------- .env
def _run_import(cwd: Path, extra_env: dict[str, str], unset: tuple[str, ...]) -> str:
    child_env = {k: v for k, v in os.environ.items() if k not in unset}
    child_env.update(extra_env)
    python = str(VENV_PYTHON if VENV_PYTHON.exists() else sys.executable)
    result = subprocess.run(
        [python, "-c", "import fastgen, os; print(os.environ.get('FOO'), os.environ.get('BAR'))"],
        cwd=cwd,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_dotenv_in_working_directory_is_loaded_and_environment_wins(tmp_path):
    (tmp_path / ".env").write_text("FOO=foo_from_dotenv\nBAR=bar_from_dotenv\n")
    out = _run_import(tmp_path, {"BAR": "bar_from_environment"}, unset=("FOO",))
    assert out == "foo_from_dotenv bar_from_environment"


def test_without_dotenv_nothing_is_loaded(tmp_path):
    out = _run_import(tmp_path, {}, unset=("FOO", "BAR"))
    assert out == "None None"


def test_dotenv_is_read_from_working_directory_not_elsewhere(tmp_path):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / ".env").write_text("FOO=should_not_load\n")
    (tmp_path / "elsewhere").mkdir()
    out = _run_import(tmp_path / "elsewhere", {}, unset=("FOO", "BAR"))
    assert out == "None None"
