"""Training on WebDataset shards streamed from a real SeaweedFS S3 server by DataLoader workers, with the keys in
``credentials_dir/s3.json``: a run SIGKILLed mid-pass and started again with the same command ends bit-identical
to an uninterrupted one (the checkpoint carries each worker stream's position)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen_testing import assert_sigkill_resume_is_bit_identical, run_cli
from s3server import S3Server

LOADER = """webdataset_loader([os.environ["SHARDS"]], batch_size=32, shuffle_buffer=64,
                                  fields={"real": "png", "condition": "cls"}, num_workers=2)
    config.credentials_dir = os.environ["CREDENTIALS"]"""


def digits_shards(folder: Path) -> None:
    """The digits as PNG + class shards, 100 samples each (18 shards)."""
    from fastgen.datasets.digits import load_digits_tensors
    from fastgen.datasets.image_zip import encode_png
    from fastgen.datasets.webdataset import write_shards

    images, labels = load_digits_tensors()
    pixels = ((images[:, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    write_shards(({"__key__": f"{i:05d}", "png": encode_png(np.ascontiguousarray(pixels[i])),
                   "cls": str(int(labels[i])).encode()} for i in range(len(labels))), folder, 100)


@pytest.mark.slow
def test_sigkill_while_streaming_shards_from_s3_then_same_command_is_bit_identical(
        output_root: Path, tmp_path: Path, s3_server: S3Server) -> None:
    """Measured ~40 s on the 2-core CPU machine (three runs of a small digits U-Net, 10 iterations each)."""
    digits_shards(tmp_path / "shards")
    client = s3_server.client()
    for shard in sorted((tmp_path / "shards").iterdir()):
        client.upload_file(str(shard), s3_server.bucket, f"wds-resume/{shard.name}")
    env = {"SHARDS": f"WDS:s3://{s3_server.bucket}/wds-resume",
           "CREDENTIALS": str(s3_server.write_credentials(tmp_path / "credentials"))}
    assert_sigkill_resume_is_bit_identical(LOADER, tmp_path, output_root, env)


USER_CONFIG = '''
from fastgen.configs.data import webdataset_loader
from fastgen.configs.experiments.Digits.config_sft_digits import create_config as digits_teacher


def create_config():
    config = digits_teacher()
    config.model.net.backbone.model_channels = 8
    config.dataloader_train = webdataset_loader(["WDS:/data/my_digit_shards"], batch_size=16,
                                                fields={"real": "png", "condition": "cls"})
    config.dataloader_val = None
    config.trainer.max_iter = 2
    config.trainer.callbacks = {}
    config.log_config.wandb_mode = "disabled"
    return config
'''


def test_a_placeholder_datatag_is_one_line_and_the_override_trains(tmp_path: Path) -> None:
    """The seed's grammar, ``- dataloader_train.datatags=[WDS:/path]``, on a config with a placeholder path."""
    digits_shards(tmp_path / "shards")
    config = tmp_path / "my_wds.py"
    config.write_text(USER_CONFIG)
    placeholder = run_cli("train", f"--config={config}", cwd=tmp_path)
    assert placeholder.returncode == 2
    lines = placeholder.stderr.strip().splitlines()
    assert len(lines) == 1 and "dataloader_train.datatags: /data/my_digit_shards does not exist; set " \
                               "dataloader_train.datatags=<path to your data>" in lines[0], placeholder.stderr
    trained = run_cli("train", f"--config={config}", "-", f"dataloader_train.datatags=[WDS:{tmp_path / 'shards'}]",
                      cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
