"""Shared test setup: every test gets its own output root and W&B disabled unless it asks otherwise."""

from __future__ import annotations

import logging

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from s3server import s3_server  # noqa: F401 - the SeaweedFS session fixture, one server for every module


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path_factory.mktemp("fastgen_output")
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(root))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("FASTGEN_NO_PROGRESS", "1")
    for name in ("WANDB_API_KEY", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def output_root() -> Path:
    return Path(os.environ["FASTGEN_OUTPUT_ROOT"])


@pytest.fixture
def fastgen_records(caplog: pytest.LogCaptureFixture):
    """Records of the ``fastgen`` logger (DEBUG and up), also when an earlier test installed the CLI handler and
    turned propagation off: caplog's handler is attached to the ``fastgen`` logger itself, and propagation is off
    while the test runs so each record is captured once."""
    logger = logging.getLogger("fastgen")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
