"""A checkpoint save on a full disk: one line that says so (the device, the path, the bytes needed and free), exit 1,
the previous checkpoint intact and no half-written file. The disk is a real, small tmpfs (mounting needs root, as CI
has)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fastgen_testing import run_cli

TOY = ["-c", "Toy/config_sft_toy", "-", "trainer.save_ckpt_iter=3", "trainer.logging_iter=1",
       "trainer.validation_iter=null", "log_config.name=full"]


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=30)


def test_a_full_disk_is_named_and_the_previous_checkpoint_kept(small_disk: Path, tmp_path: Path) -> None:
    env = {"FASTGEN_OUTPUT_ROOT": str(small_disk)}
    first = run_cli("train", *TOY, "trainer.max_iter=3", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoints = small_disk / "fastgen" / "toy" / "full" / "checkpoints"
    kept = checkpoints / "0000003.pth"
    before = kept.read_bytes()
    # fill the disk so that the next checkpoint cannot fit, leaving room for the small files written before it
    room = shutil.disk_usage(small_disk).free - len(before) // 2
    with open(small_disk / "filler", "wb") as handle:
        handle.write(b"\0" * max(room, 0))
    second = run_cli("train", *TOY, "trainer.max_iter=6", cwd=tmp_path, env=env)
    assert second.returncode == 1, (second.returncode, second.stderr[-2000:])
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, second.stderr
    assert f"No space left on device {small_disk}" in errors[0] and "0000006.pth" in errors[0], errors[0]
    assert "needed" in errors[0] and f"the previous checkpoint {kept} is intact" in errors[0], errors[0]
    assert "enforce fail" not in second.stderr and "Traceback" not in second.stderr
    assert kept.read_bytes() == before
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0000003.pth"]  # no partial or temporary file
