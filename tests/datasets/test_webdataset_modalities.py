"""WebDataset fields with dotted batch keys (``real.video``, ``real.audio``) nest into one multimodal sample
(``fastgen.networks.modalities``), what a multimodal model's ``model.modality_shapes`` trains on; a key that is
both plain and a dotted prefix is a one-line error."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen.datasets.webdataset import WebDatasetLoader, write_shards
from fastgen.utils.errors import UsageError


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_dotted_fields_nest_into_a_multimodal_sample(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    videos, audios = rng.standard_normal((4, 2, 3, 4, 4), dtype=np.float32), rng.standard_normal((4, 2, 5, 3), dtype=np.float32)
    write_shards(({"__key__": f"{i:03d}", "latent.npy": _npy(videos[i]), "audio.npy": _npy(audios[i]), "cls": b"%d" % i}
                  for i in range(4)), tmp_path, samples_per_shard=4)
    batch = next(WebDatasetLoader([f"WDS:{tmp_path}"], batch_size=4, shuffle=False, fields={
        "real.video": "latent.npy", "real.audio": "audio.npy", "condition": "cls"}))
    assert set(batch) == {"real", "condition", "sample_ids"} and set(batch["real"]) == {"video", "audio"}
    order = batch["condition"].tolist()
    assert torch.equal(batch["real"]["video"], torch.from_numpy(videos[order]))
    assert torch.equal(batch["real"]["audio"], torch.from_numpy(audios[order]))
    with pytest.raises(UsageError, match="fields.real: the key is also the prefix"):
        WebDatasetLoader([f"WDS:{tmp_path}"], batch_size=4, fields={"real": "latent.npy", "real.audio": "audio.npy"})
