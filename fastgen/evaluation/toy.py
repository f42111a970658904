"""Two-sample distances for 2-D toy data: energy distance and sliced Wasserstein distance.

Both compare generated points with fresh samples of the toy distribution (``fastgen.datasets.toy.toy_samples``
with a seed of its own, never the training seed 0), and both are 0 exactly when the two empirical distributions
coincide.

* **Energy distance** (Székely & Rizzo 2013, Eq. 2.1): ``2 E|X-Y| - E|X-X'| - E|Y-Y'|`` with Euclidean norms,
  estimated by the V-statistic (all pairs, the zero diagonal included). The V-statistic is a squared MMD with
  the distance kernel, hence never negative and exactly 0 for identical sets.
* **Sliced Wasserstein** (Rabin et al. 2011; Bonneel et al. 2015, Eq. 3-4):
  ``SW_p = (E_theta W_p^p(theta # mu, theta # nu))^{1/p}`` over ``projections`` random directions ``theta`` on the
  unit circle. ``toy_metrics`` reports ``p = 1`` (the plain average of the 1-D distances): on the multi-modal toy
  sets ``W_2`` is dominated by the few points that sampling noise pushes across a gap between modes, so its
  finite-sample floor is 2-4x higher relative to real differences (measured: 1,000 fresh eight-Gaussians points
  score 0.043 SW_1 / 0.108 SW_2 against 0.188 / 0.236 for checkerboard points).
  Each 1-D distance is exact for the empirical measures: both quantile functions are step functions, integrated
  over the union of their breakpoints (``k/n`` and ``k/m``), so the two sets need not have the same size; with
  equal sizes this is the familiar ``mean |sort(x) - sort(y)|^p``.
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_PROJECTIONS = 256
REFERENCE_SEED = 12345  # fresh reference points: never the training data (seed 0) nor its validation set (seed 1)


def _as_points(x: Any) -> torch.Tensor:
    t = torch.as_tensor(x).detach().to(device="cpu", dtype=torch.float64)
    if t.dim() != 2 or t.shape[0] < 1:
        raise ValueError(f"points must be (N, D) with N >= 1, got {tuple(t.shape)}")
    return t


def _mean_pairwise_distance(a: torch.Tensor, b: torch.Tensor, chunk: int = 2048) -> float:
    """``E |a_i - b_j|`` over all pairs, in row chunks (10k x 10k points stay within ~160 MB)."""
    total = 0.0
    for start in range(0, a.shape[0], chunk):
        total += float(torch.cdist(a[start : start + chunk], b).sum())
    return total / (a.shape[0] * b.shape[0])


def energy_distance(x: Any, y: Any) -> float:
    """``2 E|X-Y| - E|X-X'| - E|Y-Y'|`` (Székely & Rizzo 2013, Eq. 2.1), V-statistic; float64; >= 0."""
    a, b = _as_points(x), _as_points(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"dimension mismatch: {a.shape[1]} vs {b.shape[1]}")
    value = 2 * _mean_pairwise_distance(a, b) - _mean_pairwise_distance(a, a) - _mean_pairwise_distance(b, b)
    return max(value, 0.0)


def _wasserstein_1d_pow(u: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """``W_p^p`` between the empirical measures of the rows of ``u (K, n)`` and ``v (K, m)``, for each of the
    ``K`` rows: ``int_0^1 |F^-1(q) - G^-1(q)|^p dq`` with both quantile functions piecewise constant."""
    u, v = u.sort(dim=1).values, v.sort(dim=1).values
    n, m = u.shape[1], v.shape[1]
    if n == m:
        return (u - v).abs().pow(p).mean(dim=1)
    grid = torch.cat([torch.arange(1, n + 1, dtype=u.dtype) / n, torch.arange(1, m + 1, dtype=u.dtype) / m])
    grid = grid.unique().clamp(max=1.0)  # sorted breakpoints, the last one 1
    widths = torch.diff(grid, prepend=grid.new_zeros(1))
    mid = grid - widths / 2  # a point inside each interval between breakpoints
    iu = torch.clamp((mid * n).ceil().long() - 1, 0, n - 1)
    iv = torch.clamp((mid * m).ceil().long() - 1, 0, m - 1)
    return ((u[:, iu] - v[:, iv]).abs().pow(p) * widths).sum(dim=1)


def sliced_wasserstein(x: Any, y: Any, projections: int = DEFAULT_PROJECTIONS,
                       generator: torch.Generator | None = None, p: float = 1.0) -> float:
    """``SW_p(x, y) = (mean over random unit directions theta of W_p^p(<x, theta>, <y, theta>))^{1/p}``
    (Rabin et al. 2011). Directions are drawn from ``generator`` (default: seed 0), so a call is reproducible."""
    a, b = _as_points(x), _as_points(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"dimension mismatch: {a.shape[1]} vs {b.shape[1]}")
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    theta = torch.randn(projections, a.shape[1], generator=generator, dtype=torch.float64)
    theta = theta / theta.norm(dim=1, keepdim=True)
    w = _wasserstein_1d_pow(theta @ a.T, theta @ b.T, p)
    return float(w.mean() ** (1.0 / p))


def toy_metrics(points: Any, name: str, num_reference: int | None = None, seed: int = REFERENCE_SEED,
                projections: int = DEFAULT_PROJECTIONS) -> dict[str, float]:
    """Energy distance and SW_1 of ``points (N, 2)`` to ``num_reference`` (default ``N``) fresh samples of the
    toy distribution ``name`` drawn with ``seed``; the projections use ``seed`` too."""
    from fastgen.datasets.toy import toy_samples

    pts = _as_points(points)
    reference = toy_samples(name, int(num_reference or pts.shape[0]), seed=seed).double()
    return {
        "energy_distance": energy_distance(pts, reference),
        "sliced_wasserstein": sliced_wasserstein(pts, reference, projections, torch.Generator().manual_seed(seed)),
        "num_samples": int(pts.shape[0]),
        "num_reference": int(reference.shape[0]),
    }


__all__ = ["energy_distance", "sliced_wasserstein", "toy_metrics"]
