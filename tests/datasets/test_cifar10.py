"""CIFAR-10 from its binary format: small files in the real record layout, written by the tests themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen_testing import write_cifar10_binary

from fastgen.datasets.cifar10 import RECORD_BYTES, CIFAR10Dataset
from fastgen.datasets.loader import build_dataloader
from fastgen.utils.errors import UsageError

TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]


@pytest.fixture
def cifar_root(tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "data" / "cifar10"
    written = write_cifar10_binary(root / "cifar-10-batches-bin", per_file=6, seed=3)
    return root, written


def _expected(written: dict, names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.cat([written[n][0] for n in names])
    labels = torch.cat([written[n][1] for n in names])
    return images.float() / 127.5 - 1.0, labels


def test_reads_records_in_file_order_and_maps_pixels(cifar_root: tuple[Path, dict]) -> None:
    root, written = cifar_root
    train = CIFAR10Dataset(str(root), split="train")
    images, labels = _expected(written, TRAIN)
    assert len(train) == 30
    batch = train.get_batch(torch.arange(30))
    assert batch["real"].dtype == torch.float32 and batch["real"].shape == (30, 3, 32, 32)
    assert torch.equal(batch["real"], images)  # p / 127.5 - 1: 0 -> -1, 255 -> 1, CHW order kept
    assert torch.equal(batch["condition"], labels) and batch["condition"].dtype == torch.int64
    item = train[7]
    assert torch.equal(item["real"], images[7]) and int(item["condition"]) == int(labels[7])
    test = CIFAR10Dataset(str(root), split="test")
    test_images, test_labels = _expected(written, ["test_batch.bin"])
    assert len(test) == 6 and torch.equal(test.get_batch(torch.arange(6))["real"], test_images)
    assert torch.equal(test.get_batch(torch.arange(6))["condition"], test_labels)


def test_pixel_extremes_and_chw_layout(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    write_cifar10_binary(folder, per_file=1)
    record = bytearray([9]) + bytes(1024) + bytes([255]) * 1024 + bytes([128]) * 1024  # R=0, G=255, B=128
    (folder / "test_batch.bin").write_bytes(bytes(record))
    item = CIFAR10Dataset(str(folder), split="test")[0]  # the batches folder itself works as root too
    assert int(item["condition"]) == 9
    assert torch.all(item["real"][0] == -1.0) and torch.all(item["real"][1] == 1.0)
    assert torch.allclose(item["real"][2], torch.full((32, 32), 128 / 127.5 - 1.0), atol=1e-6)


def test_xflip_doubles_the_dataset_with_mirrored_copies(cifar_root: tuple[Path, dict]) -> None:
    root, _ = cifar_root
    plain = CIFAR10Dataset(str(root), split="train")
    flipped = CIFAR10Dataset(str(root), split="train", xflip=True)
    assert len(flipped) == 2 * len(plain)
    a = flipped.get_batch(torch.tensor([4, 34]))
    assert torch.equal(a["real"][0], plain[4]["real"])
    assert torch.equal(a["real"][1], plain[4]["real"].flip(-1))
    assert torch.equal(a["condition"], torch.stack([plain[4]["condition"]] * 2))


def test_loader_batches(cifar_root: tuple[Path, dict]) -> None:
    root, written = cifar_root
    loader = build_dataloader(CIFAR10Dataset(str(root), xflip=True), batch_size=8, seed=1)
    seen = [next(loader) for _ in range(len(loader) + 1)]  # into the second epoch
    assert all(b["real"].shape == (8, 3, 32, 32) and b["condition"].shape == (8,) for b in seen)
    assert all(b["real"].min() >= -1 and b["real"].max() <= 1 for b in seen)


def test_missing_data_names_the_file_and_the_command(tmp_path: Path) -> None:
    root = tmp_path / "data" / "cifar10"
    with pytest.raises(UsageError) as info:
        CIFAR10Dataset(str(root))
    message = str(info.value)
    assert "\n" not in message
    assert str(root / "data_batch_1.bin") in message
    assert f"tar xzf cifar-10-binary.tar.gz -C {root}" in message and "fastgen download-data cifar10" in message


def test_one_missing_train_file_is_an_error(cifar_root: tuple[Path, dict]) -> None:
    root, _ = cifar_root
    (root / "cifar-10-batches-bin" / "data_batch_4.bin").unlink()
    with pytest.raises(UsageError, match="data_batch_4.bin"):
        CIFAR10Dataset(str(root))
    assert len(CIFAR10Dataset(str(root), split="test")) == 6  # the test split does not need it


@pytest.mark.parametrize("size", [0, RECORD_BYTES - 1, 3 * RECORD_BYTES + 5])
def test_wrong_file_size_is_an_error(cifar_root: tuple[Path, dict], size: int) -> None:
    root, _ = cifar_root
    path = root / "cifar-10-batches-bin" / "data_batch_2.bin"
    path.write_bytes(bytes(size))
    with pytest.raises(UsageError) as info:
        CIFAR10Dataset(str(root))
    assert f"{path} has {size} bytes" in str(info.value) and "tar xzf cifar-10-binary.tar.gz" in str(info.value)


def test_a_pickle_or_garbled_file_is_refused_by_its_label_bytes(cifar_root: tuple[Path, dict]) -> None:
    root, _ = cifar_root
    path = root / "cifar-10-batches-bin" / "test_batch.bin"
    data = bytearray(path.read_bytes())
    data[2 * RECORD_BYTES] = 0x80  # a pickle starts with 0x80; a label must be 0-9
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="label byte 128"):
        CIFAR10Dataset(str(root), split="test")


def test_unknown_split(cifar_root: tuple[Path, dict]) -> None:
    with pytest.raises(UsageError, match="'train' or 'test'"):
        CIFAR10Dataset(str(cifar_root[0]), split="val")
