"""FID plumbing on a randomly initialised FID InceptionV3 written to a file (no real weights here): the key names
and shapes of pytorch-fid's weights file, loading, reference statistics from every source, FID(x, x) = 0 and a
positive finite FID for different sets. The numbers themselves mean nothing with random weights."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastgen.evaluation.evaluate import evaluate_arrays
from fastgen.evaluation.fid import fid_from_images, inception_features, load_reference_statistics, save_statistics
from fastgen.evaluation.frechet import feature_statistics
from fastgen.evaluation.inception import FIDInceptionV3, load_inception
from fastgen.utils.errors import UsageError


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random FID InceptionV3 state dict saved like the real file: no ``num_batches_tracked``, with ``fc``.
    Convolutions get He initialisation so activations neither vanish nor explode through ~90 layers."""
    torch.manual_seed(0)
    model = FIDInceptionV3()
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path_factory.mktemp("inception") / "pt_inception-random.pth"
    torch.save(state, path)
    return path


def _images(seed: int, n: int = 4, size: int = 32, offset: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.integers(0, 200, (n, size, size, 3)) + offset, 0, 255).astype(np.uint8)


def test_architecture_matches_the_pytorch_fid_weights_layout() -> None:
    model = FIDInceptionV3()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # torchvision's Inception3 has 27,161,264 parameters with its aux head (3,326,696) and 1000 classes; the
    # FID graph drops the aux head and has 1008 classes (+16,392): 23,850,960.
    assert sum(p.numel() for p in model.parameters()) == 23_850_960
    assert shapes["Conv2d_1a_3x3.conv.weight"] == (32, 3, 3, 3)
    assert shapes["Mixed_5b.branch_pool.conv.weight"] == (32, 192, 1, 1)
    assert shapes["Mixed_6e.branch7x7dbl_5.conv.weight"] == (192, 192, 1, 7)
    assert shapes["Mixed_7a.branch7x7x3_4.conv.weight"] == (192, 192, 3, 3)
    assert shapes["Mixed_7c.branch3x3dbl_3b.bn.running_var"] == (384,)
    assert shapes["fc.weight"] == (1008, 2048)
    assert not any(k.startswith("AuxLogits") or ".conv.bias" in k for k in shapes)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 2048)


def test_fid_of_a_set_with_itself_is_zero_and_different_sets_score_positive(weights: Path, tmp_path: Path) -> None:
    net = load_inception(weights)
    x, y = _images(0), _images(1, offset=55)
    images_npz = tmp_path / "reference_images.npz"
    np.savez(images_npz, arr_0=x)
    reference = load_reference_statistics(images_npz, lambda: net)
    same = fid_from_images(x, reference, net, batch_size=3)  # two batches
    different = fid_from_images(y, reference, net)
    assert same["num_samples"] == 4
    assert same["fid"] == pytest.approx(0.0, abs=1e-6 * max(1.0, different["fid"]))
    assert np.isfinite(different["fid"]) and different["fid"] > 0

    # The same reference as mu/sigma (.npz) and from an image folder (PNG files).
    stats = tmp_path / "reference_stats.npz"
    save_statistics(stats, *reference)
    folder = tmp_path / "reference_folder"
    folder.mkdir()
    for i, image in enumerate(x):
        Image.fromarray(image).save(folder / f"{i:03d}.png")
    for source in (stats, folder):
        mu, sigma = load_reference_statistics(source, lambda: net)
        np.testing.assert_allclose(mu, reference[0], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(sigma, reference[1], rtol=1e-6, atol=1e-9)


def test_evaluate_arrays_fid_reads_weights_from_the_environment(weights: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    x = _images(2, n=3)
    stats = tmp_path / "stats.npz"
    save_statistics(stats, *feature_statistics(inception_features(x, load_inception(weights))))
    monkeypatch.setenv("FASTGEN_INCEPTION_WEIGHTS", str(weights))
    metrics = evaluate_arrays(x, None, "cifar10", ref_stats=stats, batch_size=2)
    assert metrics["dataset"] == "cifar10" and metrics["num_samples"] == 3
    assert metrics["fid"] == pytest.approx(0.0, abs=1e-6)


def test_missing_or_wrong_weights_are_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTGEN_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(UsageError, match="--inception-weights"):
        load_inception(None)
    with pytest.raises(UsageError, match="not found"):
        load_inception(tmp_path / "nope.pth")
    wrong = tmp_path / "wrong.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(32, 3, 3, 3)}, wrong)
    with pytest.raises(UsageError, match="missing .* keys"):
        load_inception(wrong)
    misshaped = tmp_path / "misshaped.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(8, 3, 3, 3)}, misshaped)
    with pytest.raises(UsageError, match="size mismatch"):
        load_inception(misshaped)
    assert not os.environ.get("FASTGEN_INCEPTION_WEIGHTS")
