"""Runs whose checkpoints are in S3 are usable by every command that takes a checkpoint, folder or run directory
(``fastgen.checkpoint.source``): the local run directory, the run's S3 prefix and an S3 checkpoint work
wherever a local one does; and "newest valid" means the same in every command (a truncated newest ``.pth`` is
skipped with a warning naming it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_cli
from s3server import S3Server

pytestmark = pytest.mark.slow


def test_every_command_takes_an_s3_run(s3_server: S3Server, output_root: Path, tmp_path: Path) -> None:
    credentials = s3_server.write_credentials(tmp_path / "credentials")
    trained = run_cli("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=2", "trainer.save_ckpt_iter=2",
                      "log_config.name=s3run", "trainer.checkpointer.use_s3=True",
                      f"trainer.checkpointer.s3_container={s3_server.bucket}/runs", f"credentials_dir={credentials}",
                      cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = output_root / "fastgen" / "toy" / "s3run"
    prefix = f"s3://{s3_server.bucket}/runs/fastgen/toy/s3run"
    assert not (run_dir / "checkpoints").exists()

    by_run_dir = run_cli("sample", str(run_dir), "-n", "4", "-o", str(tmp_path / "a.npz"), cwd=tmp_path)
    assert by_run_dir.returncode == 0, by_run_dir.stderr[-3000:]
    by_prefix = run_cli("sample", prefix, "-c", str(run_dir / "config.yaml"), "-n", "4", "-o", str(tmp_path / "b.npz"),
                        "--credentials-dir", str(credentials), cwd=tmp_path)
    assert by_prefix.returncode == 0, by_prefix.stderr[-3000:]
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert np.array_equal(a["arr_0"], b["arr_0"])  # the same checkpoint, the same seed
    without_config = run_cli("sample", prefix, "-n", "4", "--credentials-dir", str(credentials), cwd=tmp_path)
    assert without_config.returncode == 2 and "pass --config" in without_config.stderr, without_config.stderr

    converted = run_cli("convert-ckpt", str(run_dir), str(tmp_path / "full.pth"), cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr[-3000:]
    from fastgen.checkpoint.checkpointer import load_checkpoint

    assert load_checkpoint(tmp_path / "full.pth")["iteration"] == 2

    checked = run_cli("check-ranks", "-c", str(run_dir / "config.yaml"), "--checkpoint", f"{prefix}/checkpoints",
                      cwd=tmp_path, env=s3_server.environment())
    assert checked.returncode == 0, checked.stderr[-3000:] + checked.stdout[-3000:]


def test_every_command_skips_a_truncated_newest_checkpoint(output_root: Path, tmp_path: Path) -> None:
    trained = run_cli("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=4", "trainer.save_ckpt_iter=2",
                      "log_config.name=trunc", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = output_root / "fastgen" / "toy" / "trunc"
    newest = run_dir / "checkpoints" / "0000004.pth"
    newest.write_bytes(newest.read_bytes()[:1000])
    for command in (("sample", str(run_dir), "-n", "2", "-o", str(tmp_path / "s.npz")),
                    ("convert-ckpt", str(run_dir), str(tmp_path / "c.pth")),
                    ("check-ranks", "-c", str(run_dir / "config.yaml"), "--checkpoint", str(run_dir))):
        result = run_cli(*command, cwd=tmp_path)
        assert result.returncode == 0, f"{command[0]}: {result.stderr[-3000:]}"
        assert "skipping checkpoint" in result.stderr and "0000004.pth" in result.stderr, (command[0], result.stderr)
    assert torch.load(tmp_path / "c.pth", weights_only=True)["iteration"] == 2
