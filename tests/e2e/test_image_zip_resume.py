"""Training on an image zip read by DataLoader worker processes: a run SIGKILLed mid-epoch and started again with the
same command ends bit-identical to an uninterrupted one (the loader's state names the next batch not yet used,
whatever the workers had prefetched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgen_testing import assert_sigkill_resume_is_bit_identical

LOADER = """image_zip_loader(os.environ["DIGITS_ZIP"], batch_size=32, xflip=True, num_workers=2)
    config.dataloader_train.persistent_workers = True
    config.dataloader_train.prefetch_factor = 4"""


@pytest.mark.slow
def test_sigkill_with_loader_workers_then_same_command_is_bit_identical(output_root: Path, tmp_path: Path) -> None:
    """Measured ~45 s on the 2-core CPU machine (three runs of a small digits U-Net, 10 iterations each)."""
    from fastgen.datasets.prepare import prepare

    prepare("digits", tmp_path / "data")
    env = {"DIGITS_ZIP": str(tmp_path / "data" / "digits" / "digits-8x8.zip")}
    assert_sigkill_resume_is_bit_identical(LOADER, tmp_path, output_root, env)
