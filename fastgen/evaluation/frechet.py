"""The Fréchet distance between two Gaussians fitted to feature sets (the distance behind FID).

For ``N(mu1, S1)`` and ``N(mu2, S2)`` (Dowson & Landau 1982; Heusel et al. 2017, Eq. 6)::

    d^2 = ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2})

``S1 S2`` is not symmetric, so the usual route (``scipy.linalg.sqrtm(S1 @ S2)``) takes a general matrix square
root, which returns complex parts and NaNs when the covariances are singular - the normal case when there are
fewer samples than feature dimensions. Only the *trace* of the square root is needed, and
``S1 S2 = S1^{1/2} (S1^{1/2} S2 S1^{1/2}) S1^{-1/2}`` is similar to the symmetric positive semi-definite
``M = S1^{1/2} S2 S1^{1/2}``, so ``Tr (S1 S2)^{1/2} = Tr M^{1/2} = sum_i sqrt(lambda_i(M))``. Both square roots
come from symmetric eigen-decompositions in float64 (eigenvalues below zero - round-off - are clipped), which is
exact for PSD inputs, never complex, and needs nothing beyond NumPy. (The tests cross-check it against
``scipy.linalg.sqrtm`` on well-conditioned covariances.)

When one side is given as ``n`` feature vectors with ``n <= D`` (a few hundred samples against 2048-d Inception
statistics), ``S1 = A^T A`` with ``A`` the centred features over ``sqrt(n-1)``, and the same similarity argument
gives ``Tr (S1 S2)^{1/2} = Tr (A S2 A^T)^{1/2}``: an ``n x n`` eigenvalue problem instead of two ``D x D`` ones
(``frechet_distance_to_statistics``).
"""

from __future__ import annotations

import numpy as np


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of ``(N, D)`` features in float64: the mean and the unbiased (N-1) covariance, as in the
    reference FID code, so statistics from here and from other tools are interchangeable."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"need at least 2 feature vectors of shape (N, D), got {x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    """Square root of a symmetric PSD matrix by eigen-decomposition (negative round-off clipped to 0)."""
    sym = 0.5 * (matrix + matrix.T)
    values, vectors = np.linalg.eigh(sym)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """``Tr (S1 S2)^{1/2}`` for symmetric PSD ``S1``, ``S2`` via ``Tr (S1^{1/2} S2 S1^{1/2})^{1/2}``."""
    root1 = _psd_sqrt(np.asarray(sigma1, dtype=np.float64))
    middle = root1 @ np.asarray(sigma2, dtype=np.float64) @ root1
    values = np.linalg.eigvalsh(0.5 * (middle + middle.T))
    return float(np.sqrt(np.clip(values, 0.0, None)).sum())


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Squared Fréchet distance ``||mu1-mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2})`` (Heusel et al. 2017, Eq. 6).

    Returned as FID is reported: the *squared* distance, clipped at 0 (round-off can make an identical pair
    come out at -1e-12)."""
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.shape[0], mu1.shape[0]):
        raise ValueError(f"mismatched statistics: mu {mu1.shape} vs {mu2.shape}, sigma {s1.shape} vs {s2.shape}")
    diff = mu1 - mu2
    value = float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * trace_sqrt_product(s1, s2))
    if not np.isfinite(value):
        raise ValueError("the Fréchet distance is not finite (NaN or inf in the features or statistics)")
    return max(value, 0.0)


def frechet_distance_to_statistics(features: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Fréchet distance between a Gaussian fitted to ``(n, D)`` ``features`` and ``N(mu2, sigma2)``; the same
    value as ``frechet_distance(*feature_statistics(features), mu2, sigma2)``, computed in ``n x n`` when
    ``n <= D``."""
    x = np.asarray(features, dtype=np.float64)
    mu1, sigma1 = feature_statistics(x)  # validates the shape
    n, d = x.shape
    if n > d:
        return frechet_distance(mu1, sigma1, mu2, sigma2)
    mu2, s2 = np.asarray(mu2, np.float64).reshape(-1), np.asarray(sigma2, np.float64)
    if mu2.shape != (d,) or s2.shape != (d, d):
        raise ValueError(f"mismatched statistics: features of dimension {d}, mu {mu2.shape}, sigma {s2.shape}")
    a = (x - mu1) / np.sqrt(n - 1)  # sigma1 = a.T @ a
    middle = a @ s2 @ a.T
    values = np.linalg.eigvalsh(0.5 * (middle + middle.T))
    diff = mu1 - mu2
    value = float(diff @ diff + np.einsum("ij,ij->", a, a) + np.trace(s2)
                  - 2.0 * np.sqrt(np.clip(values, 0.0, None)).sum())
    if not np.isfinite(value):
        raise ValueError("the Fréchet distance is not finite (NaN or inf in the features or statistics)")
    return max(value, 0.0)


def frechet_distance_features(features1: np.ndarray, features2: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two ``(N, D)`` feature sets."""
    if len(features1) > len(features2):
        features1, features2 = features2, features1  # the smaller set takes the n x n route when n <= D
    return frechet_distance_to_statistics(features1, *feature_statistics(features2))


__all__ = [
    "feature_statistics",
    "frechet_distance",
    "frechet_distance_features",
    "frechet_distance_to_statistics",
    "trace_sqrt_product",
]
