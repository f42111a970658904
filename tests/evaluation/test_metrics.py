"""Metric sanity: the Fréchet distance, energy distance and sliced Wasserstein distance against closed forms and
independent implementations (SciPy)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch

from fastgen.evaluation.frechet import (
    feature_statistics,
    frechet_distance,
    frechet_distance_features,
    frechet_distance_to_statistics,
)
from fastgen.evaluation.toy import energy_distance, sliced_wasserstein, toy_metrics


def _random_cov(rng: np.random.Generator, d: int) -> np.ndarray:
    a = rng.normal(size=(d, 2 * d))
    return a @ a.T / (2 * d) + 0.1 * np.eye(d)


# ----------------------------------------------------------------------------------------------- Fréchet
def test_frechet_of_a_set_with_itself_is_zero_and_a_shift_adds_its_squared_norm() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 16))
    assert frechet_distance_features(x, x) == pytest.approx(0.0, abs=1e-8)
    shift = np.full(16, 0.5)
    # Same covariance, means apart by `shift`: d^2 = ||shift||^2 exactly (Heusel et al. 2017, Eq. 6).
    assert frechet_distance_features(x, x + shift) == pytest.approx(float(shift @ shift), rel=1e-9)


def test_frechet_closed_form_for_scalar_gaussians() -> None:
    # N(0, 1) vs N(3, 4): 9 + 1 + 4 - 2 * sqrt(1 * 4) = 10.
    assert frechet_distance(np.zeros(1), np.eye(1), np.full(1, 3.0), 4 * np.eye(1)) == pytest.approx(10.0)


def test_frechet_matches_scipy_sqrtm_on_full_rank_covariances() -> None:
    rng = np.random.default_rng(1)
    mu1, mu2 = rng.normal(size=12), rng.normal(size=12)
    s1, s2 = _random_cov(rng, 12), _random_cov(rng, 12)
    root = scipy.linalg.sqrtm(s1 @ s2)
    expected = float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1 + s2 - 2 * np.real(root)))
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-8)


def test_low_rank_route_equals_the_covariance_route_and_singular_inputs_stay_finite() -> None:
    rng = np.random.default_rng(2)
    few = rng.normal(size=(6, 40))  # 6 samples in 40 dimensions: a rank-5 covariance
    mu, sigma = feature_statistics(rng.normal(size=(30, 40)) + 0.3)
    direct = frechet_distance(*feature_statistics(few), mu, sigma)
    assert np.isfinite(direct) and direct > 0
    # rel 1e-6: in the 40x40 route the zero eigenvalues come out as +-1e-15 round-off, whose square roots add ~1e-7.
    assert frechet_distance_to_statistics(few, mu, sigma) == pytest.approx(direct, rel=1e-6)
    assert frechet_distance_to_statistics(few, *feature_statistics(few)) == pytest.approx(0.0, abs=1e-9)


def test_frechet_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="mismatched"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))


# ---------------------------------------------------------------------------------------------- toy metrics
def test_energy_distance_zero_for_identical_sets_and_grows_with_a_shift() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 2, generator=g)
    y = torch.randn(400, 2, generator=g)
    assert energy_distance(x, x) == pytest.approx(0.0, abs=1e-12)
    same = energy_distance(x, y)
    shifted = energy_distance(x, y + torch.tensor([1.0, 0.0]))
    assert 0 <= same < 0.05 and shifted > 10 * same


def test_energy_distance_matches_scipy_in_one_dimension() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=70), rng.normal(0.5, 2.0, size=45)
    # scipy returns the square root of the same V-statistic (Székely & Rizzo 2013, Eq. 2.1).
    expected = scipy.stats.energy_distance(x, y) ** 2
    assert energy_distance(x[:, None], y[:, None]) == pytest.approx(expected, rel=1e-10)


def test_sliced_wasserstein_zero_for_identical_sets_and_closed_form_for_a_translation() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 2, generator=g)
    assert sliced_wasserstein(x, x) == pytest.approx(0.0, abs=1e-12)
    # A pure translation by d moves every 1-D projection by <d, theta>: SW_2^2 = E <d, theta>^2 = |d|^2 / 2.
    d = torch.tensor([2.0, 0.0])
    value = sliced_wasserstein(x, x + d, projections=2000, generator=torch.Generator().manual_seed(0), p=2.0)
    assert value == pytest.approx(2.0 / np.sqrt(2.0), rel=0.05)
    # SW_1 (the default): E |<d, theta>| = |d| E|cos| = |d| 2 / pi.
    value = sliced_wasserstein(x, x + d, projections=2000, generator=torch.Generator().manual_seed(0))
    assert value == pytest.approx(2.0 * 2.0 / np.pi, rel=0.05)


def test_sliced_wasserstein_unequal_sizes_matches_scipy_in_one_dimension() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=37), rng.normal(1.0, 0.5, size=91)
    # In 1-D every projection is +-identity, so SW_1 is the exact 1-D W_1 of the two empirical measures.
    ours = sliced_wasserstein(x[:, None], y[:, None], projections=4, p=1.0)
    assert ours == pytest.approx(scipy.stats.wasserstein_distance(x, y), rel=1e-10)


def test_sliced_wasserstein_is_reproducible_per_generator() -> None:
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(100, 2, generator=g), torch.randn(120, 2, generator=g) + 0.3
    a = sliced_wasserstein(x, y, 64, torch.Generator().manual_seed(7))
    b = sliced_wasserstein(x, y, 64, torch.Generator().manual_seed(7))
    assert a == b


def test_toy_metrics_fresh_samples_close_other_distribution_far() -> None:
    from fastgen.datasets.toy import toy_samples

    same = toy_metrics(toy_samples("eight_gaussians", 1000, seed=99), "eight_gaussians")
    other = toy_metrics(toy_samples("checkerboard", 1000, seed=99), "eight_gaussians")
    assert same["num_samples"] == same["num_reference"] == 1000
    assert other["energy_distance"] > 10 * same["energy_distance"]
    assert other["sliced_wasserstein"] > 3 * same["sliced_wasserstein"]
