"""Shared test setup: every test gets its own output root and cache folder, and W&B disabled unless it asks
otherwise."""

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

# The longest test files, started first (seconds on one of two pytest-xdist workers, one torch thread each, measured
# at 6f7262a): `make test` hands each worker a file at a time (--dist loadfile, in this order with
# --no-loadscope-reorder), and a long file started last leaves the other worker idle while it runs.
LONGEST_FIRST = {
    "e2e/test_hostile_checkpoints.py": 250, "e2e/test_hostile_checkpoints_s3.py": 110, "e2e/test_s3_run_dirs.py": 75,
    "e2e/test_quickstart.py": 143, "distributed/test_multirank_training.py": 140,
    "distributed/test_sharded_checkpoints.py": 130, "e2e/test_check_ranks.py": 75, "e2e/test_startup.py": 70,
    "evaluation/test_teacher_cache.py": 70, "networks/test_compile.py": 65, "configs/test_recipes.py": 64,
    "e2e/test_cli.py": 55, "e2e/test_convert_ckpt.py": 55, "distributed/test_dryrun_plan.py": 50,
    "e2e/test_s3_checkpoints.py": 65, "datasets/test_encode_data.py": 60, "e2e/test_edm_recipe.py": 40,
    "e2e/test_command_edges.py": 190, "e2e/test_command_edges_runs.py": 90, "utils/test_posthoc_ema.py": 30, "distributed/test_kd_cache_ranks.py": 25, "methods/test_frozen_teacher.py": 20,
}


def pytest_configure(config: pytest.Config) -> None:
    """Under several pytest-xdist workers, one thread of torch per process. Two workers each running torch's
    default two OpenMP threads on two cores spin at every parallel region while the other holds the cores; measured
    on this suite that made in-process training tests up to 6x slower and the whole run slower than a serial one."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every command a test starts
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (``LONGEST_FIRST``), the rest in their usual order."""
    def expected_seconds(item: pytest.Item) -> float:
        relative = Path(str(item.path)).resolve().relative_to(TESTS_DIR.resolve()).as_posix()
        return LONGEST_FIRST.get(relative, 0)

    items.sort(key=lambda item: -expected_seconds(item))


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path_factory.mktemp("fastgen_output")
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(root))
    # Caches (the teacher's scores, fastgen.evaluation.teacher_cache) go to a folder of the test's own, never into
    # the real ~/.cache; commands the test runs inherit it.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("FASTGEN_NO_PROGRESS", "1")
    # Rich wraps what a command prints at COLUMNS (80 when it is not a terminal); the temporary paths tests assert
    # on are longer under pytest-xdist (".../popen-gw1/..."), so give them room instead of depending on their length.
    monkeypatch.setenv("COLUMNS", "240")
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
