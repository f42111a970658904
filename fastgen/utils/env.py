"""Environment variables and credential files.

``.env`` in the working directory is loaded when ``fastgen`` is imported (variables already set win).
``load_credentials(credentials_dir)`` then reads the files of the config's ``credentials_dir``: a non-empty file
overrides the matching variable; a missing or empty one leaves it alone. Token files hold the token on one line.

* ``s3.json`` - ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``, ``region_name``,
  ``endpoint_url`` -> ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
  ``AWS_ENDPOINT_URL``.
* ``wandb_api.txt`` -> ``WANDB_API_KEY``; ``openai_api.txt`` -> ``OPENAI_API_KEY``; and, generally,
  ``<VARIABLE_NAME>.txt`` (e.g. ``VLM_BASE_URL.txt``) -> that variable.

Values are never logged: ``describe_credentials`` reports only which variables are set and where from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastgen.utils.errors import UsageError

S3_JSON_KEYS = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "region_name": "AWS_REGION",
    "endpoint_url": "AWS_ENDPOINT_URL",
}
TOKEN_FILES = {
    "wandb_api.txt": "WANDB_API_KEY",
    "openai_api.txt": "OPENAI_API_KEY",
}
KNOWN_VARIABLES = (
    "FASTGEN_OUTPUT_ROOT",
    "DATA_ROOT_DIR",
    "CKPT_ROOT_DIR",
    "WANDB_API_KEY",
    "WANDB_MODE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "VLM_BASE_URL",
    "OPENAI_API_KEY",
)
SECRET_VARIABLES = {"WANDB_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "OPENAI_API_KEY"}

# Where each variable came from in this process (for `fastgen env`); never the value.
_SOURCES: dict[str, str] = {}


def _read_token(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text:
        return None
    if "\n" in text:
        raise UsageError(f"token file {path} must hold the token on a single line")
    return text


def read_s3_json(path: Path) -> dict[str, str]:
    """The non-empty fields of an ``s3.json`` (keys of ``S3_JSON_KEYS``); ``{}`` when the file is missing or empty."""
    if not (path.is_file() and path.stat().st_size > 0):
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON (line {exc.lineno}): fix or remove it") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object with keys {', '.join(S3_JSON_KEYS)}")
    return {key: data[key].strip() for key in S3_JSON_KEYS if isinstance(data.get(key), str) and data[key].strip()}


def credential_source(variable: str) -> str | None:
    """The file ``load_credentials`` exported ``variable`` from in this process, if any (never the value)."""
    return _SOURCES.get(variable)


def load_credentials(credentials_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Export the credentials found in ``credentials_dir``; return ``{VARIABLE: source file}``."""
    folder = Path(credentials_dir).expanduser()
    found: dict[str, str] = {}
    if not folder.is_dir():
        return found
    s3 = folder / "s3.json"
    for key, value in read_s3_json(s3).items():
        os.environ[S3_JSON_KEYS[key]] = value
        found[S3_JSON_KEYS[key]] = str(s3)
    for token_file in sorted(folder.glob("*.txt")):
        variable = TOKEN_FILES.get(token_file.name)
        if variable is None:
            stem = token_file.stem
            if not (stem.isupper() and stem.replace("_", "").isalnum()):
                continue
            variable = stem
        value = _read_token(token_file)
        if value is not None:
            os.environ[variable] = value
            found[variable] = str(token_file)
    _SOURCES.update(found)
    return found


def describe_credentials() -> dict[str, str]:
    """``{VARIABLE: "set (from …)" | "not set"}`` for the variables fastgen uses; values never appear."""
    report = {}
    for name in KNOWN_VARIABLES:
        if os.environ.get(name):
            source = _SOURCES.get(name, "environment or .env")
            report[name] = f"set (from {source})"
        else:
            report[name] = "not set"
    return report


DEFAULT_DATA_ROOT = "./data"


def data_root() -> str:
    """``$DATA_ROOT_DIR`` (default ``./data``): where datasets are prepared and read (``.env.example`` names it)."""
    return os.environ.get("DATA_ROOT_DIR") or DEFAULT_DATA_ROOT


def output_root() -> Path:
    return Path(os.environ.get("FASTGEN_OUTPUT_ROOT", "./FASTGEN_OUTPUT"))
