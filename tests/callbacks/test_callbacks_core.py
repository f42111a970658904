"""The callback core: the seed's usage verbatim, presets, EMA and gradient clipping formulas, W&B offline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from fastgen_testing import tiny_toy_config
from omegaconf import DictConfig

from fastgen.callbacks.ema import ema_beta
from fastgen.callbacks.grad_clip import clip_global_norm_
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer

SEED_CALLBACK = '''
from fastgen.callbacks.callback import Callback
class MyCallback(Callback):
    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
        if iteration % self.config.trainer.logging_iter == 0:
            print(f"Step {iteration}: loss = {loss_dict['total_loss'].item():.4f}")
'''


def test_seed_snippets_run_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_callbacks.py").write_text(SEED_CALLBACK)
    from my_callbacks import MyCallback

    from fastgen.configs.callbacks import EMA_CALLBACK, WANDB_CALLBACK, GradClip_CALLBACK

    config = tiny_toy_config("seed", max_iter=4)
    config.trainer.callbacks = DictConfig({
        **GradClip_CALLBACK,
        **EMA_CALLBACK,
        **WANDB_CALLBACK,
    })
    config.trainer.callbacks.update({"mine": LazyCall(MyCallback)()})
    trainer = Trainer(config)
    assert list(trainer.callbacks) == ["grad_clip", "ema", "wandb", "mine"]
    trainer.run()
    printed = capsys.readouterr().out
    assert "Step 2: loss = " in printed and "Step 4: loss = " in printed
    assert trainer.callbacks["mine"].trainer is trainer and trainer.callbacks["mine"].config is config


def test_presets_are_not_mutated_by_edits() -> None:
    from fastgen.configs.callbacks import EMA_CALLBACK

    config = tiny_toy_config("presets")
    config.trainer.callbacks.ema.beta = 0.5
    assert EMA_CALLBACK["ema"].beta == 0.999


@pytest.mark.parametrize("iteration", [1, 2, 10, 1000])
def test_ema_beta_formulas_by_hand(iteration: int) -> None:
    assert ema_beta("constant", iteration, beta=0.99) == 0.99
    # EDM2 power function (Karras et al. 2024, Eq. 3): beta = (1 - 1/t)^(gamma + 1)
    assert ema_beta("power", iteration, gamma=6.94) == pytest.approx((1 - 1 / iteration) ** 7.94)
    # EDM half-life with ramp-up: h = min(500k, n_img * 0.05); beta = 0.5^(B / h)
    batch = 64
    h = min(500_000, iteration * batch * 0.05)
    assert ema_beta("halflife", iteration, halflife_kimg=500, rampup_ratio=0.05, batch_size=batch) == pytest.approx(0.5 ** (batch / h))


@pytest.mark.parametrize(("gamma", "sigma_rel"), [(6.94, 0.10), (16.97, 0.05)])
def test_power_ema_width_sigma_rel_and_gamma_convert_both_ways(gamma: float, sigma_rel: float) -> None:
    """EDM2 (Karras et al. 2024, Eq. 3 and appendix Eq. 123): sigma_rel = (gamma+1)^(1/2) / ((gamma+2) (gamma+3)^(1/2)).
    By hand: gamma 6.94 -> sqrt(7.94) / (8.94 sqrt(9.94)) = 2.8178 / 28.186 = 0.09997; gamma 16.97 -> sqrt(17.97) /
    (18.97 sqrt(19.97)) = 4.2391 / 84.773 = 0.05001. EDM2's own pairs are quoted to two decimals of gamma."""
    from fastgen.callbacks.ema import EMACallback
    from fastgen.utils.posthoc_ema import gamma_from_sigma_rel, sigma_rel_from_gamma

    assert sigma_rel_from_gamma(gamma) == pytest.approx(sigma_rel, abs=5e-5)
    assert gamma_from_sigma_rel(sigma_rel) == pytest.approx(gamma, abs=0.01)
    assert sigma_rel_from_gamma(gamma_from_sigma_rel(sigma_rel)) == pytest.approx(sigma_rel, rel=1e-12)
    callback = EMACallback(type="power", sigma_rel=sigma_rel)
    assert callback.gamma == pytest.approx(gamma, abs=0.01)
    assert ema_beta("power", 100, gamma=callback.gamma) == pytest.approx(0.99 ** (gamma + 1), rel=1e-3)


def test_power_ema_takes_gamma_or_sigma_rel_not_both() -> None:
    from fastgen.callbacks.ema import EMACallback
    from fastgen.utils.errors import ConfigError

    assert EMACallback(type="power").gamma == 6.94  # the default width, sigma_rel ~ 0.10
    assert EMACallback(type="power", gamma=3.0).gamma == 3.0
    with pytest.raises(ConfigError, match="not both"):
        EMACallback(type="power", gamma=6.94, sigma_rel=0.1)
    with pytest.raises(ConfigError, match="type='constant' does not use it"):
        EMACallback(type="constant", sigma_rel=0.1)
    for bad in (0.0, -0.1, 0.3):  # sigma_rel(gamma=0) = 1/(2 sqrt 3) = 0.2887 is the widest profile
        with pytest.raises(ConfigError, match="out of range"):
            EMACallback(type="power", sigma_rel=bad)


def test_a_run_with_sigma_rel_averages_with_the_converted_gamma() -> None:
    config = tiny_toy_config("ema_sigma_rel", max_iter=5)
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.ema.sigma_rel = 0.05
    trainer = Trainer(config)
    trainer.run()
    ema = trainer.callbacks["ema"]
    assert ema.num_updates == 5 and ema.last_beta == pytest.approx((1 - 1 / 5) ** (16.97 + 1), rel=1e-3)


def test_ema_callback_tracks_the_network() -> None:
    config = tiny_toy_config("ema", max_iter=5)
    config.trainer.callbacks.ema.beta = 0.9
    states = []

    from fastgen.callbacks.callback import Callback

    class Watch(Callback):
        def on_training_step_begin(self, model, iteration=0):
            states.append(([p.detach().clone() for p in model.ema_nets["ema"].parameters()],))

        def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
            states[-1] += ([p.detach().clone() for p in model.net.parameters()],
                           [p.detach().clone() for p in model.ema_nets["ema"].parameters()])

    trainer = Trainer(config)
    trainer.callbacks.add("watch", Watch())  # after the EMA callback: sees the updated EMA
    trainer.callbacks.bind(config, trainer)
    trainer.run()
    assert len(states) == 5
    for ema_before, net_after, ema_after in states:  # start_iter=0: averaging from the first step
        for eb, na, ea in zip(ema_before, net_after, ema_after):
            torch.testing.assert_close(ea, 0.9 * eb + 0.1 * na)


def test_ema_copies_the_network_until_start_iter() -> None:
    config = tiny_toy_config("ema_start", max_iter=3)
    config.trainer.callbacks.ema.start_iter = 2
    model = Trainer(config).run()
    for e, n in zip(model.ema_nets["ema"].parameters(), model.net.parameters()):
        assert not torch.equal(e, n)  # iteration 3 averaged
    config = tiny_toy_config("ema_start2", max_iter=2)
    config.trainer.callbacks.ema.start_iter = 2
    model = Trainer(config).run()
    for e, n in zip(model.ema_nets["ema"].parameters(), model.net.parameters()):
        assert torch.equal(e, n)  # up to start_iter the EMA is a copy


def test_global_norm_clipping_matches_the_definition() -> None:
    grads = [torch.randn(10) * 3, torch.randn(4, 4) * 3]
    norm = torch.sqrt(sum(g.square().sum() for g in grads))
    expected = [g * (1.0 / (norm + 1e-6)) for g in grads]
    total = clip_global_norm_(grads, 1.0)
    assert total == pytest.approx(float(norm), rel=1e-6)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    small = [torch.full((3,), 0.01)]
    clip_global_norm_(small, 1.0)
    torch.testing.assert_close(small[0], torch.full((3,), 0.01))


def test_wandb_offline_run_holds_scalars_and_sample_images(output_root: Path) -> None:
    config = tiny_toy_config("wandb_offline", max_iter=4)
    config.log_config.wandb_mode = "offline"
    config.trainer.callbacks.update({"wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=2, num_samples=64)})
    trainer = Trainer(config)
    trainer.run()
    run_dir = trainer.run_dir
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    keys = (b"total_loss", b"grad_norm", b"ema/ema_beta", b"lr/net")
    # W&B's service process writes the transaction log asynchronously; give it a bounded moment to close it.
    deadline = time.monotonic() + 30
    while True:
        records = next(offline[0].glob("run-*.wandb")).read_bytes()
        if all(key in records for key in keys) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for key in keys:
        assert key in records, key
    images = list((offline[0] / "files" / "media" / "images").glob("samples_*.png"))
    assert len(images) == 2  # iterations 2 and 4
    assert (run_dir / "samples" / "iter_0000004.png").is_file()
    run_id = (run_dir / "wandb_run_id.txt").read_text().strip()
    assert run_id in offline[0].name

    # Resuming continues the same W&B run id.
    resumed = tiny_toy_config("wandb_offline", max_iter=6)
    resumed.log_config.wandb_mode = "offline"
    Trainer(resumed).run()
    assert {p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("offline-run-*")} == {run_id}


def test_secrets_never_reach_config_yaml_or_wandb(output_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen_testing import SecretHolder

    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    config = tiny_toy_config("wandb_secret", max_iter=1)
    config.log_config.wandb_mode = "offline"
    config.trainer.callbacks.update({
        "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=0, num_samples=0),
        "judge": LazyCall(SecretHolder)(api_key="sk-typed-into-the-config", note="sk-from-the-environment"),
    })
    trainer = Trainer(config)
    trainer.run()
    assert trainer.callbacks["judge"].api_key == "sk-typed-into-the-config"  # the run itself gets the value
    written = b"".join(p.read_bytes() for p in trainer.run_dir.rglob("*") if p.is_file() and p.suffix != ".pth")
    assert b"sk-typed-into-the-config" not in written
    assert b"sk-from-the-environment" not in written
    assert b"<redacted>" in (trainer.run_dir / "config.yaml").read_bytes()
