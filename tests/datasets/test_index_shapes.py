"""The shapes training takes from ``encode-data``'s ``index.json`` (``member_shapes_of``): per shard member, from
every local ``WDS:`` folder; folders that disagree are a one-line error naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgen.datasets.encode import FORMAT, latent_shape_of, member_shapes_of
from fastgen.utils.errors import UsageError


def _index(folder: Path, **shapes: list[int]) -> str:
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps({"format": FORMAT, **shapes}))
    return f"WDS:{folder}"


def test_each_members_shape_is_read_and_agreeing_folders_agree(tmp_path: Path) -> None:
    a = _index(tmp_path / "a", latent_shape=[128, 16, 16, 24], audio_shape=[8, 126, 16])
    b = _index(tmp_path / "b", latent_shape=[128, 16, 16, 24], audio_shape=[8, 126, 16])
    images = _index(tmp_path / "images", latent_shape=[4, 64, 64])
    assert member_shapes_of([a, b, "WDS:s3://bucket/elsewhere"]) == {"latent.npy": [128, 16, 16, 24],
                                                                     "audio_latent.npy": [8, 126, 16]}
    assert member_shapes_of(images) == {"latent.npy": [4, 64, 64]} and latent_shape_of([images]) == [4, 64, 64]
    assert member_shapes_of([f"WDS:{tmp_path / 'missing'}"]) == {} and latent_shape_of(None) is None


def test_folders_that_disagree_are_one_line(tmp_path: Path) -> None:
    a = _index(tmp_path / "a", latent_shape=[128, 16, 16, 24], audio_shape=[8, 126, 16])
    b = _index(tmp_path / "b", latent_shape=[128, 16, 16, 24], audio_shape=[8, 63, 16])
    with pytest.raises(UsageError, match=r"audio latents of different shapes \(.*a: \[8, 126, 16\]; .*b: \[8, 63, 16\]\)"):
        member_shapes_of([a, b])
