"""Self-Forcing (``fastgen.methods.self_forcing``): the rollout is chunk-by-chunk sampling with the KV cache; in a
training step only each chunk's exit-step evaluation carries gradient; the exit steps come from the shared stream
(the same on every rank, whatever its samples); the recipe refuses a causal teacher and trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_dit import causal_video_dit
from fastgen.distributed.keyed_rng import KeyedNoise
from fastgen.utils.errors import ConfigError


def small_config():  # noqa: ANN201
    config = load_config("Digits/config_self_forcing_moving_digits")
    for name in ("net", "teacher", "fake_score"):
        causal = name == "net"
        setattr(config.model, name, causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=causal))
    config.model.teacher_ckpt = None
    return config


def build():  # noqa: ANN201
    config = small_config()
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    with torch.no_grad():
        for p in model.teacher.parameters():
            p.normal_(0.0, 0.1)
    model.init_weights()
    return model


def test_the_rollout_is_chunk_by_chunk_sampling_with_the_cache() -> None:
    """Every chunk through all student steps: chunk c of the rollout equals the student run on the whole prefix
    (finished chunks clean, then chunk c's own steps) without any cache."""
    model = build()
    net = model.net
    noise = torch.randn(2, 1, 8, 8, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([1, 2])
    with torch.no_grad():
        video = model.rollout(net, noise, labels, generator=torch.Generator().manual_seed(2))
        source = torch.Generator().manual_seed(2)
        done = []
        for start in range(0, 8, 2):
            x = noise[:, :, start:start + 2]
            for step, t in enumerate(model.student_times()):
                prefix = torch.cat([*done, x], dim=2)
                times = torch.cat([torch.zeros(2, start), torch.full((2, 2), t)], dim=1)
                x0 = net(prefix, times, condition=labels, fwd_pred_type="x0")[:, :, start:]
                if step + 1 < len(model.student_times()):
                    eps = torch.randn(x0.shape, generator=source)
                    x = model.noise_scheduler.add_noise(x0, eps, torch.full((2,), model.student_times()[step + 1]))
            done.append(x0)
    torch.testing.assert_close(video, torch.cat(done, dim=2), atol=1e-4, rtol=0)


def test_only_the_exit_step_carries_gradient() -> None:
    model = build()
    net = model.net
    calls: list[bool] = []
    handle = net.register_forward_hook(lambda module, args, out: calls.append(out.requires_grad))
    noise = torch.randn(2, 1, 8, 8, 16)
    video = model.rollout(net, noise, torch.tensor([0, 1]), exits=[1, 0, 1, 0])
    handle.remove()
    # chunk 0: step 0 (no grad), step 1 (grad), cache write (no grad); chunk 1: step 0 (grad), write; ...
    assert calls == [False, True, False, True, False, False, True, False, True]
    assert video.requires_grad
    video.square().mean().backward()
    head = net.backbone.final_layer.linear.weight
    assert head.grad is not None and float(head.grad.abs().sum()) > 0


def test_exit_steps_come_from_the_shared_stream() -> None:
    """Two ranks hold different samples; their exit-step draws agree (``rng.shared``); another iteration draws
    anew."""
    model = build()
    draws = []
    for ids in (torch.arange(0, 4), torch.arange(4, 8)):
        model._bound_noise = KeyedNoise(0, ids, 7, "train")
        draws.append(model.exit_steps(4, torch.device("cpu")).tolist())
    model._bound_noise = KeyedNoise(0, torch.arange(0, 4), 8, "train")
    later = [model.exit_steps(4, torch.device("cpu")).tolist() for _ in range(3)]
    model._bound_noise = None
    assert draws[0] == draws[1] and set(draws[0]) <= {0, 1}
    assert any(d != draws[0] for d in later) or len({tuple(d) for d in later}) > 1


def test_a_causal_teacher_is_refused() -> None:
    config = small_config()
    config.model.teacher = causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=True)
    with pytest.raises(ConfigError, match="bidirectional"):
        instantiate(config.model_class, config=config.model)


@pytest.mark.slow
def test_the_recipe_trains_and_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = small_config()
    config.trainer.max_iter = 6
    config.trainer.save_ckpt_iter = 6
    config.dataloader_train.batch_size = 4
    model = Trainer(config).run()
    videos, _ = model.sample(2, generator=torch.Generator().manual_seed(0))
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()


TINY_SELF_FORCING = '''
from fastgen.configs.experiments.Digits.config_self_forcing_moving_digits import create_config as base
from fastgen.configs.net_dit import causal_video_dit


def create_config():
    config = base()
    for name in ("net", "teacher", "fake_score"):
        setattr(config.model, name, causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=name == "net"))
    config.model.teacher_ckpt = None
    config.model.t_list = [1.0, 0.75, 0.5, 0.25]
    config.model.student_update_freq = 1
    config.trainer.callbacks = {{}}
    config.log_config.name = "tiny_self_forcing"
    return config
'''


@pytest.mark.slow
def test_every_rank_exits_at_the_same_steps(tmp_path: Path) -> None:
    """2 ranks (gloo, DDP), different samples per rank: each student step's exit steps agree across the ranks,
    and differ from step to step."""
    from multirank import fastgen

    recipe = tmp_path / "tiny_self_forcing.py"
    recipe.write_text(TINY_SELF_FORCING.format())
    prefix = tmp_path / "exits"
    result = fastgen("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                     "trainer.ddp=True", "trainer.max_iter=4", "trainer.save_ckpt_iter=4", "dataloader_train.batch_size=2",
                     f"+trainer.callbacks.exits={{_target_:rank_probes.ExitStepLog,prefix:{prefix}}}",
                     cwd=tmp_path, env={"WANDB_MODE": "disabled", "FASTGEN_OUTPUT_ROOT": str(tmp_path / "out")},
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = (tmp_path / "exits.rank0").read_text().splitlines()
    rank1 = (tmp_path / "exits.rank1").read_text().splitlines()
    assert len(rank0) == 4 and rank0 == rank1
    assert len({line.split(" ", 1)[1] for line in rank0}) > 1


@pytest.mark.slow
def test_resume_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 iterations straight, and 2 then a resumed 2: the same student, fake score and EMA, bit for bit (the
    rollout's noise and exit steps are keyed by sample and iteration, the caches rebuilt every rollout)."""
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")

    def run(name: str, max_iter: int) -> None:
        config = small_config()
        config.model.student_update_freq = 2
        config.trainer.max_iter = max_iter
        config.trainer.save_ckpt_iter = 2
        config.dataloader_train.batch_size = 4
        config.trainer.callbacks = {"ema": config.trainer.callbacks["ema"]}
        config.log_config.name = name
        Trainer(config).run()

    run("straight", 4)
    run("resumed", 2)
    import logging

    # a handler on fastgen's own logger: another test in this worker may have stopped it propagating to caplog
    records: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("fastgen")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        run("resumed", 4)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    text = "\n".join(records)
    assert "resumed from" in text and "at iteration 2" in text, text[-2000:]
    root = tmp_path / "fastgen" / "moving_digits"
    a = load_checkpoint(str(root / "straight" / "checkpoints" / "0000004.pth"))["model"]
    b = load_checkpoint(str(root / "resumed" / "checkpoints" / "0000004.pth"))["model"]
    assert a.keys() == b.keys() and {"net", "fake_score", "ema"} <= set(a)
    for module in a:
        for key in a[module]:
            assert torch.equal(a[module][key], b[module][key]), (module, key)
