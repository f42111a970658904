"""Post-hoc EMA (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", Sec. 3
and App. C.2): choose the EMA length *after* training instead of retraining for each one.

During training, ``EMACallback(type="power", snapshot_iter=N)`` writes its power-function EMA every ``N`` network
updates to ``RUN/ema_snapshots/<ema_name>-<t>.pt`` (``t``: the EMA schedule's update count, ``gamma``: its
exponent). Two such EMAs of different widths (EDM2: ``sigma_rel`` 0.05 and 0.10) are enough. The power EMA with
exponent ``gamma`` at time ``t`` averages the network's past weights with the profile
``p_{gamma,t}(tau) = (gamma + 1) tau^gamma / t^(gamma + 1)`` on ``0 <= tau <= t`` (App. C.1, Eq. 3's
continuous form). A snapshot is a known average; a linear combination of snapshots averages with the same
combination of their profiles. So the EMA of any other width ``gamma_r`` at time ``t_r`` is approximated by the
weights ``x`` that bring ``sum_i x_i p_i`` closest to ``p_r`` in L2 (App. C.2, Eq. 15-16): ``A x = b`` with
``A_ij = <p_i, p_j>`` and ``b_i = <p_i, p_r>``, where (App. C.2, Eq. 17)

    <p_{g_a,t_a}, p_{g_b,t_b}> = (g_a + 1)(g_b + 1) min(t_a, t_b)^(g_a + g_b + 1) / ((g_a + g_b + 1) t_a^(g_a+1) t_b^(g_b+1)).

``fastgen ema RUN --sigma-rel S`` runs this solve and writes the combined weights. ``relative_profile_error``
reports how well the target profile is matched (0 is exact), so a user sees when the snapshots are too sparse.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgen.utils.errors import ConfigError, UsageError
from fastgen.utils.safe_pickle import torch_load

SNAPSHOT_DIR = "ema_snapshots"
_NAME = re.compile(r"^(?P<name>.+)-(?P<t>\d+)\.pt$")


@dataclass(frozen=True)
class Snapshot:
    path: Path
    ema_name: str
    t: int  # the EMA's update count when it was written
    gamma: float


def sigma_rel_from_gamma(gamma: float) -> float:
    """The relative standard deviation of the power-function EMA profile with exponent ``gamma`` (EDM2, Karras et
    al. 2024, appendix Eq. 123): ``sigma_rel = (gamma + 1)^(1/2) / ((gamma + 2) (gamma + 3)^(1/2))``."""
    return math.sqrt(gamma + 1.0) / ((gamma + 2.0) * math.sqrt(gamma + 3.0))


SIGMA_REL_MAX = sigma_rel_from_gamma(0.0)  # 1 / (2 sqrt 3) ~ 0.289: the widest profile with gamma >= 0


def gamma_from_sigma_rel(sigma_rel: float) -> float:
    """The exponent ``gamma >= 0`` whose power-function EMA has relative width ``sigma_rel`` (the inverse of
    :func:`sigma_rel_from_gamma`; EDM2 solves the same relation as a cubic, its appendix Eq. 126).

    ``sigma_rel(gamma)`` falls strictly on ``gamma >= 0`` (its log-derivative ``1/(gamma+1) - 2/(gamma+2) -
    1/(gamma+3)`` is negative there), from ``1/(2 sqrt 3)`` at 0 towards 0, so bisection finds the one root.
    """
    if not 0.0 < sigma_rel <= SIGMA_REL_MAX:
        raise ConfigError(f"EMA sigma_rel={sigma_rel} is out of range: the power-function EMA reaches relative "
                          f"widths in (0, {SIGMA_REL_MAX:.4f}] (gamma >= 0)")
    low, high = 0.0, 1.0
    while sigma_rel_from_gamma(high) > sigma_rel:
        low, high = high, 2.0 * high
    for _ in range(200):  # far more halvings than float64 can resolve; stops early once the bracket is exhausted
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if sigma_rel_from_gamma(mid) > sigma_rel:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def profile_dot(t_a: float, gamma_a: float, t_b: float, gamma_b: float) -> float:
    """``<p_{gamma_a,t_a}, p_{gamma_b,t_b}>``, the L2 inner product of two power-function EMA profiles (EDM2 App.
    C.2, Eq. 17; computed in a ratio form that does not overflow for large ``t`` and ``gamma``)."""
    # min(t_a,t_b)^(g_a+g_b+1) / (t_a^(g_a+1) t_b^(g_b+1)) = (t_early / t_late)^(g_late) / t_late
    (t_early, _), (t_late, g_late) = sorted([(t_a, gamma_a), (t_b, gamma_b)], key=lambda pair: pair[0])
    return (gamma_a + 1.0) * (gamma_b + 1.0) / (gamma_a + gamma_b + 1.0) * (t_early / t_late) ** g_late / t_late


def solve_weights(snapshots: list[tuple[float, float]], t_r: float, gamma_r: float) -> tuple[np.ndarray, float]:
    """The least-squares weights of ``snapshots`` (``(t, gamma)`` pairs) for the profile ``(t_r, gamma_r)``, and the
    relative L2 error of the combined profile, ``||sum x_i p_i - p_r|| / ||p_r||``."""
    a = np.array([[profile_dot(ti, gi, tj, gj) for tj, gj in snapshots] for ti, gi in snapshots], dtype=np.float64)
    b = np.array([profile_dot(ti, gi, t_r, gamma_r) for ti, gi in snapshots], dtype=np.float64)
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    target = profile_dot(t_r, gamma_r, t_r, gamma_r)
    residual = max(target - 2.0 * float(x @ b) + float(x @ a @ x), 0.0)
    return x, math.sqrt(residual / target)


def snapshot_path(run_dir: str | Path, ema_name: str, t: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"{ema_name}-{t:09d}.pt"


def save_snapshot(path: Path, state: dict[str, torch.Tensor], t: int, gamma: float) -> None:
    """One snapshot file, written atomically (a crash leaves the previous snapshots and no partial file)."""
    from fastgen.utils.io import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"t": int(t), "gamma": float(gamma), "state": {k: v.detach().cpu().clone() for k, v in state.items()}}
    with atomic_open(path) as handle:
        torch.save(payload, handle)


def list_snapshots(source: str | Path) -> list[Snapshot]:
    """The snapshots of a run directory (its ``ema_snapshots/``) or of a snapshot folder, oldest first."""
    root = Path(source)
    folder = root / SNAPSHOT_DIR if (root / SNAPSHOT_DIR).is_dir() else root
    if not folder.is_dir():
        raise UsageError(f"{source} is neither a run directory with {SNAPSHOT_DIR}/ nor a snapshot folder")
    found = []
    for path in sorted(folder.glob("*.pt")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        header = torch_load(path, mmap=True)
        found.append(Snapshot(path, match["name"], int(header["t"]), float(header["gamma"])))
    if not found:
        raise UsageError(f"no EMA snapshots in {folder}: train with a power EMACallback that sets snapshot_iter "
                         "(see fastgen.utils.posthoc_ema)")
    return sorted(found, key=lambda s: (s.t, s.ema_name))


def reconstruct(source: str | Path, sigma_rel: float, at: int | None = None,
                max_error: float | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The EMA of width ``sigma_rel`` at update ``at`` (default: the newest snapshot's), combined from every
    snapshot written up to then; returns its state dict and what was used (weights, error).

    ``at`` must be an update some snapshot was written at: EDM2's least squares (App. C.2, Eq. 18) matches the
    target profile with profiles that end at or before ``at``, so between snapshots (the newest one ends early) or
    past the newest the match is poor (a relative error near 1) and past the newest nothing covers the updates in
    between. With ``max_error`` set, a relative profile error above it is refused (``UsageError``) before any
    weights are read."""
    gamma_r = gamma_from_sigma_rel(float(sigma_rel))
    snapshots = list_snapshots(source)
    t_r = snapshots[-1].t if at is None else int(at)
    times = sorted({s.t for s in snapshots})
    span = f"snapshots were written at updates {times[0]}..{times[-1]} ({len(times)} of them)"
    if t_r not in times:
        where = ("past the newest snapshot" if t_r > times[-1] else "before the first snapshot" if t_r < times[0]
                 else "between snapshots")
        nearest = [t for t in times if t <= t_r][-1:] + [t for t in times if t > t_r][:1]
        raise UsageError(f"--at {t_r} is {where}, so no EMA can be reconstructed there ({span}): use a snapshot's "
                         f"update, e.g. {' or '.join(map(str, nearest))}")
    used = [s for s in snapshots if s.t <= t_r]
    x, error = solve_weights([(float(s.t), s.gamma) for s in used], float(t_r), gamma_r)
    if max_error is not None and error > max_error:
        raise UsageError(f"sigma_rel {sigma_rel} at update {t_r} reconstructs with relative profile error {error:.3f}, "
                         f"above --max-error {max_error} ({span}, widths tracked: "
                         f"{', '.join(f'{sigma_rel_from_gamma(g):.3f}' for g in sorted({s.gamma for s in used}))}); "
                         "choose a width nearer the tracked ones or a later snapshot, or raise --max-error")
    combined: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for weight, snap in zip(x, used):
        state = torch_load(snap.path)["state"]
        dtypes = {key: value.dtype for key, value in state.items()}  # the newest snapshot's dtypes are written
        if combined and state.keys() != combined.keys():
            raise UsageError(f"{snap.path} holds other tensors than the snapshots before it: one run's snapshots only")
        for key, value in state.items():
            if not value.is_floating_point():
                combined[key] = value  # integer buffers (counters) are not averaged: the newest wins
                continue
            term = value.double() * float(weight)
            combined[key] = term if key not in combined else combined[key] + term
    state = {k: v.to(dtypes[k]) for k, v in combined.items()}
    info = {"sigma_rel": float(sigma_rel), "gamma": gamma_r, "t": t_r, "relative_profile_error": error,
            "snapshots": [{"file": s.path.name, "t": s.t, "gamma": s.gamma, "weight": float(w)} for s, w in zip(used, x)]}
    return state, info
