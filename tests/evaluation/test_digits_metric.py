"""The shipped digits classifier and FD_digits on real data: held-out accuracy, small FD between real splits,
large FD for degraded or mode-collapsed sets, identical results for every accepted image layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastgen.datasets.digits import DigitsDataset
from fastgen.evaluation.digits import (
    classifier_accuracy,
    classifier_outputs,
    frechet_distance_digits,
    load_classifier,
    quantize,
)
from fastgen.evaluation.frechet import frechet_distance_features
from fastgen.utils.images import to_uint8


def test_shipped_classifier_recognises_held_out_real_digits() -> None:
    _, meta = load_classifier()
    test = DigitsDataset("val")  # never seen in training (the classifier trains on the 'train' split)
    accuracy = classifier_accuracy(test.images, test.labels)
    assert accuracy >= 0.95
    assert meta["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert "train" in meta["train_split"]


def test_real_test_split_is_close_to_train_split_and_degraded_sets_are_far() -> None:
    train, test = DigitsDataset("train"), DigitsDataset("val")
    f_train, _ = classifier_outputs(quantize(train.images))
    f_test, _ = classifier_outputs(quantize(test.images))
    real = frechet_distance_features(f_test, f_train)
    collapsed = frechet_distance_digits(train.images[train.labels < 5])["fd_digits"]  # half the classes missing
    noisy = frechet_distance_digits(torch.rand(300, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    # 180 real test digits vs the train split: only the finite-sample bias (~20 for 180 samples in 64-d).
    assert real < 40
    assert collapsed > 4 * real
    assert noisy["fd_digits"] > 20 * real


def test_uint8_nhwc_and_float_nchw_inputs_give_the_same_scores() -> None:
    test = DigitsDataset("val")
    as_float = frechet_distance_digits(quantize(test.images), test.labels)
    nhwc = to_uint8(test.images).numpy()  # (N, 8, 8, 1) uint8: what `fastgen sample` writes
    as_uint8 = frechet_distance_digits(nhwc, test.labels)
    as_hw = frechet_distance_digits(nhwc[..., 0], test.labels.numpy())
    assert as_uint8["fd_digits"] == pytest.approx(as_float["fd_digits"], rel=1e-9)
    assert as_hw == as_uint8
    assert as_uint8["accuracy"] >= 0.95 and as_uint8["num_samples"] == len(test)


def test_frechet_distance_digits_rejects_wrong_shapes_and_label_counts() -> None:
    with pytest.raises(ValueError, match="digits images"):
        frechet_distance_digits(np.zeros((4, 16, 16, 1), dtype=np.uint8))
    with pytest.raises(ValueError, match="labels"):
        frechet_distance_digits(np.zeros((4, 8, 8, 1), dtype=np.uint8), labels=[1, 2])


@pytest.mark.slow
def test_training_script_reaches_the_accuracy_it_records(tmp_path: Path) -> None:
    out = tmp_path / "clf.pt"
    result = subprocess.run(
        [sys.executable, "-m", "fastgen.evaluation.train_digits_classifier", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    payload = torch.load(out, map_location="cpu", weights_only=True)
    assert payload["meta"]["test_accuracy"] >= 0.95
    assert f"{payload['meta']['test_accuracy']:.4f}" in result.stdout
