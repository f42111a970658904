"""``model.torch_compile_mode``: the trained network is compiled block by block (``fastgen.distributed.parallelize.
apply_compile``) and computes what the eager network computes; training runs compiled; a compile failure is one
line naming the field. Compilation with inductor on CPU takes tens of seconds: the tests are slow."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastgen_testing import run_cli


def _model(recipe: str, mode: str | None):
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate

    config = load_config(recipe)
    config.model.torch_compile_mode = mode
    if "model_channels" in config.model.net.backbone:
        config.model.net.backbone.model_channels = 16
    torch.manual_seed(0)
    return instantiate(config.model_class, config=config.model)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["Digits/config_sft_digits", "Digits/config_sft_dit_digits"])
def test_a_compiled_network_matches_the_eager_one(recipe: str) -> None:
    from fastgen.distributed.parallelize import apply_compile, shard_units

    eager, compiled = _model(recipe, None), _model(recipe, "default")
    compiled.net.load_state_dict(eager.net.state_dict())
    assert apply_compile(compiled) == len(shard_units(compiled.net)) > 0
    assert list(compiled.net.state_dict()) == list(eager.net.state_dict())  # names (checkpoints) unchanged
    x = torch.randn(8, 1, 8, 8)
    t = torch.rand(8) * 2 + 0.1
    labels = torch.nn.functional.one_hot(torch.arange(8) % 10, 10).float()
    with torch.no_grad():
        want = eager.net(x, t, condition=labels)
        got = compiled.net(x, t, condition=labels)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    unit = shard_units(compiled.net)[0]
    assert unit._compiled_call_impl is not None  # the block really is compiled


@pytest.mark.slow
def test_training_runs_compiled_and_a_compile_failure_is_one_line(tmp_path: Path) -> None:
    common = ["train", "-c", "Digits/config_sft_dit_digits", "--eval-samples", "0", "-", "trainer.max_iter=2",
              "trainer.callbacks={}", "dataloader_val=null", "model.torch_compile_mode=default"]
    good = run_cli(*common, "log_config.name=compiled", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert good.returncode == 0, good.stderr[-3000:]
    broken = run_cli(*common, "log_config.name=broken", cwd=tmp_path, timeout=600,
                     env={"WANDB_MODE": "disabled", "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc",
                          "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert broken.returncode == 1
    lines = [line for line in broken.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "model.torch_compile_mode=default: torch.compile failed" in lines[0], broken.stderr[-3000:]
    assert "set model.torch_compile_mode=null" in lines[0] and "Traceback" not in broken.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_two_ranks_train_compiled_blocks_like_eager_ones(mode: str, output_root: Path, tmp_path: Path) -> None:
    """``fastgen train --nproc-per-node 2`` with the DiT's blocks compiled (in place, after FSDP2's per-block
    sharding or DDP's replicate) computes what the eager 2-rank run computes - the same weights within float
    tolerance after 3 SGD steps - and each rank really compiled graphs (none in the eager run)."""
    import json

    from multirank import fastgen

    from fastgen.checkpoint.checkpointer import load_checkpoint

    common = ["train", "--nproc-per-node", "2", "-c", "Digits/config_sft_dit_digits", "--eval-samples", "0", "-",
              "trainer.max_iter=3", "trainer.save_ckpt_iter=3", "trainer.callbacks={}", "dataloader_val=null",
              f"trainer.{mode}=True", "dataloader_train.batch_size=16",
              # SGD: Adam's first steps divide each gradient by its own magnitude, which turns float-rounding
              # differences of near-zero gradients (adaLN-Zero starts every block at zero) into full-size steps
              "model.net_optimizer={_target_:torch.optim.SGD,lr:0.1}"]
    runs = {}
    for name, compile_mode in (("eager", "null"), ("compiled", "default")):
        probe = f"+trainer.callbacks.stats={{_target_:rank_probes.CompileStats,prefix:{tmp_path / name}}}"
        result = fastgen(*common, f"model.torch_compile_mode={compile_mode}", f"log_config.name={mode}_{name}", probe,
                         cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = load_checkpoint(str(output_root / "fastgen" / "digits" / f"{mode}_{name}" / "checkpoints"
                                         / "0000003.pth"))["model"]["net"]
        graphs = [json.loads((tmp_path / f"{name}.rank{r}.json").read_text())["unique_graphs"] for r in (0, 1)]
        assert all(g > 0 for g in graphs) if name == "compiled" else graphs == [0, 0], (name, graphs)
    for key, value in runs["eager"].items():
        torch.testing.assert_close(runs["compiled"][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_a_bad_mode_is_refused() -> None:
    from fastgen.configs.config_utils import load_config, validate_config
    from fastgen.utils.errors import ConfigError

    config = load_config("Digits/config_sft_digits")
    config.model.torch_compile_mode = "fastest"
    with pytest.raises(ConfigError, match="expected null \\(eager\\) or one of default"):
        validate_config(config)
