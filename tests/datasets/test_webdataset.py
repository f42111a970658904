"""The WebDataset loader (``fastgen.datasets.webdataset``) on shards the tests write: fields, the per-pass split,
exact resume at every kind of boundary, the resplit at another world size, and one-line errors. Multi-rank runs
through the launcher and S3 are in tests/e2e/test_webdataset_ranks.py."""

from __future__ import annotations

import collections
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen.datasets.image_zip import encode_png
from fastgen.datasets.webdataset import (
    WebDatasetLoader,
    list_shards,
    parse_datatags,
    read_samples,
    sample_id,
    write_shards,
)
from fastgen.utils.errors import FastGenRuntimeError, UsageError

KEYS = {"key": "__key__", "url": "__url__"}


def write_set(folder: Path, sizes: list[int], image: bool = False, seed: int = 0) -> dict[str, list[str]]:
    """Shards of ``sizes[i]`` samples each (``shard-00000i.tar``); returns each shard's keys in order."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    layout = {}
    for number, size in enumerate(sizes):
        samples = []
        for i in range(size):
            sample = {"__key__": f"s{number:02d}_{i:03d}", "cls": str((number + i) % 10).encode()}
            if image:
                sample["png"] = encode_png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
            samples.append(sample)
        [path] = write_shards(samples, folder, samples_per_shard=max(size, 1), prefix=f"part{number:02d}")
        layout[str(path)] = [s["__key__"] for s in samples]
    return layout


def id_table(layout: dict[str, list[str]], passes: int) -> dict[int, tuple[int, str]]:
    """sample id -> (pass, key): which pass a batch's sample belongs to."""
    return {sample_id(url, i, p): (p, key) for p in range(passes) for url, keys in layout.items()
            for i, key in enumerate(keys)}


def read(loader: WebDatasetLoader, batches: int) -> list[list[str]]:
    return [next(loader)["key"] for _ in range(batches)]


def loader(folder: Path, **options) -> WebDatasetLoader:
    options.setdefault("batch_size", 4)
    options.setdefault("shuffle_buffer", 5)
    options.setdefault("fields", KEYS)
    return WebDatasetLoader([f"WDS:{folder}"], **options)


def test_fields_decode_by_extension_and_match_the_image_zips_pixels(tmp_path: Path) -> None:
    pixels = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5
    vector = np.linspace(0, 1, 6, dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, vector)
    write_shards([{"__key__": "a/x0", "png": encode_png(pixels), "cls": b"7", "npy": buffer.getvalue(),
                   "json": json.dumps({"w": 3}).encode(), "txt": "a cat".encode()}], tmp_path, 1)
    batch = next(WebDatasetLoader([f"WDS:{tmp_path}"], batch_size=1, fields={
        "real": "jpg;png", "condition": "cls", "vec": "npy", "meta": "json", "caption": "txt", **KEYS}))
    expected = torch.from_numpy(pixels.astype(np.float32)).permute(2, 0, 1) / 127.5 - 1
    torch.testing.assert_close(batch["real"][0], expected)
    assert batch["condition"].tolist() == [7] and batch["condition"].dtype == torch.int64
    torch.testing.assert_close(batch["vec"][0], torch.from_numpy(vector))
    assert batch["meta"] == [{"w": 3}] and batch["caption"] == ["a cat"] and batch["key"] == ["a/x0"]
    assert batch["url"] == [str(tmp_path / "shard-000000.tar")]
    assert batch["sample_ids"].tolist() == [sample_id(batch["url"][0], 0, 0)]


def test_a_multi_part_extension_decodes_by_its_last_part(tmp_path: Path) -> None:
    """``latent.npy`` / ``text.npy`` (the diffusers recipes' precomputed latents and text embeddings) decode as
    ``npy`` and stack into batch tensors; ``hr.png`` is an image."""
    arrays = {name: np.random.default_rng(i).standard_normal(shape, dtype=np.float32)
              for i, (name, shape) in enumerate({"latent": (4, 2, 2), "text": (3, 5)}.items())}
    members = {}
    for name, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        members[f"{name}.npy"] = buffer.getvalue()
    pixels = np.zeros((2, 2, 1), dtype=np.uint8)
    write_shards([{"__key__": f"k{i}", **members, "hr.png": encode_png(pixels)} for i in range(2)], tmp_path, 2)
    batch = next(WebDatasetLoader([f"WDS:{tmp_path}"], batch_size=2, fields={
        "real": "latent.npy", "condition": "text.npy", "image": "hr.png"}))
    assert batch["real"].shape == (2, 4, 2, 2) and batch["condition"].shape == (2, 3, 5)
    torch.testing.assert_close(batch["condition"][1], torch.from_numpy(arrays["text"]))
    assert batch["image"].shape == (2, 1, 2, 2) and float(batch["image"].min()) == -1.0


def test_samples_group_by_key_and_long_names_keep_their_offsets(tmp_path: Path) -> None:
    """Members of one key are one sample; a name over 100 characters (a pax header) still starts its sample at the
    header's first byte, so reading from a sample's offset yields that sample."""
    long = "d" * 120 + "/k"
    samples = [{"__key__": f"{long}{i}", "png": b"p%d" % i, "cls": b"%d" % i} for i in range(4)]
    [shard] = write_shards(samples, tmp_path, 4)
    read_back = list(read_samples(str(shard)))
    assert [s.key for s in read_back] == [f"{long}{i}" for i in range(4)]
    assert read_back[2].fields == {"png": b"p2", "cls": b"2"} and [s.index for s in read_back] == [0, 1, 2, 3]
    again = list(read_samples(str(shard), read_back[2].offset, 2))
    assert [(s.key, s.index) for s in again] == [(f"{long}2", 2), (f"{long}3", 3)]


@pytest.mark.parametrize("workers", [0, 2])
def test_three_ranks_see_every_sample_once_per_pass_with_uneven_shards(tmp_path: Path, workers: int) -> None:
    layout = write_set(tmp_path, [5, 9, 3, 7, 11, 4, 6, 8, 2, 10, 5, 7])  # 77 samples, 12 shards
    table = id_table(layout, passes=16)
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for rank in range(3):
        ranks_loader = loader(tmp_path, rank=rank, world_size=3, num_workers=workers)
        for _ in range(60):  # 240 samples a rank: every stream is past its second pass
            for identity in next(ranks_loader)["sample_ids"].tolist():
                pass_, key = table[identity]
                seen[pass_][key] += 1
    every = sorted(k for keys in layout.values() for k in keys)
    for pass_ in (0, 1):
        assert sorted(seen[pass_]) == every and set(seen[pass_].values()) == {1}, pass_
    assert all(count == 1 for counter in seen.values() for count in counter.values())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 3, 7, 11, 14])  # mid-block, at block and shard boundaries, across a pass
def test_a_saved_state_resumes_at_the_exact_next_batch(tmp_path: Path, stop: int, workers: int) -> None:
    write_set(tmp_path, [6, 5, 7, 4])  # 22 samples: a pass every 5.5 batches of 4 on one rank
    first = loader(tmp_path, seed=3, num_workers=workers)
    read(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint stores it
    expected = read(first, 6)
    resumed = loader(tmp_path, seed=3, num_workers=workers)
    resumed.load_state_dict(state)
    assert read(resumed, 6) == expected


def test_blocks_are_shuffled_and_passes_differ(tmp_path: Path) -> None:
    layout = write_set(tmp_path, [10, 10])
    ordered = [k for keys in layout.values() for k in keys]
    shuffled = loader(tmp_path, batch_size=20, shuffle_buffer=20)
    first, second = next(shuffled)["key"], next(shuffled)["key"]
    assert sorted(first) == sorted(ordered) == sorted(second) and first != second and first != ordered
    plain = loader(tmp_path, batch_size=20, shuffle=False)
    assert next(plain)["key"] == ordered


@pytest.mark.parametrize("new", [(1, 0), (3, 0), (1, 2)])
def test_another_world_size_repeats_and_skips_nothing_within_a_pass(tmp_path: Path, new: tuple[int, int]) -> None:
    """2 ranks x 2 workers stop mid-pass, their streams in passes 1 to 3; the rest continues on ``new`` (ranks,
    workers) from every old rank's state: each pass so far holds every sample exactly once."""
    layout = write_set(tmp_path, [5, 9, 3, 7, 11, 4, 6, 8, 2, 10, 5, 7])
    table = id_table(layout, passes=16)
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def count(batch: dict) -> None:
        for identity in batch["sample_ids"].tolist():
            pass_, key = table[identity]
            seen[pass_][key] += 1

    old = [loader(tmp_path, rank=r, world_size=2, num_workers=2) for r in (0, 1)]
    for _ in range(24):
        for rank_loader in old:
            count(next(rank_loader))
    states = [json.loads(json.dumps(rank_loader.state_dict())) for rank_loader in old]
    streams = [(tuple(p["pass"] for p in s["parts"]), s["next_pass"]) for state in states for s in state["streams"]]
    assert streams == [((), 2), ((2,), 3), ((2,), 3), ((3,), 4)]  # one stream done with pass 1, one in pass 3
    world, workers = new
    for rank in range(world):
        continued = loader(tmp_path, rank=rank, world_size=world, num_workers=workers)
        continued.load_every_rank_state(states)
        for _ in range(120 // world):
            count(next(continued))
    every = sorted(k for keys in layout.values() for k in keys)
    for pass_ in (0, 1, 2, 3, 4):
        assert sorted(seen[pass_]) == every and set(seen[pass_].values()) == {1}, pass_


def test_s3_and_local_sources_list_sorted_shards(tmp_path: Path) -> None:
    write_set(tmp_path / "a", [2, 2])
    (tmp_path / "a" / "notes.txt").write_text("not a shard")
    assert [Path(p).name for p in list_shards([str(tmp_path / "a")])] == ["part00-000000.tar", "part01-000000.tar"]
    assert parse_datatags(["WDS:/x", "s3://b/p", "WDS:s3://b/q"]) == ["/x", "s3://b/p", "s3://b/q"]


@pytest.mark.parametrize("case,message", [
    ("few_shards", "write at least 4 shards"),
    ("missing", "does not exist"),
    ("tag", "reads WDS: only"),
    ("empty", "no .tar shards"),
])
def test_bad_sources_are_one_line_usage_errors(tmp_path: Path, case: str, message: str) -> None:
    write_set(tmp_path / "two", [3, 3])
    (tmp_path / "none").mkdir()
    tags = {"few_shards": [f"WDS:{tmp_path / 'two'}"], "missing": [f"WDS:{tmp_path / 'nope'}"],
            "tag": [f"ZIP:{tmp_path / 'two'}"], "empty": [f"WDS:{tmp_path / 'none'}"]}[case]
    with pytest.raises(UsageError, match=message) as info:
        WebDatasetLoader(tags, batch_size=2, num_workers=2 if case == "few_shards" else 0, rank=0,
                         world_size=2 if case == "few_shards" else 1)
    assert "\n" not in str(info.value)


def test_a_truncated_shard_and_a_missing_field_are_one_line_errors(tmp_path: Path) -> None:
    write_set(tmp_path / "ok", [3], image=False)
    with pytest.raises(FastGenRuntimeError, match=r"has no png or jpg for field 'real' \(it has cls\)"):
        next(WebDatasetLoader([f"WDS:{tmp_path / 'ok'}"], batch_size=2, fields={"real": "png;jpg"}))
    [shard] = write_shards([{"__key__": f"k{i}", "txt": b"1" * 3000} for i in range(3)], tmp_path / "cut", 3)
    shard.write_bytes(shard.read_bytes()[:4000])
    with pytest.raises(FastGenRuntimeError, match="is not a readable tar file") as info:
        next(WebDatasetLoader([f"WDS:{tmp_path / 'cut'}"], batch_size=3, fields={"c": "txt"}))
    assert "\n" not in str(info.value)


def test_write_shards_leaves_no_partial_shard_on_failure(tmp_path: Path) -> None:
    def samples():
        yield {"__key__": "a", "cls": b"1"}
        yield {"__key__": "b", "cls": b"2"}
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        write_shards(samples(), tmp_path, samples_per_shard=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-000000.tar"]
    with tarfile.open(tmp_path / "shard-000000.tar") as archive:
        assert archive.getnames() == ["a.cls"]


def test_a_wds_loader_config_checks_its_local_paths_before_training(tmp_path: Path) -> None:
    from fastgen.configs.checks import check_data_paths
    from fastgen.configs.data import webdataset_loader
    from fastgen.configs.experiments.Digits.config_sft_digits import create_config
    from fastgen.utils.errors import ConfigError

    config = create_config()
    config.dataloader_train = webdataset_loader([f"WDS:{tmp_path / 'my_shards'}"], batch_size=4)
    with pytest.raises(ConfigError, match=r"dataloader_train.datatags: .*my_shards does not exist; set "
                                          r"dataloader_train.datatags=<path to your data>"):
        check_data_paths(config)


def test_the_checkpoint_manager_hands_every_ranks_state_to_a_resplit(tmp_path: Path) -> None:
    """A payload saved by 2 ranks restored in a 1-rank process: the loader continues from both ranks' streams
    (``restore_rank_state`` -> ``load_every_rank_state``), so the pass still holds every sample once."""
    from fastgen.checkpoint.manager import CheckpointManager, TrainingState
    from fastgen.configs.experiments.Digits.config_sft_digits import create_config
    from fastgen.utils.rng import capture_rng_state

    layout = write_set(tmp_path / "shards", [5, 9, 3, 7, 11, 4])
    table = id_table(layout, passes=16)
    old = [loader(tmp_path / "shards", rank=r, world_size=2) for r in (0, 1)]
    seen = collections.Counter(table[i] for rank_loader in old for _ in range(3)
                               for i in next(rank_loader)["sample_ids"].tolist())
    states = [rank_loader.state_dict() for rank_loader in old]
    payload = {"iteration": 3, "world_size": 2, "rng": {0: capture_rng_state(), 1: capture_rng_state()},
               "dataloaders": {"train": states[0]},
               "per_rank": {"dataloaders": {0: {"train": states[0]}, 1: {"train": states[1]}}, "callbacks": {}}}
    config = create_config()
    config.trainer.checkpointer.save_dir = str(tmp_path / "checkpoints")
    manager = CheckpointManager(config.trainer.checkpointer, tmp_path, sharded=False)
    alone = loader(tmp_path / "shards", rank=0, world_size=1)
    manager.restore_rank_state(payload, TrainingState(model=None, callbacks=None, loaders={"train": alone}, iteration=3))
    seen.update(table[i] for _ in range(30) for i in next(alone)["sample_ids"].tolist())
    every = sorted(k for keys in layout.values() for k in keys)
    assert sorted(key for (pass_, key) in seen if pass_ == 0) == every
    assert all(count == 1 for count in seen.values())
