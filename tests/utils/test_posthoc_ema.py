"""Post-hoc EMA (``fastgen.utils.posthoc_ema``, ``fastgen ema``; EDM2, Karras et al. 2024, Sec. 3 / App. C.2):
the profile inner product, the least-squares solve, snapshots written by ``EMACallback(snapshot_iter=...)``, and
the reconstruction of a width that was also tracked directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastgen_testing import run_cli
from omegaconf import DictConfig

from fastgen.utils.posthoc_ema import profile_dot, solve_weights


def _profile(t: float, gamma: float, tau: np.ndarray) -> np.ndarray:
    return np.where(tau <= t, (gamma + 1) * tau**gamma / t ** (gamma + 1), 0.0)


@pytest.mark.parametrize("ta, ga, tb, gb", [(100, 6.94, 80, 16.97), (50, 2.0, 120, 6.94), (70, 6.94, 70, 16.97)])
def test_profile_inner_product_is_the_integral(ta: float, ga: float, tb: float, gb: float) -> None:
    tau = np.linspace(0, max(ta, tb), 2_000_001)
    numeric = np.trapezoid(_profile(ta, ga, tau) * _profile(tb, gb, tau), tau)
    assert profile_dot(ta, ga, tb, gb) == pytest.approx(numeric, rel=1e-4)
    assert profile_dot(ta, ga, tb, gb) == pytest.approx(profile_dot(tb, gb, ta, ga), rel=1e-12)


def test_a_tracked_width_is_its_own_newest_snapshot_and_others_are_approximated() -> None:
    times = [(t, g) for t in (20, 40, 60, 80, 100) for g in (16.97, 6.94)]
    weights, error = solve_weights(times, 100, 6.94)
    assert weights[-1] == pytest.approx(1.0, abs=1e-8) and np.abs(weights[:-1]).max() < 1e-8 and error < 1e-6
    weights, error = solve_weights(times, 100, 10.5)  # between the two tracked widths: approximated
    assert 0 < error < 0.05 and weights.sum() == pytest.approx(1.0, abs=0.01)  # measured 0.026; sum 1.006


def test_snapshots_need_a_power_ema() -> None:
    from fastgen.callbacks.ema import EMACallback
    from fastgen.utils.errors import ConfigError

    with pytest.raises(ConfigError, match="snapshot_iter"):
        EMACallback(type="constant", snapshot_iter=10)


@pytest.mark.slow
def test_the_reconstruction_of_a_directly_tracked_width_matches_it(output_root: Path, tmp_path: Path) -> None:
    """SFT on digits (400 steps, a small U-Net) with power EMAs of sigma_rel 0.05 and 0.10 writing snapshots every
    25 updates, and one of 0.075 tracked directly. ``fastgen ema RUN --sigma-rel 0.075`` reconstructs the latter
    from the snapshots: its distance to the tracked EMA is under 2% of the distance between the two tracked EMAs
    (measured 0.4%; the nearest tracked EMA, 0.05, is 50% away), its profile error under 1% (measured 0.35%)."""
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import LazyCall
    from fastgen.trainer import Trainer

    config = load_config("Digits/config_sft_digits")
    config.model.net.backbone.model_channels = 8
    config.model.use_ema = ["ema_005", "ema_010", "ema_0075"]
    ema = "fastgen.callbacks.ema.EMACallback"
    config.trainer.callbacks = DictConfig({
        "ema_005": LazyCall(ema)(ema_name="ema_005", type="power", sigma_rel=0.05, snapshot_iter=25),
        "ema_010": LazyCall(ema)(ema_name="ema_010", type="power", sigma_rel=0.10, snapshot_iter=25),
        "ema_0075": LazyCall(ema)(ema_name="ema_0075", type="power", sigma_rel=0.075),
    })
    config.trainer.max_iter = config.trainer.save_ckpt_iter = 400
    config.dataloader_val = None
    config.dataloader_train.batch_size = 32
    config.log_config.name = "posthoc"
    model = Trainer(config).run()
    run = output_root / "fastgen" / "digits" / "posthoc"
    assert len(list((run / "ema_snapshots").glob("ema_005-*.pt"))) == 16

    result = run_cli("ema", str(run), "--sigma-rel", "0.075", "-o", str(tmp_path / "ema.pth"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "relative profile error" in result.stdout
    written = load_checkpoint(str(tmp_path / "ema.pth"))
    state, info = written["model"]["net"], written["posthoc_ema"]
    direct, a, b = (model.ema_nets[n].state_dict() for n in ("ema_0075", "ema_005", "ema_010"))

    def distance(x: dict, y: dict) -> float:
        return float(sum(((x[k].double() - y[k].double()) ** 2).sum() for k in direct if direct[k].is_floating_point()) ** 0.5)

    assert distance(state, direct) < 0.02 * distance(a, b), (distance(state, direct), distance(a, b))
    assert info["relative_profile_error"] < 0.01 and info["t"] == 400
    # the file is a teacher: it loads into the recipe's network
    from fastgen.checkpoint.weights import load_network_state

    assert load_network_state(str(tmp_path / "ema.pth")).keys() == direct.keys()


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    result = run_cli("ema", str(tmp_path), "--sigma-rel", "0.1", "-o", str(tmp_path / "x.pth"), cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "no EMA snapshots" in lines[0], result.stderr
    result = run_cli("ema", str(tmp_path), "--sigma-rel", "0.5", "-o", str(tmp_path / "x.pth"), cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "x.pth").exists()
