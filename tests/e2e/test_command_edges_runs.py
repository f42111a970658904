"""Edges of the commands that need a run of their own (the table of single-command cases is test_command_edges.py):
a custom callback's config.yaml loaded from elsewhere, dryrun's warnings for the big recipes, the start-up banner."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgen_testing import run_cli


def test_init_callback_config_loads_back_from_its_config_yaml(tmp_path: Path) -> None:
    """`init --callback`, train it, then train again from the run's config.yaml in another folder: the custom
    callback's module is found through the recorded import_paths; and `init --from` takes a config file."""
    project, elsewhere, root = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "out"
    project.mkdir()
    elsewhere.mkdir()
    env = {"FASTGEN_OUTPUT_ROOT": str(root)}
    assert run_cli("init", "cfg/mycb", "--from", "Toy/config_sft_toy", "--callback", cwd=project).returncode == 0
    result = run_cli("train", "--config", "cfg/mycb.py", "-", "trainer.max_iter=2", cwd=project, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    config_yaml = root / "fastgen" / "toy" / "mycb" / "config.yaml"
    result = run_cli("train", "--config", str(config_yaml), "-", "trainer.max_iter=3", cwd=elsewhere, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (root / "fastgen" / "toy" / "mycb" / "checkpoints" / "0000003.pth").is_file()
    # a config file of one's own as the starting point
    result = run_cli("init", "derived", "--from", "cfg/mycb.py", cwd=project)
    assert result.returncode == 0, result.stderr
    result = run_cli("dryrun", "--config", "derived.py", "--yaml", cwd=project, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "name: derived" in result.stdout and "mycb" in result.stdout  # the callback came from cfg/mycb.py


@pytest.mark.parametrize("recipe", ["SD/config_dmd2_sd15", "Flux/config_dmd2_flux", "Wan/config_dmd2_wan"])
def test_dryrun_lists_what_train_would_refuse(recipe: str, tmp_path: Path) -> None:
    """dryrun stays useful without the weights (rc 0, the plan), and says what train would stop on; a plan that does
    not fit one GPU says so and suggests more ranks."""
    result = run_cli("dryrun", "-c", recipe, cwd=tmp_path, env={"DATA_ROOT_DIR": str(tmp_path)}, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: train would stop here:")]
    assert any("model.pretrained_model_path" in line for line in warnings), result.stderr
    if recipe.startswith("Flux"):
        assert "more than an 80 GiB GPU holds" in result.stderr and "--nproc-per-node" in result.stderr, result.stderr


def test_start_up_banner_says_where_on_what_how_big_and_where_from(tmp_path: Path) -> None:
    env = {"FASTGEN_OUTPUT_ROOT": str(tmp_path / "out")}
    tiny = ["-c", "Toy/config_sft_toy", "-", "trainer.save_ckpt_iter=2", "trainer.validation_iter=null",
            "log_config.name=banner"]
    first = run_cli("train", *tiny, "trainer.max_iter=2", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    run = tmp_path / "out" / "fastgen" / "toy" / "banner"
    banner = [line for line in first.stderr.splitlines() if f"run {run}:" in line]
    assert len(banner) == 1, first.stderr
    for part in ("1 rank(s) on cpu", "parameters net ", "global batch 256 (256 per rank x 1 rank(s))",
                 "a fresh start", "trainer.max_iter=2"):
        assert part in banner[0], (part, banner[0])
    second = run_cli("train", *tiny, "trainer.max_iter=3", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resumed from {run}/checkpoints/0000002.pth at iteration 2" in second.stderr, second.stderr
