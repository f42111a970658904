"""The seed's EDM CIFAR-10 recipes as a user runs them: dryrun (no data needed), the seed's train.py forms, and
training on a small CIFAR-10 image zip that ``download-data``'s pipeline made from an archive in the real binary
format, written by the test itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastgen_testing import run_cli

REPO = Path(__file__).resolve().parents[2]
NET_PARAMS = "55,055,107"  # edm_unet_cifar10, 10 classes; EDM's DDPM++: 55,735,299 (tests/networks explains why)
DISC_PARAMS = "590,849"
# CPU-sized: a 16-channel, one-block U-Net of the same structure (levels 32/16/8, attention at 16x16), batch 4.
TINY = ["trainer.max_iter=2", "trainer.logging_iter=1", "model.teacher_ckpt=null", "dataloader_train.batch_size=4",
        "model.net.backbone.model_channels=16", "model.net.backbone.num_blocks=1",
        "trainer.callbacks.wandb.num_samples=4"]


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    """``$DATA_ROOT_DIR`` with ``cifar10/cifar10-32x32.zip`` (65 images) and ``cifar10-32x32-test.zip`` (13), made by
    ``fastgen.datasets.prepare`` from a ``cifar-10-binary.tar.gz`` in the official layout (through a file:// mirror)."""
    from dataset_files import cifar10_tarball, md5

    from fastgen.datasets.prepare import prepare

    body, _ = cifar10_tarball(tmp_path, per_file=13, seed=5)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "cifar-10-binary.tar.gz").write_bytes(body)
    root = tmp_path / "data"
    prepare("cifar10", root, mirror=f"file://{tmp_path / 'mirror'}", checksums={"cifar-10-binary.tar.gz": md5(body)})
    return root


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _plan_rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│")]
        if len(cells) == 3 and cells[1][:1].isdigit():
            rows[cells[0]] = cells[1]
    return rows


def test_dryrun_needs_no_data_and_prints_the_parameter_counts(output_root: Path, tmp_path: Path) -> None:
    absent = tmp_path / "no_data_here"
    result = run_cli("dryrun", "--config", "EDM/config_dmd2_fast", cwd=tmp_path, env={"DATA_ROOT_DIR": str(absent)})
    assert result.returncode == 0, result.stderr
    assert _plan_rows(result.stdout) == {"net": NET_PARAMS, "ema": NET_PARAMS, "teacher": NET_PARAMS,
                                         "fake_score": NET_PARAMS, "discriminator": DISC_PARAMS}
    assert str(absent / "cifar10") in result.stdout  # the data path, from DATA_ROOT_DIR
    assert str(absent / "cifar10" / "edm_teacher.pth") in result.stdout
    peak_row = next(line for line in result.stdout.splitlines() if "training peak" in line)
    assert "not estimated without the training data" in peak_row
    assert not absent.exists() and _files_under(output_root) == []


def _train_py(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The seed's ``python train.py ...`` from the repository root, without data (dryrun needs none)."""
    import os

    env = {**os.environ, "DATA_ROOT_DIR": str(tmp_path / "absent")}
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=180, env=env)


def test_seed_train_py_dryrun(output_root: Path, tmp_path: Path) -> None:
    result = _train_py(tmp_path, "--config=fastgen/configs/experiments/EDM/config_dmd2_fast.py", "--dryrun")
    assert result.returncode == 0, result.stderr
    assert _plan_rows(result.stdout)["discriminator"] == DISC_PARAMS and NET_PARAMS in result.stdout
    assert _files_under(output_root) == []


def test_seed_overrides_turn_the_gan_off(output_root: Path, tmp_path: Path) -> None:
    result = _train_py(tmp_path, "--config=fastgen/configs/experiments/EDM/config_dmd2_fast.py", "--dryrun", "-",
                       "trainer.max_iter=10000", "model.gan_loss_weight_gen=0.", "log_config.name=my_experiment")
    assert result.returncode == 0, result.stderr
    rows = _plan_rows(result.stdout)
    assert "discriminator" not in rows and rows["fake_score"] == NET_PARAMS
    assert "max_iter: 10000" in result.stdout and "my_experiment" in result.stdout
    assert _files_under(output_root) == []


def test_seed_small_config_dryrun(output_root: Path, tmp_path: Path) -> None:
    result = _train_py(tmp_path, "--config=fastgen/configs/experiments/EDM/config_dmd2_fast_small.py", "--dryrun")
    assert result.returncode == 0, result.stderr
    assert "batch_size: 32" in result.stdout and "config_dmd2_fast_small" in result.stdout
    assert _files_under(output_root) == []


def test_the_small_config_is_the_seeds_snippet() -> None:
    text = (REPO / "fastgen/configs/experiments/EDM/config_dmd2_fast_small.py").read_text()
    assert text == (
        "# fastgen/configs/experiments/EDM/config_dmd2_fast_small.py\n"
        "from fastgen.configs.experiments.EDM.config_dmd2_fast import create_config as base_create_config\n"
        "def create_config():\n"
        "    config = base_create_config()\n"
        "    config.dataloader_train.batch_size = 32\n"
        "    return config\n"
    )


@pytest.mark.parametrize("gan", [True, False])
def test_recipe_trains_on_a_small_cifar_directory(output_root: Path, tmp_path: Path, data_root: Path, gan: bool) -> None:
    from fastgen.checkpoint.checkpointer import load_checkpoint

    extra = [] if gan else ["model.gan_loss_weight_gen=0."]
    name = "gan" if gan else "nogan"
    result = run_cli("train", "--config=EDM/config_dmd2_fast", "-", *TINY, *extra, f"log_config.name={name}",
                     cwd=tmp_path, env={"DATA_ROOT_DIR": str(data_root)})
    assert result.returncode == 0, result.stderr
    assert "randomly initialised teacher" in result.stderr
    assert "iteration 1/2" in result.stderr and "iteration 2/2" in result.stderr
    run_dir = output_root / "fastgen" / "cifar10" / name
    assert (run_dir / "samples" / "iter_0000002.png").is_file()
    payload = load_checkpoint(run_dir / "checkpoints" / "0000002.pth")
    modules = set(payload["model"])
    expected = {"net", "ema", "fake_score"} | ({"discriminator"} if gan else set())
    assert modules == expected and set(payload["frozen_fingerprints"]) == {"teacher"}  # rebuilt, not saved
    # Iteration 0 updated the student, iteration 1 the critic(s) (student_update_freq 5).
    assert payload["optimizers"]["net"]["state"] and payload["optimizers"]["fake_score"]["state"]
    if gan:
        assert payload["optimizers"]["discriminator"]["state"]
    assert payload["dataloaders"]["train"]["position"] == 8
    assert "cifar10" in (run_dir / "config.yaml").read_text() and str(data_root) in (run_dir / "config.yaml").read_text()


def test_teacher_recipe_trains_on_a_small_cifar_directory(output_root: Path, tmp_path: Path, data_root: Path) -> None:
    result = run_cli("train", "--config=EDM/config_sft_cifar10", "-", "trainer.max_iter=2", "trainer.logging_iter=1",
                     "trainer.batch_size_global=8", "dataloader_train.batch_size=4", "dataloader_val.batch_size=4",
                     "trainer.validation_iter=2", "trainer.max_val_iter=1", "model.net.backbone.model_channels=16",
                     "model.net.backbone.num_blocks=1", "trainer.callbacks.wandb.num_samples=2",
                     "model.sample_steps=2", "log_config.name=teacher",
                     cwd=tmp_path, env={"DATA_ROOT_DIR": str(data_root)})
    assert result.returncode == 0, result.stderr
    assert "validation at iteration 2" in result.stderr
    assert (output_root / "fastgen" / "cifar10" / "teacher" / "checkpoints" / "0000002.pth").is_file()


def test_missing_data_is_one_line_exit_2(output_root: Path, tmp_path: Path) -> None:
    absent = tmp_path / "empty_root"
    result = run_cli("train", "--config=EDM/config_dmd2_fast", "-", *TINY, cwd=tmp_path,
                     env={"DATA_ROOT_DIR": str(absent)})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0] == (f"error: dataloader_train.dataset.path: {absent / 'cifar10' / 'cifar10-32x32.zip'} does not "
                         "exist; prepare it with `fastgen download-data cifar10`, or set "  # to $DATA_ROOT_DIR
                         "dataloader_train.dataset.path=<path>")
    assert _files_under(output_root) == [] and not list(output_root.iterdir())  # no run directory was made


@pytest.mark.slow
def test_unmodified_network_trains_one_iteration(output_root: Path, tmp_path: Path, data_root: Path) -> None:
    """The full 55M-parameter teacher, student, fake score (and discriminator) at batch 2: one student iteration.
    Measured ~34 s on the 2-core CPU machine (most of it building the networks and writing the 1.3 GB checkpoint)."""
    result = run_cli("train", "--config=EDM/config_dmd2_fast", "-", "trainer.max_iter=1", "model.teacher_ckpt=null",
                     "dataloader_train.batch_size=2", "trainer.callbacks.wandb.num_samples=2", "log_config.name=full",
                     cwd=tmp_path, env={"DATA_ROOT_DIR": str(data_root)})
    assert result.returncode == 0, result.stderr
    assert "iteration 1/1" in result.stderr
    assert (output_root / "fastgen" / "cifar10" / "full" / "checkpoints" / "0000001.pth").is_file()
