"""``model.net_adapter`` (``fastgen.utils.lora_utils``): only the adapter trains and is checkpointed, the base is
rebuilt from its source on resume (bit-identical to an uninterrupted run), merged weights reproduce the adapted
network, and ``convert-ckpt --merge-lora`` writes plain networks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastgen_testing import assert_same_checkpoint, run_cli

from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer
from fastgen.utils.errors import ConfigError
from fastgen.utils.lora_utils import LoRAAdapter, is_adapter_key, merge_lora

DIT_TARGETS = ["*attn.qkv", "*attn.proj", "*mlp.0", "*mlp.2"]


def _dit_config(name: str, max_iter: int, adapter: bool, pretrained: Path | None = None):
    from fastgen.configs.experiments.Digits.config_sft_dit_digits import create_config

    config = create_config()
    config.dataloader_train.batch_size = 16
    config.dataloader_val = None
    config.trainer.max_iter = max_iter
    config.trainer.save_ckpt_iter = 2
    config.trainer.callbacks = {"ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", beta=0.9)}
    config.log_config.wandb_mode = "disabled"
    config.log_config.name = name
    if adapter:
        config.model.net_adapter = LazyCall(LoRAAdapter)(rank=4, alpha=8.0, target_modules=DIT_TARGETS)
    if pretrained is not None:
        config.trainer.checkpointer.pretrained_ckpt_path = str(pretrained)
    return config


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DiT trained 2 iterations without an adapter: the base the LoRA runs start from."""
    import os

    root = tmp_path_factory.mktemp("lora_base")
    old = os.environ.get("FASTGEN_OUTPUT_ROOT")
    os.environ["FASTGEN_OUTPUT_ROOT"] = str(root)
    try:
        trainer = Trainer(_dit_config("base", 2, adapter=False))
        trainer.run()
        return trainer.checkpointer.path_for(2)
    finally:
        if old is not None:
            os.environ["FASTGEN_OUTPUT_ROOT"] = old


def test_only_the_adapter_trains_and_is_checkpointed(base_checkpoint: Path) -> None:
    from fastgen.checkpoint.checkpointer import load_checkpoint

    trainer = Trainer(_dit_config("lora", 2, adapter=True, pretrained=base_checkpoint))
    model = trainer.run()
    named = dict(model.net.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    assert trained and all(is_adapter_key(n) for n in trained)
    optimized = {id(p) for group in model.optimizer_dict["net"].param_groups for p in group["params"]}
    assert optimized == {id(named[n]) for n in trained}
    base = load_checkpoint(base_checkpoint)["model"]["net"]
    for name, value in model.net.state_dict().items():
        if not is_adapter_key(name):
            assert torch.equal(value, base[name]), name  # the base did not move
    assert any(float(named[n].detach().abs().max()) > 0 for n in trained if n.endswith("up.weight"))  # B left zero
    saved = load_checkpoint(trainer.checkpointer.path_for(2))["model"]
    for network in ("net", "ema"):
        assert saved[network] and all(is_adapter_key(k) for k in saved[network]), network
    assert set(saved["net"]) == trained


def test_a_resume_rebuilds_the_base_and_is_bit_identical(base_checkpoint: Path) -> None:
    straight = Trainer(_dit_config("straight", 4, adapter=True, pretrained=base_checkpoint))
    straight.run()
    Trainer(_dit_config("resumed", 2, adapter=True, pretrained=base_checkpoint)).run()
    resumed = Trainer(_dit_config("resumed", 4, adapter=True, pretrained=base_checkpoint))
    resumed.run()
    assert resumed.start_iteration == 2
    assert_same_checkpoint(straight.checkpointer.path_for(4), resumed.checkpointer.path_for(4))


@pytest.mark.parametrize("recipe", ["Digits/config_sft_dit_digits", "Digits/config_sft_digits"])
def test_merged_weights_reproduce_the_adapted_network(recipe: str) -> None:
    """Linear layers (DiT) and 3x3 / 1x1 convolutions (U-Net) merge to the adapted outputs."""
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate

    config = load_config(recipe)
    net = instantiate(config.model.net)
    chosen = LoRAAdapter(rank=4, alpha=6.0, target_modules=["*"]).apply(net)
    kinds = {type(m).__name__ for name, m in net.named_modules() if name in chosen}
    assert kinds >= ({"Linear"} if "dit" in recipe else {"Conv2d"})
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("lora.up.weight"):
                p.normal_(0, 0.02)  # B = 0 would merge nothing
    x, t = torch.randn(4, 1, 8, 8), torch.rand(4) + 0.2
    labels = torch.nn.functional.one_hot(torch.arange(4), 10).float()
    with torch.no_grad():
        adapted = net(x, t, condition=labels)
        assert merge_lora(net) == len(chosen)
        assert not any(is_adapter_key(k) for k in net.state_dict())
        merged = net(x, t, condition=labels)
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-5)


def test_bad_adapters_are_refused() -> None:
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed.parallelize import load_full_state_dict

    net = instantiate(load_config("Digits/config_sft_dit_digits").model.net)
    with pytest.raises(ConfigError, match=r"'\*qkvv' matches no Linear / Conv layer"):
        LoRAAdapter(target_modules=["*qkvv"]).apply(net)
    LoRAAdapter(rank=2, target_modules=["*attn.qkv"]).apply(net)
    state = {k: v for k, v in net.state_dict().items() if is_adapter_key(k)}
    state.pop(next(iter(state)))
    with pytest.raises(RuntimeError, match="only part of the LoRA adapter"):
        load_full_state_dict(net, state)


@pytest.mark.slow
def test_convert_merge_lora_writes_plain_networks_with_the_adapted_outputs(base_checkpoint: Path, tmp_path: Path,
                                                                            output_root: Path) -> None:
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs.instantiate import instantiate
    from fastgen.evaluation.sampling import load_run

    trainer = Trainer(_dit_config("to_merge", 2, adapter=True, pretrained=base_checkpoint))
    trainer.run()
    checkpoint = trainer.checkpointer.path_for(2)
    result = run_cli("convert-ckpt", str(checkpoint), str(tmp_path / "merged.pth"), "--merge-lora", "--only", "ema",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "merged LoRA" in result.stdout
    merged = load_checkpoint(tmp_path / "merged.pth")["model"]
    assert list(merged) == ["net"] and not any(is_adapter_key(k) for k in merged["net"])
    plain = instantiate(_dit_config("plain", 2, adapter=False).model.net)
    plain.load_state_dict(merged["net"])  # strict: a plain network, no adapter
    adapted = load_run(checkpoint).model.ema_nets["ema"]
    x, t = torch.randn(4, 1, 8, 8), torch.rand(4) + 0.2
    labels = torch.nn.functional.one_hot(torch.arange(4), 10).float()
    with torch.no_grad():
        torch.testing.assert_close(plain(x, t, condition=labels), adapted(x, t, condition=labels), rtol=1e-4, atol=1e-5)
    again = run_cli("convert-ckpt", str(base_checkpoint), str(tmp_path / "again.pth"), "--merge-lora", cwd=tmp_path)
    assert again.returncode == 2 and "has no LoRA adapter" in again.stderr


def test_rebuilding_a_lora_run_from_a_net_only_base_starts_its_ema_from_that_base(base_checkpoint: Path,
                                                                                  tmp_path: Path) -> None:
    """A pretrained file with only ``net`` (what ``convert-ckpt --only`` writes): the EMA's base is the loaded net,
    in training and when ``load_run`` rebuilds the run for sampling or ``--merge-lora``, through one loader."""
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.evaluation.sampling import load_run

    payload = load_checkpoint(base_checkpoint)
    net_only = tmp_path / "net_only.pth"
    torch.save({**{k: v for k, v in payload.items() if k != "model"}, "model": {"net": payload["model"]["net"]}},
               net_only)
    trainer = Trainer(_dit_config("net_only_base", 2, adapter=True, pretrained=net_only))
    trainer.run()
    rebuilt = load_run(trainer.checkpointer.path_for(2)).model
    base = payload["model"]["net"]
    for name, value in rebuilt.ema_nets["ema"].state_dict().items():
        if not is_adapter_key(name):
            assert torch.equal(value, base[name]), name
