"""The EDM-style image zip / folder dataset and the resumable loader with DataLoader worker processes."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen.configs.checks import check_data_paths
from fastgen.configs.data import cifar10_loader, image_zip_loader
from fastgen.configs.instantiate import instantiate
from fastgen.datasets.image_zip import ImageZipDataset, encode_png, write_image_zip
from fastgen.datasets.loader import build_dataloader
from fastgen.utils.errors import ConfigError, FastGenRuntimeError, UsageError


def random_images(count: int, shape: tuple[int, ...] = (8, 8, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, *shape), dtype=np.uint8)


def make_zip(path: Path, images: np.ndarray, labels: list[int] | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    items = [(encode_png(image), None if labels is None else labels[i]) for i, image in enumerate(images)]
    write_image_zip(path, items)
    return path


def test_zip_layout_is_edms(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "set.zip", random_images(3), [2, 0, 1])
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["00000/img00000000.png", "00000/img00000001.png", "00000/img00000002.png",
                                      "dataset.json"]
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
        assert json.loads(archive.read("dataset.json")) == {"labels": [["00000/img00000000.png", 2],
                                                                        ["00000/img00000001.png", 0],
                                                                        ["00000/img00000002.png", 1]]}


def test_pixels_labels_and_xflip(tmp_path: Path) -> None:
    images = random_images(5)
    dataset = ImageZipDataset(str(make_zip(tmp_path / "set.zip", images, [3, 1, 4, 1, 5])), xflip=True)
    assert len(dataset) == 10 and dataset.image_shape == (3, 8, 8) and dataset.num_classes == 6
    batch = dataset.get_batch(torch.tensor([1, 6, 4]))
    expected = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    assert torch.equal(batch["real"][0], expected[1])
    assert torch.equal(batch["real"][1], expected[1].flip(-1))  # item N + i: image i mirrored
    assert torch.equal(batch["real"][2], expected[4])
    assert batch["condition"].tolist() == [1, 1, 5] and batch["real"].dtype == torch.float32
    assert batch["real"].min() >= -1 and batch["real"].max() <= 1
    item = dataset[6]
    assert torch.equal(item["real"], expected[1].flip(-1)) and int(item["condition"]) == 1


def test_a_folder_reads_like_the_zip(tmp_path: Path) -> None:
    images = random_images(4, shape=(8, 8))  # grayscale
    path = make_zip(tmp_path / "set.zip", images, [0, 1, 2, 3])
    zipfile.ZipFile(path).extractall(tmp_path / "folder")
    a, b = ImageZipDataset(str(path)), ImageZipDataset(str(tmp_path / "folder"))
    assert a.image_shape == (1, 8, 8)
    for key in ("real", "condition"):
        assert torch.equal(a.get_batch(torch.arange(4))[key], b.get_batch(torch.arange(4))[key])


def test_unlabelled_sets_have_no_condition(tmp_path: Path) -> None:
    dataset = ImageZipDataset(str(make_zip(tmp_path / "set.zip", random_images(2), None)))
    assert not dataset.has_labels and set(dataset.get_batch(torch.arange(2))) == {"real"}
    labelled = ImageZipDataset(str(make_zip(tmp_path / "l.zip", random_images(2), [0, 1])), use_labels=False)
    assert set(labelled[0]) == {"real"}


def test_a_label_missing_from_dataset_json_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "set.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("00000/img00000000.png", encode_png(random_images(1)[0]))
        archive.writestr("00000/img00000001.png", encode_png(random_images(1)[0]))
        archive.writestr("dataset.json", json.dumps({"labels": [["00000/img00000000.png", 1]]}))
    with pytest.raises(FastGenRuntimeError, match="no non-negative integer label for 00000/img00000001.png"):
        ImageZipDataset(str(path))


def test_images_of_different_sizes_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "set.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.png", encode_png(random_images(1)[0]))
        archive.writestr("b.png", encode_png(random_images(1, shape=(16, 16, 3))[0]))
    dataset = ImageZipDataset(str(path))
    with pytest.raises(FastGenRuntimeError, match="b.png .* is 16x16x3, the others 8x8x3"):
        dataset.get_batch(torch.arange(2))


def test_a_missing_dataset_names_the_command_that_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_ROOT_DIR", str(tmp_path))
    with pytest.raises(UsageError) as info:
        ImageZipDataset(str(tmp_path / "cifar10" / "cifar10-32x32.zip"))
    assert "does not exist; prepare it with: fastgen download-data cifar10" in str(info.value)
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(FastGenRuntimeError, match="broken.zip is not a readable zip"):
        ImageZipDataset(str(tmp_path / "broken.zip"))


# ------------------------------------------------------------------------------------------- loader workers
class IndexDataset:
    """``get_batch`` returns the indices themselves: what a loader reads is visible in the batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"real": torch.as_tensor(indices, dtype=torch.long).clone()}


def stream(loader, count: int) -> list[torch.Tensor]:  # noqa: ANN001
    return [next(loader)["real"] for _ in range(count)]


WORKERS = [dict(num_workers=2), dict(num_workers=2, persistent_workers=True, prefetch_factor=4),
           dict(num_workers=1, prefetch_factor=8), dict(pin_memory=True)]  # pin_memory: a no-op without CUDA


@pytest.mark.parametrize("options", WORKERS, ids=["2w", "2w-persistent-pf4", "1w-pf8", "pin"])
def test_workers_read_the_same_stream_and_resume_at_the_exact_next_batch(options: dict) -> None:
    dataset = IndexDataset(37)  # 37 // 5 = 7 batches per epoch: the stream crosses epochs
    reference = build_dataloader(dataset, batch_size=5, seed=3)
    expected = stream(reference, 20)
    loader = build_dataloader(dataset, batch_size=5, seed=3, **options)
    first = stream(loader, 9)  # the workers have read ahead by now
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 10  # what was handed out, not what was prefetched
    restarted = build_dataloader(dataset, batch_size=5, seed=3, **options)
    restarted.load_state_dict(state)
    assert [b.tolist() for b in first + stream(restarted, 11)] == [b.tolist() for b in expected]
    # a loader that keeps its workers (persistent or not) and is moved back to an earlier state
    loader.load_state_dict(reference_state := build_dataloader(dataset, batch_size=5, seed=3).state_dict())
    assert reference_state["position"] == 0
    assert [b.tolist() for b in stream(loader, 3)] == [b.tolist() for b in expected[:3]]


def test_batches_carry_sample_ids_with_workers() -> None:
    loader = build_dataloader(IndexDataset(40), batch_size=4, seed=0, num_workers=2, rank=1, world_size=2)
    plain = build_dataloader(IndexDataset(40), batch_size=4, seed=0, rank=1, world_size=2)
    for _ in range(7):
        a, b = next(loader), next(plain)
        assert torch.equal(a["sample_ids"], b["sample_ids"]) and torch.equal(a["real"], b["real"])


def test_two_ranks_with_workers_see_every_sample_once_per_epoch() -> None:
    dataset = IndexDataset(48)
    ranks = [build_dataloader(dataset, batch_size=4, seed=9, num_workers=2, rank=r, world_size=2) for r in (0, 1)]
    seen = torch.cat([b for loader in ranks for b in stream(loader, len(loader))])
    assert sorted(seen.tolist()) == list(range(48))


def test_image_zip_through_forked_workers_matches_the_main_process(tmp_path: Path) -> None:
    """The dataset opened its zip in this process (to read the first image); forked workers must reopen it rather
    than share its file offset."""
    path = make_zip(tmp_path / "set.zip", random_images(300, seed=4), list(range(300)))
    dataset = ImageZipDataset(str(path), xflip=True)
    dataset.get_batch(torch.arange(8))  # the parent's handle is open and used
    plain = build_dataloader(dataset, batch_size=16, seed=2)
    workers = build_dataloader(dataset, batch_size=16, seed=2, num_workers=2, prefetch_factor=4)
    for _ in range(len(plain) + 3):
        a, b = next(plain), next(workers)
        assert torch.equal(a["real"], b["real"]) and torch.equal(a["condition"], b["condition"])


def test_starting_workers_leaves_the_global_random_stream_alone() -> None:
    """A resumed run starts its DataLoader at another point of the training than an uninterrupted one: if starting
    it drew from the global generator, the two runs' random streams would part."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    loader = build_dataloader(IndexDataset(16), batch_size=4, num_workers=1)
    next(loader)
    loader.load_state_dict(loader.state_dict())
    next(loader)
    assert torch.equal(torch.rand(3), expected)


def test_worker_options_without_workers_are_refused() -> None:
    with pytest.raises(UsageError, match="need worker processes"):
        build_dataloader(IndexDataset(8), batch_size=2, persistent_workers=True)
    with pytest.raises(UsageError, match="num_workers must be 0 or more"):
        build_dataloader(IndexDataset(8), batch_size=2, num_workers=-1)


# ------------------------------------------------------------------------------------------------- configs
def test_cifar10_loader_points_at_the_zips_under_the_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_ROOT_DIR", str(tmp_path / "nowhere"))
    assert cifar10_loader().dataset.path == str(tmp_path / "nowhere" / "cifar10" / "cifar10-32x32.zip")
    assert cifar10_loader(split="test").dataset.path.endswith("cifar10/cifar10-32x32-test.zip")
    assert not (tmp_path / "nowhere").exists()  # building the config touches no file
    monkeypatch.delenv("DATA_ROOT_DIR")
    assert cifar10_loader().dataset.path == "./data/cifar10/cifar10-32x32.zip"
    path = make_zip(tmp_path / "c" / "cifar10-32x32-test.zip", random_images(6, (32, 32, 3)), [0] * 6)
    batch = next(instantiate(cifar10_loader(split="test", batch_size=3, root=str(path.parent))))
    assert batch["real"].shape == (3, 3, 32, 32) and batch["condition"].shape == (3,)


def test_check_data_paths_names_the_key_to_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen_testing import tiny_toy_config

    monkeypatch.setenv("DATA_ROOT_DIR", str(tmp_path / "root"))
    config = tiny_toy_config()
    check_data_paths(config)  # the toy data has no paths
    config.dataloader_train = cifar10_loader()
    with pytest.raises(ConfigError) as info:
        check_data_paths(config)
    assert str(info.value) == (f"dataloader_train.dataset.path: {tmp_path / 'root/cifar10/cifar10-32x32.zip'} does "
                               "not exist; prepare it with `fastgen download-data cifar10`, or set "
                               "dataloader_train.dataset.path=<path>")
    config.dataloader_train = image_zip_loader(str(tmp_path / "mine.zip"))
    with pytest.raises(ConfigError, match=r"mine.zip does not exist; set dataloader_train.dataset.path=<path to"):
        check_data_paths(config)
    make_zip(tmp_path / "mine.zip", random_images(2), None)
    check_data_paths(config)
    config.dataloader_val = image_zip_loader(str(tmp_path / "val.zip"))
    with pytest.raises(ConfigError, match="^dataloader_val.dataset.path: "):
        check_data_paths(config)


def test_check_data_paths_reads_tags_lists_and_skips_urls(tmp_path: Path) -> None:
    from fastgen.configs.instantiate import LazyCall
    from fastgen_testing import tiny_toy_config

    class ShardDataset:
        DATA_PATH_ARGUMENTS = ("datatags",)

    import sys

    module = type(sys)("shard_dataset_for_test")
    module.ShardDataset = ShardDataset
    sys.modules["shard_dataset_for_test"] = module
    try:
        config = tiny_toy_config()
        (tmp_path / "shards").mkdir()
        tags = [f"WDS:{tmp_path / 'shards'}", "WDS:s3://bucket/prefix", f"WDS:{tmp_path / 'my_video_shards'}"]
        config.dataloader_train = LazyCall("fastgen.datasets.loader.build_dataloader")(
            dataset=LazyCall("shard_dataset_for_test.ShardDataset")(datatags=tags), batch_size=2)
        with pytest.raises(ConfigError) as info:
            check_data_paths(config)
        assert str(info.value) == (f"dataloader_train.dataset.datatags: {tmp_path / 'my_video_shards'} does not exist; "
                                   "set dataloader_train.dataset.datatags=<path to your data>")
        config.dataloader_train.dataset.datatags = tags[:2]
        check_data_paths(config)
    finally:
        del sys.modules["shard_dataset_for_test"]


def test_runs_on_an_image_zip_name_their_dataset_by_its_file(tmp_path: Path) -> None:
    from fastgen.evaluation.sampling import dataset_of_config
    from fastgen_testing import tiny_toy_config

    config = tiny_toy_config()
    config.dataloader_train = cifar10_loader(root=str(tmp_path))
    assert dataset_of_config(config) == "cifar10"
    config.dataloader_train = image_zip_loader(str(tmp_path / "imagenet64" / "imagenet-64x64.zip"))
    assert dataset_of_config(config) == "imagenet"
    config.dataloader_train = image_zip_loader(str(tmp_path / "cifar10" / "faces.zip"))
    assert dataset_of_config(config) is None  # the folder does not decide; the file name does
